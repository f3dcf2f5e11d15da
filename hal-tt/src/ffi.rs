//! Loading the runtime adapter and the raw C ABI of `docs/hal-tt/flint_tt.h`.
//!
//! All `unsafe` of this crate lives here: resolving symbols, and calling through the
//! resolved function pointers in the thin wrappers of [`Runtime`].

use std::ffi::{c_char, c_void, CStr};
use std::path::{Path, PathBuf};

use flint_hal::{HalError, HalErrorKind};
use libloading::Library;

/// The ABI version this build speaks (`FLINT_TT_ABI_VERSION`).
pub const ABI_VERSION: u32 = 6;

/// The environment variable naming the adapter library.
pub const RUNTIME_ENV: &str = "FLINT_TT_RUNTIME";

/// The adapter's file name.
pub const RUNTIME_FILE: &str = "libflint_tt.so";

/// `flint_tt_device_info`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CDeviceInfo {
    pub name: [c_char; 64],
    pub dram_bytes: u64,
    pub compute_cores: u32,
    pub reserved: u32,
}

/// `flint_tt_weight_desc`.
#[repr(C)]
#[derive(Debug)]
pub struct CWeightDesc {
    pub ggml_type: u32,
    pub residency: u32,
    pub in_features: u64,
    pub out_features: u64,
    pub data: *const u8,
    pub len: u64,
    /// The encoding in the file, before any expansion (ABI 2).
    pub source_type: u32,
    pub reserved: u32,
}

// The header's layout on every 64-bit target: 4 + 4 + 8 + 8 + 8 + 8 + 4 + 4 bytes.
#[cfg(target_pointer_width = "64")]
const _: () = assert!(std::mem::size_of::<CWeightDesc>() == 48);

/// `FLINT_TT_RESIDENT`.
pub const RESIDENT: u32 = 0;
/// `FLINT_TT_STREAMED`.
pub const STREAMED: u32 = 1;

/// `flint_tt_kv_layout`.
#[repr(C)]
#[derive(Clone, Copy, Debug)]
pub struct CKvLayout {
    pub num_blocks: u64,
    pub block_size: u64,
    pub n_kv_heads: u64,
    pub head_dim_k: u64,
    pub head_dim_v: u64,
}

/// `flint_tt_attn_seq`.
#[repr(C)]
#[derive(Debug)]
pub struct CAttnSeq {
    pub q_start: u64,
    pub positions: u64,
    pub positions_offset: u64,
    pub n_positions: u64,
    pub block_table: u64,
    pub block_table_offset: u64,
    pub n_blocks: u64,
}

/// `FLINT_TT_ROPE_NORMAL`: pairs `(2i, 2i+1)`.
pub const ROPE_NORMAL: u32 = 0;
/// `FLINT_TT_ROPE_NEOX`: pairs `(i, i + n_rot/2)`.
pub const ROPE_NEOX: u32 = 1;

/// `flint_tt_rope_params` (ABI 3; its factors in a buffer since ABI 6).
#[repr(C)]
#[derive(Debug)]
pub struct CRopeParams {
    pub n_heads: u32,
    pub head_dim: u32,
    pub n_rot: u32,
    /// [`ROPE_NORMAL`] or [`ROPE_NEOX`].
    pub kind: u32,
    pub base: f32,
    pub freq_scale: f32,
    /// 0, or the float buffer holding the `n_rot / 2` per-pair divisors of the angle
    /// (ABI 6), read on the device.
    pub freq_factors: u64,
    /// The first factor in that buffer, counted in floats.
    pub freq_factors_offset: u64,
    /// YaRN: `ext_factor` 0 and `attn_factor` 1 when there is none.
    pub ext_factor: f32,
    pub attn_factor: f32,
    pub beta_fast: f32,
    pub beta_slow: f32,
    pub n_ctx_orig: u32,
    pub reserved: u32,
}

// The header's layout: 6 * 4 + 2 * 8 + 6 * 4 bytes, no padding.
const _: () = assert!(std::mem::size_of::<CRopeParams>() == 64);
const _: () = assert!(std::mem::offset_of!(CRopeParams, freq_factors) == 24);
const _: () = assert!(std::mem::offset_of!(CRopeParams, ext_factor) == 40);

