//! The simulated device: DRAM accounting, buffers, staged weights and the ops, all in safe
//! Rust. The FFI layer in `lib.rs` turns C arguments into the calls here.

use std::collections::HashMap;

use flint_core::math::RopeConfig;
use flint_core::GgmlType;

use crate::kernels;

/// DRAM of a Blackhole P150: 32 GiB of GDDR6.
pub const P150_DRAM_BYTES: u64 = 32 << 30;
/// Tensix cores of a Blackhole P150 (informational).
pub const P150_CORES: u32 = 140;

/// Why a call failed: a status code and a message.
#[derive(Debug)]
pub struct SimError {
    /// One of the `FLINT_TT_ERR_*` codes.
    pub code: i32,
    /// For people.
    pub message: String,
}

/// `FLINT_TT_ERR_INVALID`.
pub const ERR_INVALID: i32 = 1;
/// `FLINT_TT_ERR_UNSUPPORTED`.
pub const ERR_UNSUPPORTED: i32 = 2;
/// `FLINT_TT_ERR_OUT_OF_MEMORY`.
pub const ERR_OOM: i32 = 3;
/// `FLINT_TT_ERR_NO_DEVICE`.
pub const ERR_NO_DEVICE: i32 = 4;
/// `FLINT_TT_ERR_RUNTIME`.
pub const ERR_RUNTIME: i32 = 5;

pub(crate) fn err<T>(code: i32, message: impl Into<String>) -> Result<T, SimError> {
    Err(SimError {
        code,
        message: message.into(),
    })
}

pub(crate) fn invalid<T>(message: impl Into<String>) -> Result<T, SimError> {
    err(ERR_INVALID, message)
}

/// Block encodings a P150 computes from directly: the K-quants whose blocks map well to
/// its tiles, the IQ family (codebook lookups in SRAM) and MXFP4 (a 16-entry FP4
/// codebook and a power-of-two block scale: gpt-oss's experts, whose F32 expansion would
/// take 7.5 times the bytes). The other legacy 32-element formats, Q2_K/Q3_K and the
/// ternary formats are not admitted: the host expands them.
pub fn admits_kept(ty: GgmlType) -> bool {
    use GgmlType::*;
    matches!(
        ty,
        Q4_K | Q5_K
            | Q6_K
            | MXFP4
            | IQ2_XXS
            | IQ2_XS
            | IQ2_S
            | IQ3_XXS
            | IQ3_S
            | IQ1_S
            | IQ1_M
            | IQ4_NL
            | IQ4_XS
    )
}

/// The expanded (float) encodings every device accepts: BF16, F16 and F32.
pub fn is_float(ty: GgmlType) -> bool {
    matches!(ty, GgmlType::BF16 | GgmlType::F16 | GgmlType::F32)
}

/// Host memory a streamed weight is read from on every use.
#[derive(Debug)]
pub struct HostBytes {
    pub(crate) ptr: *const u8,
    pub(crate) len: usize,
}

// SAFETY: the ABI makes the host keep the memory valid and unchanged until the weight is
// freed; it is only read, so sharing the pointer between threads is sound.
unsafe impl Send for HostBytes {}

impl HostBytes {
    fn as_slice(&self) -> &[u8] {
        // SAFETY: `ptr` was non-null with `len` readable bytes when staged (checked in
        // lib.rs) and the host keeps them valid and unchanged until `weight_free`.
        unsafe { std::slice::from_raw_parts(self.ptr, self.len) }
    }
}

#[derive(Debug)]
enum Store {
    Resident(Vec<u8>),
    Streamed(HostBytes),
}

#[derive(Debug)]
struct SimWeight {
    ty: GgmlType,
    /// The file's encoding: activations meet an expanded weight at the precision ggml
    /// pairs with this encoding (see `gemm`).
    source_ty: GgmlType,
    in_f: usize,
    out_f: usize,
    row_bytes: usize,
    store: Store,
}

impl SimWeight {
    fn bytes(&self) -> &[u8] {
        match &self.store {
            Store::Resident(v) => v,
            Store::Streamed(h) => h.as_slice(),
        }
    }
    fn streamed(&self) -> bool {
        matches!(self.store, Store::Streamed(_))
    }
    fn is_block(&self) -> bool {
        self.ty.is_quantized()
    }
    fn row(&self, o: usize, out: &mut [f32]) -> Result<(), SimError> {
        let b = &self.bytes()[o * self.row_bytes..(o + 1) * self.row_bytes];
        kernels::dequant_row(self.ty, b, out).map_err(|m| SimError {
            code: ERR_RUNTIME,
            message: m,
        })
    }
}

#[derive(Debug)]
struct Buffer {
    data: Vec<f32>,
    bytes: u64,
}

/// The counters of `flint_tt_counters`.
#[derive(Clone, Copy, Debug, Default)]
pub struct Counters {
    pub block_dispatches: u64,
    pub float_dispatches: u64,
    pub streamed_bytes: u64,
    pub dram_used_bytes: u64,
    /// `flint_tt_buffer_write` calls and the bytes they moved (host to device).
    pub host_writes: u64,
    pub host_write_bytes: u64,
    /// `flint_tt_buffer_read` calls and the bytes they moved (device to host).
    pub host_reads: u64,
    pub host_read_bytes: u64,
    /// `flint_tt_buffer_copy` calls and the bytes they moved (device to device).
    pub device_copies: u64,
    pub device_copy_bytes: u64,
}

