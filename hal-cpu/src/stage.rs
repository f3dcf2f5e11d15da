//! Staging: a weight kept where it lies in the file, repacked into 16-row groups for the
//! AVX-512 VNNI decode kernels, or copied into the device's huge-page arena.

use std::any::Any;
use std::sync::Arc;

use flint_core::GgmlType;
use flint_hal::{
    HalError, PlannedWeight, StagedInfo, StagingPlan, Tier, Weight, WeightDesc, WeightHandle,
    WeightSource,
};
use rayon::prelude::*;

use crate::arena;
use crate::device::CpuDevice;
use crate::kernels::x16::X16_ROWS;
use crate::kernels::{self, WeightRows};
use crate::simd::SimdLevel;

/// A weight staged on the CPU: the file's bytes, kept where they lie.
#[derive(Debug)]
pub struct CpuWeight {
    pub(crate) info: StagedInfo,
    pub(crate) src: WeightSource,
    pub(crate) ty: GgmlType,
    /// Elements per row.
    pub(crate) k: usize,
    /// Rows per matrix (per expert for a tower).
    pub(crate) n: usize,
    /// Experts (1 for a matrix).
    pub(crate) e: usize,
    pub(crate) row_bytes: usize,
    /// The rows repacked for the decode kernels (`kernels::q4_k::x16`, `q6_k::x16`,
    /// `q0::x16`, `mxfp4::x16`, `q3_k::perm`), when the weight was staged so; the matmuls
    /// then read these, never `src`.
    pub(crate) x16: Option<Packed>,
    /// Whether the rows (Q8_0, Q5_0, Q4_K or Q6_K) are multiplied in the AMX order
    /// (`WeightRows::Q8_0Amx`, `Q5_0Amx`, `Q4KAmx`, `Q6KAmx` in the file's layout;
    /// `Q8_0x16Amx`, `Q5_0x16Amx` repacked, where the process cannot run AMX tiles).
    pub(crate) amx: bool,
}

/// A Q4_K, Q6_K, Q8_0, Q5_0 or MXFP4 weight's rows repacked at staging
/// (`kernels::{q4_k, q6_k, q0, mxfp4}::x16`), or a Q3_K weight's blocks arranged
/// (`kernels::q3_k::perm`), in the device's huge-page arena (`arena.rs` says why).
pub(crate) struct Packed {
    region: arena::Region,
    ty: GgmlType,
}

impl std::fmt::Debug for Packed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Packed")
            .field("ty", &self.ty)
            .field("len", &self.region.as_slice().len())
            .finish()
    }
}

impl Packed {
    /// Rows per unit of the layout: a row group of `x16`, or one row of arranged Q3_K
    /// blocks. Row ranges of the weight start and end on whole units.
    pub(crate) fn group_rows(&self) -> usize {
        if self.ty == GgmlType::Q3_K {
            1
        } else {
            X16_ROWS
        }
    }

