//! `flint-tt-sim`: a simulated Tenstorrent runtime adapter. It exports the C ABI of
//! `docs/hal-tt/flint_tt.h` (version [`ABI_VERSION`]) and computes every op on the host
//! CPU with the scalar references of `flint-core`, with the properties of a Blackhole
//! P150 that matter to the host:
//!
//! - a DRAM budget of 32 GiB ([`device::P150_DRAM_BYTES`]) against which resident weights
//!   and buffers are counted; `FLINT_TT_SIM_DRAM_BYTES` overrides it (tests make it small);
//! - the admission predicate for kept block encodings ([`device::admits_kept`]): Q4_K,
//!   Q5_K, Q6_K, the IQ types and MXFP4; everything else reaches it expanded by the host
//!   (BF16, F16 or F32);
//! - a V cache at fp16 precision (keys at f32), attention tiled over 64 keys with an
//!   online softmax, GELU on fp16 operands: where the core offers the routine the CPU
//!   backend and the reference forward use, the simulator uses it too;
//! - dispatch counters (block and float matmuls), the bytes streamed from host memory
//!   for weights staged as streamed, and the host-device traffic through
//!   `flint_tt_buffer_write` / `flint_tt_buffer_read` (calls and bytes) and the device-side
//!   copies of `flint_tt_buffer_copy` (ABI 4), to cross-check the host's own count.
//! - Qwen 3.5's Gated DeltaNet ops (ABI 6): the convolution with SiLU and the delta rule
//!   with their states in device buffers at an offset, updated in place, and the gates,
//!   products, splits and L2 norms around them, each with the `flint_core::math` reference
//!   the CPU backend matches bit for bit.
//!
//! Test knobs, read when a device is opened: `FLINT_TT_SIM_FAIL_OPEN=1` makes
//! `flint_tt_device_open` fail (as a machine without a card would); read by
//! `flint_tt_abi_version`: `FLINT_TT_SIM_ABI_VERSION=N` makes it report `N` (to test the
//! host's version check).
//!
//! The crate builds as a `cdylib` (`libflint_tt_sim.so`) that `flint-hal-tt` loads.

mod device;
mod kernels;

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Mutex;

use flint_core::math::{RopeConfig, RopeKind, Yarn};
use flint_core::GgmlType;

pub use device::{admits_kept, P150_CORES, P150_DRAM_BYTES};
use device::{HostBytes, KvLayout, Seq, SimError, State, ERR_INVALID, ERR_NO_DEVICE, ERR_RUNTIME};

/// The ABI version this library implements.
pub const ABI_VERSION: u32 = 6;

