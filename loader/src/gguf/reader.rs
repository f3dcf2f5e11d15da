//! The GGUF reader: parses and validates the header, metadata and tensor infos of a file
//! held in memory (usually a read-only mmap) and hands out zero-copy tensor views.
//!
//! Every count and length read from the file is checked against the bytes that remain
//! before anything is allocated for it, so a hostile file can make the reader allocate
//! only in proportion to its own size; parsing is a single forward pass (no loops driven
//! by untrusted values other than element counts already bounded that way), so it cannot
//! hang; nested arrays are limited in depth so recursion cannot exhaust the stack.

use std::borrow::Cow;
use std::collections::HashMap;
use std::fmt;
use std::ops::Range;
use std::path::Path;
use std::sync::Arc;

use flint_core::GgmlType;

use super::error::GgufError;
use super::residence::{advise_huge_pages, release_mapped, HugePageCopy, LoadMode, Residence};
use super::value::{Array, Value, ValueType};

/// Bytes shared between the reader and whoever builds weights from them (the same type
/// as `flint_hal::SharedBytes`, without depending on the HAL).
pub type SharedBytes = Arc<dyn AsRef<[u8]> + Send + Sync>;

/// Lets whoever keeps its own copy of a tensor give the file's pages for a byte range
/// back to the system (the same type as `flint_hal::ReleaseHook`): the bytes stay
/// readable and unchanged.
pub type ReleaseHook = Arc<dyn Fn(Range<usize>) + Send + Sync>;

/// The four magic bytes at the start of every GGUF file.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// The alignment of tensor data when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: usize = 32;
/// The key that sets the alignment.
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// At most this many dimensions per tensor (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of arrays inside arrays the reader accepts.
pub const MAX_ARRAY_DEPTH: usize = 8;

/// One tensor's description, validated against the file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TensorInfo {
    /// Name (`blk.0.attn_q.weight`).
    pub name: String,
    /// Element type.
    pub ty: GgmlType,
    /// Dimensions in GGUF order: `dims[0]` is the contiguous one.
    pub dims: Vec<usize>,
    /// Offset of the data relative to the start of the data section, as in the file.
    pub offset: usize,
    /// Absolute byte offset of the data in the file.
    pub start: usize,
    /// Bytes of data.
    pub n_bytes: usize,
    /// Number of elements (product of `dims`; 1 for zero dims).
    pub n_elements: usize,
    /// The shard whose bytes hold the data: 0 for a single file, `split.no` for a
    /// split model ([`GgufFile::tensor_bytes`] gives them).
    pub shard: usize,
}

impl TensorInfo {
    /// The absolute byte range of the data inside its shard's bytes (for a single file,
    /// [`GgufFile::shared_bytes`]; in general [`GgufFile::tensor_bytes`]).
    pub fn range(&self) -> Range<usize> {
        // Saturating: a hand-built TensorInfo with absurd fields yields an empty view in
        // `tensor_data`, not an overflow panic.
        self.start..self.start.saturating_add(self.n_bytes)
    }

    /// Number of rows (`n_elements / dims[0]`; 0 for an empty tensor).
    pub fn n_rows(&self) -> usize {
        match self.dims.first() {
            Some(&0) => 0,
            Some(&d0) => self.n_elements / d0,
            None => 1,
        }
    }
}

/// The bytes of one shard and the hook that hands its pages back.
#[derive(Clone)]
pub(super) struct Held {
    pub(super) bytes: SharedBytes,
    pub(super) release: Option<ReleaseHook>,
}

/// Where a tensor's data lies: the bytes of its shard, the range inside them, and the
/// hook that gives that shard's pages back to the system (see
/// [`GgufFile::release_hook`]). The same for a single file and a split model.
#[derive(Clone)]
pub struct TensorBytes {
    /// The shard's bytes, shared.
    pub bytes: SharedBytes,
    /// The tensor's range inside `bytes`.
    pub range: Range<usize>,
    /// Hands pages of `bytes` back (`None` for bytes held in a vector).
    pub release: Option<ReleaseHook>,
}

impl fmt::Debug for TensorBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TensorBytes")
            .field("range", &self.range)
            .field("release", &self.release.is_some())
            .finish()
    }
}

