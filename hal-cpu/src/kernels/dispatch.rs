//! The run-time dispatch: for a weight type, a SIMD level and a number of activation
//! rows, which kernel of which format folder runs ([`dot_rows`]: a tile of up to four
//! rows; [`matvec_rows`]: a decode; [`rows_small_batch`]: 2-15 rows; [`gemm`]: a prompt
//! batch; [`x16_rows`]: any rows of a weight repacked at staging; [`amx_matmul`]: any
//! rows of a weight staged for AMX), and the drivers that split a matmul's rows into
//! panels and tiles for them.

use std::borrow::Cow;

use bytemuck::Pod;
use flint_core::blocks::{
    BlockIQ4NL, BlockIQ4XS, BlockQ2K, BlockQ3K, BlockQ4K, BlockQ4_0, BlockQ5K, BlockQ5_0, BlockQ6K,
    BlockQ8K, BlockQ8_0,
};

use flint_core::{FormatError, GgmlType};

use crate::simd::SimdLevel;

use super::act_quant::Acts;
#[cfg(target_arch = "x86_64")]
use super::amx;
use super::float::FloatKind;
#[cfg(target_arch = "x86_64")]
use super::q0::panel::{AmxOrder, Q0Order, TinyBlas};
#[cfg(target_arch = "x86_64")]
use super::x16::Ahead;
use super::{
    float, iq4_nl, iq4_xs, kq_panel, kq_panel_avx2, mxfp4, panel, q0, q2_k, q3_k, q4_k, q5_k, q6_k,
    x16,
};

/// Activation rows in a tile that share each decoded weight block.
pub const TILE: usize = 4;

/// A weight row viewed as blocks: borrowed when the bytes are aligned for `B`, else
/// copied (GGUF data is 32-byte aligned, so the copy is only a safety net).
pub(crate) fn view<B: Pod>(w: &[u8]) -> Cow<'_, [B]> {
    match bytemuck::try_cast_slice(w) {
        Ok(s) => Cow::Borrowed(s),
        Err(_) => {
            let mut v = vec![B::zeroed(); w.len() / std::mem::size_of::<B>()];
            bytemuck::cast_slice_mut::<B, u8>(&mut v).copy_from_slice(w);
            Cow::Owned(v)
        }
    }
}

/// Whether `level` has a native kernel for weights of `ty` (else: the scalar reference).
pub fn native_kernel(level: SimdLevel, ty: GgmlType) -> Option<SimdLevel> {
    use GgmlType::*;
    match level {
        SimdLevel::Scalar => None,
        SimdLevel::Avx2 => matches!(
            ty,
            Q4_K | Q5_K
                | Q6_K
                | Q8_0
                | Q5_0
                | Q4_0
                | MXFP4
                | IQ4_NL
                | IQ4_XS
                | Q3_K
                | Q2_K
                | F32
                | F16
                | BF16
        )
        .then_some(SimdLevel::Avx2),
        SimdLevel::Avx512Vnni => match ty {
            Q4_K | Q5_K | Q6_K | Q8_0 | Q5_0 | Q4_0 | MXFP4 => Some(SimdLevel::Avx512Vnni),
            _ => native_kernel(SimdLevel::Avx512, ty),
        },
        // The K-quants take the AVX2 kernels here: they compute llama.cpp's orders
        // (`q4_k/avx2.rs`), as the AVX-512 VNNI ones do.
        SimdLevel::Avx512 => match ty {
            Q8_0 | Q5_0 | Q4_0 | MXFP4 => Some(SimdLevel::Avx512),
            _ => native_kernel(SimdLevel::Avx2, ty),
        },
    }
}

/// Runs a tile kernel `$f::<R>` for the activation rows `rows` of one weight row.
macro_rules! tiled {
    // Kernels that also take each activation row's block scales as f32 (`; scales`).
    ($($f:ident)::+, $w:expr, $a:expr, $nb:expr, $rows:expr, $out:expr; $s:expr) => {{
        let w = $w;
        let row = |i: usize| &$a[i * $nb..(i + 1) * $nb];
        let sc = |i: usize| &$s[i * $nb..(i + 1) * $nb];
        let rows: &[usize] = $rows;
        let mut t = 0;
        while t < rows.len() {
            let len = (rows.len() - t).min(4);
            let r = &rows[t..t + len];
            let o = &mut $out[t..t + len];
            // SAFETY (each call): the level was checked against the CPU's features at
            // device open (`SimdLevel::check`), so the kernel's target features are present.
            match len {
                4 => {
                    let ys = [row(r[0]), row(r[1]), row(r[2]), row(r[3])];
                    let ss = [sc(r[0]), sc(r[1]), sc(r[2]), sc(r[3])];
                    let mut v = [0f32; 4];
                    // SAFETY: features checked at device open (see above).
                    unsafe { $($f)::+::<4>(&w, &ys, &ss, &mut v) };
                    o.copy_from_slice(&v);
                }
                3 => {
                    let ys = [row(r[0]), row(r[1]), row(r[2])];
                    let ss = [sc(r[0]), sc(r[1]), sc(r[2])];
                    let mut v = [0f32; 3];
                    // SAFETY: features checked at device open (see above).
                    unsafe { $($f)::+::<3>(&w, &ys, &ss, &mut v) };
                    o.copy_from_slice(&v);
                }
                2 => {
                    let ys = [row(r[0]), row(r[1])];
                    let ss = [sc(r[0]), sc(r[1])];
                    let mut v = [0f32; 2];
                    // SAFETY: features checked at device open (see above).
                    unsafe { $($f)::+::<2>(&w, &ys, &ss, &mut v) };
                    o.copy_from_slice(&v);
                }
                _ => {
                    let mut v = [0f32; 1];
                    // SAFETY: features checked at device open (see above).
                    unsafe { $($f)::+::<1>(&w, &[row(r[0])], &[sc(r[0])], &mut v) };
                    o[0] = v[0];
                }
            }
            t += len;
        }
    }};
    ($($f:ident)::+, $w:expr, $a:expr, $nb:expr, $rows:expr, $out:expr) => {{
        let w = $w;
        let row = |i: usize| &$a[i * $nb..(i + 1) * $nb];
        // A tile of 1..=4 rows: the remainder of M gets its own smaller tile rather
        // than decoding the weight once per leftover row.
        // SAFETY (each call): the level was checked against the CPU's features at
        // device open (`SimdLevel::check`), so the kernel's target features are present.
        match $rows.len() {
            4 => {
                let ys = [row($rows[0]), row($rows[1]), row($rows[2]), row($rows[3])];
                let mut o = [0f32; 4];
                // SAFETY: features checked at device open (see above).
                unsafe { $($f)::+::<4>(&w, &ys, &mut o) };
                $out.copy_from_slice(&o);
            }
            3 => {
                let ys = [row($rows[0]), row($rows[1]), row($rows[2])];
                let mut o = [0f32; 3];
                // SAFETY: features checked at device open (see above).
                unsafe { $($f)::+::<3>(&w, &ys, &mut o) };
                $out.copy_from_slice(&o);
            }
            2 => {
                let ys = [row($rows[0]), row($rows[1])];
                let mut o = [0f32; 2];
                // SAFETY: features checked at device open (see above).
                unsafe { $($f)::+::<2>(&w, &ys, &mut o) };
                $out.copy_from_slice(&o);
            }
            _ => {
                for (k, &i) in $rows.iter().enumerate() {
                    let mut o = [0f32; 1];
                    // SAFETY: features checked at device open (see above).
                    unsafe { $($f)::+::<1>(&w, &[row(i)], &mut o) };
                    $out[k] = o[0];
                }
            }
        }
    }};
}

/// `out[t] = dot(weight row, activation row rows[t])` for a tile of `rows.len() <= TILE`
/// activation rows. `k` is the row length in elements.
pub(crate) fn dot_rows(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    acts: &Acts,
    k: usize,
    rows: &[usize],
    out: &mut [f32],
) -> Result<(), FormatError> {
    debug_assert!(rows.len() <= TILE && out.len() == rows.len());
    #[cfg(target_arch = "x86_64")]
    {
        let nbk = k / 256;
        let nb0 = k / 32;
        match (native_kernel(level, ty), acts) {
            (Some(l), Acts::Q8_0 { .. }) if ty == GgmlType::MXFP4 => {
                let act = acts.mxfp4_act(nb0).ok_or(FormatError::Unsupported(ty))?;
                mxfp4::dot_rows(l, &view(w), act, rows, out);
            }
            // Q4_K and Q6_K in llama.cpp's prompt-batch float orders, the same for every
            // row whatever the batch (docs/parity.md, kernels/q4_k/vnni.rs).
            (Some(SimdLevel::Avx512Vnni), Acts::Q8K(a)) => match ty {
                GgmlType::Q4_K => {
                    tiled!(
                        q4_k::vnni::dot_q4k_gemm,
                        view::<BlockQ4K>(w),
                        a,
                        nbk,
                        rows,
                        out
                    )
                }
                GgmlType::Q5_K => {
                    tiled!(q5_k::vnni::dot_q5k, view::<BlockQ5K>(w), a, nbk, rows, out)
                }
                GgmlType::Q6_K => {
                    tiled!(
                        q6_k::vnni::dot_q6k_tiled,
                        view::<BlockQ6K>(w),
                        a,
                        nbk,
                        rows,
                        out
                    )
                }
                _ => unreachable!("no AVX-512 VNNI Q8_K kernel for {ty}"),
            },
            (
                Some(SimdLevel::Avx512Vnni),
                Acts::Q8_0 {
                    blocks: a,
                    scales: sa,
                    ..
                },
            ) => match ty {
                GgmlType::Q5_0 => {
                    let side = |i: usize| acts.q8_0_side(i, nb0);
                    q0::vnni::q5_0_rows(&view::<BlockQ5_0>(w), rows, &side, out);
                }
                // The VNNI level's own Q8_0/Q4_0 kernels are the matvec and the gemm;
                // tiles of a few rows take the AVX-512 ones (the same order).
                GgmlType::Q8_0 => tiled!(
                    q0::avx512::dot_q8_0,
                    view::<BlockQ8_0>(w),
                    a,
                    nb0,
                    rows,
                    out;
                    sa
                ),
                GgmlType::Q4_0 => tiled!(
                    q0::avx512::dot_q4_0,
                    view::<BlockQ4_0>(w),
                    a,
                    nb0,
                    rows,
                    out;
                    sa
                ),
                _ => unreachable!("no AVX-512 VNNI Q8_0 kernel for {ty}"),
            },
            (
                Some(SimdLevel::Avx512),
                Acts::Q8_0 {
                    blocks: a,
                    scales: sa,
                    ..
                },
            ) => match ty {
                GgmlType::Q8_0 => tiled!(
                    q0::avx512::dot_q8_0,
                    view::<BlockQ8_0>(w),
                    a,
                    nb0,
                    rows,
                    out;
                    sa
                ),
                GgmlType::Q5_0 => tiled!(
                    q0::avx512::dot_q5_0,
                    view::<BlockQ5_0>(w),
                    a,
                    nb0,
                    rows,
                    out;
                    sa
                ),
                GgmlType::Q4_0 => tiled!(
                    q0::avx512::dot_q4_0,
                    view::<BlockQ4_0>(w),
                    a,
                    nb0,
                    rows,
                    out;
                    sa
                ),
                _ => unreachable!("no AVX-512 Q8_0 kernel for {ty}"),
            },
            (Some(SimdLevel::Avx2), Acts::Q8K(a)) => match ty {
                GgmlType::Q4_K => {
                    tiled!(q4_k::avx2::dot_q4k, view::<BlockQ4K>(w), a, nbk, rows, out)
                }
                GgmlType::Q5_K => {
                    tiled!(q5_k::avx2::dot_q5k, view::<BlockQ5K>(w), a, nbk, rows, out)
                }
                GgmlType::Q6_K => {
                    tiled!(q6_k::avx2::dot_q6k, view::<BlockQ6K>(w), a, nbk, rows, out)
                }
                GgmlType::IQ4_XS => tiled!(
                    iq4_xs::avx2::dot_iq4xs,
                    view::<BlockIQ4XS>(w),
                    a,
                    nbk,
                    rows,
                    out
                ),
                GgmlType::Q3_K => {
                    tiled!(q3_k::avx2::dot_q3k, view::<BlockQ3K>(w), a, nbk, rows, out)
                }
                GgmlType::Q2_K => {
                    tiled!(q2_k::avx2::dot_q2k, view::<BlockQ2K>(w), a, nbk, rows, out)
                }
                _ => unreachable!("no AVX2 Q8_K kernel for {ty}"),
            },
            (
                Some(SimdLevel::Avx2),
                Acts::Q8_0 {
                    blocks: a,
                    scales: sa,
                    ..
                },
            ) => match ty {
                GgmlType::Q8_0 => {
                    tiled!(q0::avx2::dot_q8_0, view::<BlockQ8_0>(w), a, nb0, rows, out; sa)
                }
                GgmlType::Q5_0 => {
                    tiled!(q0::avx2::dot_q5_0, view::<BlockQ5_0>(w), a, nb0, rows, out; sa)
                }
                GgmlType::Q4_0 => {
                    tiled!(q0::avx2::dot_q4_0, view::<BlockQ4_0>(w), a, nb0, rows, out; sa)
                }
                GgmlType::IQ4_NL => tiled!(
                    iq4_nl::avx2::dot_iq4nl,
                    view::<BlockIQ4NL>(w),
                    a,
                    nb0,
                    rows,
                    out
                ),
                _ => unreachable!("no AVX2 Q8_0 kernel for {ty}"),
            },
            (Some(_), Acts::F32(a)) => {
                let kind = FloatKind::of(ty).ok_or(FormatError::Unsupported(ty))?;
                let row = |i: usize| &a[i * k..(i + 1) * k];
                if rows.len() == TILE {
                    let ys = [row(rows[0]), row(rows[1]), row(rows[2]), row(rows[3])];
                    let mut o = [0f32; TILE];
                    // SAFETY: AVX2/FMA/F16C were checked at device open.
                    unsafe { float::avx2::dot_float::<TILE>(kind, w, &ys, &mut o) };
                    out.copy_from_slice(&o);
                } else {
                    for (t, &i) in rows.iter().enumerate() {
                        let mut o = [0f32; 1];
                        // SAFETY: as above.
                        unsafe { float::avx2::dot_float::<1>(kind, w, &[row(i)], &mut o) };
                        out[t] = o[0];
                    }
                }
            }
            _ => scalar_rows(ty, w, acts, k, rows, out)?,
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = level;
        scalar_rows(ty, w, acts, k, rows, out)
    }
}

/// Fewest activation rows for which a matmul takes the weight-tiled gemm (`gemm`).
pub const GEMM_MIN_ROWS: usize = 16;

/// Most bytes of decoded weight panels [`gemm`] keeps at once: a larger weight is
/// decoded and applied in strips of rows ([`gemm_strip_rows`]).
const GEMM_MAX_DECODED_BYTES: usize = 16 << 20;

/// Whether `ty` takes the eight-row panels of `kq_panel_avx2` for prompt batches at
/// `level`, whatever the level from AVX2 up: the types whose order does not depend on
/// the level (their decode matvecs differ by level, their sums do not), for dense
/// matmuls and expert towers alike: the low-bit types held to the scalar reference's
/// order (Q2_K, Q3_K, IQ4_XS) and Q5_K (llama.cpp's tiled order at every level).
pub(crate) fn level_free_panels(level: SimdLevel, ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64")
        && level != SimdLevel::Scalar
        && matches!(
            ty,
            GgmlType::Q2_K | GgmlType::Q3_K | GgmlType::IQ4_XS | GgmlType::Q5_K
        )
}

/// The weight rows per strip of the prompt-batch gemm of `ty` with rows of `k` elements
/// at `level` (a weight with more rows is decoded and applied strip by strip): the
/// sixteen-row panels of AVX-512 VNNI, the eight-row panels of the AVX2 and AVX-512 F
/// levels (and of every level for the types of [`level_free_panels`]); `None` for a type
/// or level without such a gemm.
pub fn gemm_strip_rows(level: SimdLevel, ty: GgmlType, k: usize) -> Option<usize> {
    #[cfg(target_arch = "x86_64")]
    {
        use q0::panel_avx2::PANEL8_ROWS;
        let kq = matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K);
        let q0 = matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0);
        if level_free_panels(level, ty) {
            return Some(panel::strip_rows_of::<PANEL8_ROWS>(
                (k / 256) * std::mem::size_of::<kq_panel_avx2::KPanel8Block>(),
                GEMM_MAX_DECODED_BYTES,
                Q0_DECODE_PANELS8,
            ));
        }
        match level {
            SimdLevel::Avx512Vnni if kq => Some(panel::strip_rows(
                (k / 256) * std::mem::size_of::<kq_panel::KPanelBlock>(),
                GEMM_MAX_DECODED_BYTES,
                KQ_DECODE_PANELS,
            )),
            SimdLevel::Avx512Vnni if q0 => Some(panel::strip_rows(
                (k / 32) * std::mem::size_of::<q0::panel::PanelBlock>(),
                GEMM_MAX_DECODED_BYTES,
                Q0_DECODE_PANELS,
            )),
            SimdLevel::Avx2 | SimdLevel::Avx512 if kq => Some(panel::strip_rows_of::<PANEL8_ROWS>(
                (k / 256) * std::mem::size_of::<kq_panel_avx2::KPanel8Block>(),
                GEMM_MAX_DECODED_BYTES,
                Q0_DECODE_PANELS8,
            )),
            SimdLevel::Avx2 | SimdLevel::Avx512 if q0 => Some(panel::strip_rows_of::<PANEL8_ROWS>(
                (k / 32) * std::mem::size_of::<q0::panel_avx2::Panel8Block>(),
                GEMM_MAX_DECODED_BYTES,
                Q0_DECODE_PANELS8,
            )),
            _ => None,
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, ty, k);
        None
    }
}

