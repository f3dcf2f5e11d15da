//! The prompt-batch gemm of Q5_0, Q4_0 and Q8_0 on AVX2 (no `vpdpbusd`): each weight
//! decoded once per matmul into panels of eight rows side by side ([`Panel8Block`]),
//! multiplied in tinyBLAS's order (`tinyblas.rs`) eight outputs per instruction. The
//! AVX2 counterpart of `panel.rs`.
//!
//! Per block, activation row and tinyBLAS lane `j` (quants `4j..4j + 4`), one register
//! holds lane `j` of the eight rows: the four activation quants broadcast, `vpmaddubsw`
//! and `vpmaddwd` give the eight rows' exact lane sums at once ([`Avx2Q0::lane_sums`],
//! the same steps as the row kernels), then one conversion and one FMA with the eight
//! rows' scale products. The row kernels spend the scale product, the sign step and the
//! block's decoding per weight row and activation row; here the decoding is done once
//! per matmul and the scale product once per eight lanes.

use std::arch::x86_64::*;

use crate::kernels::panel::{for_each_panel_of, OutCols};
use crate::kernels::q0::avx2::Avx2Q0;
use crate::kernels::q0::vnni::Q8_0Side;
use crate::kernels::x86::avx2::transpose8;

/// Weight rows per panel: one per f32 lane of a 256-bit register.
pub(crate) const PANEL8_ROWS: usize = 8;

/// One 32-quant block of eight weight rows (a panel), decoded once for every activation
/// row of a batch: `u[j]` and `s[j]` hold quants `4j..4j + 4` of the eight rows (row `r`
/// in bytes `4r..4r + 4`) as [`Avx2Q0::quants`] gives them (the first and the second
/// register: for Q8_0 the magnitudes and the signed quants, for the others the quants
/// plus their offset, `s` then unused); `d` holds the rows' scales widened. Rows past
/// the end of the weight are zero.
#[derive(Clone, Copy)]
#[repr(C, align(32))]
pub(crate) struct Panel8Block {
    u: [[u8; 32]; 8],
    s: [[u8; 32]; 8],
    d: [f32; 8],
}

const _: () = assert!(std::mem::size_of::<Panel8Block>() == 544);

impl Panel8Block {
    /// A zeroed block (scratch space).
    pub(crate) const ZERO: Self = Self {
        u: [[0; 32]; 8],
        s: [[0; 32]; 8],
        d: [0.0; 8],
    };
}

/// Decodes the weight rows `rows` (at most [`PANEL8_ROWS`], each `out.len()` blocks)
/// into panel blocks.
#[target_feature(enable = "avx2,fma,f16c")]
fn decode_panel<B: Avx2Q0>(rows: &[&[B]], out: &mut [Panel8Block]) {
    assert!(rows.len() <= PANEL8_ROWS, "decode_panel: rows");
    let zero = _mm256_setzero_si256();
    for (i, o) in out.iter_mut().enumerate() {
        let mut u = [zero; PANEL8_ROWS];
        let mut s = [zero; PANEL8_ROWS];
        let mut h = [0i16; PANEL8_ROWS];
        for (r, row) in rows.iter().enumerate() {
            // SAFETY: this function's features include what `quants` needs.
            (u[r], s[r]) = unsafe { row[i].quants() };
            h[r] = row[i].scale_bits() as i16;
        }
        for (dst, v) in o.u.iter_mut().zip(transpose8(u)) {
            // SAFETY: 32 writable bytes, 32-byte aligned.
            unsafe { _mm256_store_si256(dst.as_mut_ptr() as *mut __m256i, v) };
        }
        if B::SIGNS {
            for (dst, v) in o.s.iter_mut().zip(transpose8(s)) {
                // SAFETY: as above.
                unsafe { _mm256_store_si256(dst.as_mut_ptr() as *mut __m256i, v) };
            }
        }
        // The scales built in a register (a store of eight halves read back as one
        // vector would stall on store forwarding).
        let hv = _mm_setr_epi16(h[0], h[1], h[2], h[3], h[4], h[5], h[6], h[7]);
        // SAFETY: 32 writable bytes, 32-byte aligned.
        unsafe { _mm256_store_ps(o.d.as_mut_ptr(), _mm256_cvtph_ps(hv)) };
    }
}

/// Decodes the `n` weight rows of `w` (each `nb` blocks) into panels: panel `p` (rows
/// `8p..8p + 8`) at `dec[(p - p0) * nb..]`, for the panels `p0..p0 + dec.len() / nb`.
pub(crate) fn q0_decode8<B: Avx2Q0>(
    w: &[B],
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [Panel8Block],
) {
    // SAFETY: the AVX2 level (AVX2, FMA, F16C) was checked against the CPU at device
    // open.
    for_each_panel_of::<PANEL8_ROWS, _, _>(w, nb, n, p0, dec, |rows, d| unsafe {
        decode_panel(rows, d)
    });
}