/// A parsed, validated GGUF file: one file, or every shard of a split model opened
/// through its first shard (the metadata is the first shard's, the tensors are all of
/// them, each knowing its shard).
pub struct GgufFile {
    pub(super) bytes: SharedBytes,
    pub(super) version: u32,
    pub(super) metadata: Vec<(String, Value)>,
    pub(super) key_index: HashMap<String, usize>,
    pub(super) tensors: Vec<TensorInfo>,
    pub(super) tensor_index: HashMap<String, usize>,
    pub(super) alignment: usize,
    pub(super) data_start: usize,
    pub(super) residence: Residence,
    pub(super) release: Option<ReleaseHook>,
    /// The shards after the first (empty for a single file): shard `i` is `extra[i - 1]`.
    pub(super) extra: Vec<Held>,
}

impl fmt::Debug for GgufFile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("GgufFile")
            .field("version", &self.version)
            .field("len", &self.len())
            .field("metadata", &self.metadata.len())
            .field("tensors", &self.tensors.len())
            .field("alignment", &self.alignment)
            .field("data_start", &self.data_start)
            .field("residence", &self.residence)
            .field("shards", &self.shard_count())
            .finish()
    }
}

impl GgufFile {
    /// Maps the file read-only and parses it (zero copies: what tools that read a few
    /// tensors want; a model that is about to run wants [`GgufFile::open_with`]). The
    /// first shard of a split model opens every shard (see [`GgufFile::open_with`]).
    pub fn open(path: impl AsRef<Path>) -> Result<GgufFile, GgufError> {
        Self::open_with(path, LoadMode::Map, &mut |_, _| {})
    }

    /// Opens the file held as `mode` says ([`LoadMode::Auto`]: in transparent huge pages
    /// where that pays, see [`LoadMode`]) and parses it. A copy reports
    /// `(bytes read, file length)` to `progress` as it goes; a mapping reports nothing.
    ///
    /// The first shard of a split model (`split.count > 1`, named
    /// `PREFIX-00001-of-NNNNN.gguf` as llama.cpp's `gguf-split` writes it) opens every
    /// shard, each held as `mode` says and validated as a single file, and checks them
    /// against each other (`super::split`). Opening another shard directly is an error
    /// that names the first.
    pub fn open_with(
        path: impl AsRef<Path>,
        mode: LoadMode,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<GgufFile, GgufError> {
        let path = path.as_ref();
        let first = Self::open_one(path, mode, progress)?;
        super::split::assemble(first, path, mode, progress)
    }

    /// Opens and parses one file, without looking at its `split.*` keys.
    pub(super) fn open_one(
        path: &Path,
        mode: LoadMode,
        progress: &mut dyn FnMut(u64, u64),
    ) -> Result<GgufFile, GgufError> {
        let io = |source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        };
        let file = std::fs::File::open(path).map_err(io)?;
        let len = file.metadata().map_err(io)?.len();
        if len == 0 {
            // Mapping an empty file fails on some systems; the parse error is the useful one.
            return Self::parse_shared(Arc::new(Vec::new()));
        }
        let residence = mode.resolve(len);
        let mut parsed = match residence {
            Residence::HugePages => {
                let len = usize::try_from(len).map_err(|_| {
                    io(std::io::Error::other(
                        "the file is larger than the address space",
                    ))
                })?;
                let copy = Arc::new(HugePageCopy::read(path, &file, len, progress)?);
                let mut parsed = Self::parse_shared(copy.clone())?;
                parsed.release = Some(Arc::new(move |r| copy.release(r)));
                parsed
            }
            Residence::Mapped => {
                // SAFETY: the map is read-only and private to this process; the file must
                // not be truncated or rewritten by another process while it is mapped (the
                // usual mmap contract, which model files in a cache directory satisfy).
                let map = unsafe { memmap2::Mmap::map(&file) }.map_err(io)?;
                advise_huge_pages(&map);
                let map = Arc::new(map);
                let mut parsed = Self::parse_shared(map.clone())?;
                parsed.release = Some(Arc::new(move |r| release_mapped(&map, r)));
                parsed
            }
        };
        parsed.residence = residence;
        Ok(parsed)
    }

    /// Parses a file held in a vector (tests, fuzzing).
    pub fn from_bytes(bytes: Vec<u8>) -> Result<GgufFile, GgufError> {
        Self::from_shared(Arc::new(bytes))
    }

    /// Parses a file held in shared bytes, without copying them. One shard of a split
    /// model is refused ([`GgufError::SplitInMemory`]): the others are found from a path.
    pub fn from_shared(bytes: SharedBytes) -> Result<GgufFile, GgufError> {
        let f = Self::parse_shared(bytes)?;
        if let Some(s) = super::split::SplitKeys::read(&f)? {
            return Err(GgufError::SplitInMemory {
                no: s.no + 1,
                count: s.count,
            });
        }
        Ok(f)
    }

