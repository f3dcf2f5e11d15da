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
        if dims.len() > MAX_DIMS {
            return Err(GgufError::Writer(format!(
                "tensor '{name}' has {} dims (at most {MAX_DIMS})",
                dims.len()
            )));
        }
        let n = dims
            .iter()
            .try_fold(1usize, |a, &d| a.checked_mul(d))
            .ok_or_else(|| {
                GgufError::Writer(format!("tensor '{name}' shape {dims:?} overflows"))
            })?;
        let ne0 = dims.first().copied().unwrap_or(1);
        if !ne0.is_multiple_of(ty.block_size()) {
            return Err(GgufError::Writer(format!(
                "tensor '{name}' of type {ty}: first dimension {ne0} is not a multiple of the block size {}",
                ty.block_size()
            )));
        }
        let expect = (n / ty.block_size())
            .checked_mul(ty.type_size())
            .ok_or_else(|| {
                GgufError::Writer(format!("tensor '{name}' shape {dims:?} overflows"))
            })?;
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

    fn write_into(&self, out: &mut Vec<u8>) {
        let align = self.alignment();
        out.extend_from_slice(b"GGUF");
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
        out.extend_from_slice(&(self.metadata.len() as u64).to_le_bytes());
        for (k, v) in &self.metadata {
            put_str(out, k);
            out.extend_from_slice(&v.value_type().id().to_le_bytes());
            put_value(out, v);
        }
        let mut offset = 0usize;
        for t in &self.tensors {
            put_str(out, &t.name);
            out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
            for &d in &t.dims {
                out.extend_from_slice(&(d as u64).to_le_bytes());
            }
            out.extend_from_slice(&t.ty.id().to_le_bytes());
            out.extend_from_slice(&(offset as u64).to_le_bytes());
            offset += t.data.len().div_ceil(align) * align;
        }
        pad(out, align);
        for t in &self.tensors {
            out.extend_from_slice(&t.data);
            pad(out, align);
        }
    }
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