/// A staged weight as the ABI describes it.
#[derive(Debug)]
pub struct StageRequest {
    pub ty: GgmlType,
    /// The file's encoding before any expansion (equal to `ty` for kept blocks).
    pub source_ty: GgmlType,
    pub streamed: bool,
    pub in_f: usize,
    pub out_f: usize,
    pub data: HostBytes,
}

/// The paged KV layout of the ABI.
#[derive(Clone, Copy, Debug)]
pub struct KvLayout {
    pub num_blocks: usize,
    pub block_size: usize,
    pub n_kv_heads: usize,
    pub head_dim_k: usize,
    pub head_dim_v: usize,
}

/// One sequence of a paged attention call, with host slices.
#[derive(Debug)]
pub struct Seq<'a> {
    pub q_start: usize,
    pub positions: &'a [u32],
    pub block_table: &'a [u32],
}

/// The whole state of one opened device.
#[derive(Debug)]
pub struct State {
    dram_bytes: u64,
    next: u64,
    buffers: HashMap<u64, Buffer>,
    weights: HashMap<u64, SimWeight>,
    counters: Counters,
}

impl State {
    /// A device with `dram_bytes` of DRAM.
    pub fn new(dram_bytes: u64) -> Self {
        Self {
            dram_bytes,
            next: 1,
            buffers: HashMap::new(),
            weights: HashMap::new(),
            counters: Counters::default(),
        }
    }

    /// DRAM size.
    pub fn dram_bytes(&self) -> u64 {
        self.dram_bytes
    }

    /// Counters now.
    pub fn counters(&self) -> Counters {
        self.counters
    }

    fn reserve(&mut self, bytes: u64, what: &str) -> Result<(), SimError> {
        let used = self.counters.dram_used_bytes;
        if used.saturating_add(bytes) > self.dram_bytes {
            return err(
                ERR_OOM,
                format!(
                    "{what} of {bytes} bytes does not fit: {used} of {} bytes of DRAM in use",
                    self.dram_bytes
                ),
            );
        }
        self.counters.dram_used_bytes += bytes;
        Ok(())
    }

    fn handle(&mut self) -> u64 {
        let h = self.next;
        self.next += 1;
        h
    }

    /// `flint_tt_buffer_alloc`.
    pub fn alloc(&mut self, bytes: u64) -> Result<u64, SimError> {
        let words = usize::try_from(bytes.div_ceil(4)).map_err(|_| SimError {
            code: ERR_OOM,
            message: format!("buffer of {bytes} bytes"),
        })?;
        self.reserve(bytes, "buffer")?;
        let h = self.handle();
        self.buffers.insert(
            h,
            Buffer {
                data: vec![0.0; words],
                bytes,
            },
        );
        Ok(h)
    }

    /// `flint_tt_buffer_free`.
    pub fn free(&mut self, h: u64) -> Result<(), SimError> {
        match self.buffers.remove(&h) {
            Some(b) => {
                self.counters.dram_used_bytes -= b.bytes;
                Ok(())
            }
            None => invalid(format!("no buffer {h}")),
        }
    }

    fn buf(&self, h: u64) -> Result<&Buffer, SimError> {
        self.buffers.get(&h).ok_or_else(|| SimError {
            code: ERR_INVALID,
            message: format!("no buffer {h}"),
        })
    }

    /// A buffer's first `n` floats.
    fn floats(&self, h: u64, n: usize, what: &str) -> Result<&[f32], SimError> {
        let b = self.buf(h)?;
        if (n as u64) * 4 > b.bytes {
            return invalid(format!(
                "{what}: buffer {h} holds {} bytes, {n} floats needed",
                b.bytes
            ));
        }
        Ok(&b.data[..n])
    }

    /// Takes a buffer out of the map to write it while others are read; `put` returns it.
    fn take(&mut self, h: u64, n: usize, what: &str) -> Result<Buffer, SimError> {
        self.floats(h, n, what)?;
        self.buffers.remove(&h).ok_or_else(|| SimError {
            code: ERR_INVALID,
            message: format!("no buffer {h}"),
        })
    }

    fn put(&mut self, h: u64, b: Buffer) {
        self.buffers.insert(h, b);
    }

    /// `n` index values (`u32`, ABI 5) of buffer `h` from index `offset`: an op's index
    /// list, read on the device's side.
    pub fn indices(&self, h: u64, offset: u64, n: u64, what: &str) -> Result<Vec<u32>, SimError> {
        let b = self.buf(h)?;
        let end = offset
            .checked_add(n)
            .filter(|&e| e.saturating_mul(4) <= b.bytes);
        let Some(end) = end else {
            return invalid(format!(
                "{what}: {n} indices at {offset} outside buffer {h} of {} bytes",
                b.bytes
            ));
        };
        Ok(b.data[offset as usize..end as usize]
            .iter()
            .map(|x| x.to_bits())
            .collect())
    }