/// Panels per decoding task of the K-quant panels (32 rows).
#[cfg(target_arch = "x86_64")]
const KQ_DECODE_PANELS: usize = 2;

/// Panels per decoding task of the legacy-quant panels (64 rows).
#[cfg(target_arch = "x86_64")]
const Q0_DECODE_PANELS: usize = 4;

/// Scratch space of the weight-tiled gemm (decoded weight blocks), kept by the device
/// between matmuls.
#[derive(Default)]
pub(crate) struct GemmScratch {
    #[cfg(target_arch = "x86_64")]
    panels: Vec<q0::panel::PanelBlock>,
    /// The up projection's panels of [`q0_glu_gemm`] (the gate's in `panels`).
    #[cfg(target_arch = "x86_64")]
    panels_up: Vec<q0::panel::PanelBlock>,
    #[cfg(target_arch = "x86_64")]
    panels8: Vec<q0::panel_avx2::Panel8Block>,
    #[cfg(target_arch = "x86_64")]
    kpanels: Vec<kq_panel::KPanelBlock>,
    #[cfg(target_arch = "x86_64")]
    kpanels8: Vec<kq_panel_avx2::KPanel8Block>,
}

impl std::fmt::Debug for GemmScratch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("GemmScratch")
    }
}

/// `out[i * n + o] = dot(weight row o, activation row i)` for the `n` weight rows in `w`
/// and the `m` activation rows of `acts`, with a kernel that tiles weight rows as well as
/// activation rows: the weight decoded once (in parallel), then the activation rows split
/// over the threads in chunks of about `rows_per_task`, each task writing its own rows of
/// `out`. The same results as [`dot_rows`] row by row, bit for bit, or for the matrix of
/// one expert of a tower (`expert`) as [`expert_rows_gemv`] where [`expert_gemv`] holds.
/// `Ok(false)` (nothing written) where `level` has no such kernel for `ty`. Runs inside
/// the device's pool.
#[allow(clippy::too_many_arguments)]
pub(crate) fn gemm(
    level: SimdLevel,
    ty: GgmlType,
    w: WeightRows<'_>,
    acts: &Acts,
    k: usize,
    n: usize,
    m: usize,
    rows_per_task: usize,
    expert: bool,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) -> Result<bool, FormatError> {
    // Decoding a weight costs about what a few activation rows of work on it do, and the
    // decoded copy is 36 bytes per 32-quant block: worth it for a prompt batch, not for a
    // few decode rows or a vocabulary-sized matrix.
    #[cfg(target_arch = "x86_64")]
    if level == SimdLevel::Avx512Vnni && m >= GEMM_MIN_ROWS {
        if let Acts::Q8K(a) = acts {
            if matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K) {
                let order = if expert {
                    kq_panel::EXPERT
                } else {
                    kq_panel::DENSE
                };
                kq_panel_gemm(ty, w, a, k, n, rows_per_task, order, scratch, out);
                return Ok(true);
            }
        }
    }
    #[cfg(target_arch = "x86_64")]
    if m >= AVX2_GEMM_MIN_ROWS
        && (matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512) && !expert
            || level_free_panels(level, ty))
    {
        // (A Q3_K weight arranged for the matvec is unpacked once for the call: a prompt
        // batch's work on it is hundreds of times the copy's.)
        if let (Acts::Q8K(a), WeightRows::File(_) | WeightRows::Q3KPerm(_)) = (acts, w) {
            let bytes = w.file_bytes(k);
            match ty {
                GgmlType::Q4_K => {
                    kq_gemm_avx2::<BlockQ4K>(level, &bytes, a, k, n, rows_per_task, scratch, out)
                }
                GgmlType::Q6_K => {
                    kq_gemm_avx2::<BlockQ6K>(level, &bytes, a, k, n, rows_per_task, scratch, out)
                }
                GgmlType::Q2_K => {
                    kq_gemm_avx2::<BlockQ2K>(level, &bytes, a, k, n, rows_per_task, scratch, out)
                }
                GgmlType::Q3_K => {
                    kq_gemm_avx2::<BlockQ3K>(level, &bytes, a, k, n, rows_per_task, scratch, out)
                }
                GgmlType::IQ4_XS => {
                    kq_gemm_avx2::<BlockIQ4XS>(level, &bytes, a, k, n, rows_per_task, scratch, out)
                }
                GgmlType::Q5_K => {
                    kq_gemm_avx2::<BlockQ5K>(level, &bytes, a, k, n, rows_per_task, scratch, out)
                }
                _ => return Ok(false),
            }
            return Ok(true);
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let Acts::Q8_0 {
        blocks,
        scales,
        neg16_lanes,
    } = acts
    {
        if !matches!(
            w,
            WeightRows::File(_) | WeightRows::Q8_0x16(_) | WeightRows::Q5_0x16(_)
        ) {
            return Ok(false);
        }
        let a = (&blocks[..], &scales[..], &neg16_lanes[..]);
        if matches!(level, SimdLevel::Avx2 | SimdLevel::Avx512)
            && m >= AVX2_GEMM_MIN_ROWS
            && matches!(w, WeightRows::File(_))
        {
            let bytes = w.file_bytes(k);
            match ty {
                GgmlType::Q5_0 => {
                    q0_gemm_avx2::<BlockQ5_0>(&bytes, a, k, n, rows_per_task, scratch, out)
                }
                GgmlType::Q8_0 => {
                    q0_gemm_avx2::<BlockQ8_0>(&bytes, a, k, n, rows_per_task, scratch, out)
                }
                GgmlType::Q4_0 => {
                    q0_gemm_avx2::<BlockQ4_0>(&bytes, a, k, n, rows_per_task, scratch, out)
                }
                _ => return Ok(false),
            }
            return Ok(true);
        }
        if level == SimdLevel::Avx512Vnni && m >= GEMM_MIN_ROWS {
            match (ty, w) {
                (GgmlType::Q5_0, _) => {
                    q0_gemm::<BlockQ5_0, TinyBlas>(w, a, k, n, rows_per_task, scratch, out)
                }
                (GgmlType::Q8_0, _) => {
                    q0_gemm::<BlockQ8_0, TinyBlas>(w, a, k, n, rows_per_task, scratch, out)
                }
                (GgmlType::Q4_0, WeightRows::File(_)) => {
                    q0_gemm::<BlockQ4_0, TinyBlas>(w, a, k, n, rows_per_task, scratch, out)
                }
                _ => return Ok(false),
            }
            return Ok(true);
        }
    }
    let _ = (
        level,
        ty,
        w,
        acts,
        k,
        n,
        m,
        rows_per_task,
        expert,
        scratch,
        out,
    );
    Ok(false)
}

/// Activation rows below which [`gemm`] runs weight-stationary ([`fused_gemm`]): a
/// decode batch of a few dozen sequences against a vocabulary-sized output matrix. With
/// the activation rows split over the tasks, every task would stream the whole decoded
/// weight (at 16 rows and 2 threads, eight times the weight's bytes from memory).
#[cfg(target_arch = "x86_64")]
const FUSED_MAX_ROWS: usize = 64;

/// `out[t * n + r]` for the `n` weight rows and the `out.len() / n` activation rows,
/// weight-stationary: the panels split over the tasks, each task decoding one panel at a
/// time into its own buffer (`decode(panel, buffer)`, `nb` blocks) and applying every
/// activation row to it while it is in L1 (`apply(buffer, live rows, results, columns)`)
/// into a panel-wide buffer of its own, then copying each activation row's outputs to
/// that row of `out` (each task holds its own columns of every row). The weight is read
/// once; each output is computed by the same tile as in the activation-split gemm, so the
/// bits are the same.
#[cfg(target_arch = "x86_64")]
fn fused_gemm<D: Copy + Send + Sync>(
    n: usize,
    nb: usize,
    zero: D,
    decode: impl Fn(usize, &mut [D]) + Sync,
    apply: impl Fn(&[D], usize, &mut [f32], panel::OutCols, usize) + Sync,
    out: &mut [f32],
) {
    use rayon::prelude::*;
    const W: usize = panel::PANEL_ROWS;
    let m = out.len() / n;
    let panels = n.div_ceil(W);
    // About four tasks per thread, whole panels each.
    let per = panels
        .div_ceil(rayon::current_num_threads().max(1) * 4)
        .max(1);
    task_columns(out, n, per * W)
        .into_par_iter()
        .enumerate()
        .for_each(|(c, mut rows)| {
            let (p0, p1) = (c * per, ((c + 1) * per).min(panels));
            let mut dec = vec![zero; nb];
            let mut buf = vec![0f32; m * W];
            for p in p0..p1 {
                decode(p, &mut dec);
                let live = W.min(n - p * W);
                apply(&dec, live, &mut buf, panel::OutCols { stride: W, c0: 0 }, p);
                let at = (p - p0) * W;
                for (dst, src) in rows.iter_mut().zip(buf.chunks_exact(W)) {
                    let src: &[f32; W] = src.try_into().expect("a panel-wide row");
                    panel::put_row(&mut dst[at..at + live], src);
                }
            }
        });
}

/// `out[t * n + r]` = weight row `r` of `w` (Q8_0 or Q5_0 rows in the file's layout, `n`
/// a multiple of 16) · activation row `t` of `acts` (all `out.len() / n` of them), in
/// llama.cpp's AMX order: up to [`AMX_VNNI_MAX_ROWS`] activation rows on AVX-512 VNNI
/// (`amx::rows`: the rows split over the tasks, each task its columns of the output
/// rows), more on the tiles, weight-stationary as [`fused_gemm`] (the sixteen-row
/// panels split over the tasks, each multiplied with every activation row while the
/// next one is asked for); where this process cannot run the tiles, more on the VNNI
/// panels in that order ([`q0_gemm`] with [`AmxOrder`]: `rows_per_task` and `scratch`
/// as for [`gemm`]). Runs inside the device's pool.
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_matmul<B: amx::q8_0::AmxWeight>(
    w: &[B],
    k: usize,
    n: usize,
    acts: &Acts,
    rows_per_task: usize,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) {
    const R: usize = panel::PANEL_ROWS;
    let nb = k / 32;
    let Acts::Q8_0 { blocks, scales, .. } = acts else {
        unreachable!("Q8_0 and Q5_0 weights take Q8_0 activations");
    };
    let m = out.len() / n.max(1);
    let rows: Vec<usize> = (0..m).collect();
    if m <= AMX_VNNI_MAX_ROWS {
        over_row_groups(out, n, |r0, rn, cols| {
            let put = |r: usize, t: usize, v: f32| cols[t][r] = v;
            amx_vnni_rows(&w[r0 * nb..(r0 + rn) * nb], nb, acts, &rows, put)
        });
        return;
    }
    if !amx::available() {
        let w = WeightRows::File(bytemuck::cast_slice(w));
        let a = acts.q8_0_all();
        q0_gemm::<B, AmxOrder>(w, a, k, n, rows_per_task, scratch, out);
        return;
    }
    let a = amx::q8_0::AmxActs::new(blocks, scales, &rows, nb);
    let direct = B::as_q8_0(w);
    // Q5_0 panels widened to Q8_0 blocks, one at a time per task.
    let dec_len = if direct.is_some() { 0 } else { R * nb };
    let decode = |p: usize, d: &mut [BlockQ8_0]| {
        if direct.is_none() {
            // SAFETY: weights are staged for AMX only at the AVX-512 VNNI level, checked
            // at device open.
            unsafe { amx::q8_0::widen(&w[p * R * nb..(p + 1) * R * nb], d) };
        }
    };
    let apply = |d: &[BlockQ8_0], live: usize, buf: &mut [f32], cols: panel::OutCols, p: usize| {
        debug_assert_eq!(live, R, "AMX weights have whole panels");
        let panel = match direct {
            Some(q) => &q[p * R * nb..(p + 1) * R * nb],
            None => d,
        };
        let at = amx::q8_0::Strides {
            t: cols.stride,
            r: 1,
        };
        // The next panel into L1, the one after it into L2 (`rows16`).
        let next = amx_panels_ahead(w, nb, p + 1..p + 2);
        let far = amx_panels_ahead(w, nb, p + AMX_L2_AHEAD..p + AMX_L2_AHEAD + 1);
        // SAFETY: this path is taken only where `amx::available()` (checked above), and
        // weights are staged for AMX only at the AVX-512 VNNI level, checked at device
        // open.
        unsafe { amx::q8_0::rows16(panel, &a, &mut buf[cols.c0..], at, next, far) };
    };
    fused_gemm(
        n,
        dec_len,
        BlockQ8_0 { d: 0, qs: [0; 32] },
        decode,
        apply,
        out,
    );
}

/// `out[t * n + r]` = weight row `r` of `w` ([`WeightRows::Q8_0x16Amx`] or
/// [`WeightRows::Q5_0x16Amx`]: 16-row groups staged for the AMX orders where the process
/// cannot run the tiles) · activation row `t` of `acts`, in llama.cpp's AMX order on
/// AVX-512 VNNI for any number of activation rows ([`q0_gemm`] with [`AmxOrder`]: the
/// groups decoded into panels, weight-stationary below [`FUSED_MAX_ROWS`] rows).
/// `rows_per_task` and `scratch` as for [`gemm`]. Runs inside the device's pool.
#[cfg(target_arch = "x86_64")]
pub(crate) fn amx_x16_matmul(
    w: WeightRows<'_>,
    k: usize,
    n: usize,
    acts: &Acts,
    rows_per_task: usize,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) {
    let m = out.len() / n.max(1);
    if m <= AMX_VNNI_MAX_ROWS {
        amx_x16_decode(w, k, n, acts, out);
        return;
    }
    let a = acts.q8_0_all();
    match w {
        WeightRows::Q8_0x16Amx(g) => q0_gemm::<BlockQ8_0, AmxOrder>(
            WeightRows::Q8_0x16(g),
            a,
            k,
            n,
            rows_per_task,
            scratch,
            out,
        ),
        WeightRows::Q5_0x16Amx(g) => q0_gemm::<BlockQ5_0, AmxOrder>(
            WeightRows::Q5_0x16(g),
            a,
            k,
            n,
            rows_per_task,
            scratch,
            out,
        ),
        _ => unreachable!("amx_x16_matmul: a weight not staged for AMX in 16-row groups"),
    }
}

/// [`amx_x16_matmul`] for up to [`AMX_VNNI_MAX_ROWS`] activation rows: the row groups
/// split over the tasks (four a thread), each group streamed once through
/// `q0::x16::dot_group_amx` for every activation row.
#[cfg(target_arch = "x86_64")]
fn amx_x16_decode(w: WeightRows<'_>, k: usize, n: usize, acts: &Acts, out: &mut [f32]) {
    let nb = k / 32;
    let m = out.len() / n.max(1);
    let rows: Vec<usize> = (0..m).collect();
    over_row_groups(out, n, |r0, rn, cols| {
        let put = |r: usize, t: usize, v: f32| cols[t][r] = v;
        amx_x16_rows(w.packed_rows(k, r0, rn), nb, acts, &rows, put)
    });
}

/// The decode drivers' split of a matmul (`out`: rows of `n` outputs, `n` a multiple of
/// 16) over the pool: whole groups of sixteen weight rows, four tasks a thread, each
/// task its columns of every activation row. `run(first row, rows, cols)` per task,
/// `cols[t][r]` activation row `t`'s output for the task's row `r`.
#[cfg(target_arch = "x86_64")]
fn over_row_groups(
    out: &mut [f32],
    n: usize,
    run: impl Fn(usize, usize, &mut [&mut [f32]]) + Sync,
) {
    use rayon::prelude::*;
    const R: usize = panel::PANEL_ROWS;
    let per = (n / R)
        .div_ceil(rayon::current_num_threads().max(1) * 4)
        .max(1)
        * R;
    task_columns(out, n, per)
        .into_par_iter()
        .enumerate()
        .for_each(|(c, mut cols)| {
            let rows_here = cols.first().map_or(0, |v| v.len());
            run(c * per, rows_here, &mut cols);
        });
}

/// How many panels ahead of the one on the tiles [`amx_matmul`] asks for a panel into
/// the L2 cache, besides the next one into L1. Gemma 3's tied 262144 x 640 Q8_0 matrix
/// at 16 rows from memory (`kernel_speed`, 2 threads, six alternated rounds on the
/// Intel Xeon host): 352-372 GMAC/s against 281-330 with the next panel alone.
#[cfg(target_arch = "x86_64")]
const AMX_L2_AHEAD: usize = 2;

/// The lines of the sixteen-row panels `panels` of AMX-staged rows `w` (`nb` blocks a
/// row), for [`Ahead`]; nothing past the last panel.
#[cfg(target_arch = "x86_64")]
fn amx_panels_ahead<B>(w: &[B], nb: usize, panels: std::ops::Range<usize>) -> Ahead {
    let r = |p: usize| (p * panel::PANEL_ROWS * nb).min(w.len());
    Ahead::of(&w[r(panels.start)..r(panels.end)])
}

/// `out[t * n + r]` = weight row `r` of `w` (Q4_K or Q6_K rows in the file's layout
/// staged for AMX, [`WeightRows::Q4KAmx`] / [`WeightRows::Q6KAmx`], `n` a multiple of 16)
/// · activation row `t` of `acts` (Q8_K, all `out.len() / n` of them), in llama.cpp's
/// AMX order: up to [`AMX_VNNI_MAX_ROWS`] activation rows with the four-row kernels
/// ([`KAmx::ROWS4`]; the weight rows split over the tasks, each task its columns of the
/// output rows), more with the prompt-batch panels of [`kq_panel_gemm`] in that order.
/// Runs inside the device's pool.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn amx_kq_matmul(
    ty: GgmlType,
    w: WeightRows<'_>,
    k: usize,
    n: usize,
    acts: &Acts,
    rows_per_task: usize,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) {
    let nb = k / 256;
    let m = out.len() / n.max(1);
    let Acts::Q8K(blocks) = acts else {
        unreachable!("Q4_K and Q6_K weights take Q8_K activations");
    };
    if m > AMX_VNNI_MAX_ROWS {
        kq_panel_gemm(
            ty,
            w,
            blocks,
            k,
            n,
            rows_per_task,
            kq_panel::AMX,
            scratch,
            out,
        );
        return;
    }
    let rows: Vec<usize> = (0..m).collect();
    over_row_groups(out, n, |r0, rn, cols| {
        let put = |r: usize, t: usize, v: f32| cols[t][r] = v;
        match w {
            WeightRows::Q4KAmx(wb) => {
                amx_kq_rows(&wb[r0 * nb..(r0 + rn) * nb], nb, acts, &rows, put)
            }
            WeightRows::Q6KAmx(wb) => {
                amx_kq_rows(&wb[r0 * nb..(r0 + rn) * nb], nb, acts, &rows, put)
            }
            _ => unreachable!("amx_kq_matmul: a weight not staged for AMX"),
        }
    });
}