    /// Parses one file's bytes, without looking at its `split.*` keys.
    pub(super) fn parse_shared(bytes: SharedBytes) -> Result<GgufFile, GgufError> {
        let parsed = parse((*bytes).as_ref())?;
        Ok(GgufFile {
            bytes,
            version: parsed.version,
            metadata: parsed.metadata,
            key_index: parsed.key_index,
            tensors: parsed.tensors,
            tensor_index: parsed.tensor_index,
            alignment: parsed.alignment,
            data_start: parsed.data_start,
            residence: Residence::Mapped,
            release: None,
            extra: Vec::new(),
        })
    }

    /// The whole file (the first shard of a split model).
    pub fn as_bytes(&self) -> &[u8] {
        (*self.bytes).as_ref()
    }

    /// File size in bytes (of the first shard of a split model).
    pub fn len(&self) -> usize {
        self.as_bytes().len()
    }

    /// Never true for a parsed file (a header takes bytes); here for clippy's sake.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The file's bytes, shared (the first shard's, for a split model: a tensor's bytes
    /// come from [`GgufFile::tensor_bytes`]).
    pub fn shared_bytes(&self) -> SharedBytes {
        Arc::clone(&self.bytes)
    }

    /// Bytes of every shard together ([`GgufFile::len`] for a single file): what a
    /// decision about holding the whole model in memory should weigh.
    pub fn total_len(&self) -> u64 {
        let extra: u64 = self
            .extra
            .iter()
            .map(|h| (*h.bytes).as_ref().len() as u64)
            .sum();
        self.len() as u64 + extra
    }

    /// Number of shards: 1 for a single file, `split.count` for a split model.
    pub fn shard_count(&self) -> usize {
        1 + self.extra.len()
    }

    /// Where `info`'s data lies, zero-copy: its shard's bytes, the range in them and
    /// that shard's release hook. The one way to reach a tensor's bytes for building
    /// weights, for single files and split models alike. A `TensorInfo` naming a shard
    /// this file lacks yields an empty range of the first shard rather than a panic.
    pub fn tensor_bytes(&self, info: &TensorInfo) -> TensorBytes {
        let held = match info.shard {
            0 => Some((&self.bytes, &self.release)),
            i => self.extra.get(i - 1).map(|h| (&h.bytes, &h.release)),
        };
        match held {
            Some((bytes, release)) => TensorBytes {
                bytes: Arc::clone(bytes),
                range: info.range(),
                release: release.clone(),
            },
            None => TensorBytes {
                bytes: Arc::clone(&self.bytes),
                range: 0..0,
                release: None,
            },
        }
    }

    /// A hook that gives the pages of a byte range of [`GgufFile::shared_bytes`] (the
    /// first shard; [`TensorBytes::release`] for any tensor) back to the system, for a device that keeps its own copy of a tensor (`None` for bytes
    /// held in a vector). The bytes stay readable: a mapping reads them again from the
    /// file; a huge-page copy becomes a mapping of the file for that range.
    pub fn release_hook(&self) -> Option<ReleaseHook> {
        self.release.clone()
    }

    /// GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// Alignment of the tensor data.
    pub fn alignment(&self) -> usize {
        self.alignment
    }

    /// Where the file's bytes are held.
    pub fn residence(&self) -> Residence {
        self.residence
    }

    /// Absolute offset of the data section.
    pub fn data_start(&self) -> usize {
        self.data_start
    }