/// `FLINT_TT_OK`.
const OK: i32 = 0;

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: &str) {
    let c = CString::new(msg.replace('\0', " ")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

/// An opened simulated device (`flint_tt_device *` on the C side).
#[derive(Debug)]
pub struct SimDevice {
    state: Mutex<State>,
}

/// Runs `f` on the device state, turning errors and panics into a status code and the
/// thread's last-error message.
fn call(dev: *const SimDevice, f: impl FnOnce(&mut State) -> Result<(), SimError>) -> i32 {
    if dev.is_null() {
        set_error("null device");
        return ERR_INVALID;
    }
    // SAFETY: a non-null `dev` was returned by `flint_tt_device_open` and not yet closed
    // (the ABI's contract); `SimDevice` is only accessed through its mutex.
    let dev = unsafe { &*dev };
    let r = catch_unwind(AssertUnwindSafe(|| {
        let mut st = match dev.state.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        f(&mut st)
    }));
    match r {
        Ok(Ok(())) => OK,
        Ok(Err(e)) => {
            set_error(&e.message);
            e.code
        }
        Err(_) => {
            set_error("internal error in the simulated runtime");
            ERR_RUNTIME
        }
    }
}

/// A host slice from a C pointer and count; `NULL` with `n == 0` is the empty slice.
///
/// # Safety
/// `p` must point at `n` readable `T`s that stay valid for `'a`.
unsafe fn slice<'a, T>(p: *const T, n: u64, what: &str) -> Result<&'a [T], SimError> {
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return device::invalid(format!("{what}: null pointer for {n} entries"));
    }
    // SAFETY: the caller guarantees `n` readable elements at `p`.
    Ok(unsafe { std::slice::from_raw_parts(p, n as usize) })
}

/// Mutable version of [`slice`].
///
/// # Safety
/// `p` must point at `n` writable `T`s, not aliased, valid for `'a`.
unsafe fn slice_mut<'a, T>(p: *mut T, n: u64, what: &str) -> Result<&'a mut [T], SimError> {
    if n == 0 {
        return Ok(&mut []);
    }
    if p.is_null() {
        return device::invalid(format!("{what}: null pointer for {n} entries"));
    }
    // SAFETY: the caller guarantees `n` writable, unaliased elements at `p`.
    Ok(unsafe { std::slice::from_raw_parts_mut(p, n as usize) })
}

fn usize_of(v: u64, what: &str) -> Result<usize, SimError> {
    usize::try_from(v).map_err(|_| SimError {
        code: ERR_INVALID,
        message: format!("{what} = {v} does not fit this machine"),
    })
}

/// `flint_tt_abi_version`.
#[no_mangle]
pub extern "C" fn flint_tt_abi_version() -> u32 {
    match std::env::var("FLINT_TT_SIM_ABI_VERSION") {
        Ok(v) => v.trim().parse().unwrap_or(0),
        Err(_) => ABI_VERSION,
    }
}

/// `flint_tt_last_error`.
#[no_mangle]
pub extern "C" fn flint_tt_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// `flint_tt_device_info` of the C header.
#[repr(C)]
#[derive(Debug)]
pub struct DeviceInfo {
    /// NUL-terminated name.
    pub name: [c_char; 64],
    /// DRAM bytes.
    pub dram_bytes: u64,
    /// Tensix cores.
    pub compute_cores: u32,
    /// Zero.
    pub reserved: u32,
}

/// `flint_tt_device_open`.
///
/// # Safety
/// `out` must be a valid pointer to write a device pointer to.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_device_open(index: u32, out: *mut *mut SimDevice) -> i32 {
    if out.is_null() {
        set_error("flint_tt_device_open: null output pointer");
        return ERR_INVALID;
    }
    if index != 0 {
        set_error(&format!(
            "no simulated device {index}: the simulator has one device (0)"
        ));
        return ERR_NO_DEVICE;
    }
    if std::env::var("FLINT_TT_SIM_FAIL_OPEN").is_ok_and(|v| v.trim() == "1") {
        set_error("simulated device failed to open (FLINT_TT_SIM_FAIL_OPEN=1)");
        return ERR_NO_DEVICE;
    }
    let dram = match std::env::var("FLINT_TT_SIM_DRAM_BYTES") {
        Ok(v) => match v.trim().parse::<u64>() {
            Ok(n) => n,
            Err(_) => {
                set_error(&format!(
                    "FLINT_TT_SIM_DRAM_BYTES={v:?} is not a byte count"
                ));
                return ERR_NO_DEVICE;
            }
        },
        Err(_) => P150_DRAM_BYTES,
    };
    let dev = Box::new(SimDevice {
        state: Mutex::new(State::new(dram)),
    });
    // SAFETY: `out` is non-null and points at writable storage for a pointer (contract).
    unsafe { *out = Box::into_raw(dev) };
    OK
}

/// `flint_tt_device_close`.
///
/// # Safety
/// `dev` must be NULL or a device from `flint_tt_device_open`, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_device_close(dev: *mut SimDevice) -> i32 {
    if !dev.is_null() {
        // SAFETY: `dev` came from `Box::into_raw` in `flint_tt_device_open` and the caller
        // gives up its last use here.
        drop(unsafe { Box::from_raw(dev) });
    }
    OK
}