    /// The whole weight's row groups.
    fn rows(&self) -> WeightRows<'_> {
        let bytes = self.region.as_slice();
        match self.ty {
            GgmlType::Q4_K => WeightRows::Q4Kx16(bytemuck::cast_slice(bytes)),
            GgmlType::Q8_0 => WeightRows::Q8_0x16(bytemuck::cast_slice(bytes)),
            GgmlType::Q5_0 => WeightRows::Q5_0x16(bytemuck::cast_slice(bytes)),
            GgmlType::MXFP4 => WeightRows::Mxfp4x16(bytemuck::cast_slice(bytes)),
            GgmlType::Q3_K => WeightRows::Q3KPerm(bytemuck::cast_slice(bytes)),
            _ => WeightRows::Q6Kx16(bytemuck::cast_slice(bytes)),
        }
    }

    /// A Q4_K, Q6_K, Q8_0, Q5_0 or MXFP4 tensor's bytes (whole rows of `k` elements, a
    /// multiple of 16 rows) repacked into `arena`, or a Q3_K tensor's (any rows) arranged;
    /// `None` for another type or when the memory cannot be had (the weight then stays in
    /// the file's layout).
    ///
    /// The source's bytes are handed back piece by piece as they are packed, then whole
    /// ([`WeightSource::release_resident_part`]): a weight as large as Gemma 3's output
    /// matrix (178 MB) would otherwise be in memory twice at once, in the loader's copy
    /// and in the arena (the peak resident set of a `flint run` went from 284 to 453 MB).
    fn pack(
        ty: GgmlType,
        src: &WeightSource,
        k: usize,
        pool: &rayon::ThreadPool,
        arena: &arena::PackArena,
    ) -> Option<Self> {
        let bytes = src.as_slice();
        let mut region = arena.alloc(bytes.len()).ok()?;
        let dst = region.as_mut_slice();
        let release = |r: std::ops::Range<usize>| src.release_resident_part(r);
        match ty {
            GgmlType::Q4_K => pack_groups(
                bytes,
                k / 256,
                dst,
                pool,
                &release,
                kernels::q4_k::x16::pack,
            ),
            GgmlType::Q6_K => pack_groups(
                bytes,
                k / 256,
                dst,
                pool,
                &release,
                kernels::q6_k::x16::pack,
            ),
            GgmlType::Q8_0 => pack_groups(
                bytes,
                k / 32,
                dst,
                pool,
                &release,
                kernels::q0::x16::pack_q8_0,
            ),
            GgmlType::Q5_0 => pack_groups(
                bytes,
                k / 32,
                dst,
                pool,
                &release,
                kernels::q0::x16::pack_q5_0,
            ),
            GgmlType::MXFP4 => pack_groups(
                bytes,
                k / 32,
                dst,
                pool,
                &release,
                kernels::mxfp4::x16::pack,
            ),
            GgmlType::Q3_K => pack_pieces(
                bytes,
                dst,
                pool,
                &release,
                1,
                4096,
                kernels::q3_k::perm::pack,
            ),
            _ => return None,
        }
        Some(Self { region, ty })
    }
}

/// Source bytes packed between two hand-backs of [`pack_groups`].
const PACK_PIECE_BYTES: usize = 4 << 20;

/// Packs the blocks `B` of `src` (the file's bytes) into blocks `X` written over `dst`
/// (the same length), each `X` from `per_x` consecutive `B` (16 for a row group of
/// `x16`, 1 for a block arranged on its own), `task` blocks `X` per task on `pool`, in
/// pieces of about [`PACK_PIECE_BYTES`], each piece's source bytes but the last passed to
/// `release` once packed (the caller hands back the whole range when done).
fn pack_pieces<B: bytemuck::Pod + Send + Sync, X: bytemuck::Pod + Send>(
    src: &[u8],
    dst: &mut [u8],
    pool: &rayon::ThreadPool,
    release: &dyn Fn(std::ops::Range<usize>),
    per_x: usize,
    task: usize,
    pack: impl Fn(&[B], &mut [X]) + Sync,
) {
    let src = kernels::view::<B>(src);
    let out: &mut [X] = bytemuck::cast_slice_mut(dst);
    let task = task.max(1);
    // A packed block holds the same bytes as the file blocks it replaces, so packed
    // blocks `x0..x1` came from source bytes `x0..x1` times its size.
    let block_bytes = std::mem::size_of::<X>().max(1);
    // Whole tasks per piece.
    let piece = (PACK_PIECE_BYTES / block_bytes).next_multiple_of(task);
    let total = out.len();
    let mut x0 = 0;
    for part in out.chunks_mut(piece) {
        let blocks = part.len();
        pool.install(|| {
            part.par_chunks_mut(task).enumerate().for_each(|(c, o)| {
                let s0 = (x0 + c * task) * per_x;
                pack(&src[s0..s0 + o.len() * per_x], o)
            })
        });
        if x0 + blocks < total {
            release(x0 * block_bytes..(x0 + blocks) * block_bytes);
        }
        x0 += blocks;
    }
}