    /// `flint_tt_buffer_write`.
    pub fn write(&mut self, h: u64, offset: u64, src: &[u8]) -> Result<(), SimError> {
        let b = self.buffers.get_mut(&h).ok_or_else(|| SimError {
            code: ERR_INVALID,
            message: format!("no buffer {h}"),
        })?;
        let end = offset
            .checked_add(src.len() as u64)
            .filter(|&e| e <= b.bytes);
        let Some(end) = end else {
            return invalid(format!(
                "write of {} bytes at {offset} outside buffer {h} of {} bytes",
                src.len(),
                b.bytes
            ));
        };
        let bytes: &mut [u8] = bytemuck::cast_slice_mut(&mut b.data);
        bytes[offset as usize..end as usize].copy_from_slice(src);
        self.counters.host_writes += 1;
        self.counters.host_write_bytes += src.len() as u64;
        Ok(())
    }

    /// `flint_tt_buffer_read`.
    pub fn read(&mut self, h: u64, offset: u64, dst: &mut [u8]) -> Result<(), SimError> {
        let b = self.buf(h)?;
        let end = offset
            .checked_add(dst.len() as u64)
            .filter(|&e| e <= b.bytes);
        let Some(end) = end else {
            return invalid(format!(
                "read of {} bytes at {offset} outside buffer {h} of {} bytes",
                dst.len(),
                b.bytes
            ));
        };
        let bytes: &[u8] = bytemuck::cast_slice(&b.data);
        dst.copy_from_slice(&bytes[offset as usize..end as usize]);
        self.counters.host_reads += 1;
        self.counters.host_read_bytes += dst.len() as u64;
        Ok(())
    }

    /// `flint_tt_buffer_copy`: `bytes` from `src` at `src_offset` to `dst` at
    /// `dst_offset`, on the device. Overlapping ranges of one buffer are refused.
    pub fn copy(
        &mut self,
        src: u64,
        src_offset: u64,
        dst: u64,
        dst_offset: u64,
        bytes: u64,
    ) -> Result<(), SimError> {
        let range = |h: u64, off: u64, this: &Self, what: &str| {
            let b = this.buf(h)?;
            match off.checked_add(bytes).filter(|&e| e <= b.bytes) {
                Some(end) => Ok(off as usize..end as usize),
                None => invalid(format!(
                    "buffer_copy: {bytes} bytes at {off} outside {what} buffer {h} of {} bytes",
                    b.bytes
                )),
            }
        };
        let s = range(src, src_offset, self, "source")?;
        let d = range(dst, dst_offset, self, "destination")?;
        if bytes == 0 {
            return Ok(());
        }
        if src == dst {
            if s.start < d.end && d.start < s.end {
                return invalid(format!(
                    "buffer_copy: overlapping ranges {}..{} and {}..{} of buffer {src}",
                    s.start, s.end, d.start, d.end
                ));
            }
            let b = self.buffers.get_mut(&src).ok_or_else(|| SimError {
                code: ERR_INVALID,
                message: format!("no buffer {src}"),
            })?;
            let v: &mut [u8] = bytemuck::cast_slice_mut(&mut b.data);
            v.copy_within(s, d.start);
        } else {
            let sb = self.take(src, 0, "buffer_copy")?;
            let r = match self.buffers.get_mut(&dst) {
                Some(db) => {
                    let from: &[u8] = bytemuck::cast_slice(&sb.data);
                    let to: &mut [u8] = bytemuck::cast_slice_mut(&mut db.data);
                    to[d].copy_from_slice(&from[s]);
                    Ok(())
                }
                None => invalid(format!("no buffer {dst}")),
            };
            self.put(src, sb);
            r?;
        }
        self.counters.device_copies += 1;
        self.counters.device_copy_bytes += bytes;
        Ok(())
    }

    /// `flint_tt_weight_stage`.
    pub fn stage(&mut self, r: StageRequest) -> Result<u64, SimError> {
        if !is_float(r.ty) && !admits_kept(r.ty) {
            return err(
                ERR_UNSUPPORTED,
                format!(
                    "encoding {} is not admitted as kept blocks (expand it to BF16)",
                    r.ty
                ),
            );
        }
        if !is_float(r.ty) && r.source_ty != r.ty {
            return invalid(format!(
                "kept {} blocks with source encoding {}: kept blocks are their own source",
                r.ty, r.source_ty
            ));
        }
        let Some(row_bytes) = r.ty.row_bytes(r.in_f) else {
            return invalid(format!(
                "a row of {} values is not a whole number of {} blocks",
                r.in_f, r.ty
            ));
        };
        let expect = row_bytes.checked_mul(r.out_f);
        if expect != Some(r.data.len) {
            return invalid(format!(
                "{} weight [{}, {}] should be {:?} bytes, got {}",
                r.ty, r.in_f, r.out_f, expect, r.data.len
            ));
        }
        let store = if r.streamed {
            Store::Streamed(r.data)
        } else {
            self.reserve(r.data.len as u64, "resident weight")?;
            Store::Resident(r.data.as_slice().to_vec())
        };
        let h = self.handle();
        self.weights.insert(
            h,
            SimWeight {
                ty: r.ty,
                source_ty: r.source_ty,
                in_f: r.in_f,
                out_f: r.out_f,
                row_bytes,
                store,
            },
        );
        Ok(h)
    }

