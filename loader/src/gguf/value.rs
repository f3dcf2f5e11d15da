//! GGUF metadata values.

use core::fmt;

/// The type tag of a GGUF metadata value, with its on-disk id as the discriminant.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum ValueType {
    /// `u8`
    U8 = 0,
    /// `i8`
    I8 = 1,
    /// `u16`
    U16 = 2,
    /// `i16`
    I16 = 3,
    /// `u32`
    U32 = 4,
    /// `i32`
    I32 = 5,
    /// `f32`
    F32 = 6,
    /// `bool` (one byte, 0 or 1)
    Bool = 7,
    /// UTF-8 string with a `u64` length prefix
    String = 8,
    /// typed array with a `u32` element type and a `u64` count
    Array = 9,
    /// `u64`
    U64 = 10,
    /// `i64`
    I64 = 11,
    /// `f64`
    F64 = 12,
}

impl ValueType {
    /// The type with this on-disk id, if any.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The on-disk id.
    pub fn id(self) -> u32 {
        self as u32
    }

    /// The smallest number of bytes one value of this type takes in a file. Counts read
    /// from a file are checked against `count * min_size <= remaining bytes` before any
    /// allocation, so a hostile count can never allocate more than the file backs.
    pub fn min_size(self) -> usize {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 => 8,
            // u64 length prefix.
            String => 8,
            // u32 element type + u64 count.
            Array => 12,
        }
    }

    /// A short lower-case name (`"u32"`, `"string"`, `"array"`).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One metadata value.
#[derive(Clone, Debug, PartialEq)]
pub enum Value {
    /// `u8`
    U8(u8),
    /// `i8`
    I8(i8),
    /// `u16`
    U16(u16),
    /// `i16`
    I16(i16),
    /// `u32`
    U32(u32),
    /// `i32`
    I32(i32),
    /// `f32`
    F32(f32),
    /// `bool`
    Bool(bool),
    /// string
    String(String),
    /// typed array (possibly of arrays)
    Array(Array),
    /// `u64`
    U64(u64),
    /// `i64`
    I64(i64),
    /// `f64`
    F64(f64),
}

/// A typed GGUF array. Elements are kept in typed vectors (not one `Value` each) so a
/// 262k-entry vocabulary costs what its data costs.
#[derive(Clone, Debug, PartialEq)]
pub enum Array {
    /// `u8` elements
    U8(Vec<u8>),
    /// `i8` elements
    I8(Vec<i8>),
    /// `u16` elements
    U16(Vec<u16>),
    /// `i16` elements
    I16(Vec<i16>),
    /// `u32` elements
    U32(Vec<u32>),
    /// `i32` elements
    I32(Vec<i32>),
    /// `f32` elements
    F32(Vec<f32>),
    /// `bool` elements
    Bool(Vec<bool>),
    /// string elements
    String(Vec<String>),
    /// nested arrays; each inner array has its own element type
    Array(Vec<Array>),
    /// `u64` elements
    U64(Vec<u64>),
    /// `i64` elements
    I64(Vec<i64>),
    /// `f64` elements
    F64(Vec<f64>),
}

impl Value {
    /// The type tag.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// A human-readable type name: the scalar type, or `array[T]` for arrays.
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => format!("array[{}]", a.elem_type()),
            v => v.value_type().name().to_string(),
        }
    }

    /// The value as an integer when it is one of the integer types (any width, any sign).
    pub fn as_i128(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v as i128,
            Value::I8(v) => v as i128,
            Value::U16(v) => v as i128,
            Value::I16(v) => v as i128,
            Value::U32(v) => v as i128,
            Value::I32(v) => v as i128,
            Value::U64(v) => v as i128,
            Value::I64(v) => v as i128,
            _ => return None,
        })
    }

    /// The string, when this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Value::String(s) => Some(s),
            _ => None,
        }
    }

    /// The array, when this is an array.
    pub fn as_array(&self) -> Option<&Array> {
        match self {
            Value::Array(a) => Some(a),
            _ => None,
        }
    }
}

