//! Qwen 3.5's Gated DeltaNet ops on the `tt` device (ABI 6): `ssm_conv_silu`,
//! `gated_delta_net`, `sigmoid`, `mul`, `deinterleave`, `delta_net_gate` and `l2_norm`.
//! On device tensors each gives the cpu device's bits and moves nothing over the bus; the
//! recurrent states live in a `tt` tensor (at an offset, as the engine keeps one slot per
//! sequence) that the adapter updates in place, so a convolution and a delta rule carried
//! over two calls give the bits of one call over all the tokens. Host views are counted,
//! one transfer per input and per output.

mod common;

use common::{h, hm, open_sim, Rng};
use flint_core::math;
use flint_hal::{
    DeltaNetShape, Device, DeviceOptions, HalErrorKind, Op, Tensor, Transfers, View, ViewMut,
};
use flint_hal_cpu::CpuDevice;
use flint_hal_tt::{TtCounters, TtDevice};

/// Two key heads, four value heads of 64 (Qwen 3.5's layout, smaller).
const SHAPE: DeltaNetShape = DeltaNetShape {
    heads_k: 2,
    heads_v: 4,
    head_dim: 64,
};
const D_CONV: usize = 4;
/// The convolution's channels: q, k, then v of a token.
const CD: usize = 2 * 2 * 64 + 4 * 64;
const QK: usize = 2 * 64;
const VL: usize = 4 * 64;
const HV: usize = 4;
const EPS: f32 = 1e-6;
/// Floats of one sequence's state: the convolution window, then the delta rule's.
const CONV_LEN: usize = CD * (D_CONV - 1);
const DELTA_LEN: usize = 4 * 64 * 64;
const SLOT_LEN: usize = CONV_LEN + DELTA_LEN;

