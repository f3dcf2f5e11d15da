//! The arithmetic of the simulated device. Everything numeric goes through the scalar
//! references of `flint-core` (dequantization, f32 dot product, kernel math); this module
//! only arranges them per row, per head and per expert.

use flint_core::GgmlType;

/// Decodes one row of `n` elements stored as `ty` (a kept block encoding or BF16) into
/// `out`. The error names the encoding.
pub fn dequant_row(ty: GgmlType, bytes: &[u8], out: &mut [f32]) -> Result<(), String> {
    flint_core::dequant::dequantize(ty, bytes, out)
        .map_err(|e| format!("cannot decode a {ty} row of {} values: {e}", out.len()))
}

/// The activation encoding a weight of `ty` is paired with, as ggml pairs them: Q8_K
/// for the K-quants and IQ types, Q8_0/Q8_1 for the legacy types, f32 for BF16.
pub fn act_type(ty: GgmlType) -> GgmlType {
    if ty.is_quantized() {
        ty.vec_dot_type()
    } else {
        GgmlType::F32
    }
}

/// Activation rows of `in_f` values encoded for weights of `ty` (core quantizers),
/// `rows * row_bytes(act_type(ty), in_f)` bytes.
pub fn encode_acts(ty: GgmlType, x: &[f32], in_f: usize) -> Result<Vec<u8>, String> {
    let at = act_type(ty);
    if at == GgmlType::F32 {
        return Ok(bytemuck::cast_slice(x).to_vec());
    }
    let rb = at
        .row_bytes(in_f)
        .ok_or_else(|| format!("{in_f} values are not whole {at} blocks"))?;
    let rows = x.len().checked_div(in_f).unwrap_or(0);
    let mut out = vec![0u8; rows * rb];
    for (xr, or) in x.chunks_exact(in_f).zip(out.chunks_exact_mut(rb)) {
        // The activation quantizers of ggml's x86 build, as the CPU backend uses them.
        flint_core::quant::quantize_act(at, xr, or)
            .map_err(|e| format!("quantizing activations to {at}: {e}"))?;
    }
    Ok(out)
}

/// Activation rows of `in_f` values rounded to the encoding ggml pairs with weights of
/// `source` ([`act_type`]) and decoded back to f32: what an expanded weight of a block
/// encoding meets, so that its matmul agrees with the block matmul up to the order of the
/// float sums.
pub fn round_acts(source: GgmlType, x: &[f32], in_f: usize) -> Result<Vec<f32>, String> {
    let at = act_type(source);
    if at == GgmlType::F32 || in_f == 0 {
        return Ok(x.to_vec());
    }
    let bytes = encode_acts(source, x, in_f)?;
    let rb = bytes.len().checked_div(x.len() / in_f).unwrap_or(0);
    let mut out = vec![0.0f32; x.len()];
    for (br, or) in bytes
        .chunks_exact(rb.max(1))
        .zip(out.chunks_exact_mut(in_f))
    {
        // Q8_K and Q8_1 are activation-only encodings that the core does not decode:
        // `d * q` per value (`d` an f32 per 256 values, or an f16 per 32).
        if at == GgmlType::Q8_K {
            let blocks = br
                .chunks_exact(std::mem::size_of::<flint_core::blocks::BlockQ8K>())
                .map(bytemuck::pod_read_unaligned::<flint_core::blocks::BlockQ8K>);
            for (b, o) in blocks.zip(or.chunks_exact_mut(at.block_size())) {
                for (v, &q) in o.iter_mut().zip(b.qs.iter()) {
                    *v = b.d * f32::from(q);
                }
            }
        } else if at == GgmlType::Q8_1 {
            let blocks = br
                .chunks_exact(std::mem::size_of::<flint_core::blocks::BlockQ8_1>())
                .map(bytemuck::pod_read_unaligned::<flint_core::blocks::BlockQ8_1>);
            for (b, o) in blocks.zip(or.chunks_exact_mut(at.block_size())) {
                let d = half::f16::from_bits(b.d).to_f32();
                for (v, &q) in o.iter_mut().zip(b.qs.iter()) {
                    *v = d * f32::from(q);
                }
            }
        } else {
            flint_core::dequant::dequantize(at, br, or)
                .map_err(|e| format!("decoding {at} activations: {e}"))?;
        }
    }
    Ok(out)
}