/// The eight rows of a panel (`panel`: its blocks) against one activation row `y`, in
/// tinyBLAS's order: per output eight f32 lanes, per block `lane j = fma(d_w * d_a, sum
/// of quants 4j..4j + 4, lane j)`, the lanes added as `hsum_ps` adds them (bit for bit
/// `avx2::dot_q5_0` / `dot_q8_0` / `dot_q4_0` and `tinyblas::dot_q0`). `y`'s side data
/// must be its lane sums times -16.
#[inline]
#[target_feature(enable = "avx2,fma,f16c")]
fn panel8_tile<B: Avx2Q0>(panel: &[Panel8Block], y: Q8_0Side<'_>) -> [f32; PANEL8_ROWS] {
    let nb = panel.len();
    let (q, sc, l) = (&y.0[..nb], &y.1[..nb], &y.2[..nb]);
    let mut acc = [_mm256_setzero_ps(); 8];
    for (i, b) in panel.iter().enumerate() {
        // SAFETY: 32 readable f32 bytes, 32-byte aligned.
        let dw = unsafe { _mm256_load_ps(b.d.as_ptr()) };
        let dd = _mm256_mul_ps(dw, _mm256_set1_ps(sc[i]));
        let qs = q[i].qs.as_ptr() as *const i32;
        for (j, a) in acc.iter_mut().enumerate() {
            // SAFETY: `qs` points at 32 readable quant bytes and `j < 8` (read_unaligned
            // needs no alignment); `u[j]` / `s[j]` are 32 readable bytes, 32-byte
            // aligned; this function's features include what `lane_sums` needs.
            unsafe {
                let yv = _mm256_set1_epi32(qs.add(j).read_unaligned());
                let w = _mm256_load_si256(b.u[j].as_ptr() as *const __m256i);
                let sg = if B::SIGNS {
                    _mm256_load_si256(b.s[j].as_ptr() as *const __m256i)
                } else {
                    w
                };
                let sum = B::lane_sums((w, sg), yv, _mm256_set1_epi32(l[i][j]));
                *a = _mm256_fmadd_ps(dd, _mm256_cvtepi32_ps(sum), *a);
            }
        }
    }
    // hsum_ps: ((l0 + l4) + (l2 + l6)) + ((l1 + l5) + (l3 + l7)).
    let r = _mm256_add_ps(
        _mm256_add_ps(_mm256_add_ps(acc[0], acc[4]), _mm256_add_ps(acc[2], acc[6])),
        _mm256_add_ps(_mm256_add_ps(acc[1], acc[5]), _mm256_add_ps(acc[3], acc[7])),
    );
    let mut o = [0f32; PANEL8_ROWS];
    // SAFETY: 8 writable f32; storeu is unaligned.
    unsafe { _mm256_storeu_ps(o.as_mut_ptr(), r) };
    o
}

/// `out[t * cols.stride + cols.c0 + r] = dot(weight row r, activation row t)` for the
/// `n` weight rows decoded in `dec` (panels of `nb` blocks, [`q0_decode8`]) and the
/// activation rows `sides` (each row's Q8_0 blocks, scales and lane sums times -16;
/// `out.len() / cols.stride` of them), in tinyBLAS's order (the results of the row
/// kernels, bit for bit): per panel (which stays in L1) every activation row in turn.
pub(crate) fn q0_gemm8<B: Avx2Q0>(
    dec: &[Panel8Block],
    nb: usize,
    n: usize,
    sides: &[Q8_0Side<'_>],
    out: &mut [f32],
    cols: OutCols,
) {
    if n == 0 || nb == 0 {
        return;
    }
    assert!(cols.c0 + n <= cols.stride, "q0_gemm8: output columns");
    let m = out.len() / cols.stride;
    assert!(sides.len() >= m, "q0_gemm8: activation rows");
    let panels = n.div_ceil(PANEL8_ROWS);
    assert!(dec.len() >= panels * nb, "q0_gemm8: decoded rows");
    for p in 0..panels {
        let blocks = &dec[p * nb..(p + 1) * nb];
        let r0 = p * PANEL8_ROWS;
        let live = PANEL8_ROWS.min(n - r0);
        for (t, &y) in sides.iter().enumerate().take(m) {
            // SAFETY: the AVX2 level was checked against the CPU at device open.
            let v = unsafe { panel8_tile::<B>(blocks, y) };
            let at = t * cols.stride + cols.c0 + r0;
            out[at..at + live].copy_from_slice(&v[..live]);
        }
    }
}