    /// The metadata in file order.
    pub fn metadata(&self) -> impl ExactSizeIterator<Item = (&str, &Value)> + '_ {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    /// The value of `key`, if present.
    pub fn get(&self, key: &str) -> Option<&Value> {
        self.key_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// True when `key` is present.
    pub fn contains_key(&self, key: &str) -> bool {
        self.key_index.contains_key(key)
    }

    /// The tensors in file order.
    pub fn tensors(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// The tensor called `name`.
    pub fn tensor(&self, name: &str) -> Option<&TensorInfo> {
        self.tensor_index.get(name).map(|&i| &self.tensors[i])
    }

    /// The data of a tensor of this file (from its shard), zero-copy. A `TensorInfo`
    /// from another file whose range lies outside this one yields an empty slice rather
    /// than a panic.
    pub fn tensor_data(&self, info: &TensorInfo) -> &[u8] {
        let bytes = match info.shard {
            0 => Some(&self.bytes),
            i => self.extra.get(i - 1).map(|h| &h.bytes),
        };
        bytes
            .and_then(|b| (**b).as_ref().get(info.range()))
            .unwrap_or(&[])
    }

    /// `general.architecture`.
    pub fn architecture(&self) -> Result<&str, GgufError> {
        self.get_str("general.architecture")
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.get(key).ok_or_else(|| GgufError::MissingKey {
            key: key.to_string(),
        })
    }

    fn int_as<T: TryFrom<i128>>(
        &self,
        key: &str,
        v: &Value,
        expected: &'static str,
    ) -> Result<T, GgufError> {
        let i = v.as_i128().ok_or_else(|| wrong_type(key, expected, v))?;
        T::try_from(i).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: i.to_string(),
            expected,
        })
    }

    /// An unsigned 32-bit value. Any integer type is accepted when the value fits
    /// (converters write u32, i32 or u64 for the same key).
    pub fn get_u32(&self, key: &str) -> Result<u32, GgufError> {
        self.int_as(key, self.require(key)?, "u32")
    }

    /// A signed 32-bit value (any integer type that fits).
    pub fn get_i32(&self, key: &str) -> Result<i32, GgufError> {
        self.int_as(key, self.require(key)?, "i32")
    }

    /// An unsigned 64-bit value (any integer type that fits).
    pub fn get_u64(&self, key: &str) -> Result<u64, GgufError> {
        self.int_as(key, self.require(key)?, "u64")
    }

    /// A signed 64-bit value (any integer type that fits).
    pub fn get_i64(&self, key: &str) -> Result<i64, GgufError> {
        self.int_as(key, self.require(key)?, "i64")
    }