/// An F32 weight row that the host expanded from Q8_0 or Q5_0 blocks, against one row of
/// Q8_0 activation blocks, summed in tinyBLAS's order (the order the CPU backend and the
/// reference use for those blocks, `flint_core::dot::ggml_x86`): per 32-element block,
/// eight lanes of four products each, `lane = fma(d_w * d_a, lane_sum, lane)`, then the
/// eight lanes summed pairwise.
///
/// The block scale `d_w` is not known here, only the expanded values `d_w * q`, which
/// f32 holds exactly. The lane's term `(d_w * d_a) * lane_sum` is therefore formed as
/// `d_a * sum(w * q_a)` in f64, where every step is exact (at most 38 significant bits),
/// and added to the f32 lane with a single rounding, as the fused multiply-add does. The
/// result equals the block kernel's bit for bit; expansion changes where the weight lives
/// and how many bytes it takes, not the matmul.
pub fn dot_f32_tinyblas(w: &[u8], acts: &[flint_core::blocks::BlockQ8_0]) -> Result<f32, String> {
    const QK: usize = 32;
    if w.len() != acts.len() * QK * 4 {
        return Err(format!(
            "expanded row of {} bytes against {} Q8_0 activation blocks",
            w.len(),
            acts.len()
        ));
    }
    let mut lanes = [0.0f32; 8];
    for (wb, a) in w.chunks_exact(QK * 4).zip(acts) {
        let da = f64::from(half::f16::from_bits(a.d).to_f32());
        for (l, lane) in lanes.iter_mut().enumerate() {
            let mut p = 0.0f64;
            for e in 4 * l..4 * l + 4 {
                let wv =
                    f32::from_le_bytes([wb[4 * e], wb[4 * e + 1], wb[4 * e + 2], wb[4 * e + 3]]);
                p += f64::from(wv) * f64::from(a.qs[e]);
            }
            *lane = add_rounded_once(p * da, *lane);
        }
    }
    Ok(flint_core::dot::ggml_x86::hsum8(lanes))
}

/// `t + acc` rounded once to f32 (`t` exact in f64): the sum is formed in f64 with its
/// rounding error kept (Knuth's two-sum), and when the f64 sum lies exactly halfway
/// between two f32 values, the error decides the side, which a plain conversion of the
/// f64 sum would get wrong (double rounding). Values in the f32 subnormal range are
/// converted plainly.
pub fn add_rounded_once(t: f64, acc: f32) -> f32 {
    let c = f64::from(acc);
    let s = t + c;
    let bb = s - t;
    let err = (t - (s - bb)) + (c - bb);
    let r = s as f32;
    if err == 0.0 || !s.is_finite() {
        return r;
    }
    // Halfway between two f32 values: the 29 fraction bits f32 drops are 100...0.
    let bits = s.to_bits();
    const DROPPED: u64 = (1 << 29) - 1;
    if bits & DROPPED != 1 << 28 {
        return r;
    }
    // The exact sum lies strictly between `s` and its f64 neighbour on the error's side,
    // which is no longer a halfway point.
    let away_from_zero = (err > 0.0) == (s > 0.0);
    let nb = f64::from_bits(if away_from_zero { bits + 1 } else { bits - 1 });
    nb as f32
}

/// A BF16 weight row (little-endian bytes) against f32 activations: each product in f32,
/// the sum in f64, as `flint_core::vec_dot` computes BF16 rows, but with four partial
/// sums (the f64 sums differ from the core's single running sum only in their rounding
/// order, far below f32 precision). The hot loop of the BF16 arm.
pub fn dot_bf16(w: &[u8], x: &[f32]) -> f32 {
    let widen = |lo: u8, hi: u8| f32::from_bits(u32::from(u16::from_le_bytes([lo, hi])) << 16);
    let mut acc = [0.0f64; 4];
    let (wc, xc) = (w.chunks_exact(8), x.chunks_exact(4));
    let (wr, xr) = (wc.remainder(), xc.remainder());
    for (c, xs) in wc.zip(xc) {
        for k in 0..4 {
            acc[k] += f64::from(widen(c[2 * k], c[2 * k + 1]) * xs[k]);
        }
    }
    let mut s = (acc[0] + acc[1]) + (acc[2] + acc[3]);
    for (c, &xv) in wr.chunks_exact(2).zip(xr) {
        s += f64::from(widen(c[0], c[1]) * xv);
    }
    s as f32
}