/// `flint_tt_device_info_get`.
///
/// # Safety
/// `dev` an open device, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_device_info_get(
    dev: *const SimDevice,
    out: *mut DeviceInfo,
) -> i32 {
    call(dev, |st| {
        if out.is_null() {
            return device::invalid("flint_tt_device_info_get: null output");
        }
        let mut name = [0 as c_char; 64];
        for (d, b) in name.iter_mut().zip(b"Blackhole P150 (simulated)".iter()) {
            *d = *b as c_char;
        }
        // SAFETY: `out` is non-null and writable (contract).
        unsafe {
            out.write(DeviceInfo {
                name,
                dram_bytes: st.dram_bytes(),
                compute_cores: P150_CORES,
                reserved: 0,
            })
        };
        Ok(())
    })
}

/// `flint_tt_admits_kept`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_admits_kept(_dev: *const SimDevice, ggml_type: u32) -> i32 {
    match GgmlType::from_id(ggml_type) {
        Ok(t) => i32::from(admits_kept(t)),
        Err(_) => 0,
    }
}

/// `flint_tt_buffer_alloc`.
///
/// # Safety
/// `dev` an open device, `out` writable.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_buffer_alloc(
    dev: *const SimDevice,
    bytes: u64,
    out: *mut u64,
) -> i32 {
    call(dev, |st| {
        if out.is_null() {
            return device::invalid("flint_tt_buffer_alloc: null output");
        }
        let h = st.alloc(bytes)?;
        // SAFETY: `out` is non-null and writable (contract).
        unsafe { out.write(h) };
        Ok(())
    })
}

/// `flint_tt_buffer_free`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_buffer_free(dev: *const SimDevice, buf: u64) -> i32 {
    call(dev, |st| st.free(buf))
}

/// `flint_tt_buffer_write`.
///
/// # Safety
/// `dev` an open device; `src` `len` readable bytes.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_buffer_write(
    dev: *const SimDevice,
    buf: u64,
    offset: u64,
    src: *const u8,
    len: u64,
) -> i32 {
    call(dev, |st| {
        // SAFETY: `src` holds `len` readable bytes (contract).
        let s = unsafe { slice(src, len, "buffer_write source") }?;
        st.write(buf, offset, s)
    })
}

/// `flint_tt_buffer_read`.
///
/// # Safety
/// `dev` an open device; `dst` `len` writable bytes.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_buffer_read(
    dev: *const SimDevice,
    buf: u64,
    offset: u64,
    dst: *mut u8,
    len: u64,
) -> i32 {
    call(dev, |st| {
        // SAFETY: `dst` holds `len` writable bytes (contract).
        let d = unsafe { slice_mut(dst, len, "buffer_read destination") }?;
        st.read(buf, offset, d)
    })
}

/// `flint_tt_buffer_copy` (ABI 4): `bytes` from `src` at byte `src_offset` to `dst` at
/// byte `dst_offset`, on the device. Overlapping ranges of one buffer are
/// `FLINT_TT_ERR_INVALID`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_buffer_copy(
    dev: *const SimDevice,
    src: u64,
    src_offset: u64,
    dst: u64,
    dst_offset: u64,
    bytes: u64,
) -> i32 {
    call(dev, |st| st.copy(src, src_offset, dst, dst_offset, bytes))
}

/// `flint_tt_weight_desc` of the C header.
#[repr(C)]
#[derive(Debug)]
pub struct WeightDesc {
    /// Encoding of `data`.
    pub ggml_type: u32,
    /// 0 resident, 1 streamed.
    pub residency: u32,
    /// Row length.
    pub in_features: u64,
    /// Rows.
    pub out_features: u64,
    /// The bytes.
    pub data: *const u8,
    /// Their length.
    pub len: u64,
    /// The encoding in the file before the host expanded it (ABI 2).
    pub source_type: u32,
    /// Zero.
    pub reserved: u32,
}

// The header's layout on every 64-bit target (as the host's `CWeightDesc`).
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<WeightDesc>() == 48);