    /// A size (any non-negative integer type that fits `usize`).
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        self.int_as(key, self.require(key)?, "usize")
    }

    /// A float: f32, or f64 narrowed to f32.
    pub fn get_f32(&self, key: &str) -> Result<f32, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v),
            Value::F64(v) => Ok(*v as f32),
            v => Err(wrong_type(key, "f32", v)),
        }
    }

    /// A float: f64 or f32 widened.
    pub fn get_f64(&self, key: &str) -> Result<f64, GgufError> {
        match self.require(key)? {
            Value::F32(v) => Ok(*v as f64),
            Value::F64(v) => Ok(*v),
            v => Err(wrong_type(key, "f64", v)),
        }
    }

    /// A bool.
    pub fn get_bool(&self, key: &str) -> Result<bool, GgufError> {
        match self.require(key)? {
            Value::Bool(b) => Ok(*b),
            v => Err(wrong_type(key, "bool", v)),
        }
    }

    /// A string.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            v => Err(wrong_type(key, "string", v)),
        }
    }

    /// An array of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            v => Err(wrong_type(key, "array", v)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.get_array(key)? {
            Array::String(v) => Ok(v),
            a => Err(wrong_array(key, "array[string]", a)),
        }
    }

    /// An array of f32 (zero-copy); an f64 array is narrowed into a copy.
    pub fn get_f32_array(&self, key: &str) -> Result<Cow<'_, [f32]>, GgufError> {
        match self.get_array(key)? {
            Array::F32(v) => Ok(Cow::Borrowed(v)),
            Array::F64(v) => Ok(Cow::Owned(v.iter().map(|&x| x as f32).collect())),
            a => Err(wrong_array(key, "array[f32]", a)),
        }
    }

    /// An array of bools.
    pub fn get_bool_array(&self, key: &str) -> Result<&[bool], GgufError> {
        match self.get_array(key)? {
            Array::Bool(v) => Ok(v),
            a => Err(wrong_array(key, "array[bool]", a)),
        }
    }

    fn int_array<T: TryFrom<i128> + Clone>(
        &self,
        key: &str,
        expected: &'static str,
    ) -> Result<Vec<T>, GgufError> {
        let a = self.get_array(key)?;
        let ints = a
            .to_i128_vec()
            .ok_or_else(|| wrong_array(key, expected, a))?;
        ints.into_iter()
            .map(|i| {
                T::try_from(i).map_err(|_| GgufError::OutOfRange {
                    key: key.to_string(),
                    value: i.to_string(),
                    expected,
                })
            })
            .collect()
    }

    /// An array of i32: zero-copy for an i32 array, converted from any other integer
    /// element type when every element fits.
    pub fn get_i32_array(&self, key: &str) -> Result<Cow<'_, [i32]>, GgufError> {
        match self.get_array(key)? {
            Array::I32(v) => Ok(Cow::Borrowed(v)),
            _ => self.int_array(key, "array[i32]").map(Cow::Owned),
        }
    }

    /// An array of u32: zero-copy for a u32 array, converted from any other integer
    /// element type when every element fits.
    pub fn get_u32_array(&self, key: &str) -> Result<Cow<'_, [u32]>, GgufError> {
        match self.get_array(key)? {
            Array::U32(v) => Ok(Cow::Borrowed(v)),
            _ => self.int_array(key, "array[u32]").map(Cow::Owned),
        }
    }

    /// `Ok(None)` when `key` is absent, else as [`get_u32`](Self::get_u32).
    pub fn opt_u32(&self, key: &str) -> Result<Option<u32>, GgufError> {
        self.opt(key, Self::get_u32)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_i32`](Self::get_i32).
    pub fn opt_i32(&self, key: &str) -> Result<Option<i32>, GgufError> {
        self.opt(key, Self::get_i32)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_u64`](Self::get_u64).
    pub fn opt_u64(&self, key: &str) -> Result<Option<u64>, GgufError> {
        self.opt(key, Self::get_u64)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_usize`](Self::get_usize).
    pub fn opt_usize(&self, key: &str) -> Result<Option<usize>, GgufError> {
        self.opt(key, Self::get_usize)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_f32`](Self::get_f32).
    pub fn opt_f32(&self, key: &str) -> Result<Option<f32>, GgufError> {
        self.opt(key, Self::get_f32)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_bool`](Self::get_bool).
    pub fn opt_bool(&self, key: &str) -> Result<Option<bool>, GgufError> {
        self.opt(key, Self::get_bool)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_str`](Self::get_str).
    pub fn opt_str(&self, key: &str) -> Result<Option<&str>, GgufError> {
        self.opt(key, Self::get_str)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_array`](Self::get_array).
    pub fn opt_array(&self, key: &str) -> Result<Option<&Array>, GgufError> {
        self.opt(key, Self::get_array)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_str_array`](Self::get_str_array).
    pub fn opt_str_array(&self, key: &str) -> Result<Option<&[String]>, GgufError> {
        self.opt(key, Self::get_str_array)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_f32_array`](Self::get_f32_array).
    pub fn opt_f32_array(&self, key: &str) -> Result<Option<Cow<'_, [f32]>>, GgufError> {
        self.opt(key, Self::get_f32_array)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_i32_array`](Self::get_i32_array).
    pub fn opt_i32_array(&self, key: &str) -> Result<Option<Cow<'_, [i32]>>, GgufError> {
        self.opt(key, Self::get_i32_array)
    }

    /// `Ok(None)` when `key` is absent, else as [`get_bool_array`](Self::get_bool_array).
    pub fn opt_bool_array(&self, key: &str) -> Result<Option<&[bool]>, GgufError> {
        self.opt(key, Self::get_bool_array)
    }

    fn opt<'a, T>(
        &'a self,
        key: &str,
        get: impl FnOnce(&'a Self, &str) -> Result<T, GgufError>,
    ) -> Result<Option<T>, GgufError> {
        if self.contains_key(key) {
            get(self, key).map(Some)
        } else {
            Ok(None)
        }
    }
}

fn wrong_type(key: &str, expected: &'static str, v: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: v.type_name(),
    }
}

fn wrong_array(key: &str, expected: &'static str, a: &Array) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected,
        found: format!("array[{}]", a.elem_type()),
    }
}

// ---------------------------------------------------------------------------------------
// Parsing.

struct Parsed {
    version: u32,
    metadata: Vec<(String, Value)>,
    key_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: usize,
    data_start: usize,
}

/// A forward-only reader over the file bytes that reports where it failed.
struct Cursor<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Cursor<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let avail = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= avail => {
                let s = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(s)
            }
            _ => Err(GgufError::Truncated {
                what: what(),
                offset: self.pos,
                needed: n,
                available: avail,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let s = self.take(N as u64, what)?;
        let mut a = [0u8; N];
        a.copy_from_slice(s);
        Ok(a)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a count and checks that `count` elements of at least `min_size` bytes each
    /// fit in what remains, so the caller may allocate `count` elements.
    fn count(&mut self, min_size: usize, what: &dyn Fn() -> String) -> Result<usize, GgufError> {
        let offset = self.pos;
        let count = self.u64(what)?;
        let available = self.remaining();
        let max = (available / min_size.max(1)) as u64;
        if count > max {
            return Err(GgufError::CountTooLarge {
                what: what(),
                offset,
                count,
                max,
                available,
            });
        }
        // count <= available, so it fits usize.
        Ok(count as usize)
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let offset = self.pos;
        let len = self.u64(&|| format!("length of {}", what()))?;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_string()),
            Err(_) => Err(GgufError::InvalidUtf8 {
                what: what(),
                offset,
            }),
        }
    }
}

