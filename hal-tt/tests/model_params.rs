//! Per-op parameters that are tensors of the model (ABI 6): RoPE frequency factors and
//! attention sinks are read by the adapter from device buffers (a handle and an offset).
//! With them in device tensors the ops give the cpu device's bits and move nothing over
//! the bus (no upload, no download, no arg bytes); host views of them are one counted
//! upload each; a factor that is not finite and positive in a device tensor, and a range
//! outside its buffer, are `InvalidInput`.

mod common;

use common::{open_sim, Rng};
use flint_hal::{
    AttnSeq, Device, DeviceOptions, HalErrorKind, KvLayout, PagedAttention, RopeKind, RopeParams,
    Tensor, Transfers, View, Yarn,
};
use flint_hal_cpu::CpuDevice;
use flint_hal_tt::TtCounters;

const N_HEADS: usize = 4;
const HEAD_DIM: usize = 64;
const POS: [u32; 5] = [0, 1, 17, 300, 70_000];

fn cpu() -> CpuDevice {
    CpuDevice::new(&DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    })
    .expect("the cpu device opens")
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|f| f.to_bits()).collect()
}

/// Asserts the same bits, naming the first value that differs.
fn assert_bits(got: &[f32], want: &[f32], what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    if let Some(i) = (0..got.len()).find(|&i| got[i].to_bits() != want[i].to_bits()) {
        panic!(
            "{what}: value {i} is {} where {} was wanted",
            got[i], want[i]
        );
    }
}

/// `len` values of device tensor `t` from `offset`, without the range check of
/// [`View::slice`] (to hand the adapter a range outside the buffer).
fn raw_view(t: &Tensor, offset: usize, len: usize) -> View<'_> {
    match t {
        Tensor::Device(b) => View::Device {
            buf: &**b,
            offset,
            len,
        },
        Tensor::Host(_) => panic!("a device tensor"),
    }
}

/// The adapter's host traffic between two readings: buffer writes, their bytes, buffer
/// reads, their bytes.
fn bus(a: &TtCounters, b: &TtCounters) -> (u64, u64, u64, u64) {
    (
        b.host_writes - a.host_writes,
        b.host_write_bytes - a.host_write_bytes,
        b.host_reads - a.host_reads,
        b.host_read_bytes - a.host_read_bytes,
    )
}

/// Per-pair divisors as Llama 3's `rope_freqs` holds them: none of them 1.
fn factors(n: usize) -> Vec<f32> {
    (0..n).map(|i| 1.25 + 0.37 * i as f32).collect()
}

/// The parameter sets the RoPE test walks: both pairings, full and partial rotation,
/// with and without YaRN.
fn rope_cases() -> Vec<RopeParams<'static>> {
    let yarn = Some(Yarn {
        ext_factor: 1.0,
        attn_factor: 0.9,
        beta_fast: 32.0,
        beta_slow: 1.0,
        n_ctx_orig: 4096,
    });
    let mut v = Vec::new();
    for kind in [RopeKind::Normal, RopeKind::Neox] {
        for (n_rot, freq_scale, yarn) in [(64, 1.0, None), (32, 0.25, None), (64, 0.125, yarn)] {
            v.push(RopeParams {
                kind,
                freq_scale,
                yarn,
                ..RopeParams::neox(N_HEADS, HEAD_DIM, n_rot, 500_000.0)
            });
        }
    }
    v
}

/// RoPE on the cpu device with host factors (`None`: without factors).
fn rope_cpu(cpu: &CpuDevice, p: &RopeParams<'_>, x0: &[f32], ff: Option<&[f32]>) -> Vec<f32> {
    let mut x = x0.to_vec();
    let p = RopeParams {
        freq_factors: ff.map(View::Host),
        ..*p
    };
    cpu.rope((&mut x[..]).into(), (&POS).into(), &p)
        .expect("cpu rope");
    x
}