fn cpu() -> CpuDevice {
    CpuDevice::new(&DeviceOptions {
        threads: Some(2),
        keep_quant: true,
    })
    .expect("the cpu device opens")
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

/// The adapter's buffer writes, reads and device copies between two readings.
fn bus(a: &TtCounters, b: &TtCounters) -> (u64, u64, u64) {
    (
        b.host_writes - a.host_writes,
        b.host_reads - a.host_reads,
        b.device_copies - a.device_copies,
    )
}

fn down(dev: &dyn Device, t: &Tensor) -> Vec<f32> {
    let mut v = vec![0.0; t.len()];
    dev.download(t.view(), &mut v).expect("download");
    v
}

/// Runs `f` on `dev` and checks that it moved nothing over the bus, on the host's count
/// and the adapter's, and made `copies` device copies (those `f` asks for itself: the ops
/// pass every view as it is).
fn on_device(dev: &TtDevice, what: &str, copies: u64, f: impl FnOnce()) {
    let before = dev.transfers();
    let before_tt = dev.tt_counters().expect("counters");
    f();
    let d = dev.transfers().since(&before);
    assert_eq!(d, Transfers::default(), "{what}: {d:?}");
    let after_tt = dev.tt_counters().expect("counters");
    assert_eq!(bus(&before_tt, &after_tt), (0, 0, copies), "{what}");
}

/// The inputs of a Gated DeltaNet layer's ops over `n` tokens: the `qkv` projection, the
/// convolution kernel, the gate inputs and their per-head parameters.
struct Layer {
    qkv: Vec<f32>,
    conv_w: Vec<f32>,
    beta: Vec<f32>,
    alpha: Vec<f32>,
    dt_bias: Vec<f32>,
    a: Vec<f32>,
}

fn layer(n: usize, seed: u64) -> Layer {
    let mut rng = Rng::new(seed);
    Layer {
        qkv: rng.vec(n * CD).iter().map(|v| 2.0 * v).collect(),
        conv_w: rng.vec(CD * D_CONV),
        beta: rng.vec(n * HV).iter().map(|v| 4.0 * v).collect(),
        // Some above 20: softplus's linear branch.
        alpha: rng.vec(n * HV).iter().map(|v| 12.0 * v + 6.0).collect(),
        dt_bias: rng.vec(HV),
        a: rng.vec(HV).iter().map(|v| -0.5 - v.abs()).collect(),
    }
}

/// One call's tensors: its rows of the layer's inputs and the intermediate tensors.
struct Step {
    n: usize,
    qkv: Tensor,
    beta: Tensor,
    alpha: Tensor,
    conv: Tensor,
    q: Tensor,
    k: Tensor,
    v: Tensor,
    o: Tensor,
}

fn step(dev: &dyn Device, l: &Layer, rows: std::ops::Range<usize>) -> Step {
    let n = rows.len();
    let put = |v: &[f32]| dev.upload_new(v).expect("upload");
    let alloc = |n: usize| dev.alloc(n).expect("alloc");
    Step {
        n,
        qkv: put(&l.qkv[rows.start * CD..rows.end * CD]),
        beta: put(&l.beta[rows.start * HV..rows.end * HV]),
        alpha: put(&l.alpha[rows.start * HV..rows.end * HV]),
        conv: alloc(n * CD),
        q: alloc(n * QK),
        k: alloc(n * QK),
        v: alloc(n * VL),
        o: alloc(n * VL),
    }
}

/// A layer's ops over one call's rows (as the engine runs them), the states carried in
/// `slot` (the convolution window, then the delta rule's state): the gates, the
/// convolution, the split into q, k and v, their L2 norms and the delta rule.
fn run(dev: &dyn Device, s: &mut Step, params: &[Tensor; 3], slot: ViewMut<'_>) {
    let [conv_w, dt_bias, a] = params;
    dev.sigmoid(s.beta.view_mut()).expect("sigmoid");
    dev.delta_net_gate(s.alpha.view_mut(), dt_bias.view(), a.view())
        .expect("delta_net_gate");
    let (conv_state, delta_state) = slot.split_at(CONV_LEN);
    dev.ssm_conv_silu(
        s.qkv.view(),
        conv_w.view(),
        D_CONV,
        conv_state,
        s.conv.view_mut(),
    )
    .expect("ssm_conv_silu");
    for t in 0..s.n {
        let row = s.conv.slice(t * CD..(t + 1) * CD);
        dev.copy(row.slice(0..QK), s.q.slice_mut(t * QK..(t + 1) * QK))
            .expect("q");
        dev.copy(row.slice(QK..2 * QK), s.k.slice_mut(t * QK..(t + 1) * QK))
            .expect("k");
        dev.copy(row.slice(2 * QK..CD), s.v.slice_mut(t * VL..(t + 1) * VL))
            .expect("v");
    }
    dev.l2_norm(s.q.view_mut(), SHAPE.head_dim, EPS)
        .expect("l2_norm q");
    dev.l2_norm(s.k.view_mut(), SHAPE.head_dim, EPS)
        .expect("l2_norm k");
    dev.gated_delta_net(
        &SHAPE,
        s.q.view(),
        s.k.view(),
        s.v.view(),
        s.alpha.view(),
        s.beta.view(),
        delta_state,
        s.o.view_mut(),
    )
    .expect("gated_delta_net");
}

fn params(dev: &dyn Device, l: &Layer) -> [Tensor; 3] {
    let put = |v: &[f32]| dev.upload_new(v).expect("upload");
    [put(&l.conv_w), put(&l.dt_bias), put(&l.a)]
}

/// The layer's ops over all `n` tokens in one call each, with the core references alone
/// (fresh states): outputs and the final state slot.
fn reference(l: &Layer, n: usize) -> (Vec<f32>, Vec<f32>) {
    let mut beta = l.beta.clone();
    math::sigmoid_ggml_in_place(&mut beta);
    let mut alpha = l.alpha.clone();
    math::delta_net_gates(&mut alpha, &l.dt_bias, &l.a);
    let mut slot = vec![0.0f32; SLOT_LEN];
    let (cs, ds) = slot.split_at_mut(CONV_LEN);
    let mut conv = vec![0.0; n * CD];
    math::ssm_conv(&l.qkv, &l.conv_w, D_CONV, cs, &mut conv);
    for c in &mut conv {
        *c = math::silu(*c);
    }
    let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
    for row in conv.chunks_exact(CD) {
        q.extend_from_slice(&row[..QK]);
        k.extend_from_slice(&row[QK..2 * QK]);
        v.extend_from_slice(&row[2 * QK..]);
    }
    math::l2_norm_heads(&mut q, SHAPE.head_dim, EPS);
    math::l2_norm_heads(&mut k, SHAPE.head_dim, EPS);
    let mut o = vec![0.0; n * VL];
    math::gated_delta_net(&SHAPE, &q, &k, &v, &alpha, &beta, ds, &mut o);
    (o, slot)
}

/// A prompt of 9 tokens, then a decode step of one, then 3 more tokens, the states
/// carried in slot 1 of a `tt` tensor of three slots: every call's outputs and the
/// carried states are the cpu device's bits, and those of the core references run once
/// over all 13 tokens; the ops move nothing over the bus; the other slots stay zero; and
/// the carried state matters (a call from a fresh state gives other values).
#[test]
fn conv_and_delta_rule_carry_their_state_in_a_tt_tensor() {
    const N: usize = 13;
    let l = layer(N, 7);
    let tt = open_sim(true);
    let cpu = cpu();
    eprintln!("cpu device at {:?}", cpu.level());
    let (tp, cp) = (params(&tt, &l), params(&cpu, &l));
    let mut states = tt.alloc(3 * SLOT_LEN).expect("states");
    let mut cpu_states = vec![0.0f32; 3 * SLOT_LEN];
    let slot = SLOT_LEN..2 * SLOT_LEN;
    let mut got = Vec::new();
    for rows in [0..9, 9..10, 10..13] {
        let what = format!("rows {rows:?}");
        let mut s = step(&tt, &l, rows.clone());
        // The split of q, k and v: three copies per row (`Device::copy`).
        on_device(&tt, &what, 3 * rows.len() as u64, || {
            run(&tt, &mut s, &tp, states.slice_mut(slot.clone()))
        });
        let o = down(&tt, &s.o);
        let mut c = step(&cpu, &l, rows.clone());
        run(
            &cpu,
            &mut c,
            &cp,
            ViewMut::Host(&mut cpu_states[slot.clone()]),
        );
        let co = down(&cpu, &c.o);
        assert_bits(&o, &co, &format!("{what}: output"));
        let st = down(&tt, &states);
        assert_bits(&st, &cpu_states, &format!("{what}: states"));
        // Each intermediate as well (the last call's).
        for (name, a, b) in [
            ("sigmoid", &s.beta, &c.beta),
            ("delta_net_gate", &s.alpha, &c.alpha),
            ("ssm_conv_silu", &s.conv, &c.conv),
            ("l2_norm q", &s.q, &c.q),
            ("l2_norm k", &s.k, &c.k),
        ] {
            assert_bits(&down(&tt, a), &down(&cpu, b), &format!("{what}: {name}"));
        }
        got.extend(o);
    }
    let (ro, rslot) = reference(&l, N);
    assert_bits(&got, &ro, "outputs against one call of the references");
    let st = down(&tt, &states);
    assert_bits(&st[slot.clone()], &rslot, "state against the references");
    assert!(
        st[..SLOT_LEN]
            .iter()
            .chain(&st[2 * SLOT_LEN..])
            .all(|&v| v == 0.0),
        "only slot 1 was written"
    );
    assert!(
        st[slot.clone()].iter().filter(|&&v| v != 0.0).count() > SLOT_LEN / 2,
        "the state was written"
    );

    // The last three tokens from a fresh state: other outputs, so the carried state was
    // read.
    let mut fresh = tt.alloc(SLOT_LEN).expect("fresh state");
    let mut s = step(&tt, &l, 10..13);
    run(&tt, &mut s, &tp, fresh.view_mut());
    let o = down(&tt, &s.o);
    let same = o
        .iter()
        .zip(&got[10 * VL..])
        .filter(|(a, b)| a.to_bits() == b.to_bits())
        .count();
    assert!(same < o.len() / 10, "{same} of {} outputs equal", o.len());
}

/// Where a case's tensors live on `tt`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Place {
    /// Device tensors of their own: views at offset 0.
    Start,
    /// Inside longer device tensors, at offsets (states are passed at their offset, other
    /// views through scratch copies on the device).
    Inside,
    /// Host memory.
    Host,
}