/// An F32 weight row (little-endian bytes) against f32 activations in llama.cpp's F32
/// matmul orders on an AVX-512 build, as the reference forward and the CPU backend
/// compute F32 matrices: tinyBLAS's (sixteen FMA lanes, then `_mm512_reduce_add_ps`;
/// `flint_core::dot::ggml_x86::vec_dot_f32_tinyblas`) for a batch, `ggml_vec_dot_f32`'s
/// (`vec_dot_f32_ggml`, four accumulators of sixteen lanes) where tinyBLAS declines the
/// matmul whatever the batch (`vec_order`: an expert tower, a row count that is not a
/// multiple of 4). The hot loop of weights expanded to F32.
pub fn dot_f32(w: &[u8], x: &[f32], vec_order: bool) -> f32 {
    let wf: Vec<f32> = w
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let build = flint_core::math::GgmlCpuBuild::Avx512;
    if vec_order {
        flint_core::dot::ggml_x86::vec_dot_f32_ggml(build, &wf, x)
    } else {
        flint_core::dot::ggml_x86::vec_dot_f32_tinyblas(build, &wf, x)
    }
}

/// One weight row of `ty` against one encoded activation row of `n` values. Q4_K, Q6_K,
/// Q8_0, Q5_0 and MXFP4 sum in llama.cpp's prompt-batch float orders
/// (`flint_core::dot::ggml_x86`, docs/parity.md), as the reference forward and the CPU
/// backend do, so that the simulated device computes what the project's oracle
/// computes; every other type through the core `vec_dot` reference. A row of an expert
/// tower (`expert`) takes llama.cpp's `MUL_MAT_ID` order instead: Q4_K through the gemv
/// kernel (`BatchRow::expert`, docs/parity.md).
pub fn vec_dot(
    ty: GgmlType,
    w_row: &[u8],
    act_row: &[u8],
    n: usize,
    expert: bool,
) -> Result<f32, String> {
    use flint_core::blocks::{BlockMXFP4, BlockQ4K, BlockQ5_0, BlockQ6K, BlockQ8K, BlockQ8_0};
    use flint_core::dot::ggml_x86 as x86;
    fn blocks<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(std::mem::size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }
    let same = |a: usize, b: usize| -> Result<(), String> {
        if a == b {
            Ok(())
        } else {
            Err(format!(
                "{ty} dot product: {a} weight blocks against {b} activation blocks"
            ))
        }
    };
    match ty {
        GgmlType::Q4_K | GgmlType::Q6_K => {
            let a: Vec<BlockQ8K> = blocks(act_row);
            if ty == GgmlType::Q4_K {
                let w: Vec<BlockQ4K> = blocks(w_row);
                same(w.len(), a.len())?;
                let path = if expert {
                    x86::Q4kPath::Gemv
                } else {
                    x86::Q4kPath::Gemm
                };
                Ok(x86::vec_dot_q4_k_q8_k_repack(&w, &a, path))
            } else {
                let w: Vec<BlockQ6K> = blocks(w_row);
                same(w.len(), a.len())?;
                Ok(x86::vec_dot_q6_k_q8_k_tiled(&w, &a))
            }
        }
        GgmlType::Q8_0 | GgmlType::Q5_0 => {
            let a: Vec<BlockQ8_0> = blocks(act_row);
            if ty == GgmlType::Q8_0 {
                let w: Vec<BlockQ8_0> = blocks(w_row);
                same(w.len(), a.len())?;
                Ok(x86::vec_dot_q8_0_q8_0_tinyblas(&w, &a))
            } else {
                let w: Vec<BlockQ5_0> = blocks(w_row);
                same(w.len(), a.len())?;
                Ok(x86::vec_dot_q5_0_q8_0_tinyblas(&w, &a))
            }
        }
        GgmlType::MXFP4 => {
            let a: Vec<BlockQ8_0> = blocks(act_row);
            let w: Vec<BlockMXFP4> = blocks(w_row);
            same(w.len(), a.len())?;
            Ok(x86::vec_dot_mxfp4_q8_0_repack(&w, &a))
        }
        _ => {
            flint_core::vec_dot(ty, w_row, act_row, n).map_err(|e| format!("{ty} dot product: {e}"))
        }
    }
}