#[test]
fn rope_with_device_factors_gives_the_cpu_devices_bits_and_moves_nothing() {
    let tt = open_sim(true);
    let cpu = cpu();
    let mut rng = Rng::new(61);
    let x0 = rng.vec(POS.len() * N_HEADS * HEAD_DIM);
    for p in rope_cases() {
        let half = p.n_rot / 2;
        let f = factors(half);
        let want = rope_cpu(&cpu, &p, &x0, Some(&f));
        // The factors matter here: without them the cpu device computes other bits.
        assert_ne!(bits(&want), bits(&rope_cpu(&cpu, &p, &x0, None)), "{p:?}");

        // The factors inside a model tensor (at an offset, values around them that are
        // no factors), the positions and x on the device too.
        let mut padded = vec![-7.0f32; 3];
        padded.extend_from_slice(&f);
        padded.push(-7.0);
        let ft = tt.upload_new(&padded).expect("factors");
        let pos = tt.upload_indices(POS.to_vec()).expect("positions");
        let mut x = tt.upload_new(&x0).expect("x");
        let pd = RopeParams {
            freq_factors: Some(ft.slice(3..3 + half)),
            ..p
        };
        let (before, before_tt) = (tt.transfers(), tt.tt_counters().expect("counters"));
        tt.rope(x.view_mut(), pos.view(), &pd).expect("tt rope");
        let d = tt.transfers().since(&before);
        assert_eq!(d, Transfers::default(), "{p:?}: {d:?}");
        let after_tt = tt.tt_counters().expect("counters");
        assert_eq!(bus(&before_tt, &after_tt), (0, 0, 0, 0), "{p:?}");
        // x at offset 0 is rotated in place: not even a device-side copy.
        assert_eq!(after_tt.device_copies, before_tt.device_copies, "{p:?}");
        let got = tt.download_tensor(x).expect("x");
        assert_bits(&got, &want, &format!("device factors {p:?}"));

        // Host factors: uploaded for the op, one counted upload, still no arg bytes.
        let mut x = tt.upload_new(&x0).expect("x");
        let ph = RopeParams {
            freq_factors: Some((&f[..]).into()),
            ..p
        };
        let (before, before_tt) = (tt.transfers(), tt.tt_counters().expect("counters"));
        tt.rope(x.view_mut(), pos.view(), &ph)
            .expect("tt rope, host factors");
        let d = tt.transfers().since(&before);
        let one_upload = Transfers {
            uploads: 1,
            upload_bytes: 4 * half as u64,
            ..Transfers::default()
        };
        assert_eq!(d, one_upload, "{p:?}");
        assert_eq!(
            bus(&before_tt, &tt.tt_counters().expect("counters")),
            (1, 4 * half as u64, 0, 0),
            "{p:?}: the adapter's count"
        );
        let got = tt.download_tensor(x).expect("x");
        assert_bits(&got, &want, &format!("host factors {p:?}"));
    }
}

const LAYOUT: KvLayout = KvLayout {
    num_blocks: 6,
    block_size: 4,
    n_kv_heads: 2,
    head_dim_k: 32,
    head_dim_v: 16,
};

/// Two sequences: A's 9 tokens in blocks 5, 0, 2 (queries at its last 3 positions, a
/// prefill chunk), B's 6 tokens in blocks 3, 1 (a query at its last position, decode).
struct Attn {
    tables: [Vec<u32>; 2],
    positions: [Vec<u32>; 2],
    k: Vec<Vec<f32>>,
    v: Vec<Vec<f32>>,
    slots: Vec<Vec<u32>>,
    q: Vec<f32>,
    sinks: Vec<f32>,
}

fn attn_case(rng: &mut Rng) -> Attn {
    let tables = [vec![5u32, 0, 2], vec![3, 1]];
    let lens = [9usize, 6];
    let (kr, vr) = (
        LAYOUT.n_kv_heads * LAYOUT.head_dim_k,
        LAYOUT.n_kv_heads * LAYOUT.head_dim_v,
    );
    let mut a = Attn {
        positions: [vec![6, 7, 8], vec![5]],
        k: Vec::new(),
        v: Vec::new(),
        slots: Vec::new(),
        q: rng.vec(4 * N_HEADS * LAYOUT.head_dim_k),
        // Large enough against the scores that they change the softmax.
        sinks: vec![1.5, -0.75, 3.0, 0.25],
        tables,
    };
    for (len, table) in lens.iter().zip(&a.tables) {
        a.k.push(rng.vec(len * kr));
        a.v.push(rng.vec(len * vr));
        a.slots.push(
            (0..*len)
                .map(|j| table[j / 4] * 4 + (j % 4) as u32)
                .collect(),
        );
    }
    a
}