type OpFn = dyn Fn(&dyn Device, &[View<'_>], &mut [ViewMut<'_>]) -> Result<(), flint_hal::HalError>;

/// One op on some inputs and some in-place or output tensors (`(values, read)`: `read`
/// when the op reads their values, in-place operands and states).
struct Case {
    name: String,
    ins: Vec<Vec<f32>>,
    muts: Vec<(Vec<f32>, bool)>,
    op: Box<OpFn>,
}

const PAD: f32 = 7.5;

/// `v` at offset `off` of a device tensor with `PAD` around it.
fn inside(dev: &dyn Device, v: &[f32], off: usize) -> Tensor {
    let mut all = vec![PAD; off];
    all.extend_from_slice(v);
    all.extend([PAD; 3]);
    dev.upload_new(&all).expect("upload")
}

/// Runs `c` on the cpu device (host memory) and on `tt` at `place`; returns the `tt`
/// results, the cpu's, and what `tt` moved over the bus during the op.
#[allow(clippy::type_complexity)]
fn run_case(
    tt: &TtDevice,
    cpu: &CpuDevice,
    c: &Case,
    place: Place,
) -> (Vec<Vec<f32>>, Vec<Vec<f32>>, Transfers, (u64, u64, u64)) {
    let mut want: Vec<Vec<f32>> = c.muts.iter().map(|(v, _)| v.clone()).collect();
    {
        let ins: Vec<View<'_>> = c.ins.iter().map(|v| h(v)).collect();
        let mut muts: Vec<ViewMut<'_>> = want.iter_mut().map(|v| hm(v)).collect();
        (c.op)(cpu, &ins, &mut muts).expect("the cpu op");
    }
    let offs = |i: usize| 3 + 2 * i;
    let (got, d, b);
    match place {
        Place::Host => {
            let mut m: Vec<Vec<f32>> = c.muts.iter().map(|(v, _)| v.clone()).collect();
            let ins: Vec<View<'_>> = c.ins.iter().map(|v| h(v)).collect();
            let mut muts: Vec<ViewMut<'_>> = m.iter_mut().map(|v| hm(v)).collect();
            let (before, before_tt) = (tt.transfers(), tt.tt_counters().expect("counters"));
            (c.op)(tt, &ins, &mut muts).expect("the tt op");
            d = tt.transfers().since(&before);
            b = bus(&before_tt, &tt.tt_counters().expect("counters"));
            got = m;
        }
        Place::Start | Place::Inside => {
            let at = |i: usize| if place == Place::Start { 0 } else { offs(i) };
            let ins_t: Vec<Tensor> = c
                .ins
                .iter()
                .enumerate()
                .map(|(i, v)| inside(tt, v, at(i)))
                .collect();
            let mut muts_t: Vec<Tensor> = c
                .muts
                .iter()
                .enumerate()
                .map(|(i, (v, _))| inside(tt, v, at(i + 1)))
                .collect();
            {
                let ins: Vec<View<'_>> = ins_t
                    .iter()
                    .zip(&c.ins)
                    .enumerate()
                    .map(|(i, (t, v))| t.slice(at(i)..at(i) + v.len()))
                    .collect();
                let mut muts: Vec<ViewMut<'_>> = muts_t
                    .iter_mut()
                    .zip(&c.muts)
                    .enumerate()
                    .map(|(i, (t, (v, _)))| t.slice_mut(at(i + 1)..at(i + 1) + v.len()))
                    .collect();
                let (before, before_tt) = (tt.transfers(), tt.tt_counters().expect("counters"));
                (c.op)(tt, &ins, &mut muts).expect("the tt op");
                d = tt.transfers().since(&before);
                b = bus(&before_tt, &tt.tt_counters().expect("counters"));
            }
            let mut g = Vec::new();
            for (i, (t, (v, _))) in muts_t.iter().zip(&c.muts).enumerate() {
                let all = down(tt, t);
                let o = at(i + 1);
                assert!(
                    all[..o]
                        .iter()
                        .chain(&all[o + v.len()..])
                        .all(|&x| x == PAD),
                    "{} at {place:?}: written outside operand {i}",
                    c.name
                );
                g.push(all[o..o + v.len()].to_vec());
            }
            for (t, v) in ins_t.iter().zip(&c.ins) {
                let all = down(tt, t);
                assert!(
                    all.windows(v.len()).any(|w| w == &v[..]),
                    "{}: an input changed",
                    c.name
                );
            }
            got = g;
        }
    }
    (got, want, d, b)
}