/// `flint_tt_weight_stage`.
///
/// # Safety
/// `dev` an open device; `desc` readable, its `data` `len` readable bytes (for streamed
/// weights valid until `flint_tt_weight_free`); `out` writable.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_weight_stage(
    dev: *const SimDevice,
    desc: *const WeightDesc,
    out: *mut u64,
) -> i32 {
    call(dev, |st| {
        if desc.is_null() || out.is_null() {
            return device::invalid("flint_tt_weight_stage: null argument");
        }
        // SAFETY: `desc` is non-null and readable (contract).
        let d = unsafe { &*desc };
        let ty = GgmlType::from_id(d.ggml_type).map_err(|e| SimError {
            code: device::ERR_UNSUPPORTED,
            message: e.to_string(),
        })?;
        let source_ty = GgmlType::from_id(d.source_type).map_err(|e| SimError {
            code: device::ERR_UNSUPPORTED,
            message: format!("source encoding: {e}"),
        })?;
        if d.residency > 1 {
            return device::invalid(format!("unknown residency {}", d.residency));
        }
        let len = usize_of(d.len, "weight length")?;
        if len > 0 && d.data.is_null() {
            return device::invalid("flint_tt_weight_stage: null data");
        }
        let h = st.stage(device::StageRequest {
            ty,
            source_ty,
            streamed: d.residency == 1,
            in_f: usize_of(d.in_features, "in_features")?,
            out_f: usize_of(d.out_features, "out_features")?,
            data: HostBytes {
                ptr: if len == 0 { [0u8; 0].as_ptr() } else { d.data },
                len,
            },
        })?;
        // SAFETY: `out` is non-null and writable (contract).
        unsafe { out.write(h) };
        Ok(())
    })
}

/// `flint_tt_weight_free`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_weight_free(dev: *const SimDevice, w: u64) -> i32 {
    call(dev, |st| st.weight_free(w))
}

/// `flint_tt_matmul`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_matmul(
    dev: *const SimDevice,
    w: u64,
    x: u64,
    m: u64,
    out: u64,
) -> i32 {
    call(dev, |st| st.matmul(w, x, usize_of(m, "m")?, out))
}

/// `flint_tt_expert_matmul` (ABI 6): `out[i] = W[ids[i]] x[i / (n_rows / x_rows)]`, the
/// `n_rows` ids read from index buffer `ids` from index `ids_offset`.
///
/// # Safety
/// `dev` an open device; `experts` `n_experts` handles.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_expert_matmul(
    dev: *const SimDevice,
    experts: *const u64,
    n_experts: u32,
    x: u64,
    x_rows: u64,
    ids: u64,
    ids_offset: u64,
    n_rows: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        // SAFETY: `experts` holds `n_experts` handles (contract).
        let e = unsafe { slice(experts, n_experts as u64, "experts") }?;
        st.expert_matmul(
            e,
            x,
            usize_of(x_rows, "x_rows")?,
            ids,
            ids_offset,
            usize_of(n_rows, "n_rows")?,
            out,
        )
    })
}

/// `flint_tt_get_rows`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_get_rows(
    dev: *const SimDevice,
    w: u64,
    ids: u64,
    ids_offset: u64,
    n: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        let ids = st.indices(ids, ids_offset, n, "get_rows ids")?;
        st.get_rows(w, &ids, out)
    })
}

/// `flint_tt_rms_norm`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_rms_norm(
    dev: *const SimDevice,
    x: u64,
    n: u64,
    weight: u64,
    eps: f32,
    dim: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        st.rms_norm(
            x,
            usize_of(n, "n")?,
            weight,
            eps,
            usize_of(dim, "dim")?,
            out,
        )
    })
}

/// `flint_tt_add_rms_norm`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_add_rms_norm(
    dev: *const SimDevice,
    residual: u64,
    delta: u64,
    n: u64,
    weight: u64,
    eps: f32,
    dim: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        st.add_rms_norm(
            residual,
            delta,
            usize_of(n, "n")?,
            weight,
            eps,
            usize_of(dim, "dim")?,
            out,
        )
    })
}

/// `FLINT_TT_ROPE_NORMAL`.
pub const ROPE_NORMAL: u32 = 0;
/// `FLINT_TT_ROPE_NEOX`.
pub const ROPE_NEOX: u32 = 1;