/// RMSNorm of each row of `dim` (core reference).
pub fn rms_norm(x: &[f32], weight: Option<&[f32]>, eps: f32, dim: usize, out: &mut [f32]) {
    for (xr, or) in x.chunks_exact(dim).zip(out.chunks_exact_mut(dim)) {
        flint_core::math::rms_norm(xr, weight, eps, or);
    }
}

/// RoPE in place for each head of each row (core reference).
pub fn rope(
    x: &mut [f32],
    positions: &[u32],
    n_heads: usize,
    head_dim: usize,
    cfg: &flint_core::math::RopeConfig<'_>,
) {
    let row = n_heads * head_dim;
    for (xr, &p) in x.chunks_exact_mut(row).zip(positions) {
        flint_core::math::rope_heads(xr, head_dim, p, cfg);
    }
}

/// `x[r * bias.len() + j] += bias[j]` for every row `r`.
pub fn add_bias(x: &mut [f32], bias: &[f32]) {
    for row in x.chunks_exact_mut(bias.len()) {
        row.iter_mut().zip(bias).for_each(|(v, b)| *v += b);
    }
}

/// `silu(x)` (core reference).
pub fn silu(x: f32) -> f32 {
    flint_core::math::silu(x)
}

/// GELU (tanh form) on fp16 operands: the input and the result rounded to fp16 (the
/// device's Float16 format), computed by the core routine the CPU backend and the
/// reference forward use (`gelu_tanh_ggml_f16`).
pub fn gelu(x: f32) -> f32 {
    flint_core::math::gelu_tanh_ggml_f16(x)
}

/// Gated DeltaNet's short causal convolution of one sequence with the window carried in
/// `state`, then SiLU on every output: `flint_core::math::ssm_conv`, then
/// `flint_core::math::silu` (the references the CPU backend matches bit for bit).
pub fn ssm_conv_silu(x: &[f32], weight: &[f32], d_conv: usize, state: &mut [f32], out: &mut [f32]) {
    flint_core::math::ssm_conv(x, weight, d_conv, state, out);
    for o in out.iter_mut() {
        *o = silu(*o);
    }
}

/// The gated delta rule of one sequence, token by token (the recurrent form,
/// `flint_core::math::gated_delta_net`): what the CPU backend computes for prompts and
/// decode steps alike (its AVX2 head loop has the reference's bits). The chunked form
/// (`gated_delta_net_chunked`) agrees only within rounding, so it is not used.
#[allow(clippy::too_many_arguments)]
pub fn gated_delta_net(
    shape: &flint_core::math::DeltaNetShape,
    q: &[f32],
    k: &[f32],
    v: &[f32],
    g: &[f32],
    beta: &[f32],
    state: &mut [f32],
    out: &mut [f32],
) {
    flint_core::math::gated_delta_net(shape, q, k, v, g, beta, state, out);
}

/// Top-k routing of one row of logits into `ids`/`weights` (`k` entries each), the
/// core reference.
pub fn route_topk_row(
    logits: &[f32],
    bias: Option<&[f32]>,
    k: usize,
    gating: flint_core::math::Gating,
    normalize: bool,
    scale: f32,
    ids: &mut [u32],
    weights: &mut [f32],
) -> Result<(), String> {
    flint_core::math::route_topk(logits, bias, k, gating, normalize, scale, ids, weights)
        .map_err(|e| e.to_string())
}