    /// `flint_tt_weight_free`.
    pub fn weight_free(&mut self, h: u64) -> Result<(), SimError> {
        match self.weights.remove(&h) {
            Some(w) => {
                if let Store::Resident(v) = &w.store {
                    self.counters.dram_used_bytes -= v.len() as u64;
                }
                Ok(())
            }
            None => invalid(format!("no weight {h}")),
        }
    }

    fn weight(&self, h: u64) -> Result<&SimWeight, SimError> {
        self.weights.get(&h).ok_or_else(|| SimError {
            code: ERR_INVALID,
            message: format!("no weight {h}"),
        })
    }

    fn count(&mut self, block: bool, streamed: u64) {
        if block {
            self.counters.block_dispatches += 1;
        } else {
            self.counters.float_dispatches += 1;
        }
        self.counters.streamed_bytes += streamed;
    }

    /// `flint_tt_matmul`.
    pub fn matmul(&mut self, w: u64, x: u64, m: usize, out: u64) -> Result<(), SimError> {
        let wt = self.weight(w)?;
        let (in_f, out_f) = (wt.in_f, wt.out_f);
        let mut ob = self.take(out, m * out_f, "matmul output")?;
        let r = (|| {
            if x == out {
                return invalid("matmul input and output are the same buffer");
            }
            let xs = self.floats(x, m * in_f, "matmul input")?;
            let wt = self.weight(w)?;
            let rows: Vec<usize> = (0..m).collect();
            gemm(wt, xs, &rows, &mut ob.data[..m * out_f], false)?;
            Ok((
                wt.is_block(),
                if wt.streamed() {
                    wt.bytes().len() as u64
                } else {
                    0
                },
            ))
        })();
        self.put(out, ob);
        let (block, streamed) = r?;
        self.count(block, streamed);
        Ok(())
    }

    /// `flint_tt_expert_matmul`; `rows` are `(input_row, expert)` pairs.
    pub fn expert_matmul(
        &mut self,
        experts: &[u64],
        x: u64,
        x_rows: usize,
        rows: &[(u32, u32)],
        out: u64,
    ) -> Result<(), SimError> {
        let Some(&first) = experts.first() else {
            return invalid("expert matmul with no experts");
        };
        let (in_f, out_f, block) = {
            let w = self.weight(first)?;
            (w.in_f, w.out_f, w.is_block())
        };
        for &e in experts {
            let w = self.weight(e)?;
            if (w.in_f, w.out_f, w.is_block()) != (in_f, out_f, block) {
                return invalid(format!(
                    "expert weights differ: {} [{}, {}] vs [{in_f}, {out_f}]",
                    w.ty, w.in_f, w.out_f
                ));
            }
        }
        for &(ir, e) in rows {
            if ir as usize >= x_rows || e as usize >= experts.len() {
                return invalid(format!(
                    "expert row (input {ir}, expert {e}) outside {x_rows} rows / {} experts",
                    experts.len()
                ));
            }
        }
        let mut ob = self.take(out, rows.len() * out_f, "expert matmul output")?;
        let r = (|| {
            if x == out {
                return invalid("expert matmul input and output are the same buffer");
            }
            let xs = self.floats(x, x_rows * in_f, "expert matmul input")?;
            let mut streamed = 0u64;
            // Group by expert so each expert's blocks are read once for all its rows.
            let mut by_expert: Vec<Vec<usize>> = vec![Vec::new(); experts.len()];
            for (i, &(_, e)) in rows.iter().enumerate() {
                by_expert[e as usize].push(i);
            }
            for (e, mine) in by_expert.iter().enumerate() {
                if mine.is_empty() {
                    continue;
                }
                let w = self.weight(experts[e])?;
                if w.streamed() {
                    streamed += w.bytes().len() as u64;
                }
                let act_rows: Vec<usize> = mine.iter().map(|&i| rows[i].0 as usize).collect();
                let mut tmp = vec![0.0f32; mine.len() * out_f];
                gemm(w, xs, &act_rows, &mut tmp, true)?;
                for (j, &i) in mine.iter().enumerate() {
                    ob.data[i * out_f..(i + 1) * out_f]
                        .copy_from_slice(&tmp[j * out_f..(j + 1) * out_f]);
                }
            }
            Ok(streamed)
        })();
        self.put(out, ob);
        let streamed = r?;
        self.count(block, streamed);
        Ok(())
    }