/// A K-quant type the AMX path takes ([`WeightRows::Q4KAmx`], [`WeightRows::Q6KAmx`]):
/// its four-row kernels in llama.cpp's AMX order (`dot_q4k_rows4_m` / `dot_q6k_rows4_m`
/// with `AMX`); more activation rows take its prompt-batch panels in that order
/// ([`kq_panel::AMX`]).
#[cfg(target_arch = "x86_64")]
pub(crate) trait KAmx: kq_panel::KTile {
    /// The four-row kernels for one to four activation rows.
    const ROWS4: Rows4M<Self>;
}

#[cfg(target_arch = "x86_64")]
impl KAmx for BlockQ4K {
    const ROWS4: Rows4M<Self> = (
        q4_k::vnni::dot_q4k_rows4_m::<1, true>,
        q4_k::vnni::dot_q4k_rows4_m::<2, true>,
        q4_k::vnni::dot_q4k_rows4_m::<3, true>,
        q4_k::vnni::dot_q4k_rows4_m::<4, true>,
    );
}

#[cfg(target_arch = "x86_64")]
impl KAmx for BlockQ6K {
    const ROWS4: Rows4M<Self> = (
        q6_k::vnni::dot_q6k_rows4_m::<1, true>,
        q6_k::vnni::dot_q6k_rows4_m::<2, true>,
        q6_k::vnni::dot_q6k_rows4_m::<3, true>,
        q6_k::vnni::dot_q6k_rows4_m::<4, true>,
    );
}

/// AMX-staged Q4_K / Q6_K rows `w` (whole groups of sixteen) against the activation
/// rows `act_rows` (consecutive, as every caller's are: a task's rows, or a task of
/// `matmul_multi`), in llama.cpp's AMX order: `put(row, t, value)`. Up to
/// [`AMX_VNNI_MAX_ROWS`] rows with the four-row kernels ([`KAmx::ROWS4`]: rows a
/// quarter of the rows apart, as the decode kernels stream them), more through the
/// prompt-batch panels.
#[cfg(target_arch = "x86_64")]
fn amx_kq_rows<B: KAmx>(
    w: &[B],
    nb: usize,
    acts: &Acts,
    act_rows: &[usize],
    mut put: impl FnMut(usize, usize, f32),
) {
    const R: usize = panel::PANEL_ROWS;
    let Acts::Q8K(blocks) = acts else {
        unreachable!("Q4_K and Q6_K weights take Q8_K activations");
    };
    let m = act_rows.len();
    let Some(&i0) = act_rows.first() else { return };
    assert!(
        act_rows.iter().enumerate().all(|(t, &r)| r == i0 + t),
        "amx_kq_rows: activation rows not consecutive"
    );
    if m > AMX_VNNI_MAX_ROWS {
        let mut dec = vec![kq_panel::KPanelBlock::ZERO; nb];
        let mut res = vec![0f32; m * R];
        let cols = panel::OutCols { stride: R, c0: 0 };
        for (g, rows) in w.chunks_exact(R * nb).enumerate() {
            kq_panel::decode(rows, nb, R, 0, &mut dec);
            kq_panel::gemm::<B, { kq_panel::AMX }>(
                &dec,
                nb,
                R,
                blocks,
                i0,
                &mut res,
                cols,
                Ahead::NONE,
            );
            for (t, v) in res.chunks_exact(R).enumerate() {
                for (r, &x) in v.iter().enumerate() {
                    put(g * R + r, t, x);
                }
            }
        }
        return;
    }
    let n = w.len() / nb.max(1);
    let mut out_t = vec![0f32; n * m];
    let done = rows4_tiles(
        w,
        nb,
        &blocks[i0 * nb..(i0 + m) * nb],
        m,
        &mut out_t,
        B::ROWS4,
    );
    assert_eq!(done, n, "amx_kq_rows: whole groups of four rows");
    for (r, v) in out_t.chunks_exact(m).enumerate() {
        for (t, &x) in v.iter().enumerate() {
            put(r, t, x);
        }
    }
}

/// [`amx_matmul`] for a few groups of sixteen AMX-staged rows `w` against the
/// activation rows `act_rows` (a task of `matmul_multi`): `put(row, t, value)`.
#[cfg(target_arch = "x86_64")]
fn amx_rows<B: amx::q8_0::AmxWeight>(
    w: &[B],
    nb: usize,
    acts: &Acts,
    act_rows: &[usize],
    mut put: impl FnMut(usize, usize, f32),
) {
    const R: usize = panel::PANEL_ROWS;
    let m = act_rows.len();
    if m <= AMX_VNNI_MAX_ROWS {
        amx_vnni_rows(w, nb, acts, act_rows, put);
        return;
    }
    if !amx::available() {
        amx_panel_rows(w, nb, acts, act_rows, put);
        return;
    }
    let Acts::Q8_0 { blocks, scales, .. } = acts else {
        unreachable!("Q8_0 and Q5_0 weights take Q8_0 activations");
    };
    let a = amx::q8_0::AmxActs::new(blocks, scales, act_rows, nb);
    // The Q5_0 panels' widening buffer (Q8_0 panels are read in place).
    let mut dec = Vec::new();
    let mut res = vec![0f32; m * R];
    let at = amx::q8_0::Strides { t: R, r: 1 };
    for (g, rows) in w.chunks_exact(R * nb).enumerate() {
        let panel = match B::as_q8_0(rows) {
            Some(q) => q,
            None => {
                dec.resize(R * nb, BlockQ8_0 { d: 0, qs: [0; 32] });
                // SAFETY: as in `amx_matmul`.
                unsafe { amx::q8_0::widen(rows, &mut dec) };
                &dec[..]
            }
        };
        // SAFETY: as in `amx_matmul`.
        unsafe { amx::q8_0::rows16(panel, &a, &mut res, at, Ahead::NONE, Ahead::NONE) };
        for (t, v) in res.chunks_exact(R).enumerate() {
            for (r, &x) in v.iter().enumerate() {
                put(g * R + r, t, x);
            }
        }
    }
}

/// [`amx_rows`] where this process cannot run the tiles: each group of sixteen rows
/// decoded into a panel and multiplied in llama.cpp's AMX order on AVX-512 VNNI
/// ([`AmxOrder`]).
#[cfg(target_arch = "x86_64")]
fn amx_panel_rows<B: q0::vnni::Q0Pair>(
    w: &[B],
    nb: usize,
    acts: &Acts,
    act_rows: &[usize],
    put: impl FnMut(usize, usize, f32),
) {
    const R: usize = panel::PANEL_ROWS;
    let groups = w.len() / (R * nb).max(1);
    amx_panels_apply::<B>(groups, nb, acts, act_rows, put, |g, d| {
        q0::panel::q0_decode(&w[g * R * nb..(g + 1) * R * nb], nb, R, 0, d)
    });
}

/// Q8_0 or Q5_0 weights repacked in 16-row groups and staged for the AMX orders where
/// the process cannot run the tiles ([`WeightRows::Q8_0x16Amx`] /
/// [`WeightRows::Q5_0x16Amx`]) against the activation rows `act_rows` (a task's rows, or
/// a task of `matmul_multi`), in llama.cpp's AMX order on AVX-512 VNNI for any number
/// of rows: `put(row, t, value)`. Up to [`AMX_VNNI_MAX_ROWS`] rows stream each group
/// once (`q0::x16::dot_group_amx`), more decode it into a panel first.
#[cfg(target_arch = "x86_64")]
fn amx_x16_rows(
    w: WeightRows<'_>,
    nb: usize,
    acts: &Acts,
    act_rows: &[usize],
    put: impl FnMut(usize, usize, f32),
) {
    fn run<G: q0::x16::Q0Group>(
        g: &[G],
        nb: usize,
        acts: &Acts,
        act_rows: &[usize],
        mut put: impl FnMut(usize, usize, f32),
    ) where
        G::Row: q0::vnni::Q0Pair,
    {
        const R: usize = panel::PANEL_ROWS;
        let groups = g.len() / nb.max(1);
        let m = act_rows.len();
        if m > AMX_VNNI_MAX_ROWS {
            amx_panels_apply::<G::Row>(groups, nb, acts, act_rows, put, |p, d| {
                q0::panel::q0_decode_x16(g, nb, p, d)
            });
            return;
        }
        let offs = amx_offsets::<G::Row>(acts, act_rows, nb);
        let sides = amx_sides(acts, act_rows, nb, &offs);
        for (p, x) in g.chunks_exact(nb).enumerate().take(groups) {
            let mut o = [[0f32; R]; AMX_VNNI_MAX_ROWS];
            // SAFETY (each call): weights are staged for AMX only at the AVX-512 VNNI
            // level, checked against the CPU at device open.
            unsafe {
                match m {
                    1 => {
                        let mut o1 = [[0f32; R]; 1];
                        q0::x16::dot_group_amx(x, [sides[0]], &mut o1);
                        o[0] = o1[0];
                    }
                    2 => {
                        let mut o2 = [[0f32; R]; 2];
                        q0::x16::dot_group_amx(x, [sides[0], sides[1]], &mut o2);
                        o[..2].copy_from_slice(&o2);
                    }
                    3 => {
                        let mut o3 = [[0f32; R]; 3];
                        q0::x16::dot_group_amx(x, [sides[0], sides[1], sides[2]], &mut o3);
                        o[..3].copy_from_slice(&o3);
                    }
                    _ => {
                        q0::x16::dot_group_amx(x, [sides[0], sides[1], sides[2], sides[3]], &mut o)
                    }
                }
            }
            for (t, v) in o.iter().enumerate().take(m) {
                for (r, &x) in v.iter().enumerate() {
                    put(p * R + r, t, x);
                }
            }
        }
    }
    match w {
        WeightRows::Q8_0x16Amx(g) => run(g, nb, acts, act_rows, put),
        WeightRows::Q5_0x16Amx(g) => run(g, nb, acts, act_rows, put),
        _ => unreachable!("amx_x16_rows: a weight not staged for AMX in 16-row groups"),
    }
}

/// `groups` panels of sixteen weight rows (`decode(p, buffer)` decodes panel `p`)
/// against the activation rows `act_rows` of `acts`, in llama.cpp's AMX order
/// ([`AmxOrder`]): `put(row, t, value)`.
#[cfg(target_arch = "x86_64")]
fn amx_panels_apply<B: q0::vnni::Q0Pair>(
    groups: usize,
    nb: usize,
    acts: &Acts,
    act_rows: &[usize],
    mut put: impl FnMut(usize, usize, f32),
    mut decode: impl FnMut(usize, &mut [q0::panel::PanelBlock]),
) {
    const R: usize = panel::PANEL_ROWS;
    let m = act_rows.len();
    let offs = amx_offsets::<B>(acts, act_rows, nb);
    let sides = amx_sides(acts, act_rows, nb, &offs);
    let mut dec = vec![q0::panel::PanelBlock::ZERO; nb];
    let mut res = vec![0f32; m * R];
    let cols = panel::OutCols { stride: R, c0: 0 };
    for p in 0..groups {
        decode(p, &mut dec);
        q0::panel::q0_gemm::<AmxOrder>(&dec, nb, R, &sides, &mut res, cols, Ahead::NONE);
        for (t, v) in res.chunks_exact(R).enumerate() {
            for (r, &x) in v.iter().enumerate() {
                put(p * R + r, t, x);
            }
        }
    }
}

/// The AMX order's side data ([`AmxOrder`]) of the activation rows `act_rows` for the
/// weight type `B`: per row its `nb` blocks' quant sums times minus `B`'s offset.
#[cfg(target_arch = "x86_64")]
fn amx_offsets<B: q0::vnni::Q0Pair>(acts: &Acts, act_rows: &[usize], nb: usize) -> Vec<i32> {
    act_rows
        .iter()
        .flat_map(|&t| AmxOrder::offsets::<B>(acts.q8_0_side(t, nb).2).into_owned())
        .collect()
}

/// The activation rows `act_rows` as the AMX order's kernels take them, their side data
/// from `offs` ([`amx_offsets`]).
#[cfg(target_arch = "x86_64")]
fn amx_sides<'a>(
    acts: &'a Acts,
    act_rows: &[usize],
    nb: usize,
    offs: &'a [i32],
) -> Vec<q0::panel::Side<'a, i32>> {
    act_rows
        .iter()
        .enumerate()
        .map(|(t, &r)| {
            let (q, s, _) = acts.q8_0_side(r, nb);
            (q, s, &offs[t * nb..(t + 1) * nb])
        })
        .collect()
}

/// `out` (rows of `n` outputs) split into the tasks' columns: task `c` gets columns
/// `c * width..(c + 1) * width` (fewer for the last) of every row, each task's slices
/// in row order.
#[cfg(target_arch = "x86_64")]
fn task_columns(out: &mut [f32], n: usize, width: usize) -> Vec<Vec<&mut [f32]>> {
    let tasks = n.div_ceil(width.max(1));
    let m = out.len() / n.max(1);
    let mut columns: Vec<Vec<&mut [f32]>> = (0..tasks).map(|_| Vec::with_capacity(m)).collect();
    for row in out.chunks_mut(n) {
        let mut rest = row;
        for (c, cols) in columns.iter_mut().enumerate() {
            let w = ((c + 1) * width).min(n) - c * width;
            let (mine, after) = std::mem::take(&mut rest).split_at_mut(w);
            cols.push(mine);
            rest = after;
        }
    }
    columns
}

/// Weight rows `w` (Q8_0 or Q5_0 staged for AMX, `nb` blocks each, a multiple of 16
/// rows) against the activation rows `act_rows` of `acts`, at most [`AMX_VNNI_MAX_ROWS`], in
/// llama.cpp's AMX order on AVX-512 VNNI (`amx::rows`): `put(row, t, value)` for
/// `act_rows[t]`.
#[cfg(target_arch = "x86_64")]
fn amx_vnni_rows<B: q0::vnni::Q0Pair>(
    w: &[B],
    nb: usize,
    acts: &Acts,
    act_rows: &[usize],
    put: impl FnMut(usize, usize, f32),
) {
    let side = |t: usize| acts.q8_0_side(act_rows[t], nb);
    // SAFETY (each call): weights are staged for AMX only at the AVX-512 VNNI level,
    // checked against the CPU at device open.
    unsafe {
        match act_rows.len() {
            1 => amx::rows::rows::<B, 1, STREAM_PREFETCH>(w, nb, &[side(0)], put),
            2 => amx::rows::rows::<B, 2, STREAM_PREFETCH>(w, nb, &[side(0), side(1)], put),
            3 => amx::rows::rows::<B, 3, STREAM_PREFETCH>(w, nb, &[side(0), side(1), side(2)], put),
            4 => amx::rows::rows::<B, 4, STREAM_PREFETCH>(
                w,
                nb,
                &[side(0), side(1), side(2), side(3)],
                put,
            ),
            m => unreachable!("amx_vnni_rows: {m} activation rows"),
        }
    }
}

/// Activation rows up to which a weight staged for AMX takes the VNNI kernel of
/// its order (`amx::rows`), which streams the weight as the decode row kernels do; the
/// tiles from there on.
#[cfg(target_arch = "x86_64")]
const AMX_VNNI_MAX_ROWS: usize = 4;

/// Panel `p` of the K-quant weight rows `w` (`n` rows of `nb` blocks) decoded into `d`:
/// from its row group where the weight was repacked at staging, else from `file` (the
/// rows' blocks in the file's layout).
#[cfg(target_arch = "x86_64")]
fn kq_decode_panel<B: kq_panel::KPanel>(
    w: WeightRows<'_>,
    file: Option<&[B]>,
    nb: usize,
    n: usize,
    p: usize,
    d: &mut [kq_panel::KPanelBlock],
) {
    match (w, file) {
        (WeightRows::Q4Kx16(g), _) => q4_k::panel::decode_x16(g, nb, p, d),
        (WeightRows::Q6Kx16(g), _) => q6_k::panel::decode_q6k_x16(g, nb, p, d),
        (_, Some(wb)) => kq_panel::decode(wb, nb, n, p, d),
        (_, None) => unreachable!("file bytes are taken for every unpacked layout"),
    }
}