/// `flint_tt_rope_params` (ABI 3).
#[repr(C)]
#[derive(Debug)]
pub struct CRopeParams {
    /// Heads per row.
    pub n_heads: u32,
    /// Values per head.
    pub head_dim: u32,
    /// Rotated dims.
    pub n_rot: u32,
    /// [`ROPE_NORMAL`] or [`ROPE_NEOX`].
    pub kind: u32,
    /// Frequency base.
    pub base: f32,
    /// Linear frequency scale.
    pub freq_scale: f32,
    /// 0, or the float buffer holding the `n_rot / 2` per-pair divisors of the angle
    /// (ABI 6).
    pub freq_factors: u64,
    /// The first factor in that buffer, counted in floats.
    pub freq_factors_offset: u64,
    /// YaRN extrapolation mix (0: none).
    pub ext_factor: f32,
    /// YaRN magnitude (1: none).
    pub attn_factor: f32,
    /// YaRN `beta_fast`.
    pub beta_fast: f32,
    /// YaRN `beta_slow`.
    pub beta_slow: f32,
    /// YaRN's original context length.
    pub n_ctx_orig: u32,
    /// 0.
    pub reserved: u32,
}

/// `flint_tt_rope`.
///
/// # Safety
/// `dev` an open device; `params` NULL or a valid `flint_tt_rope_params` (its factors are
/// a buffer handle, checked on the device's side).
#[no_mangle]
pub unsafe extern "C" fn flint_tt_rope(
    dev: *const SimDevice,
    x: u64,
    rows: u64,
    positions: u64,
    positions_offset: u64,
    params: *const CRopeParams,
) -> i32 {
    call(dev, |st| {
        let p = st.indices(positions, positions_offset, rows, "rope positions")?;
        if params.is_null() {
            return device::invalid("rope: null params".to_string());
        }
        // SAFETY: non-null `params` points at a valid struct (contract).
        let cp = unsafe { &*params };
        let kind = match cp.kind {
            ROPE_NORMAL => RopeKind::Normal,
            ROPE_NEOX => RopeKind::Neox,
            k => return device::invalid(format!("rope: unknown kind {k}")),
        };
        let yarn = (cp.ext_factor != 0.0 || cp.attn_factor != 1.0).then_some(Yarn {
            ext_factor: cp.ext_factor,
            attn_factor: cp.attn_factor,
            beta_fast: cp.beta_fast,
            beta_slow: cp.beta_slow,
            n_ctx_orig: cp.n_ctx_orig,
        });
        // The factors are read from their buffer by `State::rope`.
        let cfg = RopeConfig {
            kind,
            n_rot: cp.n_rot as usize,
            base: cp.base,
            freq_scale: cp.freq_scale,
            freq_factors: None,
            yarn,
        };
        st.rope(
            x,
            &p,
            cp.n_heads as usize,
            cp.head_dim as usize,
            cfg,
            (cp.freq_factors, cp.freq_factors_offset),
        )
    })
}

/// `flint_tt_silu_mul`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_silu_mul(
    dev: *const SimDevice,
    gate: u64,
    up: u64,
    n: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        st.act_mul(gate, up, usize_of(n, "n")?, out, false)
    })
}

/// `flint_tt_gelu_mul`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_gelu_mul(
    dev: *const SimDevice,
    gate: u64,
    up: u64,
    n: u64,
    out: u64,
) -> i32 {
    call(dev, |st| st.act_mul(gate, up, usize_of(n, "n")?, out, true))
}

/// `flint_tt_add`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_add(dev: *const SimDevice, acc: u64, x: u64, n: u64) -> i32 {
    call(dev, |st| st.add(acc, x, usize_of(n, "n")?))
}

/// `flint_tt_add_bias`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_add_bias(
    dev: *const SimDevice,
    x: u64,
    n: u64,
    bias: u64,
    bias_len: u64,
) -> i32 {
    call(dev, |st| {
        st.add_bias(x, usize_of(n, "n")?, bias, usize_of(bias_len, "bias_len")?)
    })
}

/// `flint_tt_scale`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_scale(dev: *const SimDevice, x: u64, n: u64, s: f32) -> i32 {
    call(dev, |st| st.scale(x, usize_of(n, "n")?, s))
}