/// Every case of every op: several shapes, with states that are not zero (a sequence
/// part-way through).
fn cases() -> Vec<Case> {
    let mut rng = Rng::new(99);
    let mut v: Vec<Case> = Vec::new();
    let mut r = |n: usize, s: f32| -> Vec<f32> { rng.vec(n).iter().map(|x| s * x).collect() };

    v.push(Case {
        name: "sigmoid".into(),
        ins: vec![],
        muts: vec![(r(300, 12.0), true)],
        op: Box::new(|d, _, m| d.sigmoid(m[0].reborrow())),
    });
    for (n, xl) in [(12 * 64, 12 * 64), (12 * 64, 12), (40, 1)] {
        v.push(Case {
            name: format!("mul {n} by {xl}"),
            ins: vec![r(xl, 2.0)],
            muts: vec![(r(n, 3.0), true)],
            op: Box::new(|d, i, m| d.mul(m[0].reborrow(), i[0])),
        });
    }
    for (chunk, parts, groups) in [(64usize, 2usize, 6usize), (5, 3, 4), (7, 1, 3)] {
        let per = chunk * groups;
        v.push(Case {
            name: format!("deinterleave {parts} parts of {chunk}"),
            ins: vec![r(per * parts, 1.0)],
            muts: (0..parts).map(|_| (vec![0.0; per], false)).collect(),
            op: Box::new(move |d, i, m| d.deinterleave(i[0], chunk, m)),
        });
    }
    for heads in [4usize, 3] {
        v.push(Case {
            name: format!("delta_net_gate of {heads} heads"),
            ins: vec![
                r(heads, 1.0),
                r(heads, 1.0).iter().map(|x| -0.1 - x.abs()).collect(),
            ],
            muts: vec![(r(7 * heads, 15.0).iter().map(|x| x + 5.0).collect(), true)],
            op: Box::new(|d, i, m| d.delta_net_gate(m[0].reborrow(), i[0], i[1])),
        });
    }
    for dim in [64usize, 20] {
        let mut x = r(6 * dim, 4.0);
        // A row of zeros: eps decides it.
        x[dim..2 * dim].fill(0.0);
        v.push(Case {
            name: format!("l2_norm of {dim}"),
            ins: vec![],
            muts: vec![(x, true)],
            op: Box::new(move |d, _, m| d.l2_norm(m[0].reborrow(), dim, 1e-6)),
        });
    }
    // The convolution: a decode step, a short prompt and one longer than the cpu
    // device's task size (8 rows); kernel widths 4 and 2.
    for (n, channels, d_conv) in [
        (1usize, 40usize, 4usize),
        (3, 40, 4),
        (12, 72, 4),
        (5, 9, 2),
    ] {
        v.push(Case {
            name: format!("ssm_conv_silu {n} rows of {channels}, kernel {d_conv}"),
            ins: vec![r(n * channels, 2.0), r(channels * d_conv, 1.0)],
            muts: vec![
                (r(channels * (d_conv - 1), 2.0), true),
                (vec![0.0; n * channels], false),
            ],
            op: Box::new(move |d, i, m| {
                let (s, o) = m.split_at_mut(1);
                d.ssm_conv_silu(i[0], i[1], d_conv, s[0].reborrow(), o[0].reborrow())
            }),
        });
    }
    // The delta rule: a prompt and a decode step; a head size with a tail past the
    // vector width and value heads tiling one key head.
    for (shape, n) in [
        (SHAPE, 5usize),
        (SHAPE, 1),
        (
            DeltaNetShape {
                heads_k: 1,
                heads_v: 3,
                head_dim: 20,
            },
            4,
        ),
    ] {
        let (ql, vl, hv) = (shape.qk_len(), shape.v_len(), shape.heads_v);
        let mut q = r(n * ql, 1.0);
        let mut k = r(n * ql, 1.0);
        math::l2_norm_heads(&mut q, shape.head_dim, EPS);
        math::l2_norm_heads(&mut k, shape.head_dim, EPS);
        v.push(Case {
            name: format!("gated_delta_net {shape:?} over {n} tokens"),
            ins: vec![
                q,
                k,
                r(n * vl, 1.0),
                r(n * hv, 1.0).iter().map(|x| -x.abs() - 0.01).collect(),
                r(n * hv, 1.0).iter().map(|x| 0.5 + 0.5 * x).collect(),
            ],
            muts: vec![
                (r(shape.state_len(), 0.3), true),
                (vec![0.0; n * vl], false),
            ],
            op: Box::new(move |d, i, m| {
                let (s, o) = m.split_at_mut(1);
                d.gated_delta_net(
                    &shape,
                    i[0],
                    i[1],
                    i[2],
                    i[3],
                    i[4],
                    s[0].reborrow(),
                    o[0].reborrow(),
                )
            }),
        });
    }
    v
}