/// Whole rows of `nb` blocks `B` repacked into 16-row groups `X` by `pack`, 64 groups
/// per task ([`pack_pieces`]).
fn pack_groups<B: bytemuck::Pod + Send + Sync, X: bytemuck::Pod + Send>(
    src: &[u8],
    nb: usize,
    dst: &mut [u8],
    pool: &rayon::ThreadPool,
    release: &dyn Fn(std::ops::Range<usize>),
    pack: fn(&[B], usize, &mut [X]),
) {
    let per_task = 64 * nb;
    pack_pieces(
        src,
        dst,
        pool,
        release,
        X16_ROWS,
        per_task,
        |s: &[B], o: &mut [X]| pack(s, nb, o),
    )
}

impl Weight for CpuWeight {
    fn info(&self) -> &StagedInfo {
        &self.info
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl CpuWeight {
    pub(crate) fn bytes(&self) -> &[u8] {
        self.src.as_slice()
    }

    /// Row `id` (counted over all experts) of a packed weight back in the file's
    /// layout, from its unit of the layout; `None` for a weight in the file's layout.
    pub(crate) fn packed_row(&self, id: usize) -> Option<Vec<u8>> {
        let g = self.x16.as_ref()?.group_rows();
        self.rows(id / g * g, g).packed_row_bytes(self.k, id % g)
    }

    /// Weight rows `row0..row0 + rows` (counted over all experts) as the kernels read
    /// them. With a packed weight both ends must be multiples of 16 (every packed
    /// weight's rows per expert are).
    pub(crate) fn rows(&self, row0: usize, rows: usize) -> WeightRows<'_> {
        match &self.x16 {
            Some(p) => {
                let g = p.group_rows();
                debug_assert!(row0.is_multiple_of(g) && rows.is_multiple_of(g));
                let packed = p.rows().packed_rows(self.k, row0, rows);
                match packed {
                    WeightRows::Q8_0x16(g) if self.amx => WeightRows::Q8_0x16Amx(g),
                    WeightRows::Q5_0x16(g) if self.amx => WeightRows::Q5_0x16Amx(g),
                    _ => packed,
                }
            }
            None if self.amx => {
                let b = &self.bytes()[row0 * self.row_bytes..(row0 + rows) * self.row_bytes];
                match self.ty {
                    GgmlType::Q8_0 => WeightRows::Q8_0Amx(bytemuck::cast_slice(b)),
                    GgmlType::Q4_K => WeightRows::Q4KAmx(bytemuck::cast_slice(b)),
                    GgmlType::Q6_K => WeightRows::Q6KAmx(bytemuck::cast_slice(b)),
                    _ => WeightRows::Q5_0Amx(bytemuck::cast_slice(b)),
                }
            }
            None => WeightRows::File(
                &self.bytes()[row0 * self.row_bytes..(row0 + rows) * self.row_bytes],
            ),
        }
    }
}

/// How an AVX-512 VNNI device keeps its quantized weights, chosen at device open
/// ([`WeightLayout::choose`]) and named by `flint devices`. All give the same bits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WeightLayout {
    /// Q4_K, Q6_K, Q8_0, Q5_0 and MXFP4 weights repacked into 16-row groups
    /// (`kernels/*/x16.rs`), Q3_K blocks arranged for the VBMI matvec where the CPU has
    /// VBMI and GFNI (`kernels/q3_k/perm.rs`), every other weight copied as it is, all into
    /// the device's huge-page arena.
    Packed,
    /// Per weight, by what streams faster from memory ([`WeightLayout::repacks`]): every
    /// weight the packed layout repacks but the Q6_K tensors of [`Q6K_FILE_MIN_BYTES`]
    /// or more (a MoE's down-projection towers, a Q4_K_M file's output matrix), which stay
    /// in the file's layout, where the four-row kernels read them.
    BySize,
    /// Every weight in the file's layout, where the loader put it.
    File,
}

