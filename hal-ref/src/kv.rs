//! The KV cache of the reference device ([`RefKv`]: f32 in host memory), its writes
//! through a slot mapping, and paged attention through per-sequence block tables.

use std::any::Any;

use flint_core::math;
use flint_hal::{HalError, KvBuffer, KvLayout, PagedAttention, View, NO_BLOCK};

/// One layer's KV cache: `num_blocks * block_size` slots, each one row of keys
/// (`n_kv_heads * head_dim_k` f32) and one row of values (`n_kv_heads * head_dim_v`).
/// Slot `s` is block `s / block_size`, offset `s % block_size`.
#[derive(Debug)]
pub struct RefKv {
    layout: KvLayout,
    /// `[num_slots, n_kv_heads * head_dim_k]`.
    k: Vec<f32>,
    /// `[num_slots, n_kv_heads * head_dim_v]`.
    v: Vec<f32>,
}

/// `n` zeros, or `OutOfMemory` instead of an abort when the host has not got them.
fn zeros(n: usize, layout: &KvLayout) -> Result<Vec<f32>, HalError> {
    let mut v = Vec::new();
    v.try_reserve_exact(n).map_err(|e| {
        HalError::out_of_memory(format!("ref: KV cache of {n} values ({layout:?}): {e}"))
    })?;
    v.resize(n, 0.0);
    Ok(v)
}

impl RefKv {
    /// A zeroed cache of `layout`.
    pub(crate) fn new(layout: &KvLayout) -> Result<Self, HalError> {
        let slots = layout.num_slots();
        let nk = slots.checked_mul(layout.n_kv_heads * layout.head_dim_k);
        let nv = slots.checked_mul(layout.n_kv_heads * layout.head_dim_v);
        let (Some(nk), Some(nv)) = (nk, nv) else {
            return Err(HalError::out_of_memory(format!(
                "ref: KV layout {layout:?} overflows"
            )));
        };
        Ok(Self {
            layout: *layout,
            k: zeros(nk, layout)?,
            v: zeros(nv, layout)?,
        })
    }

    fn key_row(&self) -> usize {
        self.layout.n_kv_heads * self.layout.head_dim_k
    }

    fn value_row(&self) -> usize {
        self.layout.n_kv_heads * self.layout.head_dim_v
    }
}

