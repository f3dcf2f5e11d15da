//! The errors of the GGUF reader, the typed getters and the writer.

use std::path::PathBuf;

use flint_core::GgmlType;
use thiserror::Error;

/// Everything that can be wrong with a GGUF file or a request made of it. Each variant
/// names what is at fault: the key, the tensor, the byte offset.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum GgufError {
    /// The file could not be opened, sized or mapped.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error("not a GGUF file: magic bytes are {found:02x?}, expected \"GGUF\"")]
    BadMagic {
        /// The bytes found (fewer than 4 when the file is shorter).
        found: Vec<u8>,
    },
    /// The version is not 2 or 3.
    #[error("unsupported GGUF version {version} (supported: 2, 3){hint}")]
    UnsupportedVersion {
        /// The version found.
        version: u32,
        /// Extra explanation (big-endian files, v1).
        hint: &'static str,
    },
    /// The file ends inside a field.
    #[error(
        "file truncated: {what} at offset {offset} needs {needed} bytes, only {available} left"
    )]
    Truncated {
        /// The field being read.
        what: String,
        /// Its byte offset.
        offset: usize,
        /// Bytes it needs.
        needed: u64,
        /// Bytes left in the file.
        available: usize,
    },
    /// A count (of keys, tensors or array elements) that the rest of the file cannot hold.
    #[error("{what} at offset {offset} is {count}, but the {available} bytes left can hold at most {max} (file truncated or count corrupt)")]
    CountTooLarge {
        /// What is counted.
        what: String,
        /// Its byte offset.
        offset: usize,
        /// The count found.
        count: u64,
        /// The most that fits in the rest of the file.
        max: u64,
        /// Bytes left after the count.
        available: usize,
    },
    /// A string that is not UTF-8.
    #[error("{what} at offset {offset} is not valid UTF-8")]
    InvalidUtf8 {
        /// The string being read.
        what: String,
        /// Its byte offset.
        offset: usize,
    },
    /// A metadata value type id that GGUF does not define.
    #[error("metadata key '{key}' at offset {offset} has unknown value type id {id}")]
    UnknownValueType {
        /// The key.
        key: String,
        /// The id found.
        id: u32,
        /// Byte offset of the type id.
        offset: usize,
    },
    /// A bool byte other than 0 or 1.
    #[error("metadata key '{key}' at offset {offset} has bool byte {byte} (must be 0 or 1)")]
    InvalidBool {
        /// The key.
        key: String,
        /// The byte found.
        byte: u8,
        /// Its offset.
        offset: usize,
    },
    /// Arrays nested deeper than the reader allows (guards the stack).
    #[error("metadata key '{key}': arrays nested deeper than {max} levels at offset {offset}")]
    NestingTooDeep {
        /// The key.
        key: String,
        /// The deepest level allowed.
        max: usize,
        /// Where the too-deep array starts.
        offset: usize,
    },
    /// The same key twice.
    #[error("duplicate metadata key '{key}'")]
    DuplicateKey {
        /// The key.
        key: String,
    },
    /// The same tensor name twice.
    #[error("duplicate tensor name '{name}'")]
    DuplicateTensor {
        /// The tensor.
        name: String,
    },
    /// `general.alignment` is zero or not a power of two, or has a wrong type.
    #[error("general.alignment is {value}: it must be a power of two (u32)")]
    BadAlignment {
        /// The value, as text.
        value: String,
    },
    /// More than 4 dimensions.
    #[error("tensor '{tensor}' has {n_dims} dimensions (at most 4 allowed)")]
    TooManyDims {
        /// The tensor.
        tensor: String,
        /// The count found.
        n_dims: u32,
    },
    /// A tensor type id that Flint does not know.
    #[error("tensor '{tensor}' has unknown GGML type id {id}")]
    UnknownTensorType {
        /// The tensor.
        tensor: String,
        /// The id found.
        id: u32,
    },
    /// The element or byte count of a tensor overflows.
    #[error("tensor '{tensor}' with dims {dims:?}: element or byte count overflows")]
    ShapeOverflow {
        /// The tensor.
        tensor: String,
        /// Its dims, GGUF order.
        dims: Vec<u64>,
    },
    /// The first dimension is not a whole number of blocks of the type.
    #[error("tensor '{tensor}' of type {ty}: first dimension {ne0} is not a multiple of the block size {block}")]
    PartialBlock {
        /// The tensor.
        tensor: String,
        /// Its type.
        ty: GgmlType,
        /// The first dimension.
        ne0: u64,
        /// The type's block size.
        block: usize,
    },
    /// A tensor offset not a multiple of the alignment.
    #[error(
        "tensor '{tensor}' data offset {offset} is not a multiple of the alignment {alignment}"
    )]
    MisalignedTensor {
        /// The tensor.
        tensor: String,
        /// Offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: usize,
    },
    /// Tensor data that lies (partly) outside the file.
    #[error("tensor '{tensor}' data (offset {offset} in the data section at {data_start}, {n_bytes} bytes) lies outside the file of {file_len} bytes")]
    TensorOutOfBounds {
        /// The tensor.
        tensor: String,
        /// Offset relative to the data section.
        offset: u64,
        /// Absolute offset of the data section.
        data_start: usize,
        /// Bytes of the tensor.
        n_bytes: usize,
        /// File size.
        file_len: usize,
    },
    /// Two tensors whose data overlap.
    #[error("tensors '{first}' (bytes {first_start}..{first_end}) and '{second}' (bytes {second_start}..{second_end}) overlap")]
    OverlappingTensors {
        /// One tensor.
        first: String,
        /// Its absolute start.
        first_start: usize,
        /// Its absolute end.
        first_end: usize,
        /// The other.
        second: String,
        /// Its absolute start.
        second_start: usize,
        /// Its absolute end.
        second_end: usize,
    },
    /// A required metadata key is absent.
    #[error("metadata key '{key}' is missing")]
    MissingKey {
        /// The key.
        key: String,
    },
    /// A metadata value of the wrong type.
    #[error("metadata key '{key}' has type {found}, expected {expected}")]
    WrongType {
        /// The key.
        key: String,
        /// What the caller asked for.
        expected: &'static str,
        /// What the file holds.
        found: String,
    },
    /// An integer value that does not fit the type asked for.
    #[error("metadata key '{key}' = {value} does not fit in {expected}")]
    OutOfRange {
        /// The key.
        key: String,
        /// The value, as text.
        value: String,
        /// The type asked for.
        expected: &'static str,
    },
    /// A writer call that would produce an invalid file.
    #[error("GGUF writer: {0}")]
    Writer(String),
    /// A write failed.
    #[error("GGUF writer: cannot write {path}: {source}")]
    WriteIo {
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// `FLINT_LOAD` holds something other than `auto`, `map` or `copy`.
    #[error("FLINT_LOAD is '{value}': expected auto, map or copy")]
    BadLoadMode {
        /// The value found.
        value: String,
    },
    /// A shard other than the first of a split model was opened directly.
    #[error("{path} is shard {no} of {count} of a split model: open the first shard, {first}")]
    SplitNotFirst {
        /// The file opened.
        path: PathBuf,
        /// Its shard number, from 1 (`split.no + 1`).
        no: usize,
        /// `split.count`.
        count: usize,
        /// Where the first shard would be.
        first: PathBuf,
    },
    /// The first shard's name does not end in `-00001-of-NNNNN.gguf`, so the other
    /// shards' names cannot be derived from it.
    #[error("{path} is the first of {count} shards, but its name does not end in '{suffix}', so the other shards cannot be found")]
    SplitName {
        /// The file opened.
        path: PathBuf,
        /// `split.count`.
        count: usize,
        /// The ending the name must have.
        suffix: String,
    },
    /// A shard of a split model is not there.
    #[error("shard {no} of {count} of the split model is missing: {path}")]
    SplitMissingShard {
        /// The path the shard must have.
        path: PathBuf,
        /// Its shard number, from 1.
        no: usize,
        /// `split.count`.
        count: usize,
    },
    /// A shard of a split model is not a valid GGUF file.
    #[error("shard {path}: {source}")]
    SplitShard {
        /// The shard.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        source: Box<GgufError>,
    },
    /// A shard's `split.*` key disagrees with the split it belongs to.
    #[error("shard {path}: {key} is {found}, expected {expected}")]
    SplitMismatch {
        /// The shard.
        path: PathBuf,
        /// The key (`split.no`, `split.count`, `split.tensors.count`).
        key: &'static str,
        /// The value found.
        found: String,
        /// The value the split implies.
        expected: String,
    },
    /// Two shards hold a tensor of the same name.
    #[error("tensor '{name}' is in two shards: {first} and {second}")]
    SplitDuplicateTensor {
        /// The tensor.
        name: String,
        /// The shard that has it first.
        first: PathBuf,
        /// The other shard.
        second: PathBuf,
    },
    /// One shard of a split model given as bytes, with no path to find the others.
    #[error("this is shard {no} of {count} of a split model: open the first shard from its path so that the other shards are found")]
    SplitInMemory {
        /// Its shard number, from 1.
        no: usize,
        /// `split.count`.
        count: usize,
    },
}