impl Array {
    /// The element type.
    pub fn elem_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Array(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Array(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// True when the array has no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Element `i` as a [`Value`] (cloned), or `None` past the end.
    pub fn get(&self, i: usize) -> Option<Value> {
        Some(match self {
            Array::U8(v) => Value::U8(*v.get(i)?),
            Array::I8(v) => Value::I8(*v.get(i)?),
            Array::U16(v) => Value::U16(*v.get(i)?),
            Array::I16(v) => Value::I16(*v.get(i)?),
            Array::U32(v) => Value::U32(*v.get(i)?),
            Array::I32(v) => Value::I32(*v.get(i)?),
            Array::F32(v) => Value::F32(*v.get(i)?),
            Array::Bool(v) => Value::Bool(*v.get(i)?),
            Array::String(v) => Value::String(v.get(i)?.clone()),
            Array::Array(v) => Value::Array(v.get(i)?.clone()),
            Array::U64(v) => Value::U64(*v.get(i)?),
            Array::I64(v) => Value::I64(*v.get(i)?),
            Array::F64(v) => Value::F64(*v.get(i)?),
        })
    }

    /// The elements as `i128` when the element type is an integer type.
    pub fn to_i128_vec(&self) -> Option<Vec<i128>> {
        fn conv<T: Copy + Into<i128>>(v: &[T]) -> Vec<i128> {
            v.iter().map(|&x| x.into()).collect()
        }
        Some(match self {
            Array::U8(v) => conv(v),
            Array::I8(v) => conv(v),
            Array::U16(v) => conv(v),
            Array::I16(v) => conv(v),
            Array::U32(v) => conv(v),
            Array::I32(v) => conv(v),
            Array::U64(v) => conv(v),
            Array::I64(v) => conv(v),
            _ => return None,
        })
    }
}

fn fmt_list<T: fmt::Display>(
    f: &mut fmt::Formatter<'_>,
    items: impl Iterator<Item = T>,
    total: usize,
    max: usize,
) -> fmt::Result {
    f.write_str("[")?;
    for (i, x) in items.take(max).enumerate() {
        if i > 0 {
            f.write_str(", ")?;
        }
        write!(f, "{x}")?;
    }
    if total > max {
        write!(f, ", ... ({total} total)")?;
    }
    f.write_str("]")
}

struct Quoted<'a>(&'a str);

impl fmt::Display for Quoted<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

impl Array {
    /// Writes the array, showing at most `max` elements per level (long arrays end with
    /// `... (N total)`).
    pub fn fmt_summary(&self, f: &mut fmt::Formatter<'_>, max: usize) -> fmt::Result {
        match self {
            Array::U8(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::I8(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::U16(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::I16(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::U32(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::I32(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::F32(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::Bool(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::String(v) => fmt_list(f, v.iter().map(|s| Quoted(s)), v.len(), max),
            Array::Array(v) => {
                f.write_str("[")?;
                for (i, a) in v.iter().take(max).enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    a.fmt_summary(f, max)?;
                }
                if v.len() > max {
                    write!(f, ", ... ({} total)", v.len())?;
                }
                f.write_str("]")
            }
            Array::U64(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::I64(v) => fmt_list(f, v.iter(), v.len(), max),
            Array::F64(v) => fmt_list(f, v.iter(), v.len(), max),
        }
    }
}

impl fmt::Display for Array {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.fmt_summary(f, usize::MAX)
    }
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::U8(v) => write!(f, "{v}"),
            Value::I8(v) => write!(f, "{v}"),
            Value::U16(v) => write!(f, "{v}"),
            Value::I16(v) => write!(f, "{v}"),
            Value::U32(v) => write!(f, "{v}"),
            Value::I32(v) => write!(f, "{v}"),
            Value::F32(v) => write!(f, "{v}"),
            Value::Bool(v) => write!(f, "{v}"),
            Value::String(s) => write!(f, "{s:?}"),
            Value::Array(a) => write!(f, "{a}"),
            Value::U64(v) => write!(f, "{v}"),
            Value::I64(v) => write!(f, "{v}"),
            Value::F64(v) => write!(f, "{v}"),
        }
    }
}

/// Display adapter that shortens long arrays (see [`Value::summary`]).
#[derive(Debug)]
pub struct Summary<'a> {
    value: &'a Value,
    max: usize,
}

impl fmt::Display for Summary<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.value {
            Value::Array(a) => a.fmt_summary(f, self.max),
            v => write!(f, "{v}"),
        }
    }
}

impl Value {
    /// Displays the value with arrays cut to their first `max` elements per level.
    pub fn summary(&self, max: usize) -> Summary<'_> {
        Summary { value: self, max }
    }
}