/// The size from which a Q6_K tensor stays in the file's layout under
/// [`WeightLayout::BySize`]. Measured on an AMD EPYC (Zen 4) host, 2 threads, from
/// memory (`stream_speed`, docs/benchmarks.md "The weight layout and MoE decode"): the
/// repacked groups stream as fast or faster up to about a megabyte, the file layout's
/// four rows in four streams faster from a few megabytes (Q6_K 53.8 MB: 42-52 against
/// 28-40 GB/s). Q4_K streams alike in both layouts from a few megabytes and its prompt
/// panels decode faster from the groups, so it stays repacked. The qwen3moe bench
/// preset decodes 1.18x faster with this split than with every K-quant repacked; the
/// gemma4 bench preset is no slower.
pub const Q6K_FILE_MIN_BYTES: usize = 2 << 20;

impl WeightLayout {
    /// `FLINT_CPU_REPACK` (`1`: packed, `0`: file, `size`: by size) when set; else by
    /// the CPU, as measured on one host of each (`docs/benchmarks.md`, "Weight layout by
    /// host"): by size on the Intel models in [`INTEL_BY_SIZE`] (Emerald Rapids: Gemma 3
    /// 270M decode steps 0.87x the file layout's, the qwen3moe and qwen35moe bench
    /// presets' decode 1.1x) and on other vendors (AMD Zen 4); the file layout on the
    /// other Intel models (measured on an earlier Intel Xeon VM: Gemma 3 270M decode 1.3x,
    /// the qwen35moe bench preset 1.4x the packed groups', before the packed kernels
    /// prefetched their streams). The second value says why, for `flint devices`.
    pub fn choose() -> Result<(Self, &'static str), HalError> {
        match std::env::var("FLINT_CPU_REPACK") {
            Ok(v) => match v.trim() {
                "1" => Ok((WeightLayout::Packed, "FLINT_CPU_REPACK=1")),
                "0" => Ok((WeightLayout::File, "FLINT_CPU_REPACK=0")),
                "size" => Ok((WeightLayout::BySize, "FLINT_CPU_REPACK=size")),
                other => Err(HalError::invalid(format!(
                    "FLINT_CPU_REPACK={other:?} is not 0, 1 or size"
                ))),
            },
            Err(_) => Ok(Self::for_cpu(cpu_is_intel(), cpu_family_model())),
        }
    }

    /// The default for a CPU (`intel`: its vendor; its display family and model), and
    /// why.
    pub fn for_cpu(intel: bool, family_model: (u32, u32)) -> (Self, &'static str) {
        match (intel, family_model) {
            (true, fm) if INTEL_BY_SIZE.contains(&fm) => {
                (WeightLayout::BySize, "Intel Emerald Rapids, measured")
            }
            (true, _) => (WeightLayout::File, "Intel CPU"),
            (false, _) => (WeightLayout::BySize, "not an Intel CPU"),
        }
    }

    /// Whether a weight of `ty` taking `bytes` is repacked into 16-row groups (where
    /// its shape allows) in this layout.
    pub fn repacks(self, ty: GgmlType, bytes: usize) -> bool {
        match self {
            WeightLayout::Packed => true,
            WeightLayout::File => false,
            WeightLayout::BySize => ty != GgmlType::Q6_K || bytes < Q6K_FILE_MIN_BYTES,
        }
    }
}

/// The Intel CPUs (display family, model) that take [`WeightLayout::BySize`] by default:
/// family 6 model 207 (0xCF, Emerald Rapids), measured faster by size than in the file
/// layout on every model tried (`docs/benchmarks.md`, "Weight layout by host").
pub const INTEL_BY_SIZE: [(u32, u32); 1] = [(6, 207)];

/// The CPU's display family and model (CPUID leaf 1, the extended fields folded in as
/// the vendors define them; `(0, 0)` off x86-64).
pub fn cpu_family_model() -> (u32, u32) {
    #[cfg(target_arch = "x86_64")]
    {
        // `__cpuid` is a safe function in newer toolchains, unsafe in older ones.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID leaf 1 exists on every x86-64 CPU and only reads registers.
        let eax = unsafe { std::arch::x86_64::__cpuid(1) }.eax;
        family_model(eax)
    }
    #[cfg(not(target_arch = "x86_64"))]
    (0, 0)
}