/// Writes the case's keys and values into a new KV cache of `dev` (host views).
fn kv_of(dev: &dyn Device, a: &Attn) -> Box<dyn flint_hal::KvBuffer> {
    let mut kv = dev.alloc_kv(&LAYOUT).expect("alloc kv");
    for i in 0..2 {
        dev.write_kv(
            &mut *kv,
            (&a.k[i]).into(),
            (&a.v[i]).into(),
            (&a.slots[i]).into(),
        )
        .expect("write_kv");
    }
    kv
}

/// Attention on the cpu device, all in host memory.
fn attn_cpu(cpu: &CpuDevice, a: &Attn, sinks: bool, window: Option<usize>) -> Vec<f32> {
    let kv = kv_of(cpu, a);
    let seqs = [
        AttnSeq {
            q_start: 0,
            positions: (&a.positions[0]).into(),
            block_table: (&a.tables[0]).into(),
        },
        AttnSeq {
            q_start: 3,
            positions: (&a.positions[1]).into(),
            block_table: (&a.tables[1]).into(),
        },
    ];
    let p = PagedAttention {
        q: (&a.q).into(),
        seqs: &seqs,
        n_heads: N_HEADS,
        scale: 0.2,
        sinks: sinks.then(|| (&a.sinks).into()),
        window,
    };
    let mut out = vec![0.0; 4 * N_HEADS * LAYOUT.head_dim_v];
    cpu.paged_attention(&*kv, &p, (&mut out[..]).into())
        .expect("cpu attention");
    out
}

#[test]
fn attention_with_device_sinks_gives_the_cpu_devices_bits_and_moves_nothing() {
    let tt = open_sim(true);
    let cpu = cpu();
    let mut rng = Rng::new(62);
    let a = attn_case(&mut rng);
    let kv = kv_of(&tt, &a);
    // The step's lists in one index tensor, q and the sinks (inside a larger model
    // tensor, at an offset) on the device.
    let mut packed = a.positions[0].clone();
    packed.extend(&a.positions[1]);
    packed.extend(&a.tables[0]);
    packed.extend(&a.tables[1]);
    let idx = tt.upload_indices(packed).expect("indices");
    let seqs = [
        AttnSeq {
            q_start: 0,
            positions: idx.slice(0..3),
            block_table: idx.slice(4..7),
        },
        AttnSeq {
            q_start: 3,
            positions: idx.slice(3..4),
            block_table: idx.slice(7..9),
        },
    ];
    let q = tt.upload_new(&a.q).expect("q");
    let mut padded = vec![9.0f32; 2];
    padded.extend_from_slice(&a.sinks);
    padded.push(9.0);
    let st = tt.upload_new(&padded).expect("sinks");
    let n_out = 4 * N_HEADS * LAYOUT.head_dim_v;
    for window in [None, Some(3)] {
        let want = attn_cpu(&cpu, &a, true, window);
        // The sinks matter here.
        assert_ne!(
            bits(&want),
            bits(&attn_cpu(&cpu, &a, false, window)),
            "window {window:?}"
        );
        let mut out = tt.alloc(n_out).expect("out");
        let p = PagedAttention {
            q: q.view(),
            seqs: &seqs,
            n_heads: N_HEADS,
            scale: 0.2,
            sinks: Some(st.slice(2..2 + N_HEADS)),
            window,
        };
        let (before, before_tt) = (tt.transfers(), tt.tt_counters().expect("counters"));
        tt.paged_attention(&*kv, &p, out.view_mut())
            .expect("tt attention");
        let d = tt.transfers().since(&before);
        assert_eq!(d, Transfers::default(), "window {window:?}: {d:?}");
        let after_tt = tt.tt_counters().expect("counters");
        assert_eq!(
            bus(&before_tt, &after_tt),
            (0, 0, 0, 0),
            "window {window:?}"
        );
        assert_eq!(after_tt.device_copies, before_tt.device_copies);
        let got = tt.download_tensor(out).expect("out");
        assert_bits(&got, &want, &format!("device sinks, window {window:?}"));

        // Host sinks: one counted upload of n_heads floats, no arg bytes.
        let mut out = tt.alloc(n_out).expect("out");
        let p = PagedAttention {
            sinks: Some((&a.sinks).into()),
            ..p
        };
        let (before, before_tt) = (tt.transfers(), tt.tt_counters().expect("counters"));
        tt.paged_attention(&*kv, &p, out.view_mut())
            .expect("tt attention, host sinks");
        let d = tt.transfers().since(&before);
        let one_upload = Transfers {
            uploads: 1,
            upload_bytes: 4 * N_HEADS as u64,
            ..Transfers::default()
        };
        assert_eq!(d, one_upload, "window {window:?}");
        assert_eq!(
            bus(&before_tt, &tt.tt_counters().expect("counters")),
            (1, 4 * N_HEADS as u64, 0, 0),
            "the adapter's count"
        );
        let got = tt.download_tensor(out).expect("out");
        assert_bits(&got, &want, &format!("host sinks, window {window:?}"));
    }
}

