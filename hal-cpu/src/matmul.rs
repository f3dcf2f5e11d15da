//! The matmuls' task scheduling: how a matmul, a layer's several matmuls and an expert
//! matmul split their weight rows and activation rows into tasks on the device's pool,
//! and which kernel entry (`kernels::dispatch`) each task calls.

use flint_core::GgmlType;
use flint_hal::{Device, HalError, Weight};
use rayon::prelude::*;

use crate::device::{fmt_err, CpuDevice};
use crate::kernels::x16::X16_ROWS;
use crate::kernels::{self, Acts, FloatKind, WeightRows, TILE};
use crate::simd::SimdLevel;
use crate::stage::CpuWeight;

/// The most results a matmul transposes back on the calling thread rather than in a
/// parallel section (a c = 4 decode's 1024-row matrix: 4096).
const SERIAL_TRANSPOSE_MAX: usize = 1 << 16;

/// The largest scratch buffer kept between matmuls (16 MiB of f32).
const SCRATCH_KEEP: usize = 4 << 20;

/// Rows of a staged matmul chunk: a multiple of 16 when the weight is packed.
fn chunk_rows(per_task: usize, packed: bool, n: usize) -> usize {
    if packed {
        per_task.next_multiple_of(X16_ROWS).min(n.max(X16_ROWS))
    } else {
        per_task
    }
}

/// What `Acts::new` makes of a weight type: activations for one weight serve another of
/// the same form (`Acts::new` depends on the type only through these two).
fn act_form(ty: GgmlType) -> (bool, GgmlType) {
    (FloatKind::of(ty).is_some(), ty.vec_dot_type())
}

fn dot_rows_checked(
    level: SimdLevel,
    ty: GgmlType,
    w: &[u8],
    acts: &Acts,
    k: usize,
    rows: &[usize],
    out: &mut [f32],
) -> Result<(), HalError> {
    kernels::dot_rows(level, ty, w, acts, k, rows, out).map_err(|e| fmt_err("matmul", e))
}

