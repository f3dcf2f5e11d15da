//! What the reference device refuses with a typed error instead of a panic or a wrong
//! read: the inputs a caller cannot check for itself.

use flint_hal::{
    AttnSeq, Device, DeviceOptions, GgmlType, HalErrorKind, KvLayout, Op, PagedAttention,
    WeightDesc, WeightKind, WeightSource, NO_BLOCK,
};
use flint_hal_ref::RefDevice;

fn dev() -> RefDevice {
    RefDevice::new(&DeviceOptions::default())
}

/// An F32 weight of `dims` with values `0, 1, 2, ...`.
fn f32_weight(dims: &[usize], kind: WeightKind) -> WeightDesc {
    let n: usize = dims.iter().product();
    let bytes: Vec<u8> = (0..n).flat_map(|i| (i as f32).to_le_bytes()).collect();
    WeightDesc {
        name: "w".into(),
        ty: GgmlType::F32,
        dims: dims.to_vec(),
        kind,
        data: WeightSource::from_vec(bytes),
    }
}

const LAYOUT: KvLayout = KvLayout {
    num_blocks: 4,
    block_size: 2,
    n_kv_heads: 1,
    head_dim_k: 2,
    head_dim_v: 2,
};

#[test]
fn every_op_is_claimed_and_weights_by_what_core_computes() {
    let d = dev();
    for op in Op::ALL.into_iter().filter(|op| !op.takes_weight()) {
        assert!(d.supports(op, None), "{op}");
    }
    for ty in GgmlType::DEQUANTIZABLE {
        assert!(d.supports(Op::Matmul, Some(ty)), "matmul {ty}");
        assert!(d.supports(Op::GetRows, Some(ty)), "get_rows {ty}");
    }
    assert!(!d.supports(Op::Matmul, None));
}

#[test]
fn bytes_that_do_not_fit_the_shape_are_invalid_input() {
    let mut w = f32_weight(&[4, 3], WeightKind::Matrix);
    w.dims = vec![4, 4];
    let e = dev().stage(&w).unwrap_err();
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
}

#[test]
fn row_and_expert_ids_beyond_the_weight_are_invalid_input() {
    let d = dev();
    let table = d
        .stage(&f32_weight(&[4, 3], WeightKind::Embedding))
        .unwrap();
    let mut out = vec![0.0; 8];
    d.get_rows(table.as_ref(), (&[2, 1]).into(), (&mut out).into())
        .unwrap();
    assert_eq!(out, [8.0, 9.0, 10.0, 11.0, 4.0, 5.0, 6.0, 7.0]);
    let e = d
        .get_rows(table.as_ref(), (&[3, 0]).into(), (&mut out).into())
        .unwrap_err();
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");

    let tower = d
        .stage(&f32_weight(&[4, 3, 2], WeightKind::ExpertTower))
        .unwrap();
    let x = [1.0, 0.0, 0.0, 0.0];
    let mut out = vec![0.0; 3];
    d.expert_matmul(
        tower.as_ref(),
        (&x[..]).into(),
        (&[1]).into(),
        (&mut out).into(),
    )
    .unwrap();
    // Expert 1's rows start at element 12: the first column of each is 12, 16, 20.
    assert_eq!(out, [12.0, 16.0, 20.0]);
    let e = d
        .expert_matmul(
            tower.as_ref(),
            (&x[..]).into(),
            (&[2]).into(),
            (&mut out).into(),
        )
        .unwrap_err();
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
}

#[test]
fn kv_slots_and_blocks_outside_the_cache_are_invalid_input() {
    let d = dev();
    let mut kv = d.alloc_kv(&LAYOUT).unwrap();
    let (k, v) = ([1.0; 2], [2.0; 2]);
    let e = d
        .write_kv(kv.as_mut(), (&k[..]).into(), (&v[..]).into(), (&[8]).into())
        .unwrap_err();
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
    // Positions 0..=3 in blocks 3 and 1.
    for (pos, slot) in [(0u32, 6u32), (1, 7), (2, 2), (3, 3)] {
        let val = [pos as f32; 2];
        d.write_kv(
            kv.as_mut(),
            (&val[..]).into(),
            (&val[..]).into(),
            (&[slot]).into(),
        )
        .unwrap();
    }
    let q = [0.0; 2];
    let mut out = [0.0; 2];
    let attend = |table: &[u32], pos: u32, window, out: &mut [f32]| {
        let positions = [pos];
        let seqs = [AttnSeq {
            q_start: 0,
            positions: (&positions).into(),
            block_table: table.into(),
        }];
        let p = PagedAttention {
            q: (&q[..]).into(),
            seqs: &seqs,
            n_heads: 1,
            scale: 1.0,
            sinks: None,
            window,
        };
        d.paged_attention(kv.as_ref(), &p, out.into())
    };
    // q = 0: equal scores, the mean of the visible values.
    attend(&[3, 1], 3, None, &mut out).unwrap();
    assert_eq!(out, [1.5; 2]);
    // A freed block outside the window is never read; inside it, it is an error.
    attend(&[NO_BLOCK, 1], 3, Some(2), &mut out).unwrap();
    assert_eq!(out, [2.5; 2]);
    let e = attend(&[NO_BLOCK, 1], 3, Some(3), &mut out).unwrap_err();
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
    let e = attend(&[3, 9], 3, None, &mut out).unwrap_err();
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
    let e = attend(&[3], 3, None, &mut out).unwrap_err();
    assert_eq!(e.kind, HalErrorKind::InvalidInput, "{e}");
}

#[test]
fn a_cache_too_large_is_out_of_memory() {
    let layout = KvLayout {
        num_blocks: 1 << 40,
        block_size: 1 << 20,
        ..LAYOUT
    };
    let e = dev().alloc_kv(&layout).unwrap_err();
    assert_eq!(e.kind, HalErrorKind::OutOfMemory, "{e}");
}