/// Each op, each shape, its operands at the start of device tensors, inside longer ones
/// and in host memory: the cpu device's bits every time. On device tensors at offset 0
/// nothing crosses the bus and nothing is copied; inside longer tensors nothing crosses
/// either (scratch copies on the device, but a state is updated where it is); host
/// operands are one upload per input read and one download per output, on both counts.
#[test]
fn each_op_gives_the_cpu_devices_bits_and_moves_nothing_on_device_tensors() {
    let tt = open_sim(true);
    let cpu = cpu();
    let cases = cases();
    for c in &cases {
        for place in [Place::Start, Place::Inside, Place::Host] {
            let what = format!("{} at {place:?}", c.name);
            let (got, want, d, b) = run_case(&tt, &cpu, c, place);
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert_bits(g, w, &format!("{what}: operand {i}"));
                if c.muts[i].1 || g.len() > 1 {
                    assert!(
                        g.iter().zip(&c.muts[i].0).any(|(a, b)| a != b),
                        "{what}: operand {i} was not written"
                    );
                }
            }
            let reads = c.ins.len() + c.muts.iter().filter(|(_, r)| *r).count();
            match place {
                Place::Start => {
                    assert_eq!(d, Transfers::default(), "{what}: {d:?}");
                    assert_eq!(b, (0, 0, 0), "{what}: buffer writes, reads, copies");
                }
                Place::Inside => {
                    assert_eq!(d, Transfers::default(), "{what}: {d:?}");
                    assert_eq!((b.0, b.1), (0, 0), "{what}: buffer writes, reads");
                }
                Place::Host => {
                    let bytes = |v: &Vec<f32>| 4 * v.len() as u64;
                    let in_bytes: u64 = c.ins.iter().map(bytes).sum();
                    let read_bytes: u64 = c.muts.iter().filter(|m| m.1).map(|m| bytes(&m.0)).sum();
                    let out_bytes: u64 = c.muts.iter().map(|m| bytes(&m.0)).sum();
                    let want_d = Transfers {
                        uploads: reads as u64,
                        upload_bytes: in_bytes + read_bytes,
                        downloads: c.muts.len() as u64,
                        download_bytes: out_bytes,
                        arg_bytes: 0,
                    };
                    assert_eq!(d, want_d, "{what}");
                    assert_eq!((b.0, b.1), (reads as u64, c.muts.len() as u64), "{what}");
                }
            }
        }
    }
    // A state passed inside a longer tensor is read and written where it lies: the
    // convolution and the delta rule with every operand at offset 0 but the state.
    for c in cases
        .iter()
        .filter(|c| c.name.starts_with("ssm_conv") || c.name.starts_with("gated"))
    {
        let ins: Vec<Tensor> = c
            .ins
            .iter()
            .map(|v| tt.upload_new(v).expect("up"))
            .collect();
        let mut state = inside(&tt, &c.muts[0].0, 5);
        let mut out = tt.alloc(c.muts[1].0.len()).expect("out");
        let views: Vec<View<'_>> = ins.iter().map(Tensor::view).collect();
        let n = c.muts[0].0.len();
        on_device(&tt, &format!("{}: state at offset 5", c.name), 0, || {
            (c.op)(
                &tt,
                &views,
                &mut [state.slice_mut(5..5 + n), out.view_mut()],
            )
            .expect("the op")
        });
        let (_, want, _, _) = run_case(&tt, &cpu, c, Place::Host);
        assert_bits(&down(&tt, &state)[5..5 + n], &want[0], &c.name);
        assert_bits(&down(&tt, &out), &want[1], &c.name);
    }
}