/// `flint_tt_counters`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct CCounters {
    pub block_dispatches: u64,
    pub float_dispatches: u64,
    pub streamed_bytes: u64,
    pub dram_used_bytes: u64,
    /// `flint_tt_buffer_write` calls and bytes (ABI 4).
    pub host_writes: u64,
    pub host_write_bytes: u64,
    /// `flint_tt_buffer_read` calls and bytes (ABI 4).
    pub host_reads: u64,
    pub host_read_bytes: u64,
    /// `flint_tt_buffer_copy` calls and bytes (ABI 4).
    pub device_copies: u64,
    pub device_copy_bytes: u64,
}

// The header's layout: ten u64.
const _: () = assert!(std::mem::size_of::<CCounters>() == 80);

type Dev = *mut c_void;

macro_rules! abi {
    ($($field:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty;)*) => {
        /// The adapter's entry points, resolved once.
        #[derive(Clone, Copy)]
        pub(crate) struct Api {
            $(pub(crate) $field: unsafe extern "C" fn($($arg),*) -> $ret,)*
        }

        /// Every symbol the ABI requires, in header order.
        pub const SYMBOLS: &[&str] = &[$($sym),*];

        impl Api {
            /// Resolves every entry point; the error lists the missing ones.
            fn load(lib: &Library) -> Result<Self, Vec<&'static str>> {
                let mut missing = Vec::new();
                $(
                    // SAFETY: the symbol is declared in flint_tt.h with exactly this
                    // signature; an adapter exporting the name promises it.
                    let $field = unsafe {
                        lib.get::<unsafe extern "C" fn($($arg),*) -> $ret>(
                            concat!($sym, "\0").as_bytes(),
                        )
                    }
                    .map(|s| *s)
                    .map_err(|_| missing.push($sym))
                    .ok();
                )*
                match ($($field,)*) {
                    ($(Some($field),)*) => Ok(Self { $($field,)* }),
                    _ => Err(missing),
                }
            }
        }
    };
}

abi! {
    abi_version = "flint_tt_abi_version": fn() -> u32;
    last_error = "flint_tt_last_error": fn() -> *const c_char;
    device_open = "flint_tt_device_open": fn(u32, *mut Dev) -> i32;
    device_close = "flint_tt_device_close": fn(Dev) -> i32;
    device_info_get = "flint_tt_device_info_get": fn(Dev, *mut CDeviceInfo) -> i32;
    admits_kept = "flint_tt_admits_kept": fn(Dev, u32) -> i32;
    buffer_alloc = "flint_tt_buffer_alloc": fn(Dev, u64, *mut u64) -> i32;
    buffer_free = "flint_tt_buffer_free": fn(Dev, u64) -> i32;
    buffer_write = "flint_tt_buffer_write": fn(Dev, u64, u64, *const u8, u64) -> i32;
    buffer_read = "flint_tt_buffer_read": fn(Dev, u64, u64, *mut u8, u64) -> i32;
    buffer_copy = "flint_tt_buffer_copy": fn(Dev, u64, u64, u64, u64, u64) -> i32;
    weight_stage = "flint_tt_weight_stage": fn(Dev, *const CWeightDesc, *mut u64) -> i32;
    weight_free = "flint_tt_weight_free": fn(Dev, u64) -> i32;
    matmul = "flint_tt_matmul": fn(Dev, u64, u64, u64, u64) -> i32;
    expert_matmul = "flint_tt_expert_matmul":
        fn(Dev, *const u64, u32, u64, u64, u64, u64, u64, u64) -> i32;
    get_rows = "flint_tt_get_rows": fn(Dev, u64, u64, u64, u64, u64) -> i32;
    rms_norm = "flint_tt_rms_norm": fn(Dev, u64, u64, u64, f32, u64, u64) -> i32;
    add_rms_norm = "flint_tt_add_rms_norm": fn(Dev, u64, u64, u64, u64, f32, u64, u64) -> i32;
    rope = "flint_tt_rope": fn(Dev, u64, u64, u64, u64, *const CRopeParams) -> i32;
    silu_mul = "flint_tt_silu_mul": fn(Dev, u64, u64, u64, u64) -> i32;
    gelu_mul = "flint_tt_gelu_mul": fn(Dev, u64, u64, u64, u64) -> i32;
    add = "flint_tt_add": fn(Dev, u64, u64, u64) -> i32;
    add_bias = "flint_tt_add_bias": fn(Dev, u64, u64, u64, u64) -> i32;
    scale = "flint_tt_scale": fn(Dev, u64, u64, f32) -> i32;
    scatter_add_weighted = "flint_tt_scatter_add_weighted":
        fn(Dev, u64, u64, u64, u64, u64, u64, u64) -> i32;
    route_topk = "flint_tt_route_topk":
        fn(Dev, u64, u64, u32, u64, u64, u32, u32, u32, f32, u64, u64, u64, u64) -> i32;
    sigmoid = "flint_tt_sigmoid": fn(Dev, u64, u64) -> i32;
    mul = "flint_tt_mul": fn(Dev, u64, u64, u64, u64) -> i32;
    deinterleave = "flint_tt_deinterleave": fn(Dev, u64, u64, u64, *const u64, u32) -> i32;
    delta_net_gate = "flint_tt_delta_net_gate": fn(Dev, u64, u64, u64, u64, u64) -> i32;
    l2_norm = "flint_tt_l2_norm": fn(Dev, u64, u64, u64, f32) -> i32;
    ssm_conv_silu = "flint_tt_ssm_conv_silu":
        fn(Dev, u64, u64, u64, u64, u64, u64, u64, u64) -> i32;
    gated_delta_net = "flint_tt_gated_delta_net":
        fn(Dev, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64, u64) -> i32;
    write_kv = "flint_tt_write_kv":
        fn(Dev, *const CKvLayout, u64, u64, u64, u64, u64, u64, u64) -> i32;
    paged_attention = "flint_tt_paged_attention":
        fn(Dev, *const CKvLayout, u64, u64, u64, u64, *const CAttnSeq, u64, u32, f32,
           u64, u64, u64, u64) -> i32;
    sync = "flint_tt_sync": fn(Dev) -> i32;
    counters_get = "flint_tt_counters_get": fn(Dev, *mut CCounters) -> i32;
}