fn parse(buf: &[u8]) -> Result<Parsed, GgufError> {
    let mut c = Cursor { buf, pos: 0 };
    if buf.len() < 4 || buf[..4] != GGUF_MAGIC {
        return Err(GgufError::BadMagic {
            found: buf[..buf.len().min(4)].to_vec(),
        });
    }
    c.pos = 4;
    let version = c.u32(&|| "version".to_string())?;
    if version != 2 && version != 3 {
        let hint = if version == 1 {
            " (v1 files predate 64-bit counts; convert them with a current llama.cpp)"
        } else if version.swap_bytes() == 2 || version.swap_bytes() == 3 {
            " (this looks like a big-endian file; only little-endian GGUF is supported)"
        } else {
            ""
        };
        return Err(GgufError::UnsupportedVersion { version, hint });
    }
    // A tensor info takes at least: name length 8, n_dims 4, type 4, offset 8.
    let n_tensors = c.count(24, &|| "tensor count".to_string())?;
    // A key/value takes at least: key length 8, type 4, a one-byte value.
    let n_kv = c.count(13, &|| "metadata key/value count".to_string())?;
    // The tensor infos follow the key/values, so together they must fit; checking the
    // sum keeps a large tensor count from being accepted against bytes the keys use.
    let need = (n_tensors as u128) * 24 + (n_kv as u128) * 13;
    if need > c.remaining() as u128 {
        return Err(GgufError::CountTooLarge {
            what: "tensor count plus metadata key/value count".to_string(),
            offset: 8,
            count: (n_tensors as u64).saturating_add(n_kv as u64),
            max: (c.remaining() / 13) as u64,
            available: c.remaining(),
        });
    }

    let mut metadata: Vec<(String, Value)> = Vec::with_capacity(n_kv);
    let mut key_index = HashMap::with_capacity(n_kv);
    for i in 0..n_kv {
        let key = c.string(&|| format!("name of metadata key #{i}"))?;
        let type_offset = c.pos;
        let ty_id = c.u32(&|| format!("type of metadata key '{key}'"))?;
        let ty = ValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
            key: key.clone(),
            id: ty_id,
            offset: type_offset,
        })?;
        let value = read_value(&mut c, &key, ty)?;
        if key_index.insert(key.clone(), metadata.len()).is_some() {
            return Err(GgufError::DuplicateKey { key });
        }
        metadata.push((key, value));
    }

    let alignment = match key_index.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
        None => DEFAULT_ALIGNMENT,
        Some(v) => {
            let ok = match v.as_i128() {
                Some(a) if a > 0 && a <= u32::MAX as i128 && (a as u64).is_power_of_two() => {
                    Some(a as usize)
                }
                _ => None,
            };
            ok.ok_or_else(|| GgufError::BadAlignment {
                value: format!("{v} ({})", v.type_name()),
            })?
        }
    };

    // Tensor infos: read them all first; their data offsets are checked once the data
    // section's position is known.
    struct Raw {
        name: String,
        ty: GgmlType,
        dims: Vec<usize>,
        offset: u64,
        n_elements: usize,
        n_bytes: usize,
    }
    let mut raws: Vec<Raw> = Vec::with_capacity(n_tensors);
    let mut tensor_index = HashMap::with_capacity(n_tensors);
    for i in 0..n_tensors {
        let name = c.string(&|| format!("name of tensor #{i}"))?;
        let n_dims = c.u32(&|| format!("dimension count of tensor '{name}'"))?;
        if n_dims as usize > MAX_DIMS {
            return Err(GgufError::TooManyDims {
                tensor: name,
                n_dims,
            });
        }
        let mut dims64 = [0u64; MAX_DIMS];
        for (d, slot) in dims64.iter_mut().enumerate().take(n_dims as usize) {
            *slot = c.u64(&|| format!("dimension {d} of tensor '{name}'"))?;
        }
        let dims64 = dims64[..n_dims as usize].to_vec();
        let ty_id = c.u32(&|| format!("type of tensor '{name}'"))?;
        let offset = c.u64(&|| format!("data offset of tensor '{name}'"))?;
        let ty = GgmlType::from_id(ty_id).map_err(|_| GgufError::UnknownTensorType {
            tensor: name.clone(),
            id: ty_id,
        })?;
        let overflow = || GgufError::ShapeOverflow {
            tensor: name.clone(),
            dims: dims64.clone(),
        };
        let mut dims = Vec::with_capacity(dims64.len());
        let mut n_elements: usize = 1;
        for &d in &dims64 {
            // ggml keeps shapes in int64: refuse what it could not represent.
            let d = usize::try_from(d)
                .ok()
                .filter(|&d| d <= i64::MAX as usize)
                .ok_or_else(overflow)?;
            n_elements = n_elements.checked_mul(d).ok_or_else(overflow)?;
            dims.push(d);
        }
        if n_elements > i64::MAX as usize {
            return Err(overflow());
        }
        let ne0 = dims.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(ty.block_size()) {
            return Err(GgufError::PartialBlock {
                tensor: name,
                ty,
                ne0: ne0 as u64,
                block: ty.block_size(),
            });
        }
        // Whole blocks (checked above), so the byte count is exact.
        let n_bytes = (n_elements / ty.block_size())
            .checked_mul(ty.type_size())
            .ok_or_else(overflow)?;
        if tensor_index.insert(name.clone(), i).is_some() {
            return Err(GgufError::DuplicateTensor { name });
        }
        raws.push(Raw {
            name,
            ty,
            dims,
            offset,
            n_elements,
            n_bytes,
        });
    }

    // The data section starts at the next multiple of the alignment. It may be empty
    // (and the padding absent) when there are no tensors or all are empty.
    let data_start = c.pos.div_ceil(alignment).saturating_mul(alignment);
    let file_len = buf.len();
    let mut tensors = Vec::with_capacity(raws.len());
    for r in raws {
        if !r.offset.is_multiple_of(alignment as u64) {
            return Err(GgufError::MisalignedTensor {
                tensor: r.name,
                offset: r.offset,
                alignment,
            });
        }
        let start = usize::try_from(r.offset)
            .ok()
            .and_then(|o| o.checked_add(data_start));
        let end = start.and_then(|s| s.checked_add(r.n_bytes));
        let (start, _end) = match (start, end) {
            (Some(s), Some(e)) if e <= file_len => (s, e),
            _ => {
                return Err(GgufError::TensorOutOfBounds {
                    tensor: r.name,
                    offset: r.offset,
                    data_start,
                    n_bytes: r.n_bytes,
                    file_len,
                })
            }
        };
        tensors.push(TensorInfo {
            name: r.name,
            ty: r.ty,
            dims: r.dims,
            offset: r.offset as usize,
            start,
            n_bytes: r.n_bytes,
            n_elements: r.n_elements,
            shard: 0,
        });
    }

    // No two tensors may share bytes: sort the non-empty ranges and compare neighbours.
    let mut order: Vec<usize> = (0..tensors.len())
        .filter(|&i| tensors[i].n_bytes > 0)
        .collect();
    order.sort_by_key(|&i| (tensors[i].start, tensors[i].n_bytes));
    for w in order.windows(2) {
        let (a, b) = (&tensors[w[0]], &tensors[w[1]]);
        if b.start < a.start + a.n_bytes {
            return Err(GgufError::OverlappingTensors {
                first: a.name.clone(),
                first_start: a.start,
                first_end: a.start + a.n_bytes,
                second: b.name.clone(),
                second_start: b.start,
                second_end: b.start + b.n_bytes,
            });
        }
    }

    Ok(Parsed {
        version,
        metadata,
        key_index,
        tensors,
        tensor_index,
        alignment,
        data_start,
    })
}