#[test]
fn the_ops_are_supported_and_in_the_abi() {
    let dev = open_sim(true);
    for op in [
        Op::SsmConvSilu,
        Op::GatedDeltaNet,
        Op::Sigmoid,
        Op::Mul,
        Op::Deinterleave,
        Op::DeltaNetGate,
        Op::L2Norm,
    ] {
        assert!(dev.supports(op, None), "{op}");
        let sym = format!("flint_tt_{}", op.name());
        assert!(flint_hal_tt::SYMBOLS.contains(&sym.as_str()), "{sym}");
    }
    // gpt-oss's ops still have no entry.
    assert!(!dev.supports(Op::SwigluOaiMul, None));
    assert!(!dev.supports(Op::AddId, None));
}

/// A delta-rule shape that is not valid is `InvalidInput` (value heads not a multiple
/// of key heads, a zero size), and nothing is written.
#[test]
fn an_invalid_delta_rule_shape_is_invalid_input() {
    let dev = open_sim(true);
    for shape in [
        DeltaNetShape {
            heads_k: 2,
            heads_v: 3,
            head_dim: 4,
        },
        DeltaNetShape {
            heads_k: 0,
            heads_v: 2,
            head_dim: 4,
        },
        DeltaNetShape {
            heads_k: 1,
            heads_v: 2,
            head_dim: 0,
        },
    ] {
        let x = dev.upload_new(&[1.0; 16]).expect("x");
        let mut state = dev.upload_new(&[3.0; 32]).expect("state");
        let mut out = dev.upload_new(&[5.0; 8]).expect("out");
        let e = dev
            .gated_delta_net(
                &shape,
                x.view(),
                x.view(),
                x.slice(0..8),
                x.slice(0..2),
                x.slice(0..2),
                state.view_mut(),
                out.view_mut(),
            )
            .expect_err("an invalid shape");
        assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
        assert!(e.message.contains("gated_delta_net"), "{e}");
        assert!(down(&dev, &state).iter().all(|&v| v == 3.0));
        assert!(down(&dev, &out).iter().all(|&v| v == 5.0));
    }
}
