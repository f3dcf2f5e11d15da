//! The GGUF writer: metadata of every value type and tensors of every type, checked as
//! they are added so that what it writes is a file the reader accepts.

use std::collections::HashSet;
use std::io::Write;
use std::path::Path;

use flint_core::GgmlType;

use super::error::GgufError;
use super::reader::{ALIGNMENT_KEY, DEFAULT_ALIGNMENT, MAX_DIMS};
use super::value::{Array, Value};

/// Builds a GGUF v3 file in memory: metadata in insertion order, then tensor infos, then
/// the tensor data, each tensor padded to the alignment.
#[derive(Debug, Default, Clone)]
pub struct GgufWriter {
    metadata: Vec<(String, Value)>,
    keys: HashSet<String>,
    tensors: Vec<PendingTensor>,
    names: HashSet<String>,
}

#[derive(Debug, Clone)]
struct PendingTensor {
    name: String,
    ty: GgmlType,
    dims: Vec<usize>,
    data: Vec<u8>,
}

macro_rules! from_scalar {
    ($($t:ty => $v:ident),*) => {$(
        impl From<$t> for Value {
            fn from(x: $t) -> Value { Value::$v(x) }
        }
        impl From<Vec<$t>> for Array {
            fn from(x: Vec<$t>) -> Array { Array::$v(x) }
        }
        impl From<Vec<$t>> for Value {
            fn from(x: Vec<$t>) -> Value { Value::Array(Array::$v(x)) }
        }
    )*};
}

from_scalar!(u8 => U8, i8 => I8, u16 => U16, i16 => I16, u32 => U32, i32 => I32, f32 => F32,
    bool => Bool, String => String, u64 => U64, i64 => I64, f64 => F64);

impl From<&str> for Value {
    fn from(s: &str) -> Value {
        Value::String(s.to_string())
    }
}

impl From<Array> for Value {
    fn from(a: Array) -> Value {
        Value::Array(a)
    }
}

impl From<Vec<Array>> for Array {
    fn from(x: Vec<Array>) -> Array {
        Array::Array(x)
    }
}

impl From<Vec<&str>> for Value {
    fn from(x: Vec<&str>) -> Value {
        Value::Array(Array::String(x.into_iter().map(str::to_string).collect()))
    }
}

impl GgufWriter {
    /// An empty file description.
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds a metadata key. Refuses a duplicate key and an invalid `general.alignment`.
    pub fn add(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self, GgufError> {
        let value = value.into();
        if key == ALIGNMENT_KEY {
            check_alignment(&value)?;
        }
        if !self.keys.insert(key.to_string()) {
            return Err(GgufError::Writer(format!("duplicate metadata key '{key}'")));
        }
        self.metadata.push((key.to_string(), value));
        Ok(self)
    }

    /// Adds or replaces a metadata key.
    pub fn set(&mut self, key: &str, value: impl Into<Value>) -> Result<&mut Self, GgufError> {
        let value = value.into();
        if key == ALIGNMENT_KEY {
            check_alignment(&value)?;
        }
        if let Some(slot) = self.metadata.iter_mut().find(|(k, _)| k == key) {
            slot.1 = value;
            Ok(self)
        } else {
            self.add(key, value)
        }
    }

    /// Removes a metadata key (no-op when absent).
    pub fn remove(&mut self, key: &str) -> &mut Self {
        self.metadata.retain(|(k, _)| k != key);
        self.keys.remove(key);
        self
    }

    /// Sets `general.alignment` (a power of two) as a u32.
    pub fn set_alignment(&mut self, alignment: u32) -> Result<&mut Self, GgufError> {
        self.set(ALIGNMENT_KEY, alignment)
    }

    /// The alignment the file will use.
    pub fn alignment(&self) -> usize {
        self.metadata
            .iter()
            .find(|(k, _)| k == ALIGNMENT_KEY)
            .and_then(|(_, v)| v.as_i128())
            .map(|a| a as usize)
            .unwrap_or(DEFAULT_ALIGNMENT)
    }

    /// Adds a tensor from its raw encoded bytes. `dims` are in GGUF order (`dims[0]`
    /// contiguous). Checks: at most 4 dims, `dims[0]` a multiple of the type's block size,
    /// `data.len()` exactly the bytes the shape takes, no duplicate name.
    pub fn add_tensor(
        &mut self,
        name: &str,
        ty: GgmlType,
        dims: &[usize],
        data: impl Into<Vec<u8>>,
    ) -> Result<&mut Self, GgufError> {
        let data = data.into();
        let expect = tensor_bytes(name, ty, dims)?;
        if data.len() != expect {
            return Err(GgufError::Writer(format!(
                "tensor '{name}' of type {ty} and shape {dims:?} takes {expect} bytes, {} given",
                data.len()
            )));
        }
        if !self.names.insert(name.to_string()) {
            return Err(GgufError::Writer(format!("duplicate tensor name '{name}'")));
        }
        self.tensors.push(PendingTensor {
            name: name.to_string(),
            ty,
            dims: dims.to_vec(),
            data,
        });
        Ok(self)
    }

    /// Adds an f32 tensor.
    pub fn add_f32_tensor(
        &mut self,
        name: &str,
        dims: &[usize],
        values: &[f32],
    ) -> Result<&mut Self, GgufError> {
        let bytes: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        self.add_tensor(name, GgmlType::F32, dims, bytes)
    }

    /// The file as bytes.
    pub fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        self.write_into(&mut out);
        out
    }