/// CPUID leaf 1's `eax` as (display family, display model): the extended family added
/// where the family is 15, the extended model prefixed where it is 6 or 15.
fn family_model(eax: u32) -> (u32, u32) {
    let family = (eax >> 8) & 0xF;
    let model = (eax >> 4) & 0xF;
    let display_family = if family == 15 {
        family + ((eax >> 20) & 0xFF)
    } else {
        family
    };
    let display_model = if family == 6 || family == 15 {
        model | ((eax >> 16) & 0xF) << 4
    } else {
        model
    };
    (display_family, display_model)
}

/// Whether the CPU's vendor string is `GenuineIntel`.
fn cpu_is_intel() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        // `__cpuid` is a safe function in newer toolchains, unsafe in older ones.
        #[allow(unused_unsafe)]
        // SAFETY: CPUID leaf 0 exists on every x86-64 CPU and only reads registers.
        let r = unsafe { std::arch::x86_64::__cpuid(0) };
        let mut v = [0u8; 12];
        v[..4].copy_from_slice(&r.ebx.to_le_bytes());
        v[4..8].copy_from_slice(&r.edx.to_le_bytes());
        v[8..].copy_from_slice(&r.ecx.to_le_bytes());
        &v == b"GenuineIntel"
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

impl CpuDevice {
    /// `Device::plan`: every weight resident, in its own encoding.
    pub(crate) fn plan_weights(&self, weights: &[WeightDesc]) -> Result<StagingPlan, HalError> {
        // Everything stays where it lies in the file: resident, encoding kept.
        let mut plan = StagingPlan::default();
        for w in weights {
            self.check_usable(w)?;
            plan.weights.push(PlannedWeight {
                name: w.name.clone(),
                source_ty: w.ty,
                staged_ty: w.ty,
                kept_quant: true,
                tier: Tier::Resident,
                resident_bytes: w.data.len() as u64,
                streamed_bytes: 0,
            });
        }
        Ok(plan)
    }