fn read_value(c: &mut Cursor<'_>, key: &str, ty: ValueType) -> Result<Value, GgufError> {
    let what = || format!("value of metadata key '{key}'");
    Ok(match ty {
        ValueType::U8 => Value::U8(c.array::<1>(&what)?[0]),
        ValueType::I8 => Value::I8(c.array::<1>(&what)?[0] as i8),
        ValueType::U16 => Value::U16(u16::from_le_bytes(c.array(&what)?)),
        ValueType::I16 => Value::I16(i16::from_le_bytes(c.array(&what)?)),
        ValueType::U32 => Value::U32(u32::from_le_bytes(c.array(&what)?)),
        ValueType::I32 => Value::I32(i32::from_le_bytes(c.array(&what)?)),
        ValueType::F32 => Value::F32(f32::from_le_bytes(c.array(&what)?)),
        ValueType::U64 => Value::U64(u64::from_le_bytes(c.array(&what)?)),
        ValueType::I64 => Value::I64(i64::from_le_bytes(c.array(&what)?)),
        ValueType::F64 => Value::F64(f64::from_le_bytes(c.array(&what)?)),
        ValueType::Bool => {
            let offset = c.pos;
            Value::Bool(to_bool(c.array::<1>(&what)?[0], key, offset)?)
        }
        ValueType::String => Value::String(c.string(&what)?),
        ValueType::Array => Value::Array(read_array(c, key, 1)?),
    })
}

