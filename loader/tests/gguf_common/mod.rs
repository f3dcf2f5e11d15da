//! Shared by the GGUF tests: a deterministic sample file with metadata of every value
//! type (nested arrays included) and tensors of several types.

#![allow(dead_code)]

use flint_core::GgmlType;
use flint_loader::gguf::{Array, GgufWriter, Value};

/// xorshift64*: deterministic bytes without a dependency.
pub struct Rng(pub u64);

impl Rng {
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    pub fn below(&mut self, n: usize) -> usize {
        (self.next_u64() % n.max(1) as u64) as usize
    }
    pub fn bytes(&mut self, n: usize) -> Vec<u8> {
        (0..n).map(|_| self.next_u64() as u8).collect()
    }
}

/// Every scalar value type once, plus arrays of every element type and nested arrays.
pub fn all_values() -> Vec<(&'static str, Value)> {
    vec![
        ("general.architecture", Value::from("test")),
        ("general.name", Value::from("sample ✓")),
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60000)),
        ("t.i16", Value::I16(-30000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.f32", Value::F32(1.5e-6)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::from("")),
        ("t.u64", Value::U64(u64::MAX - 1)),
        ("t.i64", Value::I64(i64::MIN + 1)),
        ("t.f64", Value::F64(-2.25e100)),
        ("a.u8", Value::from(vec![1u8, 2, 255])),
        ("a.i8", Value::from(vec![-1i8, 0, 127])),
        ("a.u16", Value::from(vec![1u16, 65535])),
        ("a.i16", Value::from(vec![-32768i16, 1])),
        ("a.u32", Value::from(vec![7u32, 8, 9])),
        ("a.i32", Value::from(vec![-7i32, 0, 9])),
        ("a.f32", Value::from(vec![0.5f32, -1.0, 3.25])),
        ("a.bool", Value::from(vec![true, false, true])),
        ("a.string", Value::from(vec!["a", "", "ü<0x0A>"])),
        ("a.u64", Value::from(vec![u64::MAX, 0])),
        ("a.i64", Value::from(vec![i64::MIN, 5])),
        ("a.f64", Value::from(vec![1e-300f64, 2.0])),
        ("a.empty", Value::from(Vec::<u32>::new())),
        (
            "a.nested",
            Value::Array(Array::Array(vec![
                Array::U32(vec![1, 2]),
                Array::String(vec!["x".into()]),
                Array::Array(vec![Array::F32(vec![1.0]), Array::Bool(vec![])]),
            ])),
        ),
    ]
}

/// The tensors of the sample: (name, type, dims).
pub fn sample_tensors() -> Vec<(&'static str, GgmlType, Vec<usize>)> {
    vec![
        ("f32.weight", GgmlType::F32, vec![8, 3]),
        ("f16.weight", GgmlType::F16, vec![5]),
        ("bf16.weight", GgmlType::BF16, vec![4, 2, 2]),
        ("q8_0.weight", GgmlType::Q8_0, vec![64, 2]),
        ("q4_k.weight", GgmlType::Q4_K, vec![256, 2, 1, 1]),
        ("q6_k.weight", GgmlType::Q6_K, vec![256]),
        ("q5_0.weight", GgmlType::Q5_0, vec![32, 3]),
        ("i32.weight", GgmlType::I32, vec![3]),
        ("empty.weight", GgmlType::F32, vec![0, 4]),
    ]
}

/// The sample file description with random tensor bytes from `seed`.
pub fn sample_writer(seed: u64) -> GgufWriter {
    let mut rng = Rng(seed | 1);
    let mut w = GgufWriter::new();
    for (k, v) in all_values() {
        w.add(k, v).expect("sample key");
    }
    for (name, ty, dims) in sample_tensors() {
        let n: usize = dims.iter().product();
        let bytes = rng.bytes(n / ty.block_size() * ty.type_size());
        w.add_tensor(name, ty, &dims, bytes).expect("sample tensor");
    }
    w
}

/// The sample file as bytes.
pub fn sample_bytes() -> Vec<u8> {
    sample_writer(0x5eed).to_bytes()
}

/// Raw encoders for hand-made (usually broken) files.
pub mod raw {
    /// A GGUF string.
    pub fn str(s: &str) -> Vec<u8> {
        let mut v = (s.len() as u64).to_le_bytes().to_vec();
        v.extend_from_slice(s.as_bytes());
        v
    }

    /// A key/value with a raw type id and raw value bytes.
    pub fn kv(key: &str, ty: u32, value: &[u8]) -> Vec<u8> {
        let mut v = str(key);
        v.extend_from_slice(&ty.to_le_bytes());
        v.extend_from_slice(value);
        v
    }