#[test]
fn bad_factors_and_ranges_in_device_tensors_are_invalid_input() {
    let tt = open_sim(true);
    let mut rng = Rng::new(63);
    let p = RopeParams::neox(N_HEADS, HEAD_DIM, 16, 10_000.0);
    let x0 = rng.vec(POS.len() * N_HEADS * HEAD_DIM);
    let pos = tt.upload_indices(POS.to_vec()).expect("positions");
    let good = factors(8);
    for (i, bad) in [(0, 0.0f32), (3, -1.0), (7, f32::NAN), (5, f32::INFINITY)] {
        let mut f = good.clone();
        f[i] = bad;
        let ft = tt.upload_new(&f).expect("factors");
        let pd = RopeParams {
            freq_factors: Some(ft.view()),
            ..p
        };
        // The host cannot see these values; the adapter refuses them.
        assert!(pd.check().is_ok());
        let mut xv = tt.upload_new(&x0).expect("x");
        let e = tt
            .rope(xv.view_mut(), pos.view(), &pd)
            .expect_err("a factor that is not finite and positive");
        assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
        assert!(
            e.message.contains("rope") && e.message.contains(&format!("frequency factor {i}")),
            "{e}"
        );
        // Nothing was written.
        let left = tt.download_tensor(xv).expect("x");
        assert_bits(&left, &x0, &format!("x after factor {i} = {bad}"));
    }

    // Factors past the end of their buffer (8 floats, 8 read from float 4).
    let ft = tt.upload_new(&good).expect("factors");
    let mut xv = tt.upload_new(&x0).expect("x");
    let pd = RopeParams {
        freq_factors: Some(raw_view(&ft, 4, 8)),
        ..p
    };
    let e = tt
        .rope(xv.view_mut(), pos.view(), &pd)
        .expect_err("factors outside their buffer");
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
    assert!(e.message.contains("outside buffer"), "{e}");
    // A count other than n_rot / 2 is refused by the host.
    let pd = RopeParams {
        freq_factors: Some(ft.slice(0..7)),
        ..p
    };
    let e = tt
        .rope(xv.view_mut(), pos.view(), &pd)
        .expect_err("7 factors for n_rot 16");
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
    let left = tt.download_tensor(xv).expect("x");
    assert_bits(&left, &x0, "x after bad factor ranges");

    // Sinks past the end of their buffer.
    let a = attn_case(&mut rng);
    let kv = kv_of(&tt, &a);
    let seqs = [AttnSeq {
        q_start: 0,
        positions: (&a.positions[0]).into(),
        block_table: (&a.tables[0]).into(),
    }];
    let q = tt
        .upload_new(&a.q[..3 * N_HEADS * LAYOUT.head_dim_k])
        .expect("q");
    let st = tt.upload_new(&a.sinks).expect("sinks");
    let mut out = tt
        .upload_new(&vec![5.0; 3 * N_HEADS * LAYOUT.head_dim_v])
        .expect("out");
    let p = PagedAttention {
        q: q.view(),
        seqs: &seqs,
        n_heads: N_HEADS,
        scale: 0.2,
        sinks: Some(raw_view(&st, 1, N_HEADS)),
        window: None,
    };
    let e = tt
        .paged_attention(&*kv, &p, out.view_mut())
        .expect_err("sinks outside their buffer");
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
    assert!(
        e.message.contains("paged_attention") && e.message.contains("outside buffer"),
        "{e}"
    );
    let left = tt.download_tensor(out).expect("out");
    assert!(left.iter().all(|&v| v == 5.0));
}