    /// Writes the file to `w`.
    pub fn write_to(&self, w: &mut impl Write) -> std::io::Result<()> {
        let mut out = Vec::new();
        self.write_into(&mut out);
        w.write_all(&out)
    }

    /// Writes the file at `path` (created or truncated).
    pub fn write_file(&self, path: impl AsRef<Path>) -> Result<(), GgufError> {
        let path = path.as_ref();
        let mut out = Vec::new();
        self.write_into(&mut out);
        std::fs::write(path, out).map_err(|source| GgufError::WriteIo {
            path: path.to_path_buf(),
            source,
        })
    }

    /// Starts writing the file at `path` (created or truncated) with, after the tensors
    /// added so far, the tensors `later` declares (name, type, dims in GGUF order), whose
    /// bytes the returned [`GgufStream`] takes one at a time, in that order: a file far
    /// larger than memory is written holding one tensor at a time. Writes the header and
    /// the added tensors' bytes now; checks the declared tensors as
    /// [`GgufWriter::add_tensor`] does.
    pub fn stream_file(
        &self,
        path: impl AsRef<Path>,
        later: &[(String, GgmlType, Vec<usize>)],
    ) -> Result<GgufStream, GgufError> {
        let path = path.as_ref().to_path_buf();
        let mut names = self.names.clone();
        let mut declared = Vec::with_capacity(later.len());
        for (name, ty, dims) in later {
            let bytes = tensor_bytes(name, *ty, dims)?;
            if !names.insert(name.clone()) {
                return Err(GgufError::Writer(format!("duplicate tensor name '{name}'")));
            }
            declared.push((name.as_str(), *ty, dims.as_slice(), bytes));
        }
        let align = self.alignment();
        let mut head = Vec::new();
        let added = self
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.ty, t.dims.as_slice(), t.data.len()));
        self.write_header(&mut head, added.chain(declared.iter().copied()));
        for t in &self.tensors {
            head.extend_from_slice(&t.data);
            pad(&mut head, align);
        }
        let io = |source| GgufError::WriteIo {
            path: path.clone(),
            source,
        };
        let file = std::fs::File::create(&path).map_err(io)?;
        let mut out = std::io::BufWriter::with_capacity(8 << 20, file);
        out.write_all(&head).map_err(io)?;
        let left = declared
            .iter()
            .rev()
            .map(|&(name, _, _, bytes)| (name.to_string(), bytes))
            .collect();
        Ok(GgufStream {
            out,
            path,
            align,
            left,
        })
    }

    fn write_into(&self, out: &mut Vec<u8>) {
        let align = self.alignment();
        let infos = self
            .tensors
            .iter()
            .map(|t| (t.name.as_str(), t.ty, t.dims.as_slice(), t.data.len()));
        self.write_header(out, infos);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad(out, align);
        }
    }

    /// The header: magic, version, counts, metadata, then the infos of `tensors` (name,
    /// type, dims, bytes), padded to the alignment.
    fn write_header<'a>(
        &self,
        out: &mut Vec<u8>,
        tensors: impl Iterator<Item = (&'a str, GgmlType, &'a [usize], usize)> + Clone,
    ) {
        let align = self.alignment();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(tensors.clone().count() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(out, v);
        }
        let mut offset = 0usize;
        for (name, ty, dims, bytes) in tensors {
            put_str(out, name);
            out.extend_from_slice(&(dims.len() as u32).to_le_bytes());
            for &d in dims {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += bytes.div_ceil(align) * align;
        }
        pad(out, align);
    }
}

/// A GGUF file being written tensor by tensor ([`GgufWriter::stream_file`]).
#[derive(Debug)]
pub struct GgufStream {
    out: std::io::BufWriter<std::fs::File>,
    path: std::path::PathBuf,
    align: usize,
    /// The declared tensors still to come, the next one last: name and bytes.
    left: Vec<(String, usize)>,
}

impl GgufStream {
    /// The name of the tensor whose bytes come next, if any.
    pub fn next_tensor(&self) -> Option<&str> {
        self.left.last().map(|(n, _)| n.as_str())
    }