/// Attention of one query head `q` over the keys and values of positions
/// `first .. first + keys.len()`, with an optional sink logit, into `out`: a softmax
/// computed online over tiles of 64 keys (the way a Tenstorrent SDPA kernel walks the
/// KV cache in chunks), with the core's tiled routine, whose order of operations is the
/// one the CPU backend and the reference forward use as well.
pub fn attend_head(
    q: &[f32],
    keys: &[&[f32]],
    values: &[&[f32]],
    first: usize,
    scale: f32,
    sink: Option<f32>,
    out: &mut [f32],
) {
    flint_core::math::attend_ggml_tiled(
        flint_core::math::GgmlCpuBuild::Avx512,
        q,
        keys,
        values,
        first,
        scale,
        sink,
        out,
    );
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_core::blocks::{BlockQ5_0, BlockQ8_0};
    use flint_core::dot::ggml_x86;

    /// A small deterministic generator (xorshift64*), values in [-1, 1) times a scale
    /// that varies per block so that block scales differ widely.
    fn values(seed: u64, n: usize) -> Vec<f32> {
        let mut s = seed.max(1);
        (0..n)
            .map(|i| {
                s ^= s << 13;
                s ^= s >> 7;
                s ^= s << 17;
                let u = (s >> 40) as f32 / (1u64 << 24) as f32;
                let scale = [0.01f32, 1.0, 37.0, 0.2][(i / 32) % 4];
                (2.0 * u - 1.0) * scale
            })
            .collect()
    }

    fn blocks<T: bytemuck::Pod>(b: &[u8]) -> Vec<T> {
        b.chunks_exact(std::mem::size_of::<T>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    }

    /// Weights expanded to F32 from Q8_0 and Q5_0 blocks give, through
    /// `dot_f32_tinyblas`, exactly the bits of the block kernel's order.
    #[test]
    fn expanded_rows_match_the_block_order_bit_for_bit() {
        let n = 640;
        for seed in 1..40u64 {
            let x = values(seed * 7919, n);
            let acts = encode_acts(GgmlType::Q8_0, &x, n).expect("acts");
            let a: Vec<BlockQ8_0> = blocks(&acts);
            for ty in [GgmlType::Q8_0, GgmlType::Q5_0] {
                let w = values(seed * 104729 + 3, n);
                let mut wb = vec![0u8; ty.row_bytes(n).expect("row bytes")];
                flint_core::quant::quantize(ty, &w, &mut wb).expect("quantize");
                let mut expanded = vec![0.0f32; n];
                flint_core::dequant::dequantize(ty, &wb, &mut expanded).expect("dequantize");
                let want = if ty == GgmlType::Q8_0 {
                    ggml_x86::vec_dot_q8_0_q8_0_tinyblas(&blocks::<BlockQ8_0>(&wb), &a)
                } else {
                    ggml_x86::vec_dot_q5_0_q8_0_tinyblas(&blocks::<BlockQ5_0>(&wb), &a)
                };
                let got = dot_f32_tinyblas(bytemuck::cast_slice(&expanded), &a).expect("dot");
                assert_eq!(
                    got.to_bits(),
                    want.to_bits(),
                    "{ty} seed {seed}: expanded {got} vs blocks {want}"
                );
            }
        }
    }

    /// A length that is not whole activation blocks is an error, not a panic.
    #[test]
    fn expanded_row_length_is_checked() {
        let a = vec![BlockQ8_0 { d: 0, qs: [0; 32] }; 2];
        assert!(dot_f32_tinyblas(&[0u8; 4 * 32], &a).is_err());
    }

    /// `add_rounded_once` is a fused multiply-add when the product is exact, including
    /// the case where the f64 sum lands exactly halfway between two f32 values and a
    /// plain conversion rounds the wrong way.
    #[test]
    fn add_rounded_once_rounds_like_a_fused_multiply_add() {
        // c = 1 + 2^-23 (odd last bit), d * s = 2^-24 (1 - 2^-46): the exact sum is just
        // below the midpoint c + 2^-24, the f64 sum is the midpoint itself, and
        // ties-to-even would round it up.
        let c = 1.0f32 + f32::EPSILON;
        let d = (8388608.0f32 + 1.0) * 2f32.powi(-35);
        let s = (8388608.0f32 - 1.0) * 2f32.powi(-35);
        for sign in [1.0f32, -1.0] {
            let (c, d) = (sign * c, sign * d);
            let t = f64::from(d) * f64::from(s);
            let want = d.mul_add(s, c);
            assert_eq!(want, c, "the fused result stays at c");
            assert_ne!((t + f64::from(c)) as f32, want, "the case double-rounds");
            assert_eq!(add_rounded_once(t, c).to_bits(), want.to_bits());
        }
        // Random products of a block scale and an integer lane sum.
        let v = values(99, 4096);
        for w in v.chunks_exact(3) {
            let (d, s, c) = (w[0], (w[1] * 64516.0).round(), w[2] * 1000.0);
            let t = f64::from(d) * f64::from(s);
            assert_eq!(add_rounded_once(t, c).to_bits(), d.mul_add(s, c).to_bits());
        }
    }
}