    /// A u32 key/value.
    pub fn kv_u32(key: &str, x: u32) -> Vec<u8> {
        kv(key, 4, &x.to_le_bytes())
    }

    /// A tensor info.
    pub fn info(name: &str, dims: &[u64], ty: u32, offset: u64) -> Vec<u8> {
        let mut v = str(name);
        v.extend_from_slice(&(dims.len() as u32).to_le_bytes());
        for d in dims {
            v.extend_from_slice(&d.to_le_bytes());
        }
        v.extend_from_slice(&ty.to_le_bytes());
        v.extend_from_slice(&offset.to_le_bytes());
        v
    }

    /// A whole file: header with the given counts, the key/values, the infos, padding
    /// to `align`, then `data`.
    pub fn file(
        version: u32,
        n_tensors: u64,
        n_kv: u64,
        kvs: &[Vec<u8>],
        infos: &[Vec<u8>],
        align: usize,
        data: &[u8],
    ) -> Vec<u8> {
        let mut v = b"GGUF".to_vec();
        v.extend_from_slice(&version.to_le_bytes());
        v.extend_from_slice(&n_tensors.to_le_bytes());
        v.extend_from_slice(&n_kv.to_le_bytes());
        for k in kvs {
            v.extend_from_slice(k);
        }
        for i in infos {
            v.extend_from_slice(i);
        }
        while !v.len().is_multiple_of(align) {
            v.push(0);
        }
        v.extend_from_slice(data);
        v
    }

    /// A well-formed file of one F32 tensor `[n]` plus the given extra key/values.
    pub fn one_tensor(kvs: &[Vec<u8>], dims: &[u64], ty: u32, offset: u64, data: usize) -> Vec<u8> {
        file(
            3,
            1,
            kvs.len() as u64,
            kvs,
            &[info("w", dims, ty, offset)],
            32,
            &vec![0u8; data],
        )
    }
}