    /// Writes the bytes of the next declared tensor; refuses bytes of another size than
    /// its shape takes, or any when every declared tensor has come.
    pub fn put(&mut self, data: &[u8]) -> Result<(), GgufError> {
        let Some((name, bytes)) = self.left.pop() else {
            return Err(GgufError::Writer(format!(
                "{}: every declared tensor is written already",
                self.path.display()
            )));
        };
        if data.len() != bytes {
            return Err(GgufError::Writer(format!(
                "tensor '{name}' takes {bytes} bytes, {} given",
                data.len()
            )));
        }
        let padding = data.len().div_ceil(self.align) * self.align - data.len();
        self.out
            .write_all(data)
            .and_then(|()| self.out.write_all(&vec![0u8; padding]))
            .map_err(|source| GgufError::WriteIo {
                path: self.path.clone(),
                source,
            })
    }

    /// Flushes the file; refuses when a declared tensor has not come.
    pub fn finish(mut self) -> Result<(), GgufError> {
        if let Some((name, _)) = self.left.last() {
            return Err(GgufError::Writer(format!(
                "{}: tensor '{name}' and {} more were declared but not written",
                self.path.display(),
                self.left.len() - 1
            )));
        }
        self.out
            .flush()
            .and_then(|()| self.out.get_ref().sync_all())
            .map_err(|source| GgufError::WriteIo {
                path: self.path.clone(),
                source,
            })
    }
}

/// The bytes a tensor of `ty` and `dims` (GGUF order) takes. Checks: at most 4 dims,
/// `dims[0]` a multiple of the type's block size, no overflow.
fn tensor_bytes(name: &str, ty: GgmlType, dims: &[usize]) -> Result<usize, GgufError> {
    if dims.len() > MAX_DIMS {
        return Err(GgufError::Writer(format!(
            "tensor '{name}' has {} dims (at most {MAX_DIMS})",
            dims.len()
        )));
    }
    let n = dims
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or_else(|| GgufError::Writer(format!("tensor '{name}' shape {dims:?} overflows")))?;
    let ne0 = dims.first().copied().unwrap_or(1);
    if !ne0.is_multiple_of(ty.block_size()) {
        return Err(GgufError::Writer(format!(
            "tensor '{name}' of type {ty}: first dimension {ne0} is not a multiple of the block size {}",
            ty.block_size()
        )));
    }
    (n / ty.block_size())
        .checked_mul(ty.type_size())
        .ok_or_else(|| GgufError::Writer(format!("tensor '{name}' shape {dims:?} overflows")))
}

fn check_alignment(v: &Value) -> Result<(), GgufError> {
    match v {
        Value::U32(a) if a.is_power_of_two() => Ok(()),
        _ => Err(GgufError::Writer(format!(
            "{ALIGNMENT_KEY} must be a u32 power of two, got {v} ({})",
            v.type_name()
        ))),
    }
}

fn pad(out: &mut Vec<u8>, align: usize) {
    let n = out.len().div_ceil(align) * align - out.len();
    out.resize(out.len() + n, 0);
}

fn put_str(out: &mut Vec<u8>, s: &str) {
    out.extend_from_slice(&(s.len() as u64).to_le_bytes());
    out.extend_from_slice(s.as_bytes());
}

fn put_value(out: &mut Vec<u8>, v: &Value) {
    match v {
        Value::U8(x) => out.push(*x),
        Value::I8(x) => out.push(*x as u8),
        Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::Bool(x) => out.push(*x as u8),
        Value::String(s) => put_str(out, s),
        Value::Array(a) => put_array(out, a),
        Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
        Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
    }
}

fn put_array(out: &mut Vec<u8>, a: &Array) {
    out.extend_from_slice(&a.elem_type().id().to_le_bytes());
    out.extend_from_slice(&(a.len() as u64).to_le_bytes());
    macro_rules! le {
        ($v:expr) => {
            for x in $v {
                out.extend_from_slice(&x.to_le_bytes());
            }
        };
    }
    match a {
        Array::U8(v) => out.extend_from_slice(v),
        Array::I8(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::U16(v) => le!(v),
        Array::I16(v) => le!(v),
        Array::U32(v) => le!(v),
        Array::I32(v) => le!(v),
        Array::F32(v) => le!(v),
        Array::Bool(v) => out.extend(v.iter().map(|&x| x as u8)),
        Array::String(v) => {
            for s in v {
                put_str(out, s);
            }
        }
        Array::Array(v) => {
            for inner in v {
                put_array(out, inner);
            }
        }
        Array::U64(v) => le!(v),
        Array::I64(v) => le!(v),
        Array::F64(v) => le!(v),
    }
}