/// `flint_tt_scatter_add_weighted` (ABI 6): `acc[i / (n / acc_rows)] += weights[i] * x[i]`,
/// the `n` weights read from float buffer `weights` from float `weights_offset`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_scatter_add_weighted(
    dev: *const SimDevice,
    acc: u64,
    acc_rows: u64,
    x: u64,
    weights: u64,
    weights_offset: u64,
    n: u64,
    dim: u64,
) -> i32 {
    call(dev, |st| {
        st.scatter_add_weighted(
            acc,
            usize_of(acc_rows, "acc_rows")?,
            x,
            weights,
            weights_offset,
            usize_of(n, "n")?,
            usize_of(dim, "dim")?,
        )
    })
}

/// `flint_tt_route_topk`. `bias` and `expert_scale` are device buffers of `n_experts`
/// floats (0 = none); the ids and weights go to device buffers at the offsets given
/// (ABI 6).
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_route_topk(
    dev: *const SimDevice,
    logits: u64,
    n_rows: u64,
    n_experts: u32,
    bias: u64,
    expert_scale: u64,
    k: u32,
    gating: u32,
    normalize: u32,
    scale: f32,
    ids: u64,
    ids_offset: u64,
    weights: u64,
    weights_offset: u64,
) -> i32 {
    call(dev, |st| {
        let gating = match gating {
            0 => flint_core::math::Gating::Softmax,
            1 => flint_core::math::Gating::Sigmoid,
            2 => flint_core::math::Gating::SoftmaxWeight,
            other => return device::invalid(format!("route_topk: unknown gating {other}")),
        };
        st.route_topk(&device::Routing {
            logits,
            n_rows: usize_of(n_rows, "n_rows")?,
            n_experts: n_experts as usize,
            bias,
            expert_scale,
            k: k as usize,
            gating,
            normalize: normalize != 0,
            scale,
            ids: (ids, ids_offset),
            weights: (weights, weights_offset),
        })
    })
}

/// `flint_tt_sigmoid` (ABI 6): `x = sigmoid(x)` for `n` values.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_sigmoid(dev: *const SimDevice, x: u64, n: u64) -> i32 {
    call(dev, |st| st.sigmoid(x, usize_of(n, "n")?))
}

/// `flint_tt_mul` (ABI 6): `acc[i] *= x[i / (n / x_len)]`.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_mul(
    dev: *const SimDevice,
    acc: u64,
    n: u64,
    x: u64,
    x_len: u64,
) -> i32 {
    call(dev, |st| {
        st.mul(acc, usize_of(n, "n")?, x, usize_of(x_len, "x_len")?)
    })
}

/// `flint_tt_deinterleave` (ABI 6): `src` split by chunk into the `n_outs` buffers of
/// `outs`.
///
/// # Safety
/// `dev` an open device; `outs` `n_outs` handles.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_deinterleave(
    dev: *const SimDevice,
    src: u64,
    n: u64,
    chunk: u64,
    outs: *const u64,
    n_outs: u32,
) -> i32 {
    call(dev, |st| {
        // SAFETY: `outs` holds `n_outs` handles (contract).
        let o = unsafe { slice(outs, u64::from(n_outs), "deinterleave outputs") }?;
        st.deinterleave(src, usize_of(n, "n")?, usize_of(chunk, "chunk")?, o)
    })
}

/// `flint_tt_delta_net_gate` (ABI 6): the log decay of each row of `heads` values.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_delta_net_gate(
    dev: *const SimDevice,
    alpha: u64,
    n: u64,
    dt_bias: u64,
    a: u64,
    heads: u64,
) -> i32 {
    call(dev, |st| {
        st.delta_net_gate(
            alpha,
            usize_of(n, "n")?,
            dt_bias,
            a,
            usize_of(heads, "heads")?,
        )
    })
}

/// `flint_tt_l2_norm` (ABI 6): every row of `dim` values L2-normalised in place.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_l2_norm(
    dev: *const SimDevice,
    x: u64,
    n: u64,
    dim: u64,
    eps: f32,
) -> i32 {
    call(dev, |st| {
        st.l2_norm(x, usize_of(n, "n")?, usize_of(dim, "dim")?, eps)
    })
}