    /// `flint_tt_get_rows`.
    pub fn get_rows(&mut self, w: u64, ids: &[u32], out: u64) -> Result<(), SimError> {
        let (in_f, out_f) = {
            let wt = self.weight(w)?;
            (wt.in_f, wt.out_f)
        };
        if let Some(&bad) = ids.iter().find(|&&i| i as usize >= out_f) {
            return invalid(format!("row id {bad} outside a table of {out_f} rows"));
        }
        let mut ob = self.take(out, ids.len() * in_f, "get_rows output")?;
        let r = (|| {
            let wt = self.weight(w)?;
            for (i, &id) in ids.iter().enumerate() {
                wt.row(id as usize, &mut ob.data[i * in_f..(i + 1) * in_f])?;
            }
            Ok(if wt.streamed() {
                (ids.len() * wt.row_bytes) as u64
            } else {
                0
            })
        })();
        self.put(out, ob);
        self.counters.streamed_bytes += r?;
        Ok(())
    }

    /// Runs `f(inputs, output)` with `out` taken out of the map and `ins` read-only.
    fn with_out<const N: usize>(
        &mut self,
        ins: [(u64, usize); N],
        out: (u64, usize),
        what: &str,
        f: impl FnOnce([&[f32]; N], &mut [f32]) -> Result<(), SimError>,
    ) -> Result<(), SimError> {
        if ins.iter().any(|&(h, _)| h == out.0) {
            return invalid(format!("{what}: an input is also the output buffer"));
        }
        let mut ob = self.take(out.0, out.1, what)?;
        let r = (|| {
            let mut refs: [&[f32]; N] = [&[]; N];
            for (k, &(h, n)) in ins.iter().enumerate() {
                refs[k] = self.floats(h, n, what)?;
            }
            f(refs, &mut ob.data[..out.1])
        })();
        self.put(out.0, ob);
        r
    }

    /// `flint_tt_rms_norm`.
    pub fn rms_norm(
        &mut self,
        x: u64,
        n: usize,
        weight: u64,
        eps: f32,
        dim: usize,
        out: u64,
    ) -> Result<(), SimError> {
        check_rows(n, dim, "rms_norm")?;
        if weight == 0 {
            self.with_out([(x, n)], (out, n), "rms_norm", |[x], o| {
                kernels::rms_norm(x, None, eps, dim, o);
                Ok(())
            })
        } else {
            self.with_out(
                [(x, n), (weight, dim)],
                (out, n),
                "rms_norm",
                |[x, w], o| {
                    kernels::rms_norm(x, Some(w), eps, dim, o);
                    Ok(())
                },
            )
        }
    }

    /// `flint_tt_add_rms_norm`.
    pub fn add_rms_norm(
        &mut self,
        residual: u64,
        delta: u64,
        n: usize,
        weight: u64,
        eps: f32,
        dim: usize,
        out: u64,
    ) -> Result<(), SimError> {
        check_rows(n, dim, "add_rms_norm")?;
        self.with_out([(delta, n)], (residual, n), "add_rms_norm", |[d], r| {
            r.iter_mut().zip(d).for_each(|(a, b)| *a += b);
            Ok(())
        })?;
        self.with_out(
            [(residual, n), (weight, dim)],
            (out, n),
            "add_rms_norm",
            |[r, w], o| {
                kernels::rms_norm(r, Some(w), eps, dim, o);
                Ok(())
            },
        )
    }

    /// `flint_tt_rope`.
    pub fn rope(
        &mut self,
        x: u64,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        cfg: &RopeConfig<'_>,
    ) -> Result<(), SimError> {
        if let Err(e) = cfg.check(head_dim) {
            return invalid(e.to_string());
        }
        let n = positions.len() * n_heads * head_dim;
        if n == 0 {
            return Ok(());
        }
        self.with_out([], (x, n), "rope", |[], x| {
            kernels::rope(x, positions, n_heads, head_dim, cfg);
            Ok(())
        })
    }

    /// `flint_tt_silu_mul` (`gelu = false`) and `flint_tt_gelu_mul`.
    pub fn act_mul(
        &mut self,
        gate: u64,
        up: u64,
        n: usize,
        out: u64,
        gelu: bool,
    ) -> Result<(), SimError> {
        self.with_out([(gate, n), (up, n)], (out, n), "act_mul", |[g, u], o| {
            for ((o, &g), &u) in o.iter_mut().zip(g).zip(u) {
                *o = if gelu {
                    kernels::gelu(g)
                } else {
                    kernels::silu(g)
                } * u;
            }
            Ok(())
        })
    }

    /// `flint_tt_add`.
    pub fn add(&mut self, acc: u64, x: u64, n: usize) -> Result<(), SimError> {
        self.with_out([(x, n)], (acc, n), "add", |[x], a| {
            a.iter_mut().zip(x).for_each(|(a, b)| *a += b);
            Ok(())
        })
    }

    /// `flint_tt_add_bias`: `bias` added to every row of `x`.
    pub fn add_bias(
        &mut self,
        x: u64,
        n: usize,
        bias: u64,
        bias_len: usize,
    ) -> Result<(), SimError> {
        if bias_len == 0 || !n.is_multiple_of(bias_len) {
            return invalid(format!(
                "add_bias: a bias of {bias_len} values does not fit rows of x ({n} values)"
            ));
        }
        self.with_out([(bias, bias_len)], (x, n), "add_bias", |[b], x| {
            kernels::add_bias(x, b);
            Ok(())
        })
    }