fn to_bool(byte: u8, key: &str, offset: usize) -> Result<bool, GgufError> {
    match byte {
        0 => Ok(false),
        1 => Ok(true),
        _ => Err(GgufError::InvalidBool {
            key: key.to_string(),
            byte,
            offset,
        }),
    }
}

/// Reads `count` fixed-size little-endian values in one bounds-checked slice.
fn fixed<const N: usize, T>(
    c: &mut Cursor<'_>,
    count: usize,
    what: &dyn Fn() -> String,
    conv: fn([u8; N]) -> T,
) -> Result<Vec<T>, GgufError> {
    // count * N <= remaining was checked by `Cursor::count`.
    let bytes = c.take((count as u64).saturating_mul(N as u64), what)?;
    Ok(bytes
        .chunks_exact(N)
        .map(|ch| {
            let mut a = [0u8; N];
            a.copy_from_slice(ch);
            conv(a)
        })
        .collect())
}

fn read_array(c: &mut Cursor<'_>, key: &str, depth: usize) -> Result<Array, GgufError> {
    let start = c.pos;
    if depth > MAX_ARRAY_DEPTH {
        return Err(GgufError::NestingTooDeep {
            key: key.to_string(),
            max: MAX_ARRAY_DEPTH,
            offset: start,
        });
    }
    let what = || format!("array of metadata key '{key}'");
    let ty_id = c.u32(&|| format!("element type of array '{key}'"))?;
    let ty = ValueType::from_id(ty_id).ok_or_else(|| GgufError::UnknownValueType {
        key: key.to_string(),
        id: ty_id,
        offset: start,
    })?;
    let n = c.count(ty.min_size(), &|| format!("element count of array '{key}'"))?;
    Ok(match ty {
        ValueType::U8 => Array::U8(fixed(c, n, &what, |[b]: [u8; 1]| b)?),
        ValueType::I8 => Array::I8(fixed(c, n, &what, |[b]: [u8; 1]| b as i8)?),
        ValueType::U16 => Array::U16(fixed(c, n, &what, u16::from_le_bytes)?),
        ValueType::I16 => Array::I16(fixed(c, n, &what, i16::from_le_bytes)?),
        ValueType::U32 => Array::U32(fixed(c, n, &what, u32::from_le_bytes)?),
        ValueType::I32 => Array::I32(fixed(c, n, &what, i32::from_le_bytes)?),
        ValueType::F32 => Array::F32(fixed(c, n, &what, f32::from_le_bytes)?),
        ValueType::U64 => Array::U64(fixed(c, n, &what, u64::from_le_bytes)?),
        ValueType::I64 => Array::I64(fixed(c, n, &what, i64::from_le_bytes)?),
        ValueType::F64 => Array::F64(fixed(c, n, &what, f64::from_le_bytes)?),
        ValueType::Bool => {
            let offset = c.pos;
            let bytes = c.take(n as u64, &what)?;
            let mut v = Vec::with_capacity(n);
            for (i, &b) in bytes.iter().enumerate() {
                v.push(to_bool(b, key, offset + i)?);
            }
            Array::Bool(v)
        }
        ValueType::String => {
            let mut v = Vec::with_capacity(n);
            for i in 0..n {
                v.push(c.string(&|| format!("element {i} of array '{key}'"))?);
            }
            Array::String(v)
        }
        ValueType::Array => {
            let mut v = Vec::with_capacity(n);
            for _ in 0..n {
                v.push(read_array(c, key, depth + 1)?);
            }
            Array::Array(v)
        }
    })
}