/// A loaded adapter library whose ABI version matched.
pub struct Runtime {
    api: Api,
    path: PathBuf,
    // Declared last so the entry points above never outlive the library.
    _lib: Library,
}

impl std::fmt::Debug for Runtime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Runtime").field("path", &self.path).finish()
    }
}

/// Where the adapter is looked for when `FLINT_TT_RUNTIME` is not set, in order:
/// `libflint_tt.so` next to the running executable, in `/opt/tenstorrent/lib`, in
/// `/usr/local/lib`, then the plain name through the system's dynamic loader
/// (`LD_LIBRARY_PATH`, the ld.so cache).
pub fn search_list() -> Vec<PathBuf> {
    let mut v = Vec::new();
    if let Some(dir) = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf))
    {
        v.push(dir.join(RUNTIME_FILE));
    }
    v.push(PathBuf::from("/opt/tenstorrent/lib").join(RUNTIME_FILE));
    v.push(PathBuf::from("/usr/local/lib").join(RUNTIME_FILE));
    v
}

impl Runtime {
    /// Loads the adapter named by `FLINT_TT_RUNTIME`, else the first of [`search_list`]
    /// that exists, else `libflint_tt.so` through the dynamic loader. Every failure is
    /// `Unavailable` with the reason.
    pub fn load_from_env() -> Result<Runtime, HalError> {
        if let Some(p) = std::env::var_os(RUNTIME_ENV).filter(|p| !p.is_empty()) {
            return Self::load(Path::new(&p));
        }
        let list = search_list();
        if let Some(p) = list.iter().find(|p| p.is_file()) {
            return Self::load(p);
        }
        // Last resort: the dynamic loader's own search (LD_LIBRARY_PATH, ld.so cache).
        match Self::load(Path::new(RUNTIME_FILE)) {
            Ok(rt) => Ok(rt),
            Err(_) => Err(HalError::unavailable(format!(
                "no Tenstorrent runtime adapter: {RUNTIME_ENV} is not set and {RUNTIME_FILE} \
                 is not in {} nor on the dynamic loader's path",
                list.iter()
                    .map(|p| p.display().to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            ))),
        }
    }

    /// Loads the adapter at `path` and checks its ABI version.
    pub fn load(path: &Path) -> Result<Runtime, HalError> {
        let shown = path.display();
        // SAFETY: loading a shared library runs its initialisers. The path is the one the
        // user configured for this purpose (or the documented search list); an adapter is
        // trusted code, as any native library the process links.
        let lib = unsafe { Library::new(path) }.map_err(|e| {
            HalError::unavailable(format!(
                "cannot load the Tenstorrent runtime adapter {shown}: {e}"
            ))
        })?;
        let wrong_version = |v: u32| {
            HalError::unavailable(format!(
                "{shown} implements flint_tt ABI version {v}, this build needs version \
                 {ABI_VERSION} (docs/hal-tt/flint_tt.h); rebuild the adapter against the \
                 current header"
            ))
        };
        let api = match Api::load(&lib) {
            Ok(api) => api,
            Err(missing) => {
                // An adapter of another version lacks some of this version's symbols:
                // its version is the clearer answer, when it exports one.
                // SAFETY: `flint_tt_abi_version` is `uint32_t (void)` in every version of
                // flint_tt.h; an adapter exporting the name promises it.
                let version = unsafe {
                    lib.get::<unsafe extern "C" fn() -> u32>(b"flint_tt_abi_version\0")
                        .map(|f| f())
                };
                return Err(match version {
                    Ok(v) if v != ABI_VERSION => wrong_version(v),
                    _ => HalError::unavailable(format!(
                        "{shown} is not a Flint Tenstorrent runtime adapter: missing symbol{} {}",
                        if missing.len() == 1 { "" } else { "s" },
                        missing.join(", ")
                    )),
                });
            }
        };
        // SAFETY: `abi_version` takes no arguments and only returns a number (header).
        let v = unsafe { (api.abi_version)() };
        if v != ABI_VERSION {
            return Err(wrong_version(v));
        }
        Ok(Runtime {
            api,
            path: path.to_path_buf(),
            _lib: lib,
        })
    }

    /// Where the library was loaded from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    pub(crate) fn api(&self) -> &Api {
        &self.api
    }