    /// `Device::stage`: the weight repacked into 16-row groups, copied into the arena, or
    /// kept where it lies.
    pub(crate) fn stage_weight(&self, desc: &WeightDesc) -> Result<WeightHandle, HalError> {
        desc.validate()?;
        self.check_usable(desc)?;
        let ty = desc.ty;
        let k = desc.in_features();
        let row_bytes = ty.row_bytes(k).ok_or_else(|| {
            HalError::invalid(format!(
                "tensor '{}': {k} is not a whole number of {ty} blocks",
                desc.name
            ))
        })?;
        let bytes = desc.data.len() as u64;
        let (n, e) = (desc.out_features(), desc.experts());
        // Q4_K, Q6_K, Q8_0, Q5_0 and MXFP4 rows repacked sixteen at a time for the VNNI decode
        // kernels (`kernels::q4_k::x16` and `kernels::q0::x16` say why); the same bytes in another order.
        // A Q8_0, Q5_0, Q4_K or Q6_K matrix on the AMX path stays in the file's layout
        // (`kernels::amx`), as llama.cpp's AMX buffer takes it: rows a multiple of 32
        // (the one exception below).
        let amx = self.amx
            && matches!(
                ty,
                GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::Q4_K | GgmlType::Q6_K
            )
            && e == 1
            && k.is_multiple_of(ty.block_size())
            && n.is_multiple_of(crate::kernels::amx::AMX_ROWS_MULTIPLE)
            && n > 0;
        // Where this process cannot run the tiles, Q8_0 and Q5_0 take the AMX orders on
        // the VNNI panels (`AmxOrder`), which read 16-row groups as cheaply as the
        // default order does: repacked where the layout repacks.
        let amx_groups = amx
            && matches!(ty, GgmlType::Q8_0 | GgmlType::Q5_0)
            && !crate::kernels::amx::available();
        // Q3_K blocks arranged one by one for the VBMI matvec (`kernels::q3_k::perm`), any
        // number of rows.
        let packable = (!amx || amx_groups)
            && self.level == SimdLevel::Avx512Vnni
            && match ty {
                GgmlType::Q4_K | GgmlType::Q6_K => {
                    k.is_multiple_of(256) && n.is_multiple_of(X16_ROWS)
                }
                GgmlType::Q8_0 | GgmlType::Q5_0 | GgmlType::MXFP4 => {
                    k.is_multiple_of(32) && n.is_multiple_of(X16_ROWS)
                }
                GgmlType::Q3_K => k.is_multiple_of(256) && crate::simd::has_vbmi_gfni(),
                _ => false,
            }
            && n * e > 0
            && self.layout.repacks(ty, desc.data.len());
        let x16 = if packable {
            Packed::pack(ty, &desc.data, k, &self.pool, &self.arena)
        } else {
            None
        };
        if x16.is_some() {
            // The file's bytes of this tensor are not read again here.
            desc.data.release_resident();
        }
        // Where weights are repacked, the file's pages of each are handed back, and those
        // holes split the loader's huge-page copy: what lies between them (a Gemma 3
        // layer's Q5_0 and Q8_0 matrices, a MoE router) ends up on small pages. A weight
        // kept in the file's layout is copied into the arena too, its pages handed back
        // the same way (Gemma 3: 85 MB of anonymous memory on small pages before). So is
        // a large one: from a mapped file (a model over half the memory) it would
        // otherwise be read through small pages of the page cache. It is copied piece by
        // piece, each piece's source handed back once copied, so the weight is never in
        // memory twice.
        let copied = if x16.is_none()
            && self.level == SimdLevel::Avx512Vnni
            && self.layout != WeightLayout::File
            && desc.data.can_release()
        {
            self.arena
                .alloc(desc.data.len())
                .ok()
                .and_then(|mut region| {
                    let src = desc.data.as_slice();
                    let len = src.len();
                    let dst = region.as_mut_slice();
                    for (i, (d, s)) in dst
                        .chunks_mut(PACK_PIECE_BYTES)
                        .zip(src.chunks(PACK_PIECE_BYTES))
                        .enumerate()
                    {
                        d.copy_from_slice(s);
                        // Every piece but the last handed back now (as `pack_groups`
                        // does); the whole range below.
                        let (at, end) = (i * PACK_PIECE_BYTES, i * PACK_PIECE_BYTES + s.len());
                        if end < len {
                            desc.data.release_resident_part(at..end);
                        }
                    }
                    let src =
                        WeightSource::new(Arc::new(arena::RegionBytes(region)), 0..len).ok()?;
                    desc.data.release_resident();
                    Some(src)
                })
        } else {
            None
        };
        let src = copied.unwrap_or_else(|| desc.data.clone());
        // GGUF data and the arena are aligned for the blocks; anything else is not taken.
        let amx = amx
            && match ty {
                GgmlType::Q8_0 => {
                    bytemuck::try_cast_slice::<u8, flint_core::blocks::BlockQ8_0>(src.as_slice())
                        .is_ok()
                }
                GgmlType::Q4_K => {
                    bytemuck::try_cast_slice::<u8, flint_core::blocks::BlockQ4K>(src.as_slice())
                        .is_ok()
                }
                GgmlType::Q6_K => {
                    bytemuck::try_cast_slice::<u8, flint_core::blocks::BlockQ6K>(src.as_slice())
                        .is_ok()
                }
                _ => bytemuck::try_cast_slice::<u8, flint_core::blocks::BlockQ5_0>(src.as_slice())
                    .is_ok(),
            };
        Ok(Arc::new(CpuWeight {
            info: StagedInfo {
                name: desc.name.clone(),
                source_ty: ty,
                staged_ty: ty,
                dims: desc.dims.clone(),
                kept_quant: true,
                tier: Tier::Resident,
                resident_bytes: bytes,
                streamed_bytes: 0,
            },
            src,
            amx,
            ty,
            k,
            n: desc.out_features(),
            e: desc.experts(),
            row_bytes,
            x16,
        }))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use flint_hal::{Device, DeviceOptions, WeightKind};

    /// CPUID leaf 1 signatures as the vendors document them: Emerald Rapids
    /// (0x000C06F2: family 6, model 0xCF), Sapphire Rapids (0x000806F8: model 0x8F),
    /// AMD Zen 4 (0x00A10F11: family 0xF + 0xA = 25, model 0x11), a family below 6
    /// (no extended model).
    #[test]
    fn family_and_model_fold_in_the_extended_fields() {
        assert_eq!(family_model(0x000C_06F2), (6, 0xCF));
        assert_eq!(family_model(0x0008_06F8), (6, 0x8F));
        assert_eq!(family_model(0x00A1_0F11), (25, 0x11));
        assert_eq!(family_model(0x0001_0543), (5, 4));
    }

    /// The default layout by CPU: by size on Emerald Rapids and off Intel, the file's
    /// layout on the other Intel models; `FLINT_CPU_REPACK` names the same three.
    #[test]
    fn the_default_layout_follows_the_cpu() {
        assert_eq!(
            WeightLayout::for_cpu(true, (6, 207)).0,
            WeightLayout::BySize
        );
        assert_eq!(WeightLayout::for_cpu(true, (6, 167)).0, WeightLayout::File);
        assert_eq!(WeightLayout::for_cpu(true, (6, 143)).0, WeightLayout::File);
        assert_eq!(
            WeightLayout::for_cpu(false, (25, 17)).0,
            WeightLayout::BySize
        );
        assert_eq!(
            WeightLayout::for_cpu(false, (6, 207)).0,
            WeightLayout::BySize
        );
    }

    /// A Q6_K tensor stays in the file's layout from `Q6K_FILE_MIN_BYTES` under `BySize`
    /// and is repacked below it; other types are repacked at any size; `Packed` and
    /// `File` take every weight one way.
    #[test]
    fn by_size_keeps_large_q6_k_tensors_in_the_file_layout() {
        let big = Q6K_FILE_MIN_BYTES;
        assert!(WeightLayout::BySize.repacks(GgmlType::Q6_K, big - 1));
        assert!(!WeightLayout::BySize.repacks(GgmlType::Q6_K, big));
        for ty in [GgmlType::Q4_K, GgmlType::Q8_0, GgmlType::MXFP4] {
            assert!(WeightLayout::BySize.repacks(ty, 64 * big));
        }
        assert!(WeightLayout::Packed.repacks(GgmlType::Q6_K, big));
        assert!(!WeightLayout::File.repacks(GgmlType::Q4_K, 1));

        let opts = DeviceOptions {
            threads: Some(2),
            keep_quant: true,
        };
        let Ok(dev) = CpuDevice::with_level(&opts, SimdLevel::Avx512Vnni) else {
            eprintln!("no AVX-512 VNNI on this CPU: nothing is repacked here");
            return;
        };
        let dev = dev.with_layout(WeightLayout::BySize);
        let k = 2048;
        let row = GgmlType::Q6_K.row_bytes(k).expect("row bytes");
        // 16 rows under the bound; the smallest multiple of 16 rows at or over it.
        let large_rows = (big.div_ceil(row)).next_multiple_of(X16_ROWS);
        for (ty, rows, packed) in [
            (GgmlType::Q6_K, 16, true),
            (GgmlType::Q6_K, large_rows, false),
            (GgmlType::Q4_K, large_rows, true),
            // Q3_K arranged block by block where the VBMI matvec runs, any rows.
            (GgmlType::Q3_K, 7, crate::simd::has_vbmi_gfni()),
        ] {
            let bytes = ty.row_bytes(k).expect("row bytes") * rows;
            let h = dev
                .stage(&WeightDesc {
                    name: format!("w{rows}"),
                    ty,
                    dims: vec![k, rows],
                    kind: WeightKind::Matrix,
                    data: WeightSource::from_vec(vec![0u8; bytes]),
                })
                .expect("stage");
            assert_eq!(dev.weight(&*h).x16.is_some(), packed, "{ty} {rows} rows");
        }
    }
}