/// `flint_tt_ssm_conv_silu` (ABI 6): the causal convolution then SiLU, the window in
/// float buffer `state` from float `state_offset`, updated in place.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_ssm_conv_silu(
    dev: *const SimDevice,
    x: u64,
    n_rows: u64,
    channels: u64,
    weight: u64,
    d_conv: u64,
    state: u64,
    state_offset: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        st.ssm_conv_silu(
            x,
            usize_of(n_rows, "n_rows")?,
            usize_of(channels, "channels")?,
            weight,
            usize_of(d_conv, "d_conv")?,
            (state, state_offset),
            out,
        )
    })
}

/// `flint_tt_gated_delta_net` (ABI 6): the gated delta rule of one sequence, the
/// per-head states in float buffer `state` from float `state_offset`, updated in place.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_gated_delta_net(
    dev: *const SimDevice,
    heads_k: u64,
    heads_v: u64,
    head_dim: u64,
    n_tokens: u64,
    q: u64,
    k: u64,
    v: u64,
    g: u64,
    beta: u64,
    state: u64,
    state_offset: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        let shape = flint_core::math::DeltaNetShape {
            heads_k: usize_of(heads_k, "heads_k")?,
            heads_v: usize_of(heads_v, "heads_v")?,
            head_dim: usize_of(head_dim, "head_dim")?,
        };
        st.gated_delta_net(
            shape,
            usize_of(n_tokens, "n_tokens")?,
            q,
            k,
            v,
            g,
            beta,
            (state, state_offset),
            out,
        )
    })
}

/// `flint_tt_kv_layout` of the C header.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CKvLayout {
    /// Blocks.
    pub num_blocks: u64,
    /// Tokens per block.
    pub block_size: u64,
    /// KV heads.
    pub n_kv_heads: u64,
    /// Key head size.
    pub head_dim_k: u64,
    /// Value head size.
    pub head_dim_v: u64,
}

/// Reads a C KV layout.
///
/// # Safety
/// `l` readable.
unsafe fn kv_layout(l: *const CKvLayout) -> Result<KvLayout, SimError> {
    if l.is_null() {
        return device::invalid("null KV layout");
    }
    // SAFETY: non-null and readable (contract).
    let l = unsafe { *l };
    Ok(KvLayout {
        num_blocks: usize_of(l.num_blocks, "num_blocks")?,
        block_size: usize_of(l.block_size, "block_size")?.max(1),
        n_kv_heads: usize_of(l.n_kv_heads, "n_kv_heads")?,
        head_dim_k: usize_of(l.head_dim_k, "head_dim_k")?,
        head_dim_v: usize_of(l.head_dim_v, "head_dim_v")?,
    })
}

/// `flint_tt_write_kv`.
///
/// # Safety
/// `dev` an open device; `layout` readable.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_write_kv(
    dev: *const SimDevice,
    layout: *const CKvLayout,
    k_cache: u64,
    v_cache: u64,
    k: u64,
    v: u64,
    slots: u64,
    slots_offset: u64,
    n: u64,
) -> i32 {
    call(dev, |st| {
        // SAFETY: `layout` readable (contract).
        let l = unsafe { kv_layout(layout) }?;
        let s = st.indices(slots, slots_offset, n, "write_kv slots")?;
        st.write_kv(&l, k_cache, v_cache, k, v, &s)
    })
}

/// `flint_tt_attn_seq` of the C header.
#[repr(C)]
#[derive(Debug)]
pub struct CAttnSeq {
    /// First query row.
    pub q_start: u64,
    /// The index buffer holding the positions (ABI 5).
    pub positions: u64,
    /// Their first index in it.
    pub positions_offset: u64,
    /// Their count.
    pub n_positions: u64,
    /// The index buffer holding the block table (ABI 5).
    pub block_table: u64,
    /// Its first index in it.
    pub block_table_offset: u64,
    /// Its length.
    pub n_blocks: u64,
}