/// The source of the panels `panels` of the `n` weight rows `w` (`nb` blocks a row), for
/// [`Ahead`]: their row groups where the weight was repacked, else their rows of `file`
/// (the rows' blocks in the file's layout, as the panels are decoded from); nothing past
/// the last panel.
#[cfg(target_arch = "x86_64")]
fn panels_ahead<B>(
    w: WeightRows<'_>,
    file: Option<&[B]>,
    nb: usize,
    n: usize,
    panels: std::ops::Range<usize>,
) -> Ahead {
    match (w, file) {
        (WeightRows::Q4Kx16(g), _) => groups_ahead(g, nb, panels),
        (WeightRows::Q6Kx16(g), _) => groups_ahead(g, nb, panels),
        (WeightRows::Q8_0x16(g), _) => groups_ahead(g, nb, panels),
        (WeightRows::Q5_0x16(g), _) => groups_ahead(g, nb, panels),
        (WeightRows::Q8_0x16Amx(g), _) => groups_ahead(g, nb, panels),
        (WeightRows::Q5_0x16Amx(g), _) => groups_ahead(g, nb, panels),
        (WeightRows::Mxfp4x16(g), _) => groups_ahead(g, nb, panels),
        (WeightRows::Q8_0Amx(w), _) => amx_panels_ahead(w, nb, panels),
        (WeightRows::Q5_0Amx(w), _) => amx_panels_ahead(w, nb, panels),
        (WeightRows::Q4KAmx(w), _) => amx_panels_ahead(w, nb, panels),
        (WeightRows::Q6KAmx(w), _) => amx_panels_ahead(w, nb, panels),
        (WeightRows::File(_), Some(wb)) => {
            let r0 = (panels.start * panel::PANEL_ROWS).min(n);
            let r1 = (panels.end * panel::PANEL_ROWS).min(n).max(r0);
            Ahead::of(&wb[r0 * nb..r1 * nb])
        }
        (WeightRows::Q3KPerm(w), _) => {
            let r0 = (panels.start * panel::PANEL_ROWS).min(n);
            let r1 = (panels.end * panel::PANEL_ROWS).min(n).max(r0);
            Ahead::of(&w[r0 * nb..r1 * nb])
        }
        (WeightRows::File(_), None) => Ahead::NONE,
    }
}

/// [`panels_ahead`] for repacked row groups `g` (`nb` blocks a group).
#[cfg(target_arch = "x86_64")]
fn groups_ahead<G>(g: &[G], nb: usize, panels: std::ops::Range<usize>) -> Ahead {
    let end = (panels.end * nb).min(g.len());
    Ahead::of(&g[(panels.start * nb).min(end)..end])
}

/// Whether an expert's `m` routed rows of a `ty` tower take [`expert_panels`] at `level`:
/// Q4_K and Q6_K for a prompt's few dozen rows an expert (from [`GEMM_MIN_ROWS`]) on
/// AVX-512 VNNI (below [`FUSED_MAX_ROWS`], where [`gemm`] would multiply
/// weight-stationary, panel by panel), and on the AVX2 and AVX-512 F levels, whose
/// eight-row panels give the row kernels' bits for any number of rows (the expert towers
/// take the dense order there); Q2_K, Q3_K, IQ4_XS and Q5_K from [`GEMM_MIN_ROWS`] at
/// every level ([`level_free_panels`]).
pub(crate) fn expert_panels_apply(level: SimdLevel, ty: GgmlType, m: usize) -> bool {
    if level_free_panels(level, ty) {
        return m >= GEMM_MIN_ROWS;
    }
    cfg!(target_arch = "x86_64")
        && matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)
        && match level {
            SimdLevel::Avx512Vnni => (GEMM_MIN_ROWS..FUSED_MAX_ROWS).contains(&m),
            SimdLevel::Avx2 | SimdLevel::Avx512 => m >= GEMM_MIN_ROWS && !expert_gemv(level, ty),
            SimdLevel::Scalar => false,
        }
}

/// The weight rows of one panel of [`expert_panels`] of `ty` at `level`: sixteen for
/// the K-quants with VNNI, else eight (no panels off x86-64: [`expert_panels_apply`]
/// never holds there).
pub(crate) fn expert_panel_rows(level: SimdLevel, ty: GgmlType) -> usize {
    #[cfg(target_arch = "x86_64")]
    {
        if level == SimdLevel::Avx512Vnni && !level_free_panels(level, ty) {
            panel::PANEL_ROWS
        } else {
            q0::panel_avx2::PANEL8_ROWS
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (level, ty);
        0
    }
}

/// The decoded panel blocks an [`expert_panels`] task keeps between its panels.
#[cfg(target_arch = "x86_64")]
#[derive(Default)]
pub(crate) struct ExpertPanelScratch {
    dec16: Vec<kq_panel::KPanelBlock>,
    dec8: Vec<kq_panel_avx2::KPanel8Block>,
}

/// One task of an expert matmul's weight-stationary gemm: panels `p0..p1` (of
/// [`expert_panel_rows`] rows) of one expert's weight rows `w` (`n` rows of `k`: Q4_K or
/// Q6_K, either layout with VNNI, the file's on the other levels; Q2_K, Q3_K, IQ4_XS or
/// Q5_K, the file's), each decoded into
/// `scratch` and applied to every row of `a` (the expert's routed rows, whole Q8_K rows)
/// in the expert tower's order, as [`gemm`] does with `expert` set. `part` is
/// `[routed row][the panels' weight rows]`. The caller runs every expert's panel tasks of
/// a call in one parallel section instead of a section (and its hand-offs) per expert
/// and weight.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn expert_panels(
    level: SimdLevel,
    ty: GgmlType,
    w: WeightRows<'_>,
    a: &[BlockQ8K],
    k: usize,
    n: usize,
    panels: std::ops::Range<usize>,
    scratch: &mut ExpertPanelScratch,
    part: &mut [f32],
) {
    let nb = k / 256;
    if nb == 0 || panels.is_empty() {
        return;
    }
    let prows = expert_panel_rows(level, ty);
    let r0 = panels.start * prows;
    let rows = (panels.end * prows).min(n) - r0;
    assert_eq!(
        part.len(),
        a.len() / nb * rows,
        "expert_panels: part length"
    );
    // The rows the panels decode from, in the file's layout, from row `base` on: the
    // whole weight's, or of a Q3_K tower arranged for the matvec, this task's rows
    // unpacked.
    let (bytes, base) = match w {
        WeightRows::Q4Kx16(_) | WeightRows::Q6Kx16(_) => (None, 0),
        WeightRows::Q3KPerm(_) => (Some(w.packed_rows(k, r0, rows).file_bytes(k)), r0),
        _ => (Some(w.file_bytes(k)), 0),
    };
    if prows == q0::panel_avx2::PANEL8_ROWS {
        let Some(bytes) = bytes else {
            unreachable!("the eight-row panels' types keep the file's layout")
        };
        let dec = &mut scratch.dec8;
        dec.resize(nb, kq_panel_avx2::KPanel8Block::ZERO);
        macro_rules! run8 {
            ($B:ty) => {{
                let wb = view::<$B>(&bytes);
                let mut arranged = Vec::new();
                // SAFETY: every level with panels has AVX2, FMA and F16C (checked against
                // the CPU at device open).
                let a = unsafe { <$B as kq_panel_avx2::KPanel8>::acts(a, &mut arranged) };
                let n_here = wb.len() / nb;
                for p in panels.clone() {
                    kq_panel_avx2::decode8(level, &wb, nb, n_here, p - base / prows, dec);
                    let c0 = p * prows - r0;
                    let live = prows.min(rows - c0);
                    let cols = panel::OutCols { stride: rows, c0 };
                    // The next panel's rows (this task's or the next one's) as they lie in
                    // memory, asked for while this one is multiplied.
                    let next = ((p + 1) * prows).min(n) * nb..((p + 2) * prows).min(n) * nb;
                    let ahead = match w {
                        WeightRows::Q3KPerm(perm) => Ahead::of(&perm[next]),
                        _ => Ahead::of(&wb[next]),
                    };
                    kq_panel_avx2::gemm8::<$B>(level, dec, nb, live, a, part, cols, ahead);
                }
            }};
        }
        match ty {
            GgmlType::Q4_K => run8!(BlockQ4K),
            GgmlType::Q6_K => run8!(BlockQ6K),
            GgmlType::Q2_K => run8!(BlockQ2K),
            GgmlType::Q3_K => run8!(BlockQ3K),
            GgmlType::IQ4_XS => run8!(BlockIQ4XS),
            GgmlType::Q5_K => run8!(BlockQ5K),
            _ => unreachable!("no eight-row panels for {ty}"),
        }
        return;
    }
    let dec = &mut scratch.dec16;
    dec.resize(nb, kq_panel::KPanelBlock::ZERO);
    macro_rules! run {
        ($B:ty) => {{
            let wb = bytes.as_ref().map(|b| view::<$B>(b));
            for p in panels.clone() {
                kq_decode_panel(w, wb.as_deref(), nb, n, p, dec);
                let c0 = p * prows - r0;
                let live = prows.min(rows - c0);
                let cols = panel::OutCols { stride: rows, c0 };
                // The next panel's rows (this task's or the next one's), asked for while
                // this one is multiplied.
                let ahead = panels_ahead(w, wb.as_deref(), nb, n, p + 1..p + 2);
                kq_panel::gemm::<$B, { kq_panel::EXPERT }>(dec, nb, live, a, 0, part, cols, ahead);
            }
        }};
    }
    match ty {
        GgmlType::Q4_K => run!(BlockQ4K),
        _ => run!(BlockQ6K),
    }
}

/// [`gemm`] for Q4_K and Q6_K on AVX-512 VNNI, strip by strip of weight rows
/// ([`gemm_strip_rows`]): the strip decoded into panels of 16 rows (`kq_panel`, in
/// parallel), then the activation rows in chunks of `rows_per_task`. In llama.cpp's
/// prompt-batch orders: bit for bit `q4_k::vnni::dot_q4k_gemm` and
/// `q6_k::vnni::dot_q6k_tiled` (the kernels of [`dot_rows`]) row by row; for an expert
/// tower (`order` [`kq_panel::EXPERT`]), Q4_K in the gemv order
/// (`q4_k::vnni::dot_q4k_gemv`, as [`expert_rows_gemv`]); for a weight on the AMX path
/// ([`kq_panel::AMX`]), llama.cpp's AMX order.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn kq_panel_gemm(
    ty: GgmlType,
    w: WeightRows<'_>,
    a: &[BlockQ8K],
    k: usize,
    n: usize,
    rows_per_task: usize,
    order: u8,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let nb = k / 256;
    if nb == 0 || n == 0 || out.is_empty() {
        return;
    }
    let per = rows_per_task.max(1);
    // The file's bytes once for every strip (borrowed unless the weight is packed in a
    // layout the panels do not read directly).
    let bytes = match w {
        WeightRows::Q4Kx16(_) | WeightRows::Q6Kx16(_) => None,
        _ => Some(w.file_bytes(k)),
    };
    if out.len() / n < FUSED_MAX_ROWS {
        macro_rules! fused {
            ($B:ty) => {{
                let wb = bytes.as_ref().map(|b| view::<$B>(b));
                let decode = |p: usize, d: &mut [kq_panel::KPanelBlock]| {
                    kq_decode_panel(w, wb.as_deref(), nb, n, p, d)
                };
                // The rows of the panel after `p`, asked for while `p` is multiplied.
                let apply = |d: &[kq_panel::KPanelBlock], live, o: &mut [f32], cols, p: usize| {
                    let ahead = panels_ahead(w, wb.as_deref(), nb, n, p + 1..p + 2);
                    match order {
                        kq_panel::EXPERT => kq_panel::gemm::<$B, { kq_panel::EXPERT }>(
                            d, nb, live, a, 0, o, cols, ahead,
                        ),
                        kq_panel::AMX => kq_panel::gemm::<$B, { kq_panel::AMX }>(
                            d, nb, live, a, 0, o, cols, ahead,
                        ),
                        _ => kq_panel::gemm::<$B, { kq_panel::DENSE }>(
                            d, nb, live, a, 0, o, cols, ahead,
                        ),
                    }
                };
                fused_gemm(n, nb, kq_panel::KPanelBlock::ZERO, decode, apply, out);
            }};
        }
        match ty {
            GgmlType::Q4_K => fused!(BlockQ4K),
            _ => fused!(BlockQ6K),
        }
        return;
    }
    let strip = gemm_strip_rows(SimdLevel::Avx512Vnni, ty, k)
        .unwrap_or(n)
        .max(1);
    for (s0, sn) in (0..n).step_by(strip).map(|s0| (s0, strip.min(n - s0))) {
        let panels = sn.div_ceil(panel::PANEL_ROWS);
        if scratch.kpanels.len() < panels * nb {
            scratch.kpanels = vec![kq_panel::KPanelBlock::ZERO; panels * nb];
        }
        let dec = &mut scratch.kpanels[..panels * nb];
        let p0 = s0 / panel::PANEL_ROWS;
        macro_rules! run {
            ($B:ty) => {{
                match (w, &bytes) {
                    (WeightRows::Q4Kx16(g), _) => dec
                        .par_chunks_mut(KQ_DECODE_PANELS * nb)
                        .enumerate()
                        .for_each(|(c, d)| {
                            let q = p0 + KQ_DECODE_PANELS * c;
                            q4_k::panel::decode_x16(g, nb, q, d);
                            // As many panels after these, asked for while these are decoded on.
                            let after = q + d.len() / nb;
                            groups_ahead(g, nb, after..after + d.len() / nb).all();
                        }),
                    (WeightRows::Q6Kx16(g), _) => dec
                        .par_chunks_mut(KQ_DECODE_PANELS * nb)
                        .enumerate()
                        .for_each(|(c, d)| {
                            let q = p0 + KQ_DECODE_PANELS * c;
                            q6_k::panel::decode_q6k_x16(g, nb, q, d);
                            // As many panels after these, asked for while these are decoded on.
                            let after = q + d.len() / nb;
                            groups_ahead(g, nb, after..after + d.len() / nb).all();
                        }),
                    (_, Some(bytes)) => {
                        let wb = view::<$B>(bytes);
                        dec.par_chunks_mut(KQ_DECODE_PANELS * nb)
                            .enumerate()
                            .for_each(|(c, d)| {
                                kq_panel::decode(&wb, nb, n, p0 + KQ_DECODE_PANELS * c, d)
                            });
                    }
                    (_, None) => unreachable!("file bytes are taken for every unpacked layout"),
                }
                let dec = &*dec;
                let cols = panel::OutCols { stride: n, c0: s0 };
                out.par_chunks_mut(per * n).enumerate().for_each(|(c, o)| {
                    let i0 = c * per;
                    match order {
                        kq_panel::EXPERT => kq_panel::gemm::<$B, { kq_panel::EXPERT }>(
                            dec,
                            nb,
                            sn,
                            a,
                            i0,
                            o,
                            cols,
                            Ahead::NONE,
                        ),
                        kq_panel::AMX => kq_panel::gemm::<$B, { kq_panel::AMX }>(
                            dec,
                            nb,
                            sn,
                            a,
                            i0,
                            o,
                            cols,
                            Ahead::NONE,
                        ),
                        _ => kq_panel::gemm::<$B, { kq_panel::DENSE }>(
                            dec,
                            nb,
                            sn,
                            a,
                            i0,
                            o,
                            cols,
                            Ahead::NONE,
                        ),
                    }
                });
            }};
        }
        match ty {
            GgmlType::Q4_K => run!(BlockQ4K),
            _ => run!(BlockQ6K),
        }
    }
}

/// The first `m` activation rows of `a` (each `nb` blocks: Q8_0 blocks, f32 scales, lane
/// sums) as the panel gemms take them, row by row.
#[cfg(target_arch = "x86_64")]
fn row_sides<'a, O>(a: q0::panel::Side<'a, O>, nb: usize, m: usize) -> Vec<q0::panel::Side<'a, O>> {
    let (blocks, scales, lanes) = a;
    (0..m)
        .map(|i| {
            let r = i * nb..(i + 1) * nb;
            (&blocks[r.clone()], &scales[r.clone()], &lanes[r])
        })
        .collect()
}