    /// The adapter's last error message on this thread.
    pub(crate) fn last_error(&self) -> String {
        // SAFETY: `last_error` returns NULL or a NUL-terminated string valid until the
        // next call into the library on this thread; it is copied at once.
        unsafe {
            let p = (self.api.last_error)();
            if p.is_null() {
                String::new()
            } else {
                CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        }
    }

    /// Turns a status into a `HalError` carrying the adapter's message and `what`.
    pub(crate) fn check(&self, status: i32, what: &str) -> Result<(), HalError> {
        if status == 0 {
            return Ok(());
        }
        let kind = match status {
            1 => HalErrorKind::InvalidInput,
            2 => HalErrorKind::Unsupported,
            3 => HalErrorKind::OutOfMemory,
            4 => HalErrorKind::Unavailable,
            _ => HalErrorKind::Runtime,
        };
        let msg = self.last_error();
        Err(HalError::new(
            kind,
            format!("tt runtime ({}): {what}: {msg}", self.path.display()),
        ))
    }

    /// Opens device `index`; returns the opaque pointer and its info.
    pub(crate) fn open_device(&self, index: u32) -> Result<(DevPtr, CDeviceInfo), HalError> {
        let mut dev: Dev = std::ptr::null_mut();
        // SAFETY: `dev` is a valid place for the output pointer.
        let st = unsafe { (self.api.device_open)(index, &mut dev) };
        self.check(st, &format!("opening device {index}"))
            .map_err(|e| {
                HalError::unavailable(format!("Tenstorrent device {index} failed to open: {e}"))
            })?;
        if dev.is_null() {
            return Err(HalError::unavailable(format!(
                "{}: flint_tt_device_open returned no device",
                self.path.display()
            )));
        }
        let dev = DevPtr(dev);
        let mut info = CDeviceInfo {
            name: [0; 64],
            dram_bytes: 0,
            compute_cores: 0,
            reserved: 0,
        };
        // SAFETY: `dev` is open; `info` is a valid output.
        let st = unsafe { (self.api.device_info_get)(dev.0, &mut info) };
        if let Err(e) = self.check(st, "querying the device") {
            self.close_device(dev);
            return Err(HalError::unavailable(e.message));
        }
        Ok((dev, info))
    }

    /// Closes a device opened by [`open_device`](Self::open_device).
    pub(crate) fn close_device(&self, dev: DevPtr) {
        // SAFETY: `dev` was opened by this runtime and is not used after this call.
        unsafe { (self.api.device_close)(dev.0) };
    }
}

/// An opened device pointer.
#[derive(Clone, Copy, Debug)]
pub(crate) struct DevPtr(pub(crate) Dev);

// SAFETY: the ABI requires adapters to accept calls on one device from any thread
// (flint_tt.h, "Conventions"); the pointer itself is an opaque handle.
unsafe impl Send for DevPtr {}
// SAFETY: as above; the adapter serialises concurrent calls.
unsafe impl Sync for DevPtr {}

/// A device name from the fixed-size C field.
pub(crate) fn name_of(info: &CDeviceInfo) -> String {
    let bytes: Vec<u8> = info
        .name
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c as u8)
        .collect();
    String::from_utf8_lossy(&bytes).into_owned()
}
