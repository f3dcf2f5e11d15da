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

/// A range of 4-byte values of one buffer: `start .. end` of buffer `h`.
#[derive(Clone, Copy, Debug)]
struct Span {
    h: u64,
    start: u64,
    end: u64,
}

impl Span {
    /// Whether the two ranges share a value.
    fn overlaps(&self, o: &Span) -> bool {
        self.h == o.h && self.start < o.end && o.start < self.end
    }
}

/// Refuses an op whose written range `out` overlaps one of the ranges it reads.
fn disjoint(what: &str, out: (&str, Span), ins: &[(&str, Span)]) -> Result<(), SimError> {
    for (name, s) in ins {
        if out.1.overlaps(s) {
            return invalid(format!(
                "{what}: {} (buffer {}, values {}..{}) overlaps {name} (values {}..{})",
                out.0, out.1.h, out.1.start, out.1.end, s.start, s.end
            ));
        }
    }
    Ok(())
}

/// The arguments of `flint_tt_route_topk` (ABI 6): buffers (0 = none for `bias` and
/// `expert_scale`) and, for the two outputs, the buffer and the first value written.
#[derive(Clone, Copy, Debug)]
pub struct Routing {
    pub logits: u64,
    pub n_rows: usize,
    pub n_experts: usize,
    pub bias: u64,
    pub expert_scale: u64,
    pub k: usize,
    pub gating: flint_core::math::Gating,
    pub normalize: bool,
    pub scale: f32,
    pub ids: (u64, u64),
    pub weights: (u64, u64),
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

    /// The 4-byte range `offset .. offset + n` of buffer `h`, checked to lie inside it.
    fn span(&self, h: u64, offset: u64, n: u64, what: &str) -> Result<Span, SimError> {
        let b = self.buffers.get(&h).ok_or_else(|| SimError {
            code: ERR_INVALID,
            message: format!("{what}: no buffer {h}"),
        })?;
        match offset
            .checked_add(n)
            .filter(|&e| e.saturating_mul(4) <= b.bytes)
        {
            Some(end) => Ok(Span {
                h,
                start: offset,
                end,
            }),
            None => invalid(format!(
                "{what}: {n} values at {offset} outside buffer {h} of {} bytes",
                b.bytes
            )),
        }
    }

    /// `n` floats of buffer `h` from float `offset`.
    fn floats_at(&self, h: u64, offset: u64, n: usize, what: &str) -> Result<&[f32], SimError> {
        let s = self.span(h, offset, n as u64, what)?;
        Ok(&self.buf(h)?.data[s.start as usize..s.end as usize])
    }