/// [`gemm`] for a legacy 32-quant type on AVX-512 VNNI in the order `O`
/// ([`TinyBlas`] by default, [`AmxOrder`] for a weight staged for AMX where the process
/// cannot run the tiles), strip by strip of weight rows ([`gemm_strip_rows`]): the strip
/// decoded into panels of 16 rows (in parallel), then the activation rows (`a`: every
/// row's Q8_0 blocks, f32 scales and `-16 x` lane sums) in chunks of `rows_per_task`;
/// below [`FUSED_MAX_ROWS`] rows, weight-stationary ([`fused_gemm`]).
#[cfg(target_arch = "x86_64")]
fn q0_gemm<B: q0::vnni::Q0Pair, O: q0::panel::Q0Order>(
    w: WeightRows<'_>,
    a: q0::vnni::Q8_0Side<'_>,
    k: usize,
    n: usize,
    rows_per_task: usize,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let nb = k / 32;
    if nb == 0 || n == 0 || out.is_empty() {
        return;
    }
    let (blocks, scales, neg16_lanes) = a;
    let offs = O::offsets::<B>(neg16_lanes);
    let m = out.len() / n;
    let sides = row_sides((blocks, scales, &offs), nb, m);
    let per = rows_per_task.max(1);
    // The file's bytes once for every strip (borrowed for a file layout).
    let bytes = match w {
        WeightRows::Q8_0x16(_) | WeightRows::Q5_0x16(_) => None,
        _ => Some(w.file_bytes(k)),
    };
    if m < FUSED_MAX_ROWS {
        let wb = bytes.as_ref().map(|b| view::<B>(b));
        let decode = |p: usize, d: &mut [q0::panel::PanelBlock]| match (w, &wb) {
            (WeightRows::Q8_0x16(g), _) => q0::panel::q0_decode_x16(g, nb, p, d),
            (WeightRows::Q5_0x16(g), _) => q0::panel::q0_decode_x16(g, nb, p, d),
            (_, Some(wb)) => q0::panel::q0_decode(wb, nb, n, p, d),
            (_, None) => unreachable!("file bytes are taken for every unpacked layout"),
        };
        // The rows of the panel after `p`, asked for while `p` is multiplied.
        let apply = |d: &[q0::panel::PanelBlock], live, o: &mut [f32], cols, p: usize| {
            let ahead = panels_ahead(w, wb.as_deref(), nb, n, p + 1..p + 2);
            q0::panel::q0_gemm::<O>(d, nb, live, &sides, o, cols, ahead)
        };
        fused_gemm(n, nb, q0::panel::PanelBlock::ZERO, decode, apply, out);
        return;
    }
    // (The legacy types' panels are the same size whatever the type.)
    let strip = gemm_strip_rows(SimdLevel::Avx512Vnni, GgmlType::Q8_0, k)
        .unwrap_or(n)
        .max(1);
    for (s0, sn) in (0..n).step_by(strip).map(|s0| (s0, strip.min(n - s0))) {
        let panels = sn.div_ceil(panel::PANEL_ROWS);
        if scratch.panels.len() < panels * nb {
            scratch.panels = vec![q0::panel::PanelBlock::ZERO; panels * nb];
        }
        let dec = &mut scratch.panels[..panels * nb];
        q0_decode_strip::<B>(w, bytes.as_deref(), nb, n, s0 / panel::PANEL_ROWS, dec);
        let dec = &*dec;
        let cols = panel::OutCols { stride: n, c0: s0 };
        out.par_chunks_mut(per * n).enumerate().for_each(|(c, o)| {
            q0::panel::q0_gemm::<O>(dec, nb, sn, &sides[c * per..], o, cols, Ahead::NONE)
        });
    }
}

/// The panels `p0..p0 + dec.len() / nb` of a legacy type's weight `w` (`n` rows of `nb`
/// blocks; `bytes`: its file bytes, for every layout but the 16-row groups) decoded on
/// the pool, the panels after them asked for while these are decoded.
#[cfg(target_arch = "x86_64")]
fn q0_decode_strip<B: q0::vnni::Q0Pair>(
    w: WeightRows<'_>,
    bytes: Option<&[u8]>,
    nb: usize,
    n: usize,
    p0: usize,
    dec: &mut [q0::panel::PanelBlock],
) {
    use rayon::prelude::*;
    fn decode_packed<G: q0::x16::Q0Group>(
        g: &[G],
        nb: usize,
        p0: usize,
        dec: &mut [q0::panel::PanelBlock],
    ) {
        dec.par_chunks_mut(Q0_DECODE_PANELS * nb)
            .enumerate()
            .for_each(|(c, d)| {
                let q = p0 + Q0_DECODE_PANELS * c;
                q0::panel::q0_decode_x16(g, nb, q, d);
                // As many panels after these, asked for while these are decoded on.
                let after = q + d.len() / nb;
                groups_ahead(g, nb, after..after + d.len() / nb).all();
            });
    }
    match (w, bytes) {
        (WeightRows::Q8_0x16(g), _) => decode_packed(g, nb, p0, dec),
        (WeightRows::Q5_0x16(g), _) => decode_packed(g, nb, p0, dec),
        (_, Some(bytes)) => {
            let wb = view::<B>(bytes);
            dec.par_chunks_mut(Q0_DECODE_PANELS * nb)
                .enumerate()
                .for_each(|(c, d)| {
                    let q = p0 + Q0_DECODE_PANELS * c;
                    q0::panel::q0_decode(&wb, nb, n, q, d);
                    // As many panels after these, asked for while these are decoded on:
                    // the file's rows lie one after another.
                    let after = q + d.len() / nb;
                    panels_ahead(w, Some(&wb[..]), nb, n, after..after + d.len() / nb).all();
                });
        }
        (_, None) => unreachable!("file bytes are taken for every unpacked layout"),
    }
}

/// A gated MLP's activation on one activation row's columns of the gate and up
/// products: `act(gate, up, out)` (`silu_mul` or `gelu_mul` on a row's slices).
pub(crate) type GluAct<'a> = dyn Fn(&[f32], &[f32], &mut [f32]) + Sync + 'a;

/// Fewest activation rows for which [`q0_glu_gemm`] serves a gated MLP (the strips of
/// [`q0_gemm`]'s prompt batches; fewer rows take the two matmuls and the activation op).
#[cfg(target_arch = "x86_64")]
pub(crate) const GLU_MIN_ROWS: usize = FUSED_MAX_ROWS;

/// Panels of each weight a task of [`q0_glu_gemm`] multiplies before it applies the
/// activation to them (256 columns: both products of 64 activation rows, 128 KiB, stay
/// in the core's L2).
#[cfg(target_arch = "x86_64")]
const GLU_GROUP_PANELS: usize = 16;

/// `out = act(gate · x, up · x)` for two legacy-type weights of the same type and shape
/// (`ws`: gate, up; `n` rows of `k`) on AVX-512 VNNI, for a prompt batch (the
/// activation rows `a`, [`FUSED_MAX_ROWS`] or more): [`q0_gemm`]'s strips, tiles and
/// order, both weights decoded strip by strip, and each task applying `act` to its
/// rows' products [`GLU_GROUP_PANELS`] panels at a time while they are in its caches (not
/// the two whole products written to memory and read back). The same bits as the two
/// matmuls and the activation op.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
pub(crate) fn q0_glu_gemm<B: q0::vnni::Q0Pair>(
    ws: [WeightRows<'_>; 2],
    a: q0::vnni::Q8_0Side<'_>,
    k: usize,
    n: usize,
    rows_per_task: usize,
    scratch: &mut GemmScratch,
    act: &GluAct<'_>,
    out: &mut [f32],
) {
    use rayon::prelude::*;
    let nb = k / 32;
    if nb == 0 || n == 0 || out.is_empty() {
        return;
    }
    let (blocks, scales, neg16_lanes) = a;
    let lanes = TinyBlas::offsets::<B>(neg16_lanes);
    let m = out.len() / n;
    let sides = row_sides((blocks, scales, &lanes), nb, m);
    let per = rows_per_task.max(1);
    let bytes = ws.map(|w| match w {
        WeightRows::Q8_0x16(_) | WeightRows::Q5_0x16(_) => None,
        _ => Some(w.file_bytes(k)),
    });
    // Two weights' panels at once: half the strip of one.
    let strip = (gemm_strip_rows(SimdLevel::Avx512Vnni, GgmlType::Q8_0, k).unwrap_or(n) / 2)
        .next_multiple_of(Q0_DECODE_PANELS * panel::PANEL_ROWS)
        .max(1);
    let group = GLU_GROUP_PANELS * panel::PANEL_ROWS;
    for (s0, sn) in (0..n).step_by(strip).map(|s0| (s0, strip.min(n - s0))) {
        let panels = sn.div_ceil(panel::PANEL_ROWS);
        for buf in [&mut scratch.panels, &mut scratch.panels_up] {
            if buf.len() < panels * nb {
                *buf = vec![q0::panel::PanelBlock::ZERO; panels * nb];
            }
        }
        let p0 = s0 / panel::PANEL_ROWS;
        let dec_g = &mut scratch.panels[..panels * nb];
        q0_decode_strip::<B>(ws[0], bytes[0].as_deref(), nb, n, p0, dec_g);
        let dec_u = &mut scratch.panels_up[..panels * nb];
        q0_decode_strip::<B>(ws[1], bytes[1].as_deref(), nb, n, p0, dec_u);
        let (dec_g, dec_u) = (
            &scratch.panels[..panels * nb],
            &scratch.panels_up[..panels * nb],
        );
        out.par_chunks_mut(per * n).enumerate().for_each(|(c, o)| {
            let rows = o.len() / n;
            let mine = &sides[c * per..];
            let mut g = vec![0f32; rows * group];
            let mut u = vec![0f32; rows * group];
            for c0 in (0..sn).step_by(group) {
                let live = group.min(sn - c0);
                let q = c0 / panel::PANEL_ROWS * nb..(c0 + live).div_ceil(panel::PANEL_ROWS) * nb;
                let cols = panel::OutCols {
                    stride: live,
                    c0: 0,
                };
                let (g, u) = (&mut g[..rows * live], &mut u[..rows * live]);
                q0::panel::q0_gemm::<TinyBlas>(
                    &dec_g[q.clone()],
                    nb,
                    live,
                    mine,
                    g,
                    cols,
                    Ahead::NONE,
                );
                q0::panel::q0_gemm::<TinyBlas>(&dec_u[q], nb, live, mine, u, cols, Ahead::NONE);
                for r in 0..rows {
                    let at = r * n + s0 + c0;
                    act(
                        &g[r * live..(r + 1) * live],
                        &u[r * live..(r + 1) * live],
                        &mut o[at..at + live],
                    );
                }
            }
        });
    }
}

/// Activation rows from which [`gemm`] decodes a legacy 32-quant weight into eight-row
/// panels without VNNI ([`q0_gemm_avx2`]): a prompt batch. Decode batches keep the row
/// kernels, which read each weight block once for up to four activation rows.
#[cfg(target_arch = "x86_64")]
const AVX2_GEMM_MIN_ROWS: usize = 64;

/// Panels per decoding task of the eight-row panels (64 rows).
#[cfg(target_arch = "x86_64")]
const Q0_DECODE_PANELS8: usize = 8;

/// [`gemm`] for a legacy 32-quant type without VNNI (the AVX2 and AVX-512 F levels),
/// strip by strip of weight rows: the strip (the file's rows `w`) decoded into panels of
/// eight rows (in parallel), then the activation rows (`a`: every row's Q8_0 blocks, f32
/// scales and `-16 x` lane sums) in chunks of `rows_per_task`.
#[cfg(target_arch = "x86_64")]
fn q0_gemm_avx2<B: q0::avx2::Avx2Q0 + flint_core::DequantBlock>(
    w: &[u8],
    a: q0::vnni::Q8_0Side<'_>,
    k: usize,
    n: usize,
    rows_per_task: usize,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) {
    use q0::panel_avx2::{q0_decode8, q0_gemm8, Panel8Block};
    let nb = k / 32;
    if nb == 0 || n == 0 || out.is_empty() {
        return;
    }
    let wb = view::<B>(w);
    let sides = row_sides(a, nb, out.len() / n);
    let strip = gemm_strip_rows(SimdLevel::Avx2, B::TYPE, k).unwrap_or(n);
    panel8_strips(
        n,
        nb,
        strip,
        rows_per_task,
        &mut scratch.panels8,
        Panel8Block::ZERO,
        |p, d| q0_decode8(&wb, nb, n, p, d),
        |dec, sn, t0, o, cols| q0_gemm8::<B>(dec, nb, sn, &sides[t0..], o, cols),
        out,
    );
}

/// [`gemm`] on the eight-row panels of `kq_panel_avx2`: Q4_K and Q6_K without VNNI (the
/// AVX2 and AVX-512 F levels; a dense matmul's orders), Q2_K, Q3_K, IQ4_XS and Q5_K at
/// every `level` ([`level_free_panels`]; their VNNI tiles where `level` has them), strip by strip
/// of weight rows as [`q0_gemm_avx2`]: the strip (the file's rows `w`) decoded into
/// panels of eight rows (in parallel), then the activation rows (`a`: every row's Q8_K
/// blocks) in chunks of `rows_per_task`.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn kq_gemm_avx2<B: kq_panel_avx2::KPanel8 + flint_core::DequantBlock>(
    level: SimdLevel,
    w: &[u8],
    a: &[BlockQ8K],
    k: usize,
    n: usize,
    rows_per_task: usize,
    scratch: &mut GemmScratch,
    out: &mut [f32],
) {
    use kq_panel_avx2::{decode8, gemm8, KPanel8Block};
    let nb = k / 256;
    if nb == 0 || n == 0 || out.is_empty() {
        return;
    }
    let wb = view::<B>(w);
    let strip = gemm_strip_rows(SimdLevel::Avx2, B::TYPE, k).unwrap_or(n);
    panel8_strips(
        n,
        nb,
        strip,
        rows_per_task,
        &mut scratch.kpanels8,
        KPanel8Block::ZERO,
        |p, d| decode8(level, &wb, nb, n, p, d),
        |dec, sn, t0, o, cols| {
            let mut arranged = Vec::new();
            let rows = &a[t0 * nb..(t0 + o.len() / n) * nb];
            // SAFETY: every level with panels has AVX2, FMA and F16C (checked against the
            // CPU at device open).
            let y = unsafe { B::acts(rows, &mut arranged) };
            gemm8::<B>(level, dec, nb, sn, y, o, cols, Ahead::NONE)
        },
        out,
    );
}

/// The strips of an eight-row panel gemm without VNNI ([`q0_gemm_avx2`],
/// [`kq_gemm_avx2`]): per strip of `strip` of the `n` weight rows ([`gemm_strip_rows`];
/// its panels of `nb` blocks held in `scratch`), its panels
/// decoded in parallel (`decode(first panel, blocks)`, eight panels a task), then the
/// activation rows in chunks of `rows_per_task` in parallel (`apply(the strip's panels,
/// its rows, the chunk's first activation row, the chunk's output rows, their columns)`).
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
fn panel8_strips<D: Copy + Send + Sync>(
    n: usize,
    nb: usize,
    strip: usize,
    rows_per_task: usize,
    scratch: &mut Vec<D>,
    zero: D,
    decode: impl Fn(usize, &mut [D]) + Sync,
    apply: impl Fn(&[D], usize, usize, &mut [f32], panel::OutCols) + Sync,
    out: &mut [f32],
) {
    use q0::panel_avx2::PANEL8_ROWS;
    use rayon::prelude::*;
    let per = rows_per_task.max(1);
    let strip = strip.max(PANEL8_ROWS);
    assert!(
        strip.is_multiple_of(PANEL8_ROWS),
        "panel8_strips: strip of whole panels"
    );
    for (s0, sn) in (0..n).step_by(strip).map(|s0| (s0, strip.min(n - s0))) {
        let panels = sn.div_ceil(PANEL8_ROWS);
        if scratch.len() < panels * nb {
            *scratch = vec![zero; panels * nb];
        }
        let dec = &mut scratch[..panels * nb];
        let p0 = s0 / PANEL8_ROWS;
        dec.par_chunks_mut(Q0_DECODE_PANELS8 * nb)
            .enumerate()
            .for_each(|(c, d)| decode(p0 + Q0_DECODE_PANELS8 * c, d));
        let dec = &*dec;
        let cols = panel::OutCols { stride: n, c0: s0 };
        out.par_chunks_mut(per * n)
            .enumerate()
            .for_each(|(c, o)| apply(dec, sn, c * per, o, cols));
    }
}

/// Bytes ahead of each weight stream that the decode kernels prefetch: the hardware
/// prefetcher alone does not keep several concurrent weight streams fed, and 1024 bytes
/// ahead gives a Gemma 3 decode step its shortest time (farther ahead, the prefetched
/// lines start to be evicted before use).
#[cfg(target_arch = "x86_64")]
const STREAM_PREFETCH: usize = 1024;

/// Whether [`rows_small_batch`] has a kernel for `ty` at `level`.
pub(crate) fn has_small_batch_kernel(level: SimdLevel, ty: GgmlType) -> bool {
    if ty == GgmlType::MXFP4 {
        return native_kernel(level, ty).is_some();
    }
    let legacy = matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0);
    cfg!(target_arch = "x86_64")
        && ((level == SimdLevel::Avx512Vnni
            && (legacy || matches!(ty, GgmlType::Q4_K | GgmlType::Q6_K)))
            || (level == SimdLevel::Avx2 && legacy)
            || (native_kernel(level, ty) == Some(SimdLevel::Avx2) && ty == GgmlType::Q4_K))
}