impl KvBuffer for RefKv {
    fn layout(&self) -> &KvLayout {
        &self.layout
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// `Device::write_kv`: token `i`'s key row `k[i]` and value row `v[i]` are copied into
/// slot `slots[i]`. A slot outside the cache is `InvalidInput` (nothing of that token
/// is written).
pub(crate) fn write_kv(
    kv: &mut RefKv,
    k: &[f32],
    v: &[f32],
    slots: &[u32],
) -> Result<(), HalError> {
    let (rk, rv) = (kv.key_row(), kv.value_row());
    assert_eq!(k.len(), slots.len() * rk, "write_kv: k length");
    assert_eq!(v.len(), slots.len() * rv, "write_kv: v length");
    let num_slots = kv.layout.num_slots();
    for (i, &s) in slots.iter().enumerate() {
        let s = s as usize;
        if s >= num_slots {
            return Err(HalError::invalid(format!(
                "ref: write_kv: slot {s} outside a cache of {num_slots} slots"
            )));
        }
        kv.k[s * rk..(s + 1) * rk].copy_from_slice(&k[i * rk..(i + 1) * rk]);
        kv.v[s * rv..(s + 1) * rv].copy_from_slice(&v[i * rv..(i + 1) * rv]);
    }
    Ok(())
}

/// `Device::paged_attention`: for each query row of each sequence, attention over the
/// keys and values it sees, found through the sequence's block table.
///
/// A query at position `p` sees positions `j` from `math::window_start(p, window)` to
/// `p`; position `j` lives in slot `block_table[j / block_size] * block_size +
/// j % block_size`. Those rows are gathered into contiguous keys and values (positions
/// renumbered from 0) and handed to `flint_core::math::attention_ref`, the conformance
/// oracle: scores `scale * q_h . k_j` (query head `h` reads KV head
/// `h / (n_heads / n_kv_heads)`), the softmax with the sink term `exp(sink_h - m)` in its
/// denominator, the weighted sum of the values. Since only visible rows are gathered,
/// the query is placed at the last of them and no window is passed on.
///
/// Rows of `q` that belong to no sequence get zeros. A query position beyond its block
/// table, or a visible position in a freed (`NO_BLOCK`) or nonexistent block, is
/// `InvalidInput`; lengths that do not fit the shapes panic (caller bugs, as the HAL
/// documents).
pub(crate) fn paged_attention(
    kv: &RefKv,
    p: &PagedAttention<'_>,
    out: &mut [f32],
) -> Result<(), HalError> {
    let l = kv.layout;
    let (dk, dv, hkv, bs) = (l.head_dim_k, l.head_dim_v, l.n_kv_heads, l.block_size);
    let nh = p.n_heads;
    assert!(
        hkv > 0 && nh.is_multiple_of(hkv),
        "paged_attention: {nh} heads over {hkv} KV heads"
    );
    let q = p.q.host();
    let (q_row, o_row) = (nh * dk, nh * dv);
    assert_eq!(q.len() % q_row.max(1), 0, "paged_attention: q length");
    let n_rows = q.len() / q_row.max(1);
    assert_eq!(out.len(), n_rows * o_row, "paged_attention: out length");
    if let Some(s) = p.sinks {
        assert_eq!(s.len(), nh, "paged_attention: sinks length");
    }
    let params = math::AttentionParams {
        n_head: nh,
        n_head_kv: hkv,
        dk,
        dv,
        scale: p.scale,
        sinks: p.sinks.map(View::host),
        window: None,
    };
    let (rk, rv) = (kv.key_row(), kv.value_row());
    let mut owned = vec![false; n_rows];
    let (mut keys, mut values) = (Vec::new(), Vec::new());
    for (si, seq) in p.seqs.iter().enumerate() {
        for (t, &pos) in seq.positions.host().iter().enumerate() {
            let r = seq.q_start + t;
            assert!(
                r < n_rows,
                "paged_attention: sequence {si} row {r} beyond q"
            );
            assert!(!owned[r], "paged_attention: row {r} in two sequences");
            owned[r] = true;
            let pos = pos as usize;
            if pos / bs >= seq.block_table.host().len() {
                return Err(HalError::invalid(format!(
                    "ref: paged_attention: sequence {si} position {pos} beyond its block table of {}",
                    seq.block_table.len()
                )));
            }
            // Gather the visible positions lo..=pos.
            let lo = math::window_start(pos, p.window);
            keys.clear();
            values.clear();
            for j in lo..=pos {
                let b = seq.block_table.host()[j / bs];
                if b == NO_BLOCK || b as usize >= l.num_blocks {
                    return Err(HalError::invalid(format!(
                        "ref: paged_attention: sequence {si} position {j} maps to a freed \
                         (NO_BLOCK) or nonexistent block {b}"
                    )));
                }
                let slot = b as usize * bs + j % bs;
                keys.extend_from_slice(&kv.k[slot * rk..(slot + 1) * rk]);
                values.extend_from_slice(&kv.v[slot * rv..(slot + 1) * rv]);
            }
            // The query is the last gathered position (with a window of 0 nothing is
            // gathered and it sees nothing).
            let last = (pos + 1 - lo).saturating_sub(1) as u32;
            math::attention_ref(
                &params,
                &q[r * q_row..(r + 1) * q_row],
                &[last],
                &keys,
                &values,
                &mut out[r * o_row..(r + 1) * o_row],
            );
        }
    }
    for (r, o) in out.chunks_exact_mut(o_row.max(1)).enumerate() {
        if !owned[r] {
            o.fill(0.0);
        }
    }
    Ok(())
}