    /// `flint_tt_scale`.
    pub fn scale(&mut self, x: u64, n: usize, s: f32) -> Result<(), SimError> {
        self.with_out([], (x, n), "scale", |[], x| {
            x.iter_mut().for_each(|v| *v *= s);
            Ok(())
        })
    }

    /// `flint_tt_scatter_add_weighted`.
    pub fn scatter_add_weighted(
        &mut self,
        acc: u64,
        acc_rows: usize,
        x: u64,
        rows: &[u32],
        weights: &[f32],
        dim: usize,
    ) -> Result<(), SimError> {
        if let Some(&bad) = rows.iter().find(|&&r| r as usize >= acc_rows) {
            return invalid(format!("scatter row {bad} outside {acc_rows} rows"));
        }
        self.with_out(
            [(x, rows.len() * dim)],
            (acc, acc_rows * dim),
            "scatter_add_weighted",
            |[x], a| {
                for (i, (&r, &w)) in rows.iter().zip(weights).enumerate() {
                    let dst = &mut a[r as usize * dim..(r as usize + 1) * dim];
                    for (d, &v) in dst.iter_mut().zip(&x[i * dim..(i + 1) * dim]) {
                        *d += w * v;
                    }
                }
                Ok(())
            },
        )
    }

    /// `flint_tt_route_topk`.
    pub fn route_topk(
        &self,
        logits: u64,
        n_rows: usize,
        n_experts: usize,
        bias: u64,
        k: usize,
        gating: flint_core::math::Gating,
        normalize: bool,
        scale: f32,
        ids: &mut [u32],
        weights: &mut [f32],
    ) -> Result<(), SimError> {
        if k == 0 || k > n_experts {
            return invalid(format!("route_topk: k = {k} with {n_experts} experts"));
        }
        let l = self.floats(logits, n_rows * n_experts, "route_topk logits")?;
        let bias = if bias == 0 {
            None
        } else {
            Some(self.floats(bias, n_experts, "route_topk bias")?)
        };
        for r in 0..n_rows {
            kernels::route_topk_row(
                &l[r * n_experts..(r + 1) * n_experts],
                bias,
                k,
                gating,
                normalize,
                scale,
                &mut ids[r * k..(r + 1) * k],
                &mut weights[r * k..(r + 1) * k],
            )
            .map_err(|m| SimError {
                code: ERR_INVALID,
                message: m,
            })?;
        }
        Ok(())
    }

    /// `flint_tt_write_kv`.
    pub fn write_kv(
        &mut self,
        l: &KvLayout,
        k_cache: u64,
        v_cache: u64,
        k: u64,
        v: u64,
        slots: &[u32],
    ) -> Result<(), SimError> {
        let slots_n = l.num_blocks * l.block_size;
        if let Some(&bad) = slots.iter().find(|&&s| s as usize >= slots_n) {
            return invalid(format!("KV slot {bad} outside {slots_n} slots"));
        }
        // Keys and values in fp16 (the device's Float16 tile format, half the DRAM of
        // f32), rounded to nearest even: the precision the CPU backend and llama.cpp's
        // default K and V caches keep them at.
        for (cache, src, hd, fp16) in [
            (k_cache, k, l.head_dim_k, true),
            (v_cache, v, l.head_dim_v, true),
        ] {
            let row = l.n_kv_heads * hd;
            self.with_out(
                [(src, slots.len() * row)],
                (cache, slots_n * row),
                "write_kv",
                |[s], c| {
                    for (i, &slot) in slots.iter().enumerate() {
                        let slot = slot as usize;
                        let dst = &mut c[slot * row..(slot + 1) * row];
                        dst.copy_from_slice(&s[i * row..(i + 1) * row]);
                        if fp16 {
                            dst.iter_mut()
                                .for_each(|x| *x = flint_core::math::f16_round(*x));
                        }
                    }
                    Ok(())
                },
            )?;
        }
        Ok(())
    }