/// `flint_tt_paged_attention`.
///
/// # Safety
/// `dev` an open device; `layout` readable; `seqs` `n_seqs` entries. `sinks` is a float
/// buffer handle (0 = none), checked on the device's side (ABI 6).
#[no_mangle]
pub unsafe extern "C" fn flint_tt_paged_attention(
    dev: *const SimDevice,
    layout: *const CKvLayout,
    k_cache: u64,
    v_cache: u64,
    q: u64,
    q_rows: u64,
    seqs: *const CAttnSeq,
    n_seqs: u64,
    n_heads: u32,
    scale: f32,
    sinks: u64,
    sinks_offset: u64,
    window: u64,
    out: u64,
) -> i32 {
    call(dev, |st| {
        // SAFETY: `layout` readable (contract).
        let l = unsafe { kv_layout(layout) }?;
        // SAFETY: `seqs` holds `n_seqs` entries (contract).
        let cs = unsafe { slice(seqs, n_seqs, "sequences") }?;
        let mut lists = Vec::with_capacity(cs.len());
        for s in cs {
            lists.push((
                usize_of(s.q_start, "q_start")?,
                st.indices(s.positions, s.positions_offset, s.n_positions, "positions")?,
                st.indices(
                    s.block_table,
                    s.block_table_offset,
                    s.n_blocks,
                    "block table",
                )?,
            ));
        }
        let v: Vec<Seq<'_>> = lists
            .iter()
            .map(|(q_start, positions, block_table)| Seq {
                q_start: *q_start,
                positions,
                block_table,
            })
            .collect();
        st.paged_attention(
            &l,
            k_cache,
            v_cache,
            q,
            usize_of(q_rows, "q_rows")?,
            &v,
            n_heads as usize,
            scale,
            (sinks, sinks_offset),
            usize_of(window, "window")?,
            out,
        )
    })
}

/// `flint_tt_sync`: every call completes before it returns, so there is nothing to wait
/// for.
///
/// # Safety
/// `dev` an open device.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_sync(dev: *const SimDevice) -> i32 {
    call(dev, |_| Ok(()))
}

/// `flint_tt_counters` of the C header.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CCounters {
    /// Block-encoded matmuls.
    pub block_dispatches: u64,
    /// Float (BF16 / F16 / F32) matmuls.
    pub float_dispatches: u64,
    /// Bytes read from host memory for streamed weights.
    pub streamed_bytes: u64,
    /// DRAM in use.
    pub dram_used_bytes: u64,
    /// `flint_tt_buffer_write` calls (ABI 4).
    pub host_writes: u64,
    /// Bytes they moved from host to device (ABI 4).
    pub host_write_bytes: u64,
    /// `flint_tt_buffer_read` calls (ABI 4).
    pub host_reads: u64,
    /// Bytes they moved from device to host (ABI 4).
    pub host_read_bytes: u64,
    /// `flint_tt_buffer_copy` calls (ABI 4).
    pub device_copies: u64,
    /// Bytes they copied on the device (ABI 4).
    pub device_copy_bytes: u64,
}

// The header's layout: ten u64.
const _: () = assert!(std::mem::size_of::<CCounters>() == 80);

/// `flint_tt_counters_get`.
///
/// # Safety
/// `dev` an open device; `out` writable.
#[no_mangle]
pub unsafe extern "C" fn flint_tt_counters_get(dev: *const SimDevice, out: *mut CCounters) -> i32 {
    call(dev, |st| {
        if out.is_null() {
            return device::invalid("flint_tt_counters_get: null output");
        }
        let c = st.counters();
        // SAFETY: `out` non-null and writable (contract).
        unsafe {
            out.write(CCounters {
                block_dispatches: c.block_dispatches,
                float_dispatches: c.float_dispatches,
                streamed_bytes: c.streamed_bytes,
                dram_used_bytes: c.dram_used_bytes,
                host_writes: c.host_writes,
                host_write_bytes: c.host_write_bytes,
                host_reads: c.host_reads,
                host_read_bytes: c.host_read_bytes,
                device_copies: c.device_copies,
                device_copy_bytes: c.device_copy_bytes,
            })
        };
        Ok(())
    })
}