/// The rows of a weight as a kernel reads them: the file's bytes, or MXFP4 / Q4_K / Q6_K / Q8_0
/// / Q5_0 rows repacked at staging (`{mxfp4, q4_k, q6_k, q0}::x16`: whole 16-row groups).
#[derive(Clone, Copy, Debug)]
pub(crate) enum WeightRows<'a> {
    /// Whole rows in the GGUF block layout.
    File(&'a [u8]),
    /// Whole 16-row groups of Q4_K blocks, repacked.
    Q4Kx16(&'a [q4_k::x16::BlockQ4Kx16]),
    /// Whole 16-row groups of Q6_K blocks, repacked.
    Q6Kx16(&'a [q6_k::x16::BlockQ6Kx16]),
    /// Whole 16-row groups of Q8_0 blocks, repacked.
    Q8_0x16(&'a [q0::x16::BlockQ8_0x16]),
    /// Whole 16-row groups of Q5_0 blocks, repacked.
    Q5_0x16(&'a [q0::x16::BlockQ5_0x16]),
    /// Whole 16-row groups of MXFP4 blocks, repacked.
    Mxfp4x16(&'a [mxfp4::x16::BlockMxfp4x16]),
    /// Whole rows of Q3_K blocks arranged for the VBMI matvec (`q3_k::perm`), any number
    /// of rows.
    Q3KPerm(&'a [q3_k::perm::BlockQ3KPerm]),
    /// Whole rows of Q8_0 blocks in the file's layout, a multiple of 16 rows, multiplied
    /// on AMX in llama.cpp's AMX order (`amx::q8_0`) whatever the number of activation
    /// rows: the device took AMX for this weight at staging.
    Q8_0Amx(&'a [BlockQ8_0]),
    /// Whole rows of Q5_0 blocks in the file's layout, a multiple of 16 rows, in the same
    /// order as [`WeightRows::Q8_0Amx`] (widened to Q8_0 blocks for the tiles).
    Q5_0Amx(&'a [BlockQ5_0]),
    /// Whole rows of Q4_K blocks in the file's layout, a multiple of 16 rows, in
    /// llama.cpp's AMX order for Q4_K ([`KAmx`]) whatever the number of activation
    /// rows.
    Q4KAmx(&'a [BlockQ4K]),
    /// The same for Q6_K.
    Q6KAmx(&'a [BlockQ6K]),
    /// Whole 16-row groups of Q8_0 blocks, repacked ([`WeightRows::Q8_0x16`]), multiplied
    /// in llama.cpp's AMX order on AVX-512 VNNI whatever the number of activation rows
    /// ([`AmxOrder`]): the device took the AMX orders for this weight at staging where the
    /// process cannot run AMX tiles.
    Q8_0x16Amx(&'a [q0::x16::BlockQ8_0x16]),
    /// The same for Q5_0 (Q8_0's AMX order).
    Q5_0x16Amx(&'a [q0::x16::BlockQ5_0x16]),
}

impl<'a> WeightRows<'a> {
    /// Whether the rows are repacked.
    pub(crate) fn is_packed(self) -> bool {
        !matches!(self, WeightRows::File(_))
    }

    /// Blocks per row of `k` elements in this layout (file bytes: 0, never used).
    pub(crate) fn blocks_per_row(self, k: usize) -> usize {
        match self {
            WeightRows::File(_) => 0,
            WeightRows::Q4Kx16(_)
            | WeightRows::Q6Kx16(_)
            | WeightRows::Q3KPerm(_)
            | WeightRows::Q4KAmx(_)
            | WeightRows::Q6KAmx(_) => k / 256,
            WeightRows::Q8_0x16(_)
            | WeightRows::Q5_0x16(_)
            | WeightRows::Mxfp4x16(_)
            | WeightRows::Q8_0Amx(_)
            | WeightRows::Q5_0Amx(_)
            | WeightRows::Q8_0x16Amx(_)
            | WeightRows::Q5_0x16Amx(_) => k / 32,
        }
    }

    /// Rows `o0..o0 + rows` (multiples of 16 but for [`WeightRows::Q3KPerm`]) of
    /// repacked rows of `k` elements each; file bytes are returned as they are.
    pub(crate) fn packed_rows(self, k: usize, o0: usize, rows: usize) -> Self {
        let nb = self.blocks_per_row(k);
        let r = o0 / x16::X16_ROWS * nb..(o0 + rows) / x16::X16_ROWS * nb;
        match self {
            WeightRows::File(_) => self,
            WeightRows::Q4Kx16(g) => WeightRows::Q4Kx16(&g[r]),
            WeightRows::Q6Kx16(g) => WeightRows::Q6Kx16(&g[r]),
            WeightRows::Q8_0x16(g) => WeightRows::Q8_0x16(&g[r]),
            WeightRows::Q5_0x16(g) => WeightRows::Q5_0x16(&g[r]),
            WeightRows::Q8_0x16Amx(g) => WeightRows::Q8_0x16Amx(&g[r]),
            WeightRows::Q5_0x16Amx(g) => WeightRows::Q5_0x16Amx(&g[r]),
            WeightRows::Mxfp4x16(g) => WeightRows::Mxfp4x16(&g[r]),
            WeightRows::Q3KPerm(w) => WeightRows::Q3KPerm(&w[o0 * nb..(o0 + rows) * nb]),
            WeightRows::Q8_0Amx(w) => WeightRows::Q8_0Amx(&w[o0 * nb..(o0 + rows) * nb]),
            WeightRows::Q5_0Amx(w) => WeightRows::Q5_0Amx(&w[o0 * nb..(o0 + rows) * nb]),
            WeightRows::Q4KAmx(w) => WeightRows::Q4KAmx(&w[o0 * nb..(o0 + rows) * nb]),
            WeightRows::Q6KAmx(w) => WeightRows::Q6KAmx(&w[o0 * nb..(o0 + rows) * nb]),
        }
    }

    /// Row `r` of these rows (of `k` elements; for a repacked layout, of its one row
    /// group) back in the file's layout, as bytes; `None` for file bytes.
    pub(crate) fn packed_row_bytes(self, k: usize, r: usize) -> Option<Vec<u8>> {
        let nb = self.blocks_per_row(k);
        match self {
            WeightRows::File(_) => None,
            WeightRows::Q3KPerm(w) => Some(q3_k::perm::unpack_bytes(&w[r * nb..(r + 1) * nb])),
            WeightRows::Q4Kx16(g) => Some(x16::unpack_row_bytes(g, r)),
            WeightRows::Q6Kx16(g) => Some(x16::unpack_row_bytes(g, r)),
            WeightRows::Q8_0x16(g) => Some(x16::unpack_row_bytes(g, r)),
            WeightRows::Q5_0x16(g) => Some(x16::unpack_row_bytes(g, r)),
            WeightRows::Q8_0x16Amx(g) => Some(x16::unpack_row_bytes(g, r)),
            WeightRows::Q5_0x16Amx(g) => Some(x16::unpack_row_bytes(g, r)),
            WeightRows::Mxfp4x16(g) => Some(x16::unpack_row_bytes(g, r)),
            WeightRows::Q8_0Amx(w) => Some(bytemuck::cast_slice(&w[r * nb..(r + 1) * nb]).to_vec()),
            WeightRows::Q5_0Amx(w) => Some(bytemuck::cast_slice(&w[r * nb..(r + 1) * nb]).to_vec()),
            WeightRows::Q4KAmx(w) => Some(bytemuck::cast_slice(&w[r * nb..(r + 1) * nb]).to_vec()),
            WeightRows::Q6KAmx(w) => Some(bytemuck::cast_slice(&w[r * nb..(r + 1) * nb]).to_vec()),
        }
    }

    /// The rows in the file's layout (`k` elements per row): borrowed, or unpacked into a
    /// new buffer (the rare paths without a kernel for the packed layout).
    pub(crate) fn file_bytes(self, k: usize) -> Cow<'a, [u8]> {
        let nb = self.blocks_per_row(k);
        match self {
            WeightRows::File(w) => Cow::Borrowed(w),
            WeightRows::Q4Kx16(g) => Cow::Owned(x16::unpack_all(g, nb)),
            WeightRows::Q6Kx16(g) => Cow::Owned(x16::unpack_all(g, nb)),
            WeightRows::Q8_0x16(g) => Cow::Owned(x16::unpack_all(g, nb)),
            WeightRows::Q5_0x16(g) => Cow::Owned(x16::unpack_all(g, nb)),
            WeightRows::Q8_0x16Amx(g) => Cow::Owned(x16::unpack_all(g, nb)),
            WeightRows::Q5_0x16Amx(g) => Cow::Owned(x16::unpack_all(g, nb)),
            WeightRows::Mxfp4x16(g) => Cow::Owned(x16::unpack_all(g, nb)),
            WeightRows::Q3KPerm(w) => Cow::Owned(q3_k::perm::unpack_bytes(w)),
            WeightRows::Q8_0Amx(w) => Cow::Borrowed(bytemuck::cast_slice(w)),
            WeightRows::Q5_0Amx(w) => Cow::Borrowed(bytemuck::cast_slice(w)),
            WeightRows::Q4KAmx(w) => Cow::Borrowed(bytemuck::cast_slice(w)),
            WeightRows::Q6KAmx(w) => Cow::Borrowed(bytemuck::cast_slice(w)),
        }
    }
}

/// Repacked weight rows (`q4_k::x16` / `q6_k::x16` / `q0::x16`: whole 16-row groups of `k`
/// elements per row) against the activation rows `act_rows` of `acts` (Q8_K for the
/// K-quants, Q8_0 for Q8_0 and Q5_0), into `out_t` as `[weight row][act_rows.len()]`:
/// the decode matmuls of a weight repacked at staging. Each packed block is read once
/// for up to four activation rows.
#[cfg(target_arch = "x86_64")]
pub(crate) fn x16_rows(
    w: WeightRows<'_>,
    k: usize,
    acts: &Acts,
    act_rows: &[usize],
    out_t: &mut [f32],
) -> Result<(), FormatError> {
    x16_rows_in(w, k, acts, act_rows, out_t, false)
}

/// [`x16_rows`], Q4_K in the gemv order where `q4k_gemv` (expert towers,
/// [`expert_rows_gemv`]).
#[cfg(target_arch = "x86_64")]
fn x16_rows_in(
    w: WeightRows<'_>,
    k: usize,
    acts: &Acts,
    act_rows: &[usize],
    out_t: &mut [f32],
    q4k_gemv: bool,
) -> Result<(), FormatError> {
    use x16::X16_ROWS;
    let nb = w.blocks_per_row(k);
    let m = act_rows.len();
    let put = |o: &[[f32; X16_ROWS]], g: usize, t0: usize, out_t: &mut [f32]| {
        if m == 1 {
            // A decode row: the sixteen outputs are consecutive.
            out_t[g * X16_ROWS..(g + 1) * X16_ROWS].copy_from_slice(&o[0]);
            return;
        }
        for (a, col) in o.iter().enumerate() {
            for (r, &v) in col.iter().enumerate() {
                out_t[(g * X16_ROWS + r) * m + t0 + a] = v;
            }
        }
    };
    // Every group against the activation rows (`y(t)`: row `act_rows[t]` as the kernel
    // takes it) in tiles of up to four.
    macro_rules! run {
        ($groups:expr, $kernel:path, $y:expr) => {{
            let (groups, y) = ($groups, $y);
            let n_groups = groups.len() / nb.max(1);
            assert_eq!(out_t.len(), n_groups * X16_ROWS * m, "x16_rows: out length");
            for g in 0..n_groups {
                let x = &groups[g * nb..(g + 1) * nb];
                let mut t0 = 0;
                while t0 < m {
                    let c = (m - t0).min(4);
                    // SAFETY (each call): weights are packed only at the AVX-512 VNNI
                    // level, which was checked against the CPU's features at device open.
                    match c {
                        4 => {
                            let mut o = [[0f32; X16_ROWS]; 4];
                            unsafe { $kernel(x, std::array::from_fn(|i| y(t0 + i)), &mut o) };
                            put(&o, g, t0, out_t);
                        }
                        3 => {
                            let mut o = [[0f32; X16_ROWS]; 3];
                            unsafe { $kernel(x, std::array::from_fn(|i| y(t0 + i)), &mut o) };
                            put(&o, g, t0, out_t);
                        }
                        2 => {
                            let mut o = [[0f32; X16_ROWS]; 2];
                            unsafe { $kernel(x, std::array::from_fn(|i| y(t0 + i)), &mut o) };
                            put(&o, g, t0, out_t);
                        }
                        _ => {
                            let mut o = [[0f32; X16_ROWS]; 1];
                            unsafe { $kernel(x, [y(t0)], &mut o) };
                            put(&o, g, t0, out_t);
                        }
                    }
                    t0 += c;
                }
            }
        }};
    }
    match (w, acts) {
        (WeightRows::Q4Kx16(g), Acts::Q8K(a)) => {
            let y = |t: usize| &a[act_rows[t] * nb..(act_rows[t] + 1) * nb];
            if q4k_gemv {
                run!(g, q4_k::x16::dot_group_gemv, y)
            } else {
                run!(g, q4_k::x16::dot_group, y)
            }
        }
        // Q6_K takes its activation rows in pairs inside each block (`q6_k::x16::dot_group`).
        (WeightRows::Q6Kx16(g), Acts::Q8K(a)) => {
            let y = |t: usize| &a[act_rows[t] * nb..(act_rows[t] + 1) * nb];
            run!(g, q6_k::x16::dot_group, y)
        }
        (WeightRows::Q8_0x16(g), Acts::Q8_0 { .. }) => {
            let scaled: Vec<_> = act_rows
                .iter()
                .map(|&r| TinyBlas::offsets::<BlockQ8_0>(acts.q8_0_side(r, nb).2))
                .collect();
            let y = |t: usize| {
                let (q, s, _) = acts.q8_0_side(act_rows[t], nb);
                (q, s, &scaled[t][..])
            };
            run!(g, q0::x16::dot_group, y)
        }
        // Q5_0's offset is 16: the `-16 x` lane sums as they are.
        (WeightRows::Q5_0x16(g), Acts::Q8_0 { .. }) => {
            let y = |t: usize| acts.q8_0_side(act_rows[t], nb);
            run!(g, q0::x16::dot_group, y)
        }
        // MXFP4 starts each block's sum from -12 times its activation quant sum (the
        // code book's bias, `mxfp4::x16`).
        (WeightRows::Mxfp4x16(g), Acts::Q8_0 { .. }) => {
            let biases: Vec<Vec<i32>> = act_rows
                .iter()
                .map(|&r| mxfp4::x16::bias(acts.q8_0_side(r, nb).2))
                .collect();
            let y = |t: usize| {
                let (q, s, _) = acts.q8_0_side(act_rows[t], nb);
                (q, s, &biases[t][..])
            };
            run!(g, mxfp4::x16::dot_group, y)
        }
        // Q3_K arranged for the VBMI matvec: its four-row kernel per activation row (the
        // order of every Q3_K path), the row arranged once for the chunk.
        (WeightRows::Q3KPerm(w), Acts::Q8K(a)) => {
            let rows = w.len() / nb.max(1);
            assert_eq!(out_t.len(), rows * m, "x16_rows: out length");
            let mut col = vec![0f32; if m == 1 { 0 } else { rows }];
            for (t, &r) in act_rows.iter().enumerate() {
                let y = &a[r * nb..(r + 1) * nb];
                let dst = if m == 1 { &mut *out_t } else { &mut col[..] };
                rows4_arranged(
                    w,
                    y,
                    dst,
                    q3_k::vnni::arrange_perm,
                    q3_k::vnni::dot_q3k_rows4_perm,
                    q3_k::vnni::dot_q3k_row_perm,
                );
                if m > 1 {
                    for (o, &v) in col.iter().enumerate() {
                        out_t[o * m + t] = v;
                    }
                }
            }
        }
        (WeightRows::Q3KPerm(_), _) => return Err(FormatError::Unsupported(GgmlType::Q3_K)),
        (WeightRows::Q8_0Amx(w), Acts::Q8_0 { .. }) => {
            amx_rows(w, nb, acts, act_rows, |r, t, v| out_t[r * m + t] = v)
        }
        (WeightRows::Q5_0Amx(w), Acts::Q8_0 { .. }) => {
            amx_rows(w, nb, acts, act_rows, |r, t, v| out_t[r * m + t] = v)
        }
        (WeightRows::Q8_0x16Amx(_) | WeightRows::Q5_0x16Amx(_), Acts::Q8_0 { .. }) => {
            amx_x16_rows(w, nb, acts, act_rows, |r, t, v| out_t[r * m + t] = v)
        }
        (WeightRows::Q4KAmx(w), Acts::Q8K(_)) => {
            amx_kq_rows(w, nb, acts, act_rows, |r, t, v| out_t[r * m + t] = v)
        }
        (WeightRows::Q6KAmx(w), Acts::Q8K(_)) => {
            amx_kq_rows(w, nb, acts, act_rows, |r, t, v| out_t[r * m + t] = v)
        }
        (WeightRows::Q6KAmx(_), _) => return Err(FormatError::Unsupported(GgmlType::Q6_K)),
        (WeightRows::Q8_0Amx(_), _) => return Err(FormatError::Unsupported(GgmlType::Q8_0)),
        (WeightRows::Q5_0Amx(_), _) => return Err(FormatError::Unsupported(GgmlType::Q5_0)),
        (WeightRows::Q8_0x16Amx(_), _) => return Err(FormatError::Unsupported(GgmlType::Q8_0)),
        (WeightRows::Q5_0x16Amx(_), _) => return Err(FormatError::Unsupported(GgmlType::Q5_0)),
        (WeightRows::Mxfp4x16(_), _) => return Err(FormatError::Unsupported(GgmlType::MXFP4)),
        (WeightRows::Q8_0x16(_), _) => return Err(FormatError::Unsupported(GgmlType::Q8_0)),
        (WeightRows::Q5_0x16(_), _) => return Err(FormatError::Unsupported(GgmlType::Q5_0)),
        _ => return Err(FormatError::Unsupported(GgmlType::Q4_K)),
    }
    Ok(())
}

/// Whether the rows of an expert tower of `ty` take their own order at `level`
/// ([`expert_rows_gemv`]): Q4_K on AVX-512 VNNI, where the device follows llama.cpp's
/// orders and llama.cpp's `MUL_MAT_ID` computes every routed row of a repacked Q4_K
/// tower with its gemv kernel (docs/parity.md), not the gemm of a dense matmul.
pub(crate) fn expert_gemv(level: SimdLevel, ty: GgmlType) -> bool {
    cfg!(target_arch = "x86_64") && level == SimdLevel::Avx512Vnni && ty == GgmlType::Q4_K
}

/// Weight rows `w` of a Q4_K expert tower (whole rows, or whole 16-row groups when
/// repacked) against the activation rows `act_rows` of `acts`, into `out_t` as
/// `[weight row][act_rows.len()]`, every output in llama.cpp's repacked gemv order
/// (`q4_k::vnni::dot_q4k_gemv`; the same bits in either layout). Only where
/// [`expert_gemv`] holds; `Unsupported` otherwise.
pub(crate) fn expert_rows_gemv(
    level: SimdLevel,
    ty: GgmlType,
    w: WeightRows<'_>,
    k: usize,
    acts: &Acts,
    act_rows: &[usize],
    out_t: &mut [f32],
) -> Result<(), FormatError> {
    if !expert_gemv(level, ty) {
        return Err(FormatError::Unsupported(ty));
    }
    #[cfg(target_arch = "x86_64")]
    {
        let (WeightRows::File(wb), Acts::Q8K(a)) = (w, acts) else {
            return x16_rows_in(w, k, acts, act_rows, out_t, true);
        };
        let nb = k / 256;
        let m = act_rows.len();
        let row_bytes = nb * std::mem::size_of::<BlockQ4K>();
        assert_eq!(
            out_t.len() * row_bytes,
            wb.len() * m,
            "expert_rows_gemv: out length"
        );
        let y = |t: usize| &a[act_rows[t] * nb..(act_rows[t] + 1) * nb];
        if let [r] = act_rows {
            // One token for the expert (a decode step's): four weight rows at a time, as
            // `matvec_rows` goes.
            rows4(
                &view::<BlockQ4K>(wb),
                &a[r * nb..(r + 1) * nb],
                out_t,
                q4_k::vnni::dot_q4k_rows4_gemv,
                q4_k::vnni::dot_q4k_row_gemv,
            );
            return Ok(());
        }
        for (wr, o) in wb.chunks_exact(row_bytes).zip(out_t.chunks_exact_mut(m)) {
            let x = view::<BlockQ4K>(wr);
            let mut t0 = 0;
            // Up to four activation rows per pass over the weight row.
            // SAFETY (each call): `expert_gemv` holds, so the level is AVX-512 VNNI, which
            // was checked against the CPU's features at device open.
            while t0 < m {
                let c = (m - t0).min(4);
                match c {
                    4 => {
                        let mut v = [0f32; 4];
                        unsafe {
                            q4_k::vnni::dot_q4k_gemv::<4>(
                                &x,
                                &[y(t0), y(t0 + 1), y(t0 + 2), y(t0 + 3)],
                                &mut v,
                            )
                        };
                        o[t0..t0 + 4].copy_from_slice(&v);
                    }
                    3 => {
                        let mut v = [0f32; 3];
                        unsafe {
                            q4_k::vnni::dot_q4k_gemv::<3>(
                                &x,
                                &[y(t0), y(t0 + 1), y(t0 + 2)],
                                &mut v,
                            )
                        };
                        o[t0..t0 + 3].copy_from_slice(&v);
                    }
                    2 => {
                        let mut v = [0f32; 2];
                        unsafe { q4_k::vnni::dot_q4k_gemv::<2>(&x, &[y(t0), y(t0 + 1)], &mut v) };
                        o[t0..t0 + 2].copy_from_slice(&v);
                    }
                    _ => {
                        let mut v = [0f32; 1];
                        unsafe { q4_k::vnni::dot_q4k_gemv::<1>(&x, &[y(t0)], &mut v) };
                        o[t0] = v[0];
                    }
                }
                t0 += c;
            }
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let _ = (w, k, acts, act_rows, out_t);
        Err(FormatError::Unsupported(ty))
    }
}

/// [`x16_rows`] where there are no such kernels (weights are never packed there).
#[cfg(not(target_arch = "x86_64"))]
pub(crate) fn x16_rows(
    _w: WeightRows<'_>,
    _k: usize,
    _acts: &Acts,
    _act_rows: &[usize],
    _out_t: &mut [f32],
) -> Result<(), FormatError> {
    Err(FormatError::Unsupported(GgmlType::Q4_K))
}

/// Weight rows `w` (a chunk of whole rows) against every activation row `0..m` of
/// `acts`, for a few rows (the decode of several sequences), into `out_t` as
/// `[weight row][m]`: one call for the chunk, each weight block decoded once for up to
/// four activation rows. `false` (nothing written) where this level has no such kernel
/// for `ty`; the caller then goes row by row ([`dot_rows`]).
pub(crate) fn rows_small_batch(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    acts: &Acts,
    k: usize,
    m: usize,
    out_t: &mut [f32],
) -> bool {
    if ty == GgmlType::MXFP4 && k >= 32 {
        let (Some(l), Some(act)) = (native_kernel(level, ty), acts.mxfp4_act(k / 32)) else {
            return false;
        };
        mxfp4::small_batch(l, &view(w), act, m, out_t);
        return true;
    }
    // Legacy quants on VNNI; on AVX2 up to a few dozen rows (decode batches), a prompt's
    // rows taking the activation tiles of `dot_rows` there (faster for them: 422 against
    // 350-375 prompt tok/s on Gemma 3 270M).
    #[cfg(target_arch = "x86_64")]
    if matches!(acts, Acts::Q8_0 { .. })
        && k >= 32
        && (level == SimdLevel::Avx512Vnni || (level == SimdLevel::Avx2 && m < FUSED_MAX_ROWS))
    {
        let nb = k / 32;
        fn run<B: q0::avx2::Avx2Q0>(
            level: SimdLevel,
            w: &[B],
            nb: usize,
            acts: &Acts,
            m: usize,
            out_t: &mut [f32],
        ) {
            let k = if level == SimdLevel::Avx512Vnni {
                q0_rows_vnni()
            } else {
                q0_rows_avx2()
            };
            q0_small_batch(w, nb, acts, m, out_t, k)
        }
        match ty {
            GgmlType::Q8_0 => run(level, &view::<BlockQ8_0>(w), nb, acts, m, out_t),
            GgmlType::Q5_0 => run(level, &view::<BlockQ5_0>(w), nb, acts, m, out_t),
            GgmlType::Q4_0 => run(level, &view::<BlockQ4_0>(w), nb, acts, m, out_t),
            _ => return false,
        }
        return true;
    }
    #[cfg(target_arch = "x86_64")]
    if let (Some(SimdLevel::Avx2), Acts::Q8K(a), GgmlType::Q4_K) =
        (native_kernel(level, ty), acts, ty)
    {
        if k >= 256 {
            q4k_small_batch_avx2(&view::<BlockQ4K>(w), k / 256, &a[..m * (k / 256)], m, out_t);
            return true;
        }
    }
    #[cfg(target_arch = "x86_64")]
    if let (SimdLevel::Avx512Vnni, Acts::Q8K(a)) = (level, acts) {
        if k >= 256 {
            // The tile kernels of `dot_rows`, called here for every row of the chunk
            // without a dispatch per weight row (a K-quant row of a 1024-wide matrix is
            // four blocks: the dispatch cost as much as the row).
            let nbk = k / 256;
            macro_rules! rows_tiled {
                ($($f:ident)::+, $B:ty, $w:expr, $out:expr) => {{
                    let wb = view::<$B>($w);
                    for (x, o) in wb.chunks_exact(nbk).zip($out.chunks_exact_mut(m)) {
                        let mut a0 = 0;
                        while a0 < m {
                            let len = (m - a0).min(TILE);
                            let idx: [usize; TILE] = std::array::from_fn(|t| a0 + t);
                            let rows = &idx[..len];
                            let dst = &mut o[a0..a0 + len];
                            tiled!($($f)::+, x, a, nbk, rows, dst);
                            a0 += len;
                        }
                    }
                }};
            }
            let a = &a[..m * nbk];
            // Four weight rows a quarter of the chunk apart against up to four activation
            // rows at a time (each weight block decoded once for them all), the last
            // `n % 4` rows one by one: the same order.
            macro_rules! small_batch {
                ($B:ty, $($four:ident)::+, $($one:ident)::+) => {{
                    let done = rows4_tiles(
                        &view::<$B>(w),
                        nbk,
                        a,
                        m,
                        out_t,
                        (
                            $($four)::+::<1, false>,
                            $($four)::+::<2, false>,
                            $($four)::+::<3, false>,
                            $($four)::+::<4, false>,
                        ),
                    );
                    let rest = &w[done * nbk * size_of::<$B>()..];
                    rows_tiled!($($one)::+, $B, rest, out_t[done * m..])
                }};
            }
            match ty {
                GgmlType::Q4_K => small_batch!(
                    BlockQ4K,
                    q4_k::vnni::dot_q4k_rows4_m,
                    q4_k::vnni::dot_q4k_gemm
                ),
                GgmlType::Q6_K => small_batch!(
                    BlockQ6K,
                    q6_k::vnni::dot_q6k_rows4_m,
                    q6_k::vnni::dot_q6k_tiled
                ),
                _ => return false,
            }
            return true;
        }
    }
    let _ = (level, ty, w, acts, k, m, out_t);
    false
}

/// [`rows_small_batch`] for Q4_K without VNNI: the `m` activation rows `a` arranged once
/// ([`q4_k::avx2::Q8KPairs`]), then four weight rows a quarter of the chunk apart against
/// up to four activation rows at a time (`q4_k::avx2::dot_q4k_rows4_m`, [`rows4_tiles`]),
/// the last `n % 4` rows with the single-row tiles (`dot_q4k`): one order throughout.
#[cfg(target_arch = "x86_64")]
fn q4k_small_batch_avx2(w: &[BlockQ4K], nbk: usize, a: &[BlockQ8K], m: usize, out_t: &mut [f32]) {
    use q4_k::avx2::{dot_q4k_rows4_m, Q8KPairs};
    let mut y = Vec::with_capacity(a.len());
    Q8KPairs::arrange(a, &mut y);
    let f: Rows4M<BlockQ4K, Q8KPairs> = (
        dot_q4k_rows4_m::<1>,
        dot_q4k_rows4_m::<2>,
        dot_q4k_rows4_m::<3>,
        dot_q4k_rows4_m::<4>,
    );
    let done = rows4_tiles(w, nbk, &y, m, out_t, f);
    let all: Vec<usize> = (0..m).collect();
    for (x, o) in w[done * nbk..]
        .chunks_exact(nbk)
        .zip(out_t[done * m..].chunks_exact_mut(m))
    {
        for (rows, dst) in all.chunks(TILE).zip(o.chunks_mut(TILE)) {
            tiled!(q4_k::avx2::dot_q4k, x, a, nbk, rows, dst);
        }
    }
}

/// One of the four-weight-row kernels of `M` = 1..=4 activation rows
/// (`dot_q4k_rows4_m`, `dot_q6k_rows4_m`), by `M - 1`.
#[cfg(target_arch = "x86_64")]
type Rows4M<B, A = BlockQ8K> = (
    unsafe fn([&[B]; 4], [&[A]; 1], &mut [[f32; 4]; 1]),
    unsafe fn([&[B]; 4], [&[A]; 2], &mut [[f32; 4]; 2]),
    unsafe fn([&[B]; 4], [&[A]; 3], &mut [[f32; 4]; 3]),
    unsafe fn([&[B]; 4], [&[A]; 4], &mut [[f32; 4]; 4]),
);

/// The first `4 * (n / 4)` weight rows of `w` (`n` rows of `nbk` blocks) against the `m`
/// activation rows of `a` into `out_t` (weight-row major, `m` per row): rows `t`,
/// `q + t`, `2q + t`, `3q + t` together (`q = n / 4`: far apart, as the decode kernels
/// stream them), the activation rows four at a time. Returns the rows done.
#[cfg(target_arch = "x86_64")]
fn rows4_tiles<B, A>(
    w: &[B],
    nbk: usize,
    a: &[A],
    m: usize,
    out_t: &mut [f32],
    f: Rows4M<B, A>,
) -> usize {
    let q = w.len() / nbk / 4;
    let row = |r: usize| &w[r * nbk..(r + 1) * nbk];
    let act = |i: usize| &a[i * nbk..(i + 1) * nbk];
    for t in 0..q {
        let rows = [t, q + t, 2 * q + t, 3 * q + t];
        let x = rows.map(row);
        let mut a0 = 0;
        while a0 < m {
            let len = (m - a0).min(4);
            let mut o = [[0f32; 4]; 4];
            // SAFETY (each call): the kernels' level was checked against the CPU at
            // device open.
            unsafe {
                match len {
                    1 => {
                        let mut r = [[0f32; 4]; 1];
                        (f.0)(x, [act(a0)], &mut r);
                        o[0] = r[0];
                    }
                    2 => {
                        let mut r = [[0f32; 4]; 2];
                        (f.1)(x, [act(a0), act(a0 + 1)], &mut r);
                        o[..2].copy_from_slice(&r);
                    }
                    3 => {
                        let mut r = [[0f32; 4]; 3];
                        (f.2)(x, [act(a0), act(a0 + 1), act(a0 + 2)], &mut r);
                        o[..3].copy_from_slice(&r);
                    }
                    _ => (f.3)(x, [act(a0), act(a0 + 1), act(a0 + 2), act(a0 + 3)], &mut o),
                }
            }
            for (j, oj) in o[..len].iter().enumerate() {
                for (s, &r) in rows.iter().enumerate() {
                    out_t[r * m + a0 + j] = oj[s];
                }
            }
            a0 += len;
        }
    }
    4 * q
}

/// The row kernels of a legacy 32-quant type for `A` = 1..=4 activation rows, by `A - 1`
/// (`q0::vnni::q0_rows` / `q0_rows_pairs`, `q0::avx2::q0_rows`): weight rows `w` of `nb`
/// blocks against the rows' side data into `out[row * stride + a]`.
#[cfg(target_arch = "x86_64")]
type Q0RowsA<B> = (
    unsafe fn(&[B], usize, &[q0::vnni::Q8_0Side<'_>; 1], &mut [f32], usize),
    unsafe fn(&[B], usize, &[q0::vnni::Q8_0Side<'_>; 2], &mut [f32], usize),
    unsafe fn(&[B], usize, &[q0::vnni::Q8_0Side<'_>; 3], &mut [f32], usize),
    unsafe fn(&[B], usize, &[q0::vnni::Q8_0Side<'_>; 4], &mut [f32], usize),
);

/// The VNNI level's [`Q0RowsA`]: from two activation rows, pairs of weight rows in the
/// halves of 512-bit registers, three pairs per activation block (more independent
/// chains per loaded activation); one row: 256-bit, where the 512-bit form gains nothing.
#[cfg(target_arch = "x86_64")]
fn q0_rows_vnni<B: q0::vnni::Q0Pair>() -> Q0RowsA<B> {
    (
        q0::vnni::q0_rows::<B, 2, 1, STREAM_PREFETCH>,
        q0::vnni::q0_rows_pairs::<B, 3, 2, STREAM_PREFETCH>,
        q0::vnni::q0_rows_pairs::<B, 3, 3, STREAM_PREFETCH>,
        q0::vnni::q0_rows_pairs::<B, 3, 4, STREAM_PREFETCH>,
    )
}

/// The AVX2 level's [`Q0RowsA`]: four far-apart weight rows against one activation row,
/// two against two to four (the sixteen vector registers hold no more chains).
#[cfg(target_arch = "x86_64")]
fn q0_rows_avx2<B: q0::avx2::Avx2Q0>() -> Q0RowsA<B> {
    (
        q0::avx2::q0_rows::<B, 4, 1, STREAM_PREFETCH>,
        q0::avx2::q0_rows::<B, 2, 2, STREAM_PREFETCH>,
        q0::avx2::q0_rows::<B, 2, 3, STREAM_PREFETCH>,
        q0::avx2::q0_rows::<B, 2, 4, STREAM_PREFETCH>,
    )
}

/// [`rows_small_batch`] for a legacy 32-quant type: the row kernels `k` with the
/// activation rows four at a time; with more than four activation rows, the weight rows
/// in blocks of 64 so that each block stays in cache while every group passes over it.
/// `k` must be one of the CPU's levels (checked at device open).
#[cfg(target_arch = "x86_64")]
fn q0_small_batch<B>(w: &[B], nb: usize, acts: &Acts, m: usize, out_t: &mut [f32], k: Q0RowsA<B>) {
    let side = |i: usize| acts.q8_0_side(i, nb);
    let rows = if m > 4 { 64 } else { (w.len() / nb).max(1) };
    for (wb, ob) in w.chunks(rows * nb).zip(out_t.chunks_mut(rows * m)) {
        let mut a0 = 0;
        while a0 < m {
            let o = &mut ob[a0..];
            // SAFETY (each call): `k`'s level was checked against the CPU at device open.
            unsafe {
                match m - a0 {
                    1 => k.0(wb, nb, &[side(a0)], o, m),
                    2 => k.1(wb, nb, &[side(a0), side(a0 + 1)], o, m),
                    3 => k.2(wb, nb, &[side(a0), side(a0 + 1), side(a0 + 2)], o, m),
                    _ => {
                        let ys = [side(a0), side(a0 + 1), side(a0 + 2), side(a0 + 3)];
                        k.3(wb, nb, &ys, o, m)
                    }
                }
            }
            a0 += (m - a0).min(4);
        }
    }
}

/// A decode of a chunk of weight rows (`out.len()` of them, each `y.len()` blocks)
/// against one activation row: four rows at a time, a quarter of the chunk apart
/// (`four`: `q4_k::vnni::dot_q4k_rows4`, `q6_k::vnni::dot_q6k_rows4`, the low-bit
/// types' `vnni::dot_*_rows4`), the last `n % 4` one by one (`one`).
#[cfg(target_arch = "x86_64")]
fn rows4<B, A>(
    w: &[B],
    y: &[A],
    out: &mut [f32],
    four: unsafe fn([&[B]; 4], &[A], &mut [f32; 4]),
    one: unsafe fn([&[B]; 1], &[A], &mut [f32; 1]),
) {
    let n = out.len();
    let nb = y.len();
    let row = |r: usize| &w[r * nb..(r + 1) * nb];
    let q = n / 4;
    for t in 0..q {
        let mut r = [0f32; 4];
        // SAFETY: the kernels' level was checked against the CPU's features at device open.
        unsafe {
            four(
                [row(t), row(q + t), row(2 * q + t), row(3 * q + t)],
                y,
                &mut r,
            )
        };
        for (s, v) in r.into_iter().enumerate() {
            out[s * q + t] = v;
        }
    }
    for t in 4 * q..n {
        let mut r = [0f32; 1];
        // SAFETY: as above.
        unsafe { one([row(t)], y, &mut r) };
        out[t] = r[0];
    }
}

/// [`rows4`] for kernels that take the activation row arranged (`arrange`, once for the
/// chunk: `q4_k::avx2::Q8KPairs`, `q3_k::avx2::Q8KLanes`, `q3_k::vnni::Q8KRunPairs`,
/// `q2_k::avx2::Q8KWords`).
#[cfg(target_arch = "x86_64")]
fn rows4_arranged<B, A>(
    w: &[B],
    y: &[BlockQ8K],
    out: &mut [f32],
    arrange: unsafe fn(&[BlockQ8K], &mut Vec<A>),
    four: unsafe fn([&[B]; 4], &[A], &mut [f32; 4]),
    one: unsafe fn([&[B]; 1], &[A], &mut [f32; 1]),
) {
    let mut ya = Vec::with_capacity(y.len());
    // SAFETY: the kernels' level was checked against the CPU's features at device open.
    unsafe { arrange(y, &mut ya) };
    rows4(w, &ya, out, four, one)
}

/// Runs the single-row kernel `$f::<1>` over every weight row of a chunk.
macro_rules! rows1 {
    // Kernels that also take the activation row's block scales as f32 (`; scales`).
    ($($f:ident)::+, $B:ty, $w:expr, $a:expr, $nb:expr, $row:expr, $out:expr; $s:expr) => {{
        let wb = view::<$B>($w);
        let nbw = wb.len() / $out.len();
        let y = &$a[$row * $nb..($row + 1) * $nb];
        let s = &$s[$row * $nb..($row + 1) * $nb];
        for (o, d) in $out.iter_mut().enumerate() {
            let mut r = [0f32; 1];
            // SAFETY: the level was checked against the CPU's features at device open.
            unsafe { $($f)::+::<1>(&wb[o * nbw..(o + 1) * nbw], &[y], &[s], &mut r) };
            *d = r[0];
        }
    }};
    ($($f:ident)::+, $B:ty, $w:expr, $a:expr, $nb:expr, $row:expr, $out:expr) => {{
        let wb = view::<$B>($w);
        let nbw = wb.len() / $out.len();
        let y = &$a[$row * $nb..($row + 1) * $nb];
        for (o, d) in $out.iter_mut().enumerate() {
            let mut r = [0f32; 1];
            // SAFETY: the level was checked against the CPU's features at device open.
            unsafe { $($f)::+::<1>(&wb[o * nbw..(o + 1) * nbw], &[y], &mut r) };
            *d = r[0];
        }
    }};
}

/// `out[o] = dot(weight row o, activation row act_row)` for the `out.len()` weight rows
/// in `w` (the M = 1 path: one dispatch for a whole chunk of rows).
pub(crate) fn matvec_rows(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    acts: &Acts,
    k: usize,
    act_row: usize,
    out: &mut [f32],
) -> Result<(), FormatError> {
    if out.is_empty() {
        return Ok(());
    }
    if let (GgmlType::F32, Acts::F32(a)) = (ty, acts) {
        // One activation row: `ggml_vec_dot_f32`'s order, llama.cpp's where tinyBLAS
        // declines a single row (`kernels/float/`).
        let y = &a[act_row * k..(act_row + 1) * k];
        for (d, wr) in out.iter_mut().zip(w.chunks_exact(4 * k.max(1))) {
            *d = dot_f32_vec(level, wr, y);
        }
        return Ok(());
    }
    #[cfg(target_arch = "x86_64")]
    {
        let nbk = k / 256;
        let nb0 = k / 32;
        let (o, a) = (out, acts);
        match (native_kernel(level, ty), a) {
            (Some(l), Acts::Q8_0 { .. }) if ty == GgmlType::MXFP4 => {
                let act = a.mxfp4_act(nb0).ok_or(FormatError::Unsupported(ty))?;
                mxfp4::matvec(l, &view(w), act, act_row, o);
            }
            // The low-bit types keep the AVX2 tiles at every level; a decode's matvec
            // takes their VNNI four-row kernels (the same order) where the CPU has them.
            (Some(SimdLevel::Avx2), Acts::Q8K(a))
                if level == SimdLevel::Avx512Vnni
                    && matches!(ty, GgmlType::IQ4_XS | GgmlType::Q3_K | GgmlType::Q2_K) =>
            {
                let y = &a[act_row * nbk..(act_row + 1) * nbk];
                match ty {
                    GgmlType::IQ4_XS => rows4(
                        &view::<BlockIQ4XS>(w),
                        y,
                        o,
                        iq4_xs::vnni::dot_iq4xs_rows4,
                        iq4_xs::avx2::dot_iq4xs_row,
                    ),
                    // The activation row arranged once for the chunk, in the layout of
                    // the kernel's transpositions (`q3_k::vnni::Q8KRunPairs`); VBMI and
                    // GFNI checked by `has_vbmi_gfni`.
                    GgmlType::Q3_K if crate::simd::has_vbmi_gfni() => rows4_arranged(
                        &view::<BlockQ3K>(w),
                        y,
                        o,
                        q3_k::vnni::arrange_vbmi,
                        q3_k::vnni::dot_q3k_rows4_vbmi,
                        q3_k::vnni::dot_q3k_row_vbmi,
                    ),
                    GgmlType::Q3_K => rows4_arranged(
                        &view::<BlockQ3K>(w),
                        y,
                        o,
                        q3_k::vnni::arrange,
                        q3_k::vnni::dot_q3k_rows4,
                        q3_k::vnni::dot_q3k_row,
                    ),
                    GgmlType::Q2_K => rows4(
                        &view::<BlockQ2K>(w),
                        y,
                        o,
                        q2_k::vnni::dot_q2k_rows4,
                        q2_k::avx2::dot_q2k_row,
                    ),
                    _ => unreachable!("no AVX-512 VNNI matvec for {ty}"),
                }
            }
            (Some(SimdLevel::Avx2), Acts::Q8_0 { blocks: a, .. })
                if level == SimdLevel::Avx512Vnni && ty == GgmlType::IQ4_NL =>
            {
                rows4(
                    &view::<BlockIQ4NL>(w),
                    &a[act_row * nb0..(act_row + 1) * nb0],
                    o,
                    if crate::simd::has_vbmi() {
                        iq4_nl::vnni::dot_iq4nl_rows4_vbmi
                    } else {
                        iq4_nl::vnni::dot_iq4nl_rows4
                    },
                    iq4_nl::avx2::dot_iq4nl_row,
                )
            }
            (Some(SimdLevel::Avx512Vnni), Acts::Q8K(a)) => match ty {
                // Four rows side by side, a quarter of the chunk apart: adjacent rows side
                // by side stream from memory at a fraction of one row's speed
                // (`q0::vnni::q0_rows`).
                GgmlType::Q4_K => rows4(
                    &view::<BlockQ4K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q4_k::vnni::dot_q4k_rows4,
                    q4_k::vnni::dot_q4k_rows::<1>,
                ),
                // The AVX2 four-row kernel (the same order): four streams side by side
                // beat this level's single-row kernel.
                GgmlType::Q5_K => rows4(
                    &view::<BlockQ5K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q5_k::avx2::dot_q5k_rows4,
                    q5_k::avx2::dot_q5k_row,
                ),
                GgmlType::Q6_K => rows4(
                    &view::<BlockQ6K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q6_k::vnni::dot_q6k_rows4,
                    q6_k::vnni::dot_q6k_rows::<1>,
                ),
                _ => unreachable!("no AVX-512 VNNI Q8_K kernel for {ty}"),
            },
            (Some(SimdLevel::Avx512Vnni), Acts::Q8_0 { .. }) => {
                // Two far-apart rows side by side (`q0::vnni::q0_matvec` says why far apart).
                let side = acts.q8_0_side(act_row, nb0);
                // SAFETY (each call): the VNNI level was checked against the CPU at
                // device open.
                match ty {
                    GgmlType::Q8_0 => unsafe {
                        q0::vnni::q0_rows::<BlockQ8_0, 2, 1, STREAM_PREFETCH>(
                            &view(w),
                            nb0,
                            &[side],
                            o,
                            1,
                        )
                    },
                    GgmlType::Q5_0 => unsafe {
                        q0::vnni::q0_rows::<BlockQ5_0, 2, 1, STREAM_PREFETCH>(
                            &view(w),
                            nb0,
                            &[side],
                            o,
                            1,
                        )
                    },
                    GgmlType::Q4_0 => unsafe {
                        q0::vnni::q0_rows::<BlockQ4_0, 2, 1, STREAM_PREFETCH>(
                            &view(w),
                            nb0,
                            &[side],
                            o,
                            1,
                        )
                    },
                    _ => unreachable!("no AVX-512 VNNI Q8_0 kernel for {ty}"),
                }
            }
            (
                Some(SimdLevel::Avx512),
                Acts::Q8_0 {
                    blocks: a,
                    scales: sa,
                    ..
                },
            ) => match ty {
                GgmlType::Q8_0 => {
                    rows1!(q0::avx512::dot_q8_0, BlockQ8_0, w, a, nb0, act_row, o; sa)
                }
                GgmlType::Q5_0 => {
                    rows1!(q0::avx512::dot_q5_0, BlockQ5_0, w, a, nb0, act_row, o; sa)
                }
                GgmlType::Q4_0 => {
                    rows1!(q0::avx512::dot_q4_0, BlockQ4_0, w, a, nb0, act_row, o; sa)
                }
                _ => unreachable!("no AVX-512 Q8_0 kernel for {ty}"),
            },
            (Some(SimdLevel::Avx2), Acts::Q8K(a)) => match ty {
                // Four rows a quarter of the chunk apart, the activation row arranged
                // once for them (`q4_k::avx2::dot_q4k_rows4`).
                GgmlType::Q4_K => rows4_arranged(
                    &view::<BlockQ4K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q4_k::avx2::Q8KPairs::arrange,
                    q4_k::avx2::dot_q4k_rows4,
                    q4_k::avx2::dot_q4k_row,
                ),
                GgmlType::Q5_K => rows4(
                    &view::<BlockQ5K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q5_k::avx2::dot_q5k_rows4,
                    q5_k::avx2::dot_q5k_row,
                ),
                GgmlType::Q6_K => rows4(
                    &view::<BlockQ6K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q6_k::avx2::dot_q6k_rows4,
                    q6_k::avx2::dot_q6k_row,
                ),
                GgmlType::IQ4_XS => rows4(
                    &view::<BlockIQ4XS>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    iq4_xs::avx2::dot_iq4xs_rows4,
                    iq4_xs::avx2::dot_iq4xs_row,
                ),
                // The activation row arranged once for the chunk (`Q8KLanes`).
                GgmlType::Q3_K => rows4_arranged(
                    &view::<BlockQ3K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q3_k::avx2::Q8KLanes::arrange,
                    q3_k::avx2::dot_q3k_rows4,
                    q3_k::avx2::dot_q3k_row_lanes,
                ),
                // The activation row arranged once for the chunk (`Q8KWords`).
                GgmlType::Q2_K => rows4_arranged(
                    &view::<BlockQ2K>(w),
                    &a[act_row * nbk..(act_row + 1) * nbk],
                    o,
                    q2_k::avx2::Q8KWords::arrange,
                    q2_k::avx2::dot_q2k_rows4,
                    q2_k::avx2::dot_q2k_row_words,
                ),
                _ => unreachable!("no AVX2 Q8_K kernel for {ty}"),
            },
            (Some(SimdLevel::Avx2), Acts::Q8_0 { blocks: a, .. }) => match ty {
                // Four far-apart rows side by side (`q0::avx2::q0_rows`).
                GgmlType::Q8_0 => {
                    let side = acts.q8_0_side(act_row, nb0);
                    // SAFETY: the level was checked against the CPU at device open.
                    unsafe {
                        q0::avx2::q0_rows::<BlockQ8_0, 4, 1, STREAM_PREFETCH>(
                            &view(w),
                            nb0,
                            &[side],
                            o,
                            1,
                        )
                    }
                }
                GgmlType::Q5_0 => {
                    let side = acts.q8_0_side(act_row, nb0);
                    // SAFETY: the level was checked against the CPU at device open.
                    unsafe {
                        q0::avx2::q0_rows::<BlockQ5_0, 4, 1, STREAM_PREFETCH>(
                            &view(w),
                            nb0,
                            &[side],
                            o,
                            1,
                        )
                    }
                }
                GgmlType::Q4_0 => {
                    let side = acts.q8_0_side(act_row, nb0);
                    // SAFETY: the level was checked against the CPU at device open.
                    unsafe {
                        q0::avx2::q0_rows::<BlockQ4_0, 4, 1, STREAM_PREFETCH>(
                            &view(w),
                            nb0,
                            &[side],
                            o,
                            1,
                        )
                    }
                }
                GgmlType::IQ4_NL => rows4(
                    &view::<BlockIQ4NL>(w),
                    &a[act_row * nb0..(act_row + 1) * nb0],
                    o,
                    iq4_nl::avx2::dot_iq4nl_rows4,
                    iq4_nl::avx2::dot_iq4nl_row,
                ),
                _ => unreachable!("no AVX2 Q8_0 kernel for {ty}"),
            },
            _ => {
                let rb = w.len() / o.len();
                for (r, d) in o.iter_mut().enumerate() {
                    dot_rows(
                        level,
                        ty,
                        &w[r * rb..(r + 1) * rb],
                        a,
                        k,
                        &[act_row],
                        std::slice::from_mut(d),
                    )?;
                }
            }
        }
        Ok(())
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        let rb = w.len() / out.len();
        for (r, d) in out.iter_mut().enumerate() {
            dot_rows(
                level,
                ty,
                &w[r * rb..(r + 1) * rb],
                acts,
                k,
                &[act_row],
                std::slice::from_mut(d),
            )?;
        }
        Ok(())
    }
}

/// One F32 weight row (bytes) · `y` in the order of `ggml_vec_dot_f32` on an AVX-512
/// build (`flint_core::dot::ggml_x86::vec_dot_f32_ggml`), with the AVX2 kernel where
/// the level has one.
pub(crate) fn dot_f32_vec(level: SimdLevel, w: &[u8], y: &[f32]) -> f32 {
    #[cfg(target_arch = "x86_64")]
    if level != SimdLevel::Scalar {
        // SAFETY: every SIMD level includes AVX2, FMA and F16C, checked at device open.
        return unsafe { float::avx2::dot_f32_vec(w, y) };
    }
    let _ = level;
    let wf: Vec<f32> = (0..y.len()).map(|j| FloatKind::F32.get(w, j)).collect();
    flint_core::dot::ggml_x86::vec_dot_f32_ggml(flint_core::math::GgmlCpuBuild::Avx512, &wf, y)
}

/// The scalar path: `flint_core::dot::vec_dot` for block types; F32 in tinyBLAS's AVX-512
/// order (`flint_core::dot::ggml_x86::vec_dot_f32_tinyblas`, as the AVX2 kernel), F16 and BF16
/// in a plain loop.
pub(crate) fn scalar_rows(
    ty: GgmlType,
    w: &[u8],
    acts: &Acts,
    k: usize,
    rows: &[usize],
    out: &mut [f32],
) -> Result<(), FormatError> {
    match acts {
        Acts::F32(a) => {
            let kind = FloatKind::of(ty).ok_or(FormatError::Unsupported(ty))?;
            let mut wf = Vec::new();
            for (t, &i) in rows.iter().enumerate() {
                let y = &a[i * k..(i + 1) * k];
                out[t] = if kind == FloatKind::F32 {
                    if wf.is_empty() {
                        wf = (0..k).map(|j| kind.get(w, j)).collect();
                    }
                    flint_core::dot::ggml_x86::vec_dot_f32_tinyblas(
                        flint_core::math::GgmlCpuBuild::Avx512,
                        &wf,
                        y,
                    )
                } else {
                    y.iter().enumerate().map(|(j, &v)| kind.get(w, j) * v).sum()
                };
            }
        }
        // MXFP4 in llama.cpp's order at every level (`kernels/mxfp4/`).
        Acts::Q8_0 { blocks, .. } if ty == GgmlType::MXFP4 => {
            let nb = k / 32;
            let wb = view(w);
            for (t, &i) in rows.iter().enumerate() {
                out[t] = mxfp4::dot_scalar(&wb, &blocks[i * nb..(i + 1) * nb]);
            }
        }
        _ => {
            let nb = k / ty.vec_dot_type().block_size();
            for (t, &i) in rows.iter().enumerate() {
                out[t] = crate::kernels::core_vec_dot(ty, w, acts.row_bytes(i, nb), k)?;
            }
        }
    }
    Ok(())
}

/// The scalar reference dot product (`flint_core::dot::vec_dot`).
pub(crate) fn core_vec_dot(ty: GgmlType, w: &[u8], a: &[u8], n: usize) -> Result<f32, FormatError> {
    flint_core::dot::vec_dot(ty, w, a, n)
}