    /// `flint_tt_paged_attention`.
    pub fn paged_attention(
        &mut self,
        l: &KvLayout,
        k_cache: u64,
        v_cache: u64,
        q: u64,
        q_rows: usize,
        seqs: &[Seq<'_>],
        n_heads: usize,
        scale: f32,
        sinks: Option<&[f32]>,
        window: usize,
        out: u64,
    ) -> Result<(), SimError> {
        if l.n_kv_heads == 0 || !n_heads.is_multiple_of(l.n_kv_heads) {
            return invalid(format!(
                "{n_heads} query heads is not a multiple of {} KV heads",
                l.n_kv_heads
            ));
        }
        let slots_n = l.num_blocks * l.block_size;
        let (dk, dv, hkv) = (l.head_dim_k, l.head_dim_v, l.n_kv_heads);
        let group = n_heads / hkv;
        // Resolve every (sequence, position) to a slot first, so a bad table is an error
        // before anything is written.
        let mut plans: Vec<Vec<Vec<usize>>> = Vec::with_capacity(seqs.len());
        for (si, s) in seqs.iter().enumerate() {
            if s.q_start + s.positions.len() > q_rows {
                return invalid(format!("sequence {si} query rows outside {q_rows} rows"));
            }
            let mut per_row = Vec::with_capacity(s.positions.len());
            for &p in s.positions {
                let p = p as usize;
                let lo = flint_core::math::window_start(p, (window > 0).then_some(window));
                let mut slots = Vec::with_capacity(p + 1 - lo);
                for j in lo..=p {
                    let b = s.block_table.get(j / l.block_size).copied();
                    match b {
                        Some(b) if b != u32::MAX && (b as usize) < l.num_blocks => {
                            slots.push(b as usize * l.block_size + j % l.block_size)
                        }
                        _ => {
                            return invalid(format!(
                                "sequence {si}: position {j} has no KV block (table {:?})",
                                b
                            ))
                        }
                    }
                }
                debug_assert!(slots.iter().all(|&s| s < slots_n));
                per_row.push(slots);
            }
            plans.push(per_row);
        }
        self.with_out(
            [
                (q, q_rows * n_heads * dk),
                (k_cache, slots_n * hkv * dk),
                (v_cache, slots_n * hkv * dv),
            ],
            (out, q_rows * n_heads * dv),
            "paged_attention",
            |[qs, kc, vc], o| {
                let (mut keys, mut values) = (Vec::new(), Vec::new());
                for (s, per_row) in seqs.iter().zip(&plans) {
                    for (r, slots) in per_row.iter().enumerate() {
                        let row = s.q_start + r;
                        // The visible positions are `first ..= positions[r]`, in order.
                        let first = (s.positions[r] as usize + 1) - slots.len();
                        for h in 0..n_heads {
                            let g = h / group;
                            let qh = &qs[(row * n_heads + h) * dk..][..dk];
                            keys.clear();
                            values.clear();
                            for &slot in slots {
                                keys.push(&kc[(slot * hkv + g) * dk..][..dk]);
                                values.push(&vc[(slot * hkv + g) * dv..][..dv]);
                            }
                            let oh = &mut o[(row * n_heads + h) * dv..][..dv];
                            kernels::attend_head(
                                qh,
                                &keys,
                                &values,
                                first,
                                scale,
                                sinks.map(|s| s[h]),
                                oh,
                            );
                        }
                    }
                }
                Ok(())
            },
        )
    }
}

/// Worker threads for one matmul: `FLINT_THREADS` when set, else the machine's
/// parallelism (at most 16); one when the work is small.
fn threads(work: usize) -> usize {
    static N: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    if work < 1 << 20 {
        return 1;
    }
    *N.get_or_init(|| {
        std::env::var("FLINT_THREADS")
            .ok()
            .and_then(|v| v.trim().parse::<usize>().ok())
            .filter(|&n| n > 0)
            .unwrap_or_else(|| std::thread::available_parallelism().map_or(1, |n| n.get()))
            .min(16)
    })
}

/// `out[j][o] = W[o] . x[rows[j]]` for every output row `o` of `w`, with the activation
/// rows encoded once as the core pairs them with `w`'s encoding and each dot product
/// from the core `vec_dot` reference (an expert tower's rows, `expert`, in llama.cpp's
/// `MUL_MAT_ID` order). Output rows of `w` are split across threads.
fn gemm(
    w: &SimWeight,
    x: &[f32],
    rows: &[usize],
    out: &mut [f32],
    expert: bool,
) -> Result<(), SimError> {
    let (in_f, out_f) = (w.in_f, w.out_f);
    let runtime = |m: String| SimError {
        code: ERR_RUNTIME,
        message: m,
    };
    let mut sel = Vec::with_capacity(rows.len() * in_f);
    for &r in rows {
        sel.extend_from_slice(&x[r * in_f..(r + 1) * in_f]);
    }
    // A weight the host expanded from blocks without loss (to F32: the keep-quant arm)
    // meets activations rounded as ggml pairs them with the blocks (Q8_0 for the legacy
    // types, Q8_K for the K-quants), so that the expansion moves the weight into a float
    // encoding without changing what the matmul computes (the ABI's `source_type`); Q8_0
    // and Q5_0 sources are also summed in the blocks' order (`dot_f32_tinyblas`). The
    // BF16 arm rounds the weights and keeps f32 activations.
    let lossless = w.ty == GgmlType::F32 && w.source_ty.is_quantized();
    let tinyblas_expanded = lossless && matches!(w.source_ty, GgmlType::Q8_0 | GgmlType::Q5_0);
    if lossless && !tinyblas_expanded {
        sel = kernels::round_acts(w.source_ty, &sel, in_f).map_err(runtime)?;
    }
    // Float rows take f32 activations as they are (BF16 and F32 through the fast row
    // dots, F16 through the core `vec_dot` on the f32 bytes); block rows the encoded ones.
    let acts = if tinyblas_expanded {
        // Q8_0 blocks, as the source blocks would meet them (see `dot_f32_tinyblas`).
        kernels::encode_acts(w.source_ty, &sel, in_f).map_err(runtime)?
    } else if matches!(w.ty, GgmlType::BF16 | GgmlType::F32) {
        Vec::new()
    } else {
        kernels::encode_acts(w.ty, &sel, in_f).map_err(runtime)?
    };
    let arb = acts.len().checked_div(rows.len()).unwrap_or(0);
    // The same bytes as blocks, read unaligned (a byte vector promises no alignment).
    let act_blocks: Vec<flint_core::blocks::BlockQ8_0> = if tinyblas_expanded {
        acts.chunks_exact(std::mem::size_of::<flint_core::blocks::BlockQ8_0>())
            .map(bytemuck::pod_read_unaligned)
            .collect()
    } else {
        Vec::new()
    };
    let (bytes, ty, row_bytes) = (w.bytes(), w.ty, w.row_bytes);
    // Where llama.cpp's tinyBLAS declines an F32 matmul whatever the batch (see
    // `kernels::dot_f32`); a single row keeps tinyBLAS's order, batch-invariant as the
    // cpu device's default.
    let f32_vec_order = expert || out_f % 4 != 0;
    let n_thr = threads(rows.len() * in_f * out_f).min(out_f.max(1));
    let chunk = out_f.div_ceil(n_thr.max(1)).max(1);
    let work = |o0: usize, o1: usize| -> Result<Vec<f32>, String> {
        let mut part = vec![0.0f32; rows.len() * (o1 - o0)];
        let wid = o1 - o0;
        for o in o0..o1 {
            let wr = &bytes[o * row_bytes..(o + 1) * row_bytes];
            for j in 0..rows.len() {
                part[j * wid + (o - o0)] = if tinyblas_expanded {
                    let per = act_blocks.len() / rows.len();
                    kernels::dot_f32_tinyblas(wr, &act_blocks[j * per..(j + 1) * per])?
                } else if ty == GgmlType::BF16 {
                    kernels::dot_bf16(wr, &sel[j * in_f..(j + 1) * in_f])
                } else if ty == GgmlType::F32 {
                    kernels::dot_f32(wr, &sel[j * in_f..(j + 1) * in_f], f32_vec_order)
                } else {
                    kernels::vec_dot(ty, wr, &acts[j * arb..(j + 1) * arb], in_f, expert)?
                };
            }
        }
        Ok(part)
    };
    let parts: Vec<(usize, usize, Result<Vec<f32>, String>)> = if n_thr <= 1 {
        vec![(0, out_f, work(0, out_f))]
    } else {
        std::thread::scope(|s| {
            let hs: Vec<_> = (0..out_f)
                .step_by(chunk)
                .map(|o0| {
                    let o1 = (o0 + chunk).min(out_f);
                    (o0, o1, s.spawn(move || work(o0, o1)))
                })
                .collect();
            hs.into_iter()
                .map(|(o0, o1, h)| {
                    let r = h
                        .join()
                        .unwrap_or_else(|_| Err("a matmul worker panicked".to_string()));
                    (o0, o1, r)
                })
                .collect()
        })
    };
    for (o0, o1, part) in parts {
        let part = part.map_err(runtime)?;
        let wid = o1 - o0;
        for j in 0..rows.len() {
            out[j * out_f + o0..j * out_f + o1].copy_from_slice(&part[j * wid..(j + 1) * wid]);
        }
    }
    Ok(())
}

fn check_rows(n: usize, dim: usize, what: &str) -> Result<(), SimError> {
    if dim == 0 || !n.is_multiple_of(dim) {
        return invalid(format!("{what}: {n} values are not rows of {dim}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn buffer_copy_checks_ranges_and_counts() {
        let mut st = State::new(1 << 20);
        let a = st.alloc(64).expect("alloc");
        let b = st.alloc(64).expect("alloc");
        let vals: Vec<f32> = (0..16).map(|i| i as f32).collect();
        st.write(a, 0, bytemuck::cast_slice(&vals)).expect("write");
        // 4 values from a[2] to b[5], then b[5..9] to b[12..16] (one buffer, apart).
        st.copy(a, 8, b, 20, 16).expect("copy");
        st.copy(b, 20, b, 48, 16).expect("copy within");
        let mut out = vec![0.0f32; 16];
        st.read(b, 0, bytemuck::cast_slice_mut(&mut out))
            .expect("read");
        assert_eq!(&out[5..9], &vals[2..6]);
        assert_eq!(&out[12..16], &vals[2..6]);
        assert_eq!(out[0], 0.0);
        // Overlapping ranges of one buffer, and ranges outside a buffer, are refused.
        let e = st.copy(a, 0, a, 8, 16).expect_err("overlap");
        assert_eq!(e.code, ERR_INVALID);
        assert!(e.message.contains("overlapping"), "{}", e.message);
        let e = st.copy(a, 60, b, 0, 8).expect_err("outside");
        assert_eq!(e.code, ERR_INVALID);
        assert!(st.copy(a, 0, 999, 0, 4).is_err());
        let c = st.counters();
        assert_eq!((c.device_copies, c.device_copy_bytes), (2, 32));
        assert_eq!((c.host_writes, c.host_write_bytes), (1, 64));
        assert_eq!((c.host_reads, c.host_read_bytes), (1, 64));
    }
}