    /// Writes 4-byte values into a range checked by [`span`](Self::span) (on the
    /// device's side: not host traffic).
    fn write_span(&mut self, s: Span, vals: impl IntoIterator<Item = f32>) {
        if let Some(b) = self.buffers.get_mut(&s.h) {
            for (d, v) in b.data[s.start as usize..s.end as usize]
                .iter_mut()
                .zip(vals)
            {
                *d = v;
            }
        }
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

    /// `flint_tt_expert_matmul` (ABI 6): routed row `i` is expert `ids[i]` (read from
    /// index buffer `ids` from `ids_offset`) on input row `i / (n_rows / x_rows)`.
    pub fn expert_matmul(
        &mut self,
        experts: &[u64],
        x: u64,
        x_rows: usize,
        ids: u64,
        ids_offset: u64,
        n_rows: usize,
        out: u64,
    ) -> Result<(), SimError> {
        let Some(&first) = experts.first() else {
            return invalid("expert_matmul: no experts");
        };
        let (in_f, out_f, block) = {
            let w = self.weight(first)?;
            (w.in_f, w.out_f, w.is_block())
        };
        for &e in experts {
            let w = self.weight(e)?;
            if (w.in_f, w.out_f, w.is_block()) != (in_f, out_f, block) {
                return invalid(format!(
                    "expert_matmul: expert weights differ: {} [{}, {}] vs [{in_f}, {out_f}]",
                    w.ty, w.in_f, w.out_f
                ));
            }
        }
        let fan = fanout(x_rows, n_rows, "expert_matmul")?;
        let id_span = self.span(ids, ids_offset, n_rows as u64, "expert_matmul ids")?;
        let out_span = self.span(out, 0, (n_rows * out_f) as u64, "expert_matmul output")?;
        disjoint(
            "expert_matmul",
            ("the output", out_span),
            &[("the ids", id_span)],
        )?;
        let ids = self.indices(ids, ids_offset, n_rows as u64, "expert_matmul ids")?;
        if let Some((i, &bad)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &e)| e as usize >= experts.len())
        {
            return invalid(format!(
                "expert_matmul: expert id {bad} (routed row {i}) outside {} experts",
                experts.len()
            ));
        }
        let rows: Vec<(u32, u32)> = ids
            .iter()
            .enumerate()
            .map(|(i, &e)| ((i / fan) as u32, e))
            .collect();
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

    /// `flint_tt_rope`: `cfg` without factors; `factors` the buffer holding them and the
    /// first one's index (ABI 6; handle 0 = none), read here on the device's side.
    pub fn rope(
        &mut self,
        x: u64,
        positions: &[u32],
        n_heads: usize,
        head_dim: usize,
        cfg: RopeConfig<'_>,
        factors: (u64, u64),
    ) -> Result<(), SimError> {
        if let Err(e) = cfg.check(head_dim) {
            return invalid(e.to_string());
        }
        let n = positions.len() * n_heads * head_dim;
        let ff = match factors {
            (0, _) => None,
            (h, off) => {
                let half = cfg.n_rot / 2;
                let fs = self.span(h, off, half as u64, "rope frequency factors")?;
                let xs = self.span(x, 0, n as u64, "rope x")?;
                disjoint("rope", ("x", xs), &[("the frequency factors", fs)])?;
                Some(
                    self.floats_at(h, off, half, "rope frequency factors")?
                        .to_vec(),
                )
            }
        };
        let cfg = RopeConfig {
            freq_factors: ff.as_deref(),
            ..cfg
        };
        // The factors' values (finite and positive), as they are in the buffer.
        if let Err(e) = cfg.check(head_dim) {
            return invalid(format!(
                "{e} (factors in buffer {} from float {})",
                factors.0, factors.1
            ));
        }
        if n == 0 {
            return Ok(());
        }
        self.with_out([], (x, n), "rope", |[], x| {
            kernels::rope(x, positions, n_heads, head_dim, &cfg);
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

    /// `flint_tt_scatter_add_weighted` (ABI 6): `acc[i / (n / acc_rows)] += weights[i] *
    /// x[i]` in order of `i`, the weights read from float buffer `weights` from
    /// `weights_offset`.
    pub fn scatter_add_weighted(
        &mut self,
        acc: u64,
        acc_rows: usize,
        x: u64,
        weights: u64,
        weights_offset: u64,
        n: usize,
        dim: usize,
    ) -> Result<(), SimError> {
        let fan = fanout(acc_rows, n, "scatter_add_weighted")?;
        let w_span = self.span(
            weights,
            weights_offset,
            n as u64,
            "scatter_add_weighted weights",
        )?;
        let acc_span = self.span(acc, 0, (acc_rows * dim) as u64, "scatter_add_weighted acc")?;
        disjoint(
            "scatter_add_weighted",
            ("acc", acc_span),
            &[("the weights", w_span)],
        )?;
        let w = self
            .floats_at(weights, weights_offset, n, "scatter_add_weighted weights")?
            .to_vec();
        self.with_out(
            [(x, n * dim)],
            (acc, acc_rows * dim),
            "scatter_add_weighted",
            |[x], a| {
                for (i, &w) in w.iter().enumerate() {
                    let r = i / fan;
                    let dst = &mut a[r * dim..(r + 1) * dim];
                    for (d, &v) in dst.iter_mut().zip(&x[i * dim..(i + 1) * dim]) {
                        *d += w * v;
                    }
                }
                Ok(())
            },
        )
    }

    /// `flint_tt_route_topk` (ABI 6): ids and weights written into device buffers.
    pub fn route_topk(&mut self, r: &Routing) -> Result<(), SimError> {
        let (n_rows, n_experts, k) = (r.n_rows, r.n_experts, r.k);
        if k == 0 || k > n_experts {
            return invalid(format!("route_topk: k = {k} with {n_experts} experts"));
        }
        let total = (n_rows * k) as u64;
        let mut ins = vec![(
            "the logits",
            self.span(
                r.logits,
                0,
                (n_rows * n_experts) as u64,
                "route_topk logits",
            )?,
        )];
        for (h, name) in [(r.bias, "the bias"), (r.expert_scale, "the expert scale")] {
            if h != 0 {
                ins.push((name, self.span(h, 0, n_experts as u64, name)?));
            }
        }
        let id_span = self.span(r.ids.0, r.ids.1, total, "route_topk ids")?;
        let w_span = self.span(r.weights.0, r.weights.1, total, "route_topk weights")?;
        disjoint("route_topk", ("the ids", id_span), &ins)?;
        ins.push(("the ids", id_span));
        disjoint("route_topk", ("the weights", w_span), &ins)?;

        let l = self.floats(r.logits, n_rows * n_experts, "route_topk logits")?;
        let bias = match r.bias {
            0 => None,
            h => Some(self.floats(h, n_experts, "route_topk bias")?),
        };
        let es = match r.expert_scale {
            0 => None,
            h => Some(self.floats(h, n_experts, "route_topk expert scale")?),
        };
        let mut ids = vec![0u32; n_rows * k];
        let mut ws = vec![0.0f32; n_rows * k];
        for row in 0..n_rows {
            let (ri, rw) = (
                &mut ids[row * k..(row + 1) * k],
                &mut ws[row * k..(row + 1) * k],
            );
            kernels::route_topk_row(
                &l[row * n_experts..(row + 1) * n_experts],
                bias,
                k,
                r.gating,
                r.normalize,
                r.scale,
                ri,
                rw,
            )
            .map_err(|m| SimError {
                code: ERR_INVALID,
                message: format!("route_topk: {m}"),
            })?;
            if let Some(s) = es {
                // Gemma 4's per-expert output scale, after the routing.
                for (w, &id) in rw.iter_mut().zip(ri.iter()) {
                    *w *= s[id as usize];
                }
            }
        }
        self.write_span(id_span, ids.into_iter().map(f32::from_bits));
        self.write_span(w_span, ws);
        Ok(())
    }

    /// `flint_tt_sigmoid`: `x = sigmoid(x)` for `n` values.
    pub fn sigmoid(&mut self, x: u64, n: usize) -> Result<(), SimError> {
        self.with_out([], (x, n), "sigmoid", |[], x| {
            flint_core::math::sigmoid_ggml_in_place(x);
            Ok(())
        })
    }

    /// `flint_tt_mul`: `acc[i] *= x[i / (n / x_len)]`.
    pub fn mul(&mut self, acc: u64, n: usize, x: u64, x_len: usize) -> Result<(), SimError> {
        if n == 0 {
            return Ok(());
        }
        if x_len == 0 || !n.is_multiple_of(x_len) {
            return invalid(format!(
                "mul: {x_len} values of x do not divide the {n} values of acc"
            ));
        }
        self.with_out([(x, x_len)], (acc, n), "mul", |[x], a| {
            flint_core::math::mul_rows(a, x);
            Ok(())
        })
    }

    /// `flint_tt_deinterleave`: `src` (`n` values, groups of `outs.len()` chunks of
    /// `chunk`) split by chunk into `outs`, `n / outs.len()` values each. Everything is
    /// checked before anything is written.
    pub fn deinterleave(
        &mut self,
        src: u64,
        n: usize,
        chunk: usize,
        outs: &[u64],
    ) -> Result<(), SimError> {
        let parts = outs.len();
        if chunk == 0 || parts == 0 || !n.is_multiple_of(chunk * parts) {
            return invalid(format!(
                "deinterleave: {n} values are not groups of {parts} chunks of {chunk}"
            ));
        }
        let per = n / parts;
        self.span(src, 0, n as u64, "deinterleave source")?;
        let mut spans = Vec::with_capacity(parts);
        for (j, &o) in outs.iter().enumerate() {
            let os = self.span(o, 0, per as u64, &format!("deinterleave output {j}"))?;
            // Every range starts at its buffer's first value: distinct buffers.
            if o == src {
                return invalid(format!(
                    "deinterleave: output {j} (buffer {o}) is also the source"
                ));
            }
            if let Some(i) = outs[..j].iter().position(|&p| p == o) {
                return invalid(format!(
                    "deinterleave: output {j} (buffer {o}) is also output {i}"
                ));
            }
            spans.push(os);
        }
        if n == 0 {
            return Ok(());
        }
        let mut parts_out: Vec<Vec<f32>> = vec![vec![0.0; per]; parts];
        {
            let s = self.floats(src, n, "deinterleave source")?;
            let mut refs: Vec<&mut [f32]> = parts_out.iter_mut().map(Vec::as_mut_slice).collect();
            flint_core::math::deinterleave(s, chunk, &mut refs);
        }
        for (os, vals) in spans.into_iter().zip(parts_out) {
            self.write_span(os, vals);
        }
        Ok(())
    }

    /// `flint_tt_delta_net_gate`: the log decay of each row of `heads` values of
    /// `alpha`, in place.
    pub fn delta_net_gate(
        &mut self,
        alpha: u64,
        n: usize,
        dt_bias: u64,
        a: u64,
        heads: usize,
    ) -> Result<(), SimError> {
        if heads == 0 || !n.is_multiple_of(heads) {
            return invalid(format!(
                "delta_net_gate: {n} values are not rows of {heads} heads"
            ));
        }
        self.with_out(
            [(dt_bias, heads), (a, heads)],
            (alpha, n),
            "delta_net_gate",
            |[dt, sa], al| {
                flint_core::math::delta_net_gates(al, dt, sa);
                Ok(())
            },
        )
    }

    /// `flint_tt_l2_norm`: every row of `dim` values of `x` L2-normalised in place.
    pub fn l2_norm(&mut self, x: u64, n: usize, dim: usize, eps: f32) -> Result<(), SimError> {
        check_rows(n, dim, "l2_norm")?;
        self.with_out([], (x, n), "l2_norm", |[], x| {
            flint_core::math::l2_norm_heads(x, dim, eps);
            Ok(())
        })
    }

    /// The `len` floats of a recurrent state at `state.1` of buffer `state.0`, checked to
    /// lie inside it and to overlap none of `others` (the op's other ranges).
    fn state_span(
        &self,
        what: &str,
        state: (u64, u64),
        len: usize,
        others: &[(&str, Span)],
    ) -> Result<Span, SimError> {
        let ss = self.span(state.0, state.1, len as u64, &format!("{what} state"))?;
        disjoint(what, ("the state", ss), others)?;
        Ok(ss)
    }

    /// `flint_tt_ssm_conv_silu`: `out = silu(ssm_conv(x))` over `n_rows` rows of
    /// `channels`, the window read from and written back to `state` (buffer, first
    /// float) on the device's side.
    #[allow(clippy::too_many_arguments)]
    pub fn ssm_conv_silu(
        &mut self,
        x: u64,
        n_rows: usize,
        channels: usize,
        weight: u64,
        d_conv: usize,
        state: (u64, u64),
        out: u64,
    ) -> Result<(), SimError> {
        const WHAT: &str = "ssm_conv_silu";
        let too_big = || SimError {
            code: ERR_INVALID,
            message: format!(
                "{WHAT}: {n_rows} rows of {channels} channels, kernel {d_conv}, are too many"
            ),
        };
        if d_conv == 0 {
            return invalid(format!("{WHAT}: d_conv is 0"));
        }
        let n = n_rows.checked_mul(channels).ok_or_else(too_big)?;
        let wl = channels.checked_mul(d_conv).ok_or_else(too_big)?;
        let sl = channels * (d_conv - 1);
        let xs = self.span(x, 0, n as u64, "ssm_conv_silu x")?;
        let ws = self.span(weight, 0, wl as u64, "ssm_conv_silu weight")?;
        let os = self.span(out, 0, n as u64, "ssm_conv_silu out")?;
        let ss = self.state_span(
            WHAT,
            state,
            sl,
            &[("x", xs), ("the weight", ws), ("out", os)],
        )?;
        let mut st = self
            .floats_at(state.0, state.1, sl, "ssm_conv_silu state")?
            .to_vec();
        self.with_out([(x, n), (weight, wl)], (out, n), WHAT, |[x, w], o| {
            kernels::ssm_conv_silu(x, w, d_conv, &mut st, o);
            Ok(())
        })?;
        self.write_span(ss, st);
        Ok(())
    }

    /// `flint_tt_gated_delta_net`: the gated delta rule of one sequence of `n_tokens`,
    /// the per-head states read from and written back to `state` (buffer, first float) on
    /// the device's side.
    #[allow(clippy::too_many_arguments)]
    pub fn gated_delta_net(
        &mut self,
        shape: flint_core::math::DeltaNetShape,
        n_tokens: usize,
        q: u64,
        k: u64,
        v: u64,
        g: u64,
        beta: u64,
        state: (u64, u64),
        out: u64,
    ) -> Result<(), SimError> {
        const WHAT: &str = "gated_delta_net";
        if !shape.is_valid() {
            return invalid(format!(
                "{WHAT}: {} value heads on {} key heads of size {} (value heads must be a \
                 non-zero multiple of key heads, sizes non-zero)",
                shape.heads_v, shape.heads_k, shape.head_dim
            ));
        }
        let sizes = (|| {
            let ql = n_tokens.checked_mul(shape.heads_k.checked_mul(shape.head_dim)?)?;
            let vl = n_tokens.checked_mul(shape.heads_v.checked_mul(shape.head_dim)?)?;
            let gl = n_tokens.checked_mul(shape.heads_v)?;
            let sl = shape
                .heads_v
                .checked_mul(shape.head_dim.checked_mul(shape.head_dim)?)?;
            Some((ql, vl, gl, sl))
        })();
        let Some((ql, vl, gl, sl)) = sizes else {
            return invalid(format!(
                "{WHAT}: {n_tokens} tokens of {shape:?} are too many values"
            ));
        };
        let mut others = Vec::with_capacity(6);
        for (h, len, name) in [
            (q, ql, "q"),
            (k, ql, "k"),
            (v, vl, "v"),
            (g, gl, "g"),
            (beta, gl, "beta"),
            (out, vl, "out"),
        ] {
            others.push((
                name,
                self.span(h, 0, len as u64, &format!("{WHAT} {name}"))?,
            ));
        }
        let ss = self.state_span(WHAT, state, sl, &others)?;
        let mut st = self
            .floats_at(state.0, state.1, sl, "gated_delta_net state")?
            .to_vec();
        self.with_out(
            [(q, ql), (k, ql), (v, vl), (g, gl), (beta, gl)],
            (out, vl),
            WHAT,
            |[q, k, v, g, b], o| {
                kernels::gated_delta_net(&shape, q, k, v, g, b, &mut st, o);
                Ok(())
            },
        )?;
        self.write_span(ss, st);
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
        sinks: (u64, u64),
        window: usize,
        out: u64,
    ) -> Result<(), SimError> {
        if l.n_kv_heads == 0 || !n_heads.is_multiple_of(l.n_kv_heads) {
            return invalid(format!(
                "paged_attention: {n_heads} query heads is not a multiple of {} KV heads",
                l.n_kv_heads
            ));
        }
        // The sink logits (ABI 6): `n_heads` floats of a float buffer (handle 0 = none),
        // read on the device's side, outside the range the op writes.
        let sinks = match sinks {
            (0, _) => None,
            (h, off) => {
                let ss = self.span(h, off, n_heads as u64, "paged_attention sinks")?;
                let os = self.span(
                    out,
                    0,
                    (q_rows * n_heads * l.head_dim_v) as u64,
                    "paged_attention out",
                )?;
                disjoint("paged_attention", ("out", os), &[("the sinks", ss)])?;
                Some(
                    self.floats_at(h, off, n_heads, "paged_attention sinks")?
                        .to_vec(),
                )
            }
        };
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
                                sinks.as_ref().map(|s| s[h]),
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

/// The fan-out of a grouped op: `routed / inputs`, refused when `routed` is not a
/// multiple of `inputs` (no input rows only with no routed rows; its fan-out is 1).
fn fanout(inputs: usize, routed: usize, what: &str) -> Result<usize, SimError> {
    if inputs == 0 {
        return if routed == 0 {
            Ok(1)
        } else {
            invalid(format!("{what}: {routed} routed rows for no input row"))
        };
    }
    if !routed.is_multiple_of(inputs) {
        return invalid(format!(
            "{what}: {routed} routed rows is not a multiple of {inputs} input rows"
        ));
    }
    Ok(routed / inputs)
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

    fn put_f32(st: &mut State, v: &[f32]) -> u64 {
        let h = st.alloc(4 * v.len() as u64).expect("alloc");
        st.write(h, 0, bytemuck::cast_slice(v)).expect("write");
        h
    }

    fn put_u32(st: &mut State, v: &[u32]) -> u64 {
        let h = st.alloc(4 * v.len() as u64).expect("alloc");
        st.write(h, 0, bytemuck::cast_slice(v)).expect("write");
        h
    }

    fn routing(logits: u64, ids: (u64, u64), weights: (u64, u64)) -> Routing {
        Routing {
            logits,
            n_rows: 2,
            n_experts: 4,
            bias: 0,
            expert_scale: 0,
            k: 2,
            gating: flint_core::math::Gating::Softmax,
            normalize: true,
            scale: 1.0,
            ids,
            weights,
        }
    }

    #[test]
    fn route_topk_writes_device_buffers_at_offsets_and_checks_ranges() {
        let mut st = State::new(1 << 20);
        let logits = put_f32(&mut st, &[0.1, 2.0, -1.0, 1.0, 3.0, 0.0, 0.5, -2.0]);
        let scale = put_f32(&mut st, &[1.0, 2.0, 4.0, 8.0]);
        let out = st.alloc(4 * 10).expect("alloc");
        // Ids at 1..5 and weights at 5..9 of one buffer.
        let mut r = routing(logits, (out, 1), (out, 5));
        r.expert_scale = scale;
        st.route_topk(&r).expect("route");
        let ids = st.indices(out, 0, 10, "ids").expect("read");
        assert_eq!(&ids[..5], &[0, 1, 3, 0, 2]);
        let w = st.floats_at(out, 5, 4, "w").expect("read");
        let (mut ci, mut cw) = ([0u32; 2], [0.0f32; 2]);
        flint_core::math::route_topk(
            &[0.1, 2.0, -1.0, 1.0],
            None,
            2,
            flint_core::math::Gating::Softmax,
            true,
            1.0,
            &mut ci,
            &mut cw,
        )
        .expect("core");
        assert_eq!(ci, [1, 3]);
        assert_eq!(w[0], cw[0] * 2.0);
        assert_eq!(w[1], cw[1] * 8.0);
        assert_eq!(st.indices(out, 9, 1, "tail").expect("read"), [0]);
        // Nothing of it was host traffic.
        assert_eq!(st.counters().host_reads, 0);

        // Outputs past their buffer, overlapping each other or an input are refused.
        for (ids, weights, what) in [
            ((out, 7), (out, 0), "outside"),
            ((out, 0), (out, 3), "overlaps"),
            ((logits, 4), (out, 0), "overlaps the logits"),
            ((out, 0), (scale, 0), "overlaps the expert scale"),
        ] {
            let mut r = routing(logits, ids, weights);
            r.expert_scale = scale;
            let e = st.route_topk(&r).expect_err(what);
            assert_eq!(e.code, ERR_INVALID);
            assert!(e.message.contains(what), "{}", e.message);
        }
        let mut r = routing(logits, (out, 0), (out, 4));
        r.k = 0;
        assert_eq!(st.route_topk(&r).expect_err("k 0").code, ERR_INVALID);
    }

    #[test]
    fn expert_ops_read_ids_and_weights_from_buffers_and_check_them() {
        let mut st = State::new(1 << 20);
        // Two experts [in 32, out 1] of F32: expert 0 sums x, expert 1 sums 2 x.
        let mut stage = |v: f32| {
            let data: Vec<f32> = vec![v; 32];
            let bytes: Vec<u8> = bytemuck::cast_slice(&data).to_vec();
            let h = st
                .stage(StageRequest {
                    ty: GgmlType::F32,
                    source_ty: GgmlType::F32,
                    streamed: false,
                    in_f: 32,
                    out_f: 1,
                    data: HostBytes {
                        ptr: bytes.as_ptr(),
                        len: bytes.len(),
                    },
                })
                .expect("stage");
            (h, bytes)
        };
        let (e0, _b0) = stage(1.0);
        let (e1, _b1) = stage(2.0);
        let mut x = vec![1.0f32; 32];
        x.extend(vec![3.0f32; 32]);
        let x = put_f32(&mut st, &x);
        // Ids [_, 1, 0, 0, 1] read from 1: rows (x0, e1), (x0, e0), (x1, e0), (x1, e1).
        let ids = put_u32(&mut st, &[9, 1, 0, 0, 1]);
        let out = st.alloc(16).expect("alloc");
        st.expert_matmul(&[e0, e1], x, 2, ids, 1, 4, out)
            .expect("expert matmul");
        assert_eq!(
            st.floats(out, 4, "out").expect("out"),
            &[64.0, 32.0, 96.0, 192.0]
        );
        // Bad ids, a count that is not a multiple of the input rows, ids outside their
        // buffer.
        let e = st
            .expert_matmul(&[e0, e1], x, 2, ids, 0, 4, out)
            .expect_err("id 9");
        assert_eq!(e.code, ERR_INVALID);
        assert!(
            e.message.contains("expert_matmul") && e.message.contains("expert id 9"),
            "{}",
            e.message
        );
        let e = st
            .expert_matmul(&[e0, e1], x, 2, ids, 1, 3, out)
            .expect_err("fan-out");
        assert!(e.message.contains("not a multiple"), "{}", e.message);
        let e = st
            .expert_matmul(&[e0, e1], x, 2, ids, 2, 4, out)
            .expect_err("outside");
        assert!(e.message.contains("outside buffer"), "{}", e.message);

        // Scatter: acc row i / 2 += w[i] * x[i], the weights at an offset.
        let acc = put_f32(&mut st, &[1.0, 1.0]);
        let xs = put_f32(&mut st, &[1.0, 2.0, 3.0, 4.0]);
        let w = put_f32(&mut st, &[7.0, 0.5, 0.25, 2.0, 1.0]);
        st.scatter_add_weighted(acc, 2, xs, w, 1, 4, 1)
            .expect("scatter");
        assert_eq!(
            st.floats(acc, 2, "acc").expect("acc"),
            &[1.0 + 0.5 + 0.5, 1.0 + 6.0 + 4.0]
        );
        let e = st
            .scatter_add_weighted(acc, 2, xs, w, 2, 4, 1)
            .expect_err("weights outside");
        assert!(e.message.contains("outside buffer"), "{}", e.message);
        let e = st
            .scatter_add_weighted(acc, 3, xs, w, 0, 4, 1)
            .expect_err("fan-out");
        assert!(e.message.contains("not a multiple"), "{}", e.message);
        let e = st
            .scatter_add_weighted(acc, 2, xs, acc, 0, 2, 1)
            .expect_err("weights in acc");
        assert!(e.message.contains("overlaps"), "{}", e.message);
    }

    fn rope_cfg(n_rot: usize) -> RopeConfig<'static> {
        RopeConfig {
            kind: flint_core::math::RopeKind::Neox,
            n_rot,
            base: 10000.0,
            freq_scale: 1.0,
            freq_factors: None,
            yarn: None,
        }
    }

    #[test]
    fn rope_reads_factors_from_a_buffer_and_checks_them() {
        let mut st = State::new(1 << 20);
        // Two heads of 8, all 8 dims rotated: 4 factors, here at floats 2..6 of a buffer.
        let x0: Vec<f32> = (0..16).map(|i| 0.1 * i as f32 - 0.7).collect();
        let f = [1.0f32, 2.5, 4.0, 8.0];
        let fb = put_f32(&mut st, &[-1.0, -1.0, f[0], f[1], f[2], f[3], -1.0]);
        let x = put_f32(&mut st, &x0);
        st.rope(x, &[37], 2, 8, rope_cfg(8), (fb, 2)).expect("rope");
        let mut want = x0.clone();
        let cfg = RopeConfig {
            freq_factors: Some(&f),
            ..rope_cfg(8)
        };
        flint_core::math::rope_heads(&mut want, 8, 37, &cfg);
        assert_eq!(st.floats(x, 16, "x").expect("x"), &want[..]);
        // Without factors: other values (the factors were read).
        let x2 = put_f32(&mut st, &x0);
        st.rope(x2, &[37], 2, 8, rope_cfg(8), (0, 0)).expect("rope");
        assert_ne!(st.floats(x2, 16, "x").expect("x"), &want[..]);
        // Reading on the device's side is no host traffic.
        assert_eq!(st.counters().host_reads, 0);

        // Factors outside their buffer, overlapping x, or not finite and positive are
        // refused naming the op, and x is left as it was.
        let x3 = put_f32(&mut st, &x0);
        let bad = put_f32(&mut st, &[1.0, 0.0, 1.0, 1.0]);
        let nan = put_f32(&mut st, &[1.0, 1.0, 1.0, f32::NAN]);
        for (factors, what) in [
            ((fb, 4), "outside buffer"),
            ((x3, 12), "overlaps the frequency factors"),
            ((bad, 0), "frequency factor 1 is 0"),
            ((nan, 0), "frequency factor 3 is NaN"),
            ((999, 0), "no buffer 999"),
        ] {
            let e = st
                .rope(x3, &[5], 2, 8, rope_cfg(8), factors)
                .expect_err(what);
            assert_eq!(e.code, ERR_INVALID, "{}", e.message);
            assert!(
                e.message.contains("rope") && e.message.contains(what),
                "{what}: {}",
                e.message
            );
            assert_eq!(st.floats(x3, 16, "x").expect("x"), &x0[..]);
        }
    }

    #[test]
    fn attention_reads_sinks_from_a_buffer_and_checks_them() {
        let mut st = State::new(1 << 20);
        let l = KvLayout {
            num_blocks: 1,
            block_size: 4,
            n_kv_heads: 1,
            head_dim_k: 4,
            head_dim_v: 4,
        };
        let kc = put_f32(&mut st, &[0.5; 16]);
        let vc = put_f32(&mut st, &(0..16).map(|i| i as f32).collect::<Vec<_>>());
        let q = put_f32(&mut st, &[0.25; 8]);
        let seqs = [Seq {
            q_start: 0,
            positions: &[2],
            block_table: &[0],
        }];
        // Two heads; their sinks at floats 1..3 of a buffer.
        let sinks = [0.75f32, -2.0];
        let sb = put_f32(&mut st, &[9.0, sinks[0], sinks[1], 9.0]);
        let out = st.alloc(4 * 8).expect("alloc");
        st.paged_attention(&l, kc, vc, q, 1, &seqs, 2, 0.5, (sb, 1), 0, out)
            .expect("attention");
        let got = st.floats(out, 8, "out").expect("out").to_vec();
        for (h, &sink) in sinks.iter().enumerate() {
            let keys: Vec<&[f32]> = (0..3).map(|_| &[0.5f32; 4][..]).collect();
            let vals: Vec<Vec<f32>> = (0..3)
                .map(|j| (0..4).map(|d| (j * 4 + d) as f32).collect())
                .collect();
            let vals: Vec<&[f32]> = vals.iter().map(Vec::as_slice).collect();
            let mut want = [0.0f32; 4];
            kernels::attend_head(&[0.25; 4], &keys, &vals, 0, 0.5, Some(sink), &mut want);
            assert_eq!(&got[h * 4..(h + 1) * 4], &want, "head {h}");
        }
        // The sinks change the output: a run without them differs.
        let out2 = st.alloc(4 * 8).expect("alloc");
        st.paged_attention(&l, kc, vc, q, 1, &seqs, 2, 0.5, (0, 0), 0, out2)
            .expect("attention");
        assert_ne!(st.floats(out2, 8, "out").expect("out"), &got[..]);

        // Sinks outside their buffer or overlapping the output are refused naming the op.
        for (sinks, what) in [
            ((sb, 3), "outside buffer"),
            ((out, 6), "overlaps the sinks"),
            ((999, 0), "no buffer 999"),
        ] {
            let e = st
                .paged_attention(&l, kc, vc, q, 1, &seqs, 2, 0.5, sinks, 0, out)
                .expect_err(what);
            assert_eq!(e.code, ERR_INVALID, "{}", e.message);
            assert!(
                e.message.contains("paged_attention") && e.message.contains(what),
                "{what}: {}",
                e.message
            );
        }
    }

    /// Gated DeltaNet's ops read their states at an offset and write them back there,
    /// with the core's bits; bad shapes and state ranges outside their buffer or
    /// overlapping another operand are `FLINT_TT_ERR_INVALID`, with nothing written.
    #[test]
    fn delta_net_ops_update_states_at_offsets_and_check_them() {
        use flint_core::math::{self, DeltaNetShape};
        let mut st = State::new(1 << 22);
        let vals = |n: usize, s: f32| -> Vec<f32> {
            (0..n)
                .map(|i| s * ((i * 37 % 23) as f32 / 11.0 - 1.0))
                .collect()
        };
        // The convolution: 2 rows of 3 channels, kernel 3; the state at floats 4..10.
        let (x0, w0, s0) = (vals(6, 1.5), vals(9, 0.7), vals(6, 2.0));
        let x = put_f32(&mut st, &x0);
        let w = put_f32(&mut st, &w0);
        let mut sbuf = vec![-9.0f32; 4];
        sbuf.extend(&s0);
        sbuf.push(-9.0);
        let sb = put_f32(&mut st, &sbuf);
        let out = st.alloc(4 * 6).expect("alloc");
        st.ssm_conv_silu(x, 2, 3, w, 3, (sb, 4), out).expect("conv");
        let (mut ws, mut wo) = (s0.clone(), vec![0.0; 6]);
        kernels::ssm_conv_silu(&x0, &w0, 3, &mut ws, &mut wo);
        assert_eq!(st.floats(out, 6, "out").expect("out"), &wo[..]);
        let got = st.floats(sb, 11, "state").expect("state").to_vec();
        assert_eq!(&got[4..10], &ws[..]);
        assert_eq!((got[..4].to_vec(), got[10]), (vec![-9.0; 4], -9.0));
        assert_ne!(ws, s0, "the window moved");
        for (state, what) in [
            ((sb, 6), "outside buffer"),
            ((x, 0), "overlaps x"),
            ((out, 0), "overlaps out"),
            ((999, 0), "no buffer 999"),
        ] {
            let before = st.floats(sb, 11, "state").expect("state").to_vec();
            let e = st.ssm_conv_silu(x, 2, 3, w, 3, state, out).expect_err(what);
            assert_eq!(e.code, ERR_INVALID, "{}", e.message);
            assert!(
                e.message.contains("ssm_conv_silu") && e.message.contains(what),
                "{what}: {}",
                e.message
            );
            assert_eq!(st.floats(sb, 11, "state").expect("state"), &before[..]);
        }
        let e = st
            .ssm_conv_silu(x, 2, 3, w, 0, (sb, 4), out)
            .expect_err("d_conv 0");
        assert!(e.message.contains("d_conv is 0"), "{}", e.message);
        let e = st
            .ssm_conv_silu(x, 2, 3, w, 3, (sb, 4), x)
            .expect_err("out is x");
        assert_eq!(e.code, ERR_INVALID, "{}", e.message);

        // The delta rule: one key head, two value heads of 4, 3 tokens; the state at
        // floats 2..34 of its buffer.
        let shape = DeltaNetShape {
            heads_k: 1,
            heads_v: 2,
            head_dim: 4,
        };
        let (q0, k0, v0) = (vals(12, 0.5), vals(12, 0.4), vals(24, 1.0));
        let g0: Vec<f32> = vals(6, 1.0).iter().map(|v| -v.abs()).collect();
        let b0: Vec<f32> = vals(6, 0.5).iter().map(|v| 0.5 + v).collect();
        let s0 = vals(32, 0.3);
        let ins: Vec<u64> = [&q0, &k0, &v0, &g0, &b0]
            .iter()
            .map(|v| put_f32(&mut st, v))
            .collect();
        let mut sv = vec![0.0f32; 2];
        sv.extend(&s0);
        let sb = put_f32(&mut st, &sv);
        let out = st.alloc(4 * 24).expect("alloc");
        let run = |st: &mut State, shape, state, out| {
            st.gated_delta_net(shape, 3, ins[0], ins[1], ins[2], ins[3], ins[4], state, out)
        };
        run(&mut st, shape, (sb, 2), out).expect("delta rule");
        let (mut ws, mut wo) = (s0.clone(), vec![0.0; 24]);
        math::gated_delta_net(&shape, &q0, &k0, &v0, &g0, &b0, &mut ws, &mut wo);
        assert_eq!(st.floats(out, 24, "out").expect("out"), &wo[..]);
        assert_eq!(st.floats_at(sb, 2, 32, "state").expect("state"), &ws[..]);
        let before = st.floats(sb, 34, "state").expect("state").to_vec();
        let big = st.alloc(4 * 64).expect("alloc");
        for (shape, state, out, what) in [
            (
                DeltaNetShape {
                    heads_k: 2,
                    heads_v: 3,
                    head_dim: 4,
                },
                (sb, 2),
                out,
                "3 value heads on 2 key heads",
            ),
            (shape, (sb, 3), out, "outside buffer"),
            (shape, (big, 8), big, "overlaps out"),
            (shape, (sb, 2), ins[2], "an input is also the output"),
        ] {
            let e = run(&mut st, shape, state, out).expect_err(what);
            assert_eq!(e.code, ERR_INVALID, "{}", e.message);
            assert!(e.message.contains(what), "{what}: {}", e.message);
            assert_eq!(st.floats(sb, 34, "state").expect("state"), &before[..]);
        }

        // The element-wise ops refuse shapes that do not fit.
        let a = put_f32(&mut st, &vals(12, 1.0));
        let b = put_f32(&mut st, &vals(12, 1.0));
        let c = st.alloc(4 * 12).expect("alloc");
        for (r, what) in [
            (st.mul(a, 12, b, 5), "do not divide"),
            (st.mul(a, 12, b, 0), "do not divide"),
            (st.delta_net_gate(a, 12, b, b, 5), "not rows of 5 heads"),
            (st.l2_norm(a, 12, 0, 1e-6), "not rows of 0"),
            (st.deinterleave(a, 12, 5, &[b, c]), "not groups"),
            (st.deinterleave(a, 12, 3, &[b, b]), "is also output 0"),
            (st.deinterleave(a, 12, 3, &[b, a]), "is also the source"),
            (st.deinterleave(a, 12, 3, &[]), "not groups"),
        ] {
            let e = r.expect_err(what);
            assert_eq!(e.code, ERR_INVALID, "{}", e.message);
            assert!(e.message.contains(what), "{what}: {}", e.message);
        }
        assert_eq!(st.floats(a, 12, "a").expect("a"), &vals(12, 1.0)[..]);
        assert_eq!(st.floats(b, 12, "b").expect("b"), &vals(12, 1.0)[..]);
        // Nothing of it was host traffic but the writes of the inputs.
        assert_eq!(st.counters().host_reads, 0);
    }
}