/// Every kind of broken file the reader must refuse: (file name, bytes, a fragment the
/// error message must contain). Shared by the reader tests and the CLI corpus test.
pub fn bad_files() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    use raw::*;
    let good = sample_bytes();
    let two =
        |a: Vec<u8>, b: Vec<u8>, data: usize| file(3, 2, 0, &[], &[a, b], 32, &vec![0u8; data]);
    let mut v = vec![
        ("empty.gguf", vec![], "magic"),
        ("bad_magic.gguf", b"GGML\x03\0\0\0".to_vec(), "magic"),
        (
            "version_1.gguf",
            file(1, 0, 0, &[], &[], 1, &[]),
            "version 1",
        ),
        (
            "version_big_endian.gguf",
            {
                let mut f = file(3, 0, 0, &[], &[], 1, &[]);
                f[4..8].copy_from_slice(&3u32.to_be_bytes());
                f
            },
            "big-endian",
        ),
        ("truncated_header.gguf", good[..12].to_vec(), "truncated"),
        (
            "truncated_in_metadata.gguf",
            good[..200].to_vec(),
            "truncated",
        ),
        (
            "absurd_tensor_count.gguf",
            file(3, u64::MAX, 0, &[], &[], 1, &[]),
            "tensor count",
        ),
        (
            "absurd_kv_count.gguf",
            file(3, 0, 1 << 60, &[], &[], 1, &[]),
            "key/value count",
        ),
        (
            "absurd_key_length.gguf",
            {
                let mut k = kv_u32("general.x", 1);
                k[..8].copy_from_slice(&(u64::MAX - 3).to_le_bytes());
                file(3, 0, 1, &[k], &[], 1, &[])
            },
            "name of metadata key #0",
        ),
        (
            "absurd_string_length.gguf",
            {
                let mut val = (1u64 << 40).to_le_bytes().to_vec();
                val.extend_from_slice(b"abc");
                file(3, 0, 1, &[kv("general.name", 8, &val)], &[], 1, &[])
            },
            "general.name",
        ),
        (
            "absurd_array_count.gguf",
            {
                let mut val = 6u32.to_le_bytes().to_vec();
                val.extend_from_slice(&(1u64 << 62).to_le_bytes());
                file(
                    3,
                    0,
                    1,
                    &[kv("tokenizer.ggml.scores", 9, &val)],
                    &[],
                    1,
                    &[],
                )
            },
            "tokenizer.ggml.scores",
        ),
        (
            "unknown_value_type.gguf",
            file(3, 0, 1, &[kv("general.x", 13, &[0; 8])], &[], 1, &[]),
            "unknown value type id 13",
        ),
        (
            "invalid_bool.gguf",
            file(3, 0, 1, &[kv("general.flag", 7, &[2])], &[], 1, &[]),
            "general.flag",
        ),
        (
            "invalid_utf8_key.gguf",
            {
                let mut k = kv_u32("general.x", 1);
                k[8] = 0xff;
                file(3, 0, 1, &[k], &[], 1, &[])
            },
            "UTF-8",
        ),
        (
            "deep_nesting.gguf",
            {
                // 100 levels of arrays of one array each.
                let mut val = Vec::new();
                for _ in 0..100 {
                    val.extend_from_slice(&9u32.to_le_bytes());
                    val.extend_from_slice(&1u64.to_le_bytes());
                }
                val.extend_from_slice(&4u32.to_le_bytes());
                val.extend_from_slice(&0u64.to_le_bytes());
                file(3, 0, 1, &[kv("general.deep", 9, &val)], &[], 1, &[])
            },
            "nested deeper",
        ),
        (
            "duplicate_key.gguf",
            file(3, 0, 2, &[kv_u32("a.b", 1), kv_u32("a.b", 2)], &[], 1, &[]),
            "duplicate metadata key 'a.b'",
        ),
        (
            "alignment_zero.gguf",
            one_tensor(&[kv_u32("general.alignment", 0)], &[4], 0, 0, 16),
            "general.alignment",
        ),
        (
            "alignment_not_pow2.gguf",
            one_tensor(&[kv_u32("general.alignment", 48)], &[4], 0, 0, 16),
            "general.alignment",
        ),
        (
            "alignment_string.gguf",
            one_tensor(&[kv("general.alignment", 8, &str("32"))], &[4], 0, 0, 16),
            "general.alignment",
        ),
        (
            "too_many_dims.gguf",
            one_tensor(&[], &[1, 1, 1, 1, 1], 0, 0, 4),
            "5 dimensions",
        ),
        (
            "unknown_tensor_type.gguf",
            one_tensor(&[], &[4], 4, 0, 16),
            "unknown GGML type id 4",
        ),
        (
            "unknown_tensor_type_huge.gguf",
            one_tensor(&[], &[4], 0xdead_beef, 0, 16),
            "'w' has unknown GGML type",
        ),
        (
            "shape_overflow.gguf",
            one_tensor(&[], &[1 << 40, 1 << 40], 0, 0, 16),
            "overflows",
        ),
        (
            "shape_over_i64.gguf",
            one_tensor(&[], &[u64::MAX], 0, 0, 16),
            "overflows",
        ),
        (
            "partial_block.gguf",
            one_tensor(&[], &[48], 8, 0, 64),
            "block size 32",
        ),
        (
            "misaligned_offset.gguf",
            one_tensor(&[], &[4], 0, 4, 32),
            "alignment 32",
        ),
        (
            "offset_past_end.gguf",
            one_tensor(&[], &[4], 0, 1 << 20, 16),
            "outside the file",
        ),
        (
            "offset_absurd.gguf",
            one_tensor(&[], &[4], 0, u64::MAX - 31, 16),
            "outside the file",
        ),
        (
            "data_truncated.gguf",
            one_tensor(&[], &[64], 0, 0, 100),
            "outside the file",
        ),
        (
            "duplicate_tensor.gguf",
            two(info("w", &[4], 0, 0), info("w", &[4], 0, 32), 64),
            "duplicate tensor name 'w'",
        ),
        (
            "overlapping_tensors.gguf",
            two(info("a", &[16], 0, 0), info("b", &[16], 0, 32), 96),
            "overlap",
        ),
        (
            "identical_offsets.gguf",
            two(info("a", &[8], 0, 0), info("b", &[8], 0, 0), 64),
            "overlap",
        ),
        (
            "truncated_tensor_info.gguf",
            {
                let f = one_tensor(&[], &[4], 0, 0, 16);
                f[..f.len() - 16 - 8].to_vec()
            },
            "truncated",
        ),
    ];
    // Truncations at every structural boundary of a real file: inside the header, key,
    // value, tensor info, padding and data.
    let f = flint_loader::gguf::GgufFile::from_bytes(good.clone()).expect("sample parses");
    let last = f
        .tensors()
        .iter()
        .map(|t| t.start + t.n_bytes)
        .max()
        .unwrap_or(0);
    v.push((
        "truncated_in_data.gguf",
        good[..last - 1].to_vec(),
        "outside the file",
    ));
    v
}