impl CpuDevice {
    /// [`Device::matmul_glu`] in one pass where a kernel takes it: a prompt batch
    /// ([`kernels::GLU_MIN_ROWS`] rows or more) on AVX-512 VNNI of two Q8_0, Q5_0 or (the
    /// file's layout) Q4_0 weights of one type and shape, with SiLU or GELU
    /// ([`kernels::q0_glu_gemm`]). `Ok(false)`, nothing written, otherwise.
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_glu_fused(
        &self,
        gate: &dyn Weight,
        up: &dyn Weight,
        x: &[f32],
        m: usize,
        glu: flint_hal::Glu,
        out: &mut [f32],
    ) -> Result<bool, HalError> {
        #[cfg(target_arch = "x86_64")]
        {
            use flint_core::blocks::{BlockQ4_0, BlockQ5_0, BlockQ8_0};
            let (g, u) = (self.weight(gate), self.weight(up));
            let (ty, k, n) = (g.ty, g.k, g.n);
            let q0 = matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_0);
            if self.level != SimdLevel::Avx512Vnni
                || m < kernels::GLU_MIN_ROWS
                || !q0
                || (u.ty, u.k, u.n, u.e, g.e) != (ty, k, n, 1, 1)
                || g.amx
                || u.amx
                || (ty == GgmlType::Q4_0 && (g.x16.is_some() || u.x16.is_some()))
                || matches!(glu, flint_hal::Glu::SwigluOai)
            {
                return Ok(false);
            }
            assert_eq!(
                x.len(),
                m * k,
                "matmul_glu: x has {} values, expected {m} x {k}",
                x.len()
            );
            assert_eq!(
                out.len(),
                m * n,
                "matmul_glu: out has {} values, expected {m} x {n}",
                out.len()
            );
            let level = self.level;
            let table = crate::device::gelu_f16_table();
            let act: &kernels::GluAct<'_> = match glu {
                // SAFETY (both): AVX-512F, AVX2 and F16C come with the VNNI level,
                // checked against the CPU at device open.
                flint_hal::Glu::GeluTanh => &|g, u, o| unsafe {
                    kernels::elementwise::avx512::gelu_mul_table(table, g, u, o)
                },
                _ => &|g, u, o| unsafe { kernels::elementwise::avx512::silu_mul(g, u, o) },
            };
            self.count(ty);
            self.count(ty);
            let ws = [g.rows(0, n), u.rows(0, n)];
            let per_rows = m.div_ceil(self.threads * 4).next_multiple_of(4);
            let mut gs =
                std::mem::take(&mut *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()));
            let res = self.pool.install(|| {
                let acts =
                    Acts::new(level, ty, x, k).map_err(|e| fmt_err("quantizing activations", e))?;
                let Acts::Q8_0 {
                    blocks,
                    scales,
                    neg16_lanes,
                } = &acts
                else {
                    return Ok(false);
                };
                let a = (&blocks[..], &scales[..], &neg16_lanes[..]);
                match ty {
                    GgmlType::Q5_0 => {
                        kernels::q0_glu_gemm::<BlockQ5_0>(ws, a, k, n, per_rows, &mut gs, act, out)
                    }
                    GgmlType::Q8_0 => {
                        kernels::q0_glu_gemm::<BlockQ8_0>(ws, a, k, n, per_rows, &mut gs, act, out)
                    }
                    _ => {
                        kernels::q0_glu_gemm::<BlockQ4_0>(ws, a, k, n, per_rows, &mut gs, act, out)
                    }
                }
                Ok(true)
            });
            *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()) = gs;
            res
        }
        #[cfg(not(target_arch = "x86_64"))]
        {
            let _ = (gate, up, x, m, glu, out);
            Ok(false)
        }
    }

    /// Whether a single activation row of an F32 matrix of a multiple of 4 rows takes
    /// `ggml_vec_dot_f32`'s order (llama.cpp's for one row, `FloatOrder::LlamaCpp`)
    /// rather than tinyBLAS's (its batches'). Other F32 matrices and expert towers take
    /// `ggml_vec_dot_f32`'s for every row in either order, as llama.cpp does.
    fn f32_row_vec_order(&self) -> bool {
        self.order == crate::kv::FloatOrder::LlamaCpp
    }

    /// `out[i][o] = W[o] . x[i]` for the `n` rows of `w_bytes` (one matrix), the
    /// activation rows `x` quantized for `ty` here, or already (`pre`).
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn matmul_bytes(
        &self,
        ty: GgmlType,
        w: WeightRows<'_>,
        k: usize,
        n: usize,
        row_bytes: usize,
        x: &[f32],
        pre: Option<&Acts>,
        m: usize,
        out: &mut [f32],
    ) -> Result<(), HalError> {
        assert_eq!(
            x.len(),
            m * k,
            "matmul: x has {} values, expected {m} x {k}",
            x.len()
        );
        assert_eq!(
            out.len(),
            m * n,
            "matmul: out has {} values, expected {m} x {n}",
            out.len()
        );
        if m == 0 || n == 0 {
            return Ok(());
        }
        let level = self.level;
        self.pool.install(|| {
            let owned;
            let acts = match pre {
                Some(a) => a,
                None => {
                    owned = Acts::new(level, ty, x, k)
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    &owned
                }
            };
            #[cfg(target_arch = "x86_64")]
            match w {
                WeightRows::Q8_0Amx(_)
                | WeightRows::Q5_0Amx(_)
                | WeightRows::Q8_0x16Amx(_)
                | WeightRows::Q5_0x16Amx(_) => {
                    let per_rows = m.div_ceil(self.threads * 4).next_multiple_of(4);
                    let mut gs = std::mem::take(
                        &mut *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()),
                    );
                    match w {
                        WeightRows::Q8_0Amx(wb) => {
                            kernels::amx_matmul(wb, k, n, acts, per_rows, &mut gs, out)
                        }
                        WeightRows::Q5_0Amx(wb) => {
                            kernels::amx_matmul(wb, k, n, acts, per_rows, &mut gs, out)
                        }
                        _ => kernels::amx_x16_matmul(w, k, n, acts, per_rows, &mut gs, out),
                    }
                    *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()) = gs;
                    return Ok(());
                }
                WeightRows::Q4KAmx(_) | WeightRows::Q6KAmx(_) => {
                    let per_rows = m.div_ceil(self.threads * 4).next_multiple_of(4);
                    let mut gs = std::mem::take(
                        &mut *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()),
                    );
                    kernels::amx_kq_matmul(ty, w, k, n, acts, per_rows, &mut gs, out);
                    *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()) = gs;
                    return Ok(());
                }
                _ => {}
            }
            // Enough rows per task to amortise dispatch (16 rows of a 4096-wide Q4_K row
            // are ~2 us of work against ~0.2 us for a rayon task), and 16 tasks per
            // thread so that the others can take over a thread that stalls or is
            // descheduled on a shared machine; for a few decode rows, four per thread,
            // as for one (each task's rows are a stream the prefetcher picks up again).
            let tasks_per_thread = if m < kernels::GEMM_MIN_ROWS { 4 } else { 16 };
            let per_task = n.div_ceil(self.threads * tasks_per_thread).max(16).min(n);
            let packed = w.is_packed();
            let per_task = chunk_rows(per_task, packed, n);
            let w_bytes = match w {
                WeightRows::File(b) => b,
                _ => &[][..],
            };
            // Packed rows `o0..o0 + rows` (whole groups).
            let groups = |o0: usize, rows: usize| w.packed_rows(k, o0, rows);
            let row_dot = |o: usize, rows: &[usize], dst: &mut [f32]| {
                dot_rows_checked(
                    level,
                    ty,
                    &w_bytes[o * row_bytes..(o + 1) * row_bytes],
                    acts,
                    k,
                    rows,
                    dst,
                )
            };
            if m == 1 && ty == GgmlType::F32 && n.is_multiple_of(4) && !self.f32_row_vec_order() {
                // An F32 matrix tinyBLAS would take: its order for the single row too
                // (batch-invariant), one weight row at a time.
                return out.par_chunks_mut(64).enumerate().try_for_each(|(c, dst)| {
                    for (r, d) in dst.iter_mut().enumerate() {
                        row_dot(c * 64 + r, &[0], std::slice::from_mut(d))?;
                    }
                    Ok(())
                });
            }
            if m == 1 {
                // Four tasks per thread, not sixteen: each task's weight rows are a
                // stream the hardware prefetcher has to pick up again, and a decode's
                // matrices are small.
                let per_task = chunk_rows(n.div_ceil(self.threads * 4).max(16).min(n), packed, n);
                return out
                    .par_chunks_mut(per_task)
                    .enumerate()
                    .try_for_each(|(c, dst)| {
                        let o0 = c * per_task;
                        if packed {
                            return kernels::x16_rows(groups(o0, dst.len()), k, acts, &[0], dst)
                                .map_err(|e| fmt_err("matmul", e));
                        }
                        let wb = &w_bytes[o0 * row_bytes..(o0 + dst.len()) * row_bytes];
                        kernels::matvec_rows(level, ty, wb, acts, k, 0, dst)
                            .map_err(|e| fmt_err("matmul", e))
                    });
            }
            if ty == GgmlType::F32 && !n.is_multiple_of(4) {
                // tinyBLAS takes F32 matrices of a multiple of 4 rows only; llama.cpp
                // computes the others with `ggml_vec_dot_f32`: the M = 1 path per
                // activation row.
                return out.par_chunks_mut(n).enumerate().try_for_each(|(i, dst)| {
                    kernels::matvec_rows(level, ty, w_bytes, acts, k, i, dst)
                        .map_err(|e| fmt_err("matmul", e))
                });
            }
            // Weight and activation rows tiled together, where there is such a kernel:
            // the weight decoded once, the activation rows split over the threads (a
            // multiple of 4 rows per task, about 4 tasks per thread).
            let per_rows = m.div_ceil(self.threads * 4).next_multiple_of(4);
            let mut gs =
                std::mem::take(&mut *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()));
            let done = kernels::gemm(level, ty, w, acts, k, n, m, per_rows, false, &mut gs, out)
                .map_err(|e| fmt_err("matmul", e))?;
            *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()) = gs;
            if done {
                return Ok(());
            }
            // Transposed result [n][m]: each task owns whole weight rows. Every value is
            // written before it is read, so a kept buffer needs no clearing.
            let mut buf =
                std::mem::take(&mut *self.scratch.lock().unwrap_or_else(|e| e.into_inner()));
            if buf.len() < n * m {
                buf = vec![0f32; n * m];
            }
            let t_out = &mut buf[..n * m];
            // Weight rows per sub-tile: small enough to stay in L1/L2 while every
            // activation tile passes over them.
            const ROW_TILE: usize = 16;
            let all_rows: Vec<usize> = (0..m).collect();
            t_out
                .par_chunks_mut(per_task * m)
                .enumerate()
                .try_for_each(|(c, dst)| {
                    let o0 = c * per_task;
                    let rows_here = dst.len() / m;
                    if packed {
                        return kernels::x16_rows(groups(o0, rows_here), k, acts, &all_rows, dst)
                            .map_err(|e| fmt_err("matmul", e));
                    }
                    let wb = &w_bytes[o0 * row_bytes..(o0 + rows_here) * row_bytes];
                    if kernels::rows_small_batch(level, ty, wb, acts, k, m, dst) {
                        return Ok(());
                    }
                    let mut tmp = [0f32; TILE];
                    let mut idx = [0usize; TILE];
                    for rb in (0..rows_here).step_by(ROW_TILE) {
                        let re = (rb + ROW_TILE).min(rows_here);
                        for i0 in (0..m).step_by(TILE) {
                            let len = TILE.min(m - i0);
                            for (t, v) in idx.iter_mut().enumerate().take(len) {
                                *v = i0 + t;
                            }
                            for r in rb..re {
                                row_dot(o0 + r, &idx[..len], &mut tmp[..len])?;
                                dst[r * m + i0..r * m + i0 + len].copy_from_slice(&tmp[..len]);
                            }
                        }
                    }
                    Ok::<(), HalError>(())
                })?;
            // Back to [m][n]: a few decode rows' worth here (a parallel section costs
            // more than the copy), else in parallel over blocks of 16 activation rows
            // (each weight row's 16 values are one cache line of `t_out`).
            let t_out = &*t_out;
            if n * m <= SERIAL_TRANSPOSE_MAX {
                for (j, row) in t_out.chunks_exact(m).enumerate() {
                    for (r, &v) in row.iter().enumerate() {
                        out[r * n + j] = v;
                    }
                }
            } else {
                out.par_chunks_mut(16 * n).enumerate().for_each(|(c, o)| {
                    let i0 = 16 * c;
                    let rows = o.len() / n;
                    for j in 0..n {
                        let src = &t_out[j * m + i0..j * m + i0 + rows];
                        for (t, &v) in src.iter().enumerate() {
                            o[t * n + j] = v;
                        }
                    }
                });
            }
            if buf.len() <= SCRATCH_KEEP {
                *self.scratch.lock().unwrap_or_else(|e| e.into_inner()) = buf;
            }
            Ok(())
        })
    }

    /// `Device::matmul_multi`: one parallel section for a few decode rows of weights that
    /// share an activation form, the activations quantized once for a prompt batch, else
    /// one matmul after the other.
    pub(crate) fn matmul_shared(
        &self,
        ws: &[&dyn Weight],
        x: &[f32],
        m: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        assert_eq!(ws.len(), outs.len(), "matmul_multi: one output per weight");
        let ws: Vec<&CpuWeight> = ws.iter().map(|w| self.weight(*w)).collect();
        let (Some(first), level) = (ws.first(), self.level) else {
            return Ok(());
        };
        // One parallel section for decode rows (one, or a few with the small-batch
        // kernels) whose weights take the same activation encoding and have a native
        // kernel: the rows quantized once, the threads sharing every matrix's rows (as
        // `expert_matmul` does for experts).
        let small = (2..kernels::GEMM_MIN_ROWS).contains(&m);
        let shared = (m == 1 || small)
            && ws.iter().all(|w| {
                w.k == first.k
                    && w.ty.vec_dot_type() == first.ty.vec_dot_type()
                    && FloatKind::of(w.ty).is_none()
                    && kernels::native_kernel(level, w.ty).is_some()
                    && (!small || kernels::has_small_batch_kernel(level, w.ty))
            });
        // Otherwise, a prompt batch: the input rows quantized once for every weight that
        // takes the same activation form (Gemma 3's q, k and v, or gate and up), then
        // one matmul after the other; or simply
        // one matmul after the other.
        let one_form = ws
            .iter()
            .all(|w| w.k == first.k && act_form(w.ty) == act_form(first.ty));
        let batch =
            !shared && one_form && m >= kernels::GEMM_MIN_ROWS && FloatKind::of(first.ty).is_none();
        if !shared && !batch {
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.matmul(*w, x.into(), m, (&mut **out).into())?;
            }
            return Ok(());
        }
        let k = first.k;
        assert_eq!(
            x.len(),
            m * k,
            "matmul_multi: x has {} values, expected {m} x {k}",
            x.len()
        );
        if batch {
            let acts = self
                .pool
                .install(|| Acts::new(level, first.ty, x, k))
                .map_err(|e| fmt_err("quantizing activations", e))?;
            for (w, out) in ws.iter().zip(outs.iter_mut()) {
                self.count(w.ty);
                self.matmul_bytes(
                    w.ty,
                    w.rows(0, w.n),
                    w.k,
                    w.n,
                    w.row_bytes,
                    x,
                    Some(&acts),
                    m,
                    out,
                )
                .map_err(|e| {
                    HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name))
                })?;
            }
            return Ok(());
        }
        for (i, (w, out)) in ws.iter().zip(outs.iter()).enumerate() {
            assert_eq!(
                out.len(),
                m * w.n,
                "matmul_multi: out {i} has {} values, expected {m} x {}",
                out.len(),
                w.n
            );
            self.count(w.ty);
        }
        // Several rows: each matrix's results as [weight row][m], transposed back after.
        let mut t_bufs: Vec<Vec<f32>> = if small {
            ws.iter().map(|w| vec![0f32; w.n * m]).collect()
        } else {
            Vec::new()
        };
        let total_rows: usize = ws.iter().map(|w| w.n).sum();
        // Four tasks per thread over all the matrices (see `matmul_bytes`); whole row
        // groups of packed weights.
        let per_task = total_rows.div_ceil(self.threads * 4).max(16);
        // Whole groups of sixteen rows where a weight is repacked or on AMX (whose kernels
        // take sixteen rows at a time).
        let per_task = chunk_rows(
            per_task,
            ws.iter().any(|w| w.x16.is_some() || w.amx),
            usize::MAX,
        );
        let mut tasks: Vec<(usize, usize, &mut [f32])> = Vec::new();
        if small {
            for (i, t) in t_bufs.iter_mut().enumerate() {
                for (c, dst) in t.chunks_mut(per_task * m).enumerate() {
                    tasks.push((i, c * per_task, dst));
                }
            }
        } else {
            for (i, out) in outs.iter_mut().enumerate() {
                for (c, dst) in out.chunks_mut(per_task).enumerate() {
                    tasks.push((i, c * per_task, dst));
                }
            }
        }
        self.pool.install(|| {
            let acts = Acts::new(level, first.ty, x, k)
                .map_err(|e| fmt_err("quantizing activations", e))?;
            let all_rows: Vec<usize> = (0..m).collect();
            tasks.into_par_iter().try_for_each(|(i, o0, dst)| {
                let w = ws[i];
                let rows = dst.len() / m;
                let wr = w.rows(o0, rows);
                if wr.is_packed() {
                    return kernels::x16_rows(wr, k, &acts, &all_rows, dst).map_err(|e| {
                        let e = fmt_err("matmul", e);
                        HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name))
                    });
                }
                let wb = &w.bytes()[o0 * w.row_bytes..(o0 + rows) * w.row_bytes];
                if small {
                    return match kernels::rows_small_batch(level, w.ty, wb, &acts, k, m, dst) {
                        true => Ok(()),
                        false => Err(HalError::runtime(format!(
                            "matmul_multi: no small-batch kernel for {} (tensor '{}')",
                            w.ty, w.info.name
                        ))),
                    };
                }
                kernels::matvec_rows(level, w.ty, wb, &acts, k, 0, dst).map_err(|e| {
                    let e = fmt_err("matmul", e);
                    HalError::new(e.kind, format!("{} (tensor '{}')", e.message, w.info.name))
                })
            })
        })?;
        for ((w, out), t) in ws.iter().zip(outs.iter_mut()).zip(&t_bufs) {
            for (j, row) in t.chunks_exact(m).enumerate() {
                for (r, &v) in row.iter().enumerate() {
                    out[r * w.n + j] = v;
                }
            }
        }
        Ok(())
    }

    /// `Device::expert_matmul_multi`: a gemm for the experts with a prompt's worth of
    /// rows, one parallel section of (weight, expert, chunk of rows) tasks for the rest.
    /// Routed row `i` is expert `ids[i]` on input row `i / fanout` (`flint_hal::fanout`).
    pub(crate) fn expert_matmuls(
        &self,
        ws: &[&dyn Weight],
        x: &[f32],
        ids: &[u32],
        outs: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        assert_eq!(
            ws.len(),
            outs.len(),
            "expert_matmul_multi: one output per weight"
        );
        let ws: Vec<&CpuWeight> = ws.iter().map(|w| self.weight(*w)).collect();
        let Some(k) = ws.first().map(|w| w.k) else {
            return Ok(());
        };
        assert!(
            k > 0 && x.len().is_multiple_of(k),
            "expert_matmul: x length {} vs in {k}",
            x.len()
        );
        let fanout = flint_hal::fanout(x.len() / k, ids.len(), "expert_matmul");
        let input_row = |i: usize| i / fanout;
        for (w, out) in ws.iter().zip(outs.iter()) {
            assert_eq!(w.k, k, "expert_matmul_multi: weights of different inputs");
            assert_eq!(out.len(), ids.len() * w.n, "expert_matmul: out length");
            self.count(w.ty);
        }
        let n_experts = ws.iter().map(|w| w.e).min().unwrap_or(0);
        // Group rows by expert so each expert's blocks are read once for all its rows.
        let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); n_experts];
        for (i, &e) in ids.iter().enumerate() {
            let e = e as usize;
            if e >= n_experts {
                let w = ws.iter().find(|w| e >= w.e).unwrap_or(&ws[0]);
                return Err(HalError::invalid(format!(
                    "expert_matmul: expert {e} of tensor '{}' with {} experts",
                    w.info.name, w.e
                )));
            }
            by_expert[e].push(i);
        }
        let active: Vec<(usize, Vec<usize>)> = by_expert
            .into_iter()
            .enumerate()
            .filter(|(_, l)| !l.is_empty())
            .collect();
        if active.is_empty() {
            return Ok(());
        }
        let level = self.level;
        // Experts with a prompt's worth of tokens (a prefill routes ~k/E of its tokens to
        // each; the bench preset's prefill: 32 tokens per expert): Q4_K/Q6_K towers with
        // a few dozen on AVX-512 VNNI, and with 16 or more on the AVX2 and AVX-512 F
        // levels, and Q2_K/Q3_K/IQ4_XS/Q5_K towers with 16 or more at every level
        // (`kernels::expert_panels_apply`), take panel tasks of every such expert and weight in one parallel
        // section (`expert_panel_section`); otherwise the weight-tiled gemm of `matmul`,
        // one expert and weight at a time, each parallel inside. The
        // rest: (weight, expert) pairs for the one parallel section below. Q4_K towers
        // take llama.cpp's expert order in all three (`kernels::expert_gemv`).
        let mut small: Vec<(usize, usize, &[usize])> = Vec::new();
        let mut panel_experts: Vec<(usize, &[usize])> = Vec::new();
        for (e, list) in &active {
            let m = list.len();
            if m < kernels::GEMM_MIN_ROWS {
                small.extend((0..ws.len()).map(|wi| (wi, *e, &list[..])));
                continue;
            }
            // One panel height for the section (`expert_panel_section`).
            if ws.iter().all(|w| {
                kernels::expert_panels_apply(level, w.ty, m)
                    && kernels::expert_panel_rows(level, w.ty)
                        == kernels::expert_panel_rows(level, ws[0].ty)
            }) {
                panel_experts.push((*e, &list[..]));
                continue;
            }
            let gathered = gather_rows(x, k, list.iter().map(|&i| input_row(i)));
            // The expert's rows quantized once per activation form (gate and up: once).
            let mut subs: Vec<(GgmlType, Acts)> = Vec::new();
            for (wi, (w, out)) in ws.iter().zip(outs.iter_mut()).enumerate() {
                let (n, ty) = (w.n, w.ty);
                if n == 0 {
                    continue;
                }
                let mat = w.rows(e * n, n);
                let mut tmp = vec![0f32; m * n];
                let per_rows = m.div_ceil(self.threads * 4).next_multiple_of(4);
                if !subs.iter().any(|(t, _)| act_form(*t) == act_form(ty)) {
                    let sub = self
                        .pool
                        .install(|| Acts::new(level, ty, &gathered, k))
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    subs.push((ty, sub));
                }
                let Some((_, sub)) = subs.iter().find(|(t, _)| act_form(*t) == act_form(ty)) else {
                    return Err(HalError::runtime(
                        "expert matmul: activations not quantized",
                    ));
                };
                let done = self.pool.install(|| {
                    let mut gs = std::mem::take(
                        &mut *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()),
                    );
                    let done = kernels::gemm(
                        level, ty, mat, sub, k, n, m, per_rows, true, &mut gs, &mut tmp,
                    )
                    .map_err(|e| fmt_err("expert matmul", e));
                    *self.gemm_scratch.lock().unwrap_or_else(|e| e.into_inner()) = gs;
                    done
                })?;
                if !done {
                    small.push((wi, *e, &list[..]));
                    continue;
                }
                for (t, &i) in list.iter().enumerate() {
                    out[i * n..(i + 1) * n].copy_from_slice(&tmp[t * n..(t + 1) * n]);
                }
            }
        }
        if !panel_experts.is_empty() {
            self.expert_panel_section(&ws, x, k, &panel_experts, fanout, ids.len(), outs)?;
        }
        small.retain(|&(wi, _, _)| ws[wi].n > 0);
        if small.is_empty() {
            return Ok(());
        }
        // One parallel section for the whole call: every input row is quantized once per
        // activation type, and the tasks are (weight, expert, chunk of its weight rows)
        // triples, so the threads share all the weights' and experts' rows instead of
        // meeting at a barrier after each (the gate and up projections of a layer's
        // experts in one call: one section, not two).
        let total_rows: usize = small.iter().map(|&(wi, _, _)| ws[wi].n).sum();
        // Four tasks per thread, as a decode's matmuls (`matmul_bytes`): fewer, longer
        // weight streams for the prefetcher.
        let per_task_of = |w: &CpuWeight| {
            chunk_rows(
                total_rows.div_ceil(self.threads * 4).max(16).min(w.n),
                w.x16.is_some(),
                w.n,
            )
        };
        // Results per (weight, expert) as [weight row][its tokens], split into per-task
        // chunks.
        let mut buf = vec![0f32; small.iter().map(|&(wi, _, l)| l.len() * ws[wi].n).sum()];
        let mut tasks = Vec::new();
        let mut rest: &mut [f32] = &mut buf;
        for (si, &(wi, _, list)) in small.iter().enumerate() {
            let (m, n) = (list.len(), ws[wi].n);
            let per_task = per_task_of(ws[wi]);
            let (mut region, tail) = rest.split_at_mut(m * n);
            rest = tail;
            let mut o0 = 0;
            while !region.is_empty() {
                let take = (per_task * m).min(region.len());
                let (chunk, r) = region.split_at_mut(take);
                region = r;
                tasks.push((si, o0, chunk));
                o0 += take / m;
            }
        }
        self.pool.install(|| {
            // The input rows quantized once for each activation form the weights need.
            let mut acts: Vec<(GgmlType, Acts)> = Vec::new();
            for w in &ws {
                if !acts.iter().any(|(t, _)| act_form(*t) == act_form(w.ty)) {
                    let a = Acts::new(level, w.ty, x, k)
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    acts.push((w.ty, a));
                }
            }
            let acts_of = |ty: GgmlType| {
                acts.iter()
                    .find(|(t, _)| act_form(*t) == act_form(ty))
                    .map(|(_, a)| a)
            };
            tasks.into_par_iter().try_for_each(|(si, o0, dst)| {
                let (wi, e, list) = small[si];
                let w = ws[wi];
                let (n, ty, row_bytes) = (w.n, w.ty, w.row_bytes);
                let Some(acts) = acts_of(ty) else {
                    return Err(HalError::runtime(
                        "expert matmul: activations not quantized",
                    ));
                };
                let m = list.len();
                let rows_here = dst.len() / m;
                let wr = w.rows(e * n + o0, rows_here);
                if kernels::expert_gemv(level, ty) {
                    // Q4_K towers in llama.cpp's `MUL_MAT_ID` order (the gemv kernel's) for
                    // every row, in either layout.
                    let inputs: Vec<usize> = list.iter().map(|&i| input_row(i)).collect();
                    return kernels::expert_rows_gemv(level, ty, wr, k, acts, &inputs, dst)
                        .map_err(|e| fmt_err("expert matmul", e));
                }
                if wr.is_packed() {
                    let inputs: Vec<usize> = list.iter().map(|&i| input_row(i)).collect();
                    return kernels::x16_rows(wr, k, acts, &inputs, dst)
                        .map_err(|e| fmt_err("expert matmul", e));
                }
                let mat_bytes = n * row_bytes;
                let mat = &w.bytes()[e * mat_bytes..(e + 1) * mat_bytes];
                if m == 1 {
                    let r = input_row(list[0]);
                    let wb = &mat[o0 * row_bytes..(o0 + rows_here) * row_bytes];
                    return kernels::matvec_rows(level, ty, wb, acts, k, r, dst)
                        .map_err(|e| fmt_err("expert matmul", e));
                }
                let inputs: Vec<usize> = list.iter().map(|&i| input_row(i)).collect();
                if ty == GgmlType::F32 {
                    // llama.cpp's `MUL_MAT_ID` takes `ggml_vec_dot_f32` for every routed
                    // row of an F32 tower: the M = 1 path row by row.
                    let wb = &mat[o0 * row_bytes..(o0 + rows_here) * row_bytes];
                    let mut tmp = vec![0f32; rows_here];
                    for (t, &r) in inputs.iter().enumerate() {
                        kernels::matvec_rows(level, ty, wb, acts, k, r, &mut tmp)
                            .map_err(|e| fmt_err("expert matmul", e))?;
                        for (o, &v) in tmp.iter().enumerate() {
                            dst[o * m + t] = v;
                        }
                    }
                    return Ok(());
                }
                if kernels::has_small_batch_kernel(level, ty) {
                    // The expert's few tokens gathered and quantized apart (row by row,
                    // as in the whole batch's `acts`: the same bytes), then each weight
                    // block decoded once for all of them (`kernels::rows_small_batch`),
                    // not a dispatch per weight row: at c = 4 on the bench preset, about
                    // one expert in eight gets two tokens.
                    let gathered = gather_rows(x, k, inputs.iter().copied());
                    let sub = Acts::new(level, ty, &gathered, k)
                        .map_err(|e| fmt_err("quantizing activations", e))?;
                    let wb = &mat[o0 * row_bytes..(o0 + rows_here) * row_bytes];
                    if kernels::rows_small_batch(level, ty, wb, &sub, k, m, dst) {
                        return Ok(());
                    }
                }
                let mut tmp = [0f32; TILE];
                for r in 0..rows_here {
                    let o = o0 + r;
                    let wrow = &mat[o * row_bytes..(o + 1) * row_bytes];
                    for (t0, idx) in inputs.chunks(TILE).enumerate() {
                        let t0 = t0 * TILE;
                        dot_rows_checked(level, ty, wrow, acts, k, idx, &mut tmp[..idx.len()])?;
                        dst[r * m + t0..r * m + t0 + idx.len()].copy_from_slice(&tmp[..idx.len()]);
                    }
                }
                Ok::<(), HalError>(())
            })
        })?;
        let mut off = 0;
        for &(wi, _, list) in &small {
            let (m, n) = (list.len(), ws[wi].n);
            let out = &mut outs[wi];
            if let [i] = list {
                // One row for this expert (most of a decode's): a plain copy.
                out[i * n..(i + 1) * n].copy_from_slice(&buf[off..off + n]);
            } else {
                for o in 0..n {
                    for (t, &i) in list.iter().enumerate() {
                        out[i * n + o] = buf[off + o * m + t];
                    }
                }
            }
            off += m * n;
        }
        Ok(())
    }

    /// The experts of an `expert_matmuls` call with a prompt's few dozen routed rows each
    /// (`experts`: (expert, its routed rows), every weight's type taking
    /// `kernels::expert_panels`): one parallel section of (expert, weight, panels) tasks
    /// for all of them, then one that puts each routed row's results in place. Per expert
    /// and weight, a gemm of its own would hand off to the threads twice and leave them
    /// idle at each end (the qwen3moe bench preset's prefill: 128 experts, 3 weights).
    #[cfg(target_arch = "x86_64")]
    #[allow(clippy::too_many_arguments)]
    fn expert_panel_section(
        &self,
        ws: &[&CpuWeight],
        x: &[f32],
        k: usize,
        experts: &[(usize, &[usize])],
        fanout: usize,
        routed: usize,
        outs: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        // Weight rows per task: tens of microseconds of work at 32 routed rows.
        const TASK_ROWS: usize = 128;
        let level = self.level;
        let ty = ws[0].ty;
        let prows = kernels::expert_panel_rows(level, ty);
        let task_panels = TASK_ROWS / prows;
        self.pool.install(|| {
            // Each expert's rows gathered and quantized once (Q4_K and Q6_K share Q8_K).
            let acts: Vec<Acts> = experts
                .par_iter()
                .map(|(_, list)| {
                    let gathered = gather_rows(x, k, list.iter().map(|&i| i / fanout));
                    Acts::new(level, ty, &gathered, k)
                        .map_err(|e| fmt_err("quantizing activations", e))
                })
                .collect::<Result<_, _>>()?;
            let mut tasks = Vec::new();
            for (xi, &(e, _)) in experts.iter().enumerate() {
                for (wi, w) in ws.iter().enumerate() {
                    let panels = w.n.div_ceil(prows);
                    for p0 in (0..panels).step_by(task_panels) {
                        tasks.push((xi, e, wi, p0..(p0 + task_panels).min(panels)));
                    }
                }
            }
            let parts: Vec<Vec<f32>> = tasks
                .par_iter()
                .map_init(
                    kernels::ExpertPanelScratch::default,
                    |dec, (xi, e, wi, panels)| {
                        let (w, list) = (ws[*wi], experts[*xi].1);
                        let Acts::Q8K(a) = &acts[*xi] else {
                            return Err(HalError::runtime(
                                "expert matmul: activations not quantized to Q8_K",
                            ));
                        };
                        let r0 = panels.start * prows;
                        let rows = (panels.end * prows).min(w.n) - r0;
                        let mut part = vec![0f32; list.len() * rows];
                        let wr = w.rows(e * w.n, w.n);
                        kernels::expert_panels(
                            level,
                            w.ty,
                            wr,
                            a,
                            k,
                            w.n,
                            panels.clone(),
                            dec,
                            &mut part,
                        );
                        Ok(part)
                    },
                )
                .collect::<Result<_, _>>()?;
            // Routed row i: its expert's place in `experts` and its row among the expert's.
            let mut at: Vec<Option<(usize, usize)>> = vec![None; routed];
            for (xi, (_, list)) in experts.iter().enumerate() {
                for (t, &i) in list.iter().enumerate() {
                    at[i] = Some((xi, t));
                }
            }
            // The tasks of each (expert, weight), in panel order.
            let mut of: Vec<Vec<usize>> = vec![Vec::new(); experts.len() * ws.len()];
            for (ti, (xi, _, wi, _)) in tasks.iter().enumerate() {
                of[xi * ws.len() + wi].push(ti);
            }
            for (wi, out) in outs.iter_mut().enumerate() {
                let n = ws[wi].n;
                if n == 0 {
                    continue;
                }
                out.par_chunks_mut(n).enumerate().for_each(|(i, o)| {
                    let Some((xi, t)) = at[i] else { return };
                    for &ti in &of[xi * ws.len() + wi] {
                        let r0 = tasks[ti].3.start * prows;
                        let part = &parts[ti];
                        let rows = part.len() / experts[xi].1.len();
                        o[r0..r0 + rows].copy_from_slice(&part[t * rows..(t + 1) * rows]);
                    }
                });
            }
            Ok(())
        })
    }

    #[cfg(not(target_arch = "x86_64"))]
    #[allow(clippy::too_many_arguments)]
    fn expert_panel_section(
        &self,
        _: &[&CpuWeight],
        _: &[f32],
        _: usize,
        _: &[(usize, &[usize])],
        _: usize,
        _: usize,
        _: &mut [&mut [f32]],
    ) -> Result<(), HalError> {
        unreachable!("kernels::expert_panels_apply holds on x86-64 only")
    }
}

/// Rows `rows` of `x` (rows of `k` values) one after the other: an expert's routed input
/// rows, to be quantized together.
fn gather_rows(x: &[f32], k: usize, rows: impl Iterator<Item = usize>) -> Vec<f32> {
    rows.flat_map(|r| x[r * k..(r + 1) * k].iter().copied())
        .collect()
}
