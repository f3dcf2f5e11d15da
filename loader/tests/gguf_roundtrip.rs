//! Writer -> reader round trips: every value type, tensors of every type, alignments.

mod gguf_common;

use flint_core::GgmlType;
use flint_loader::gguf::{Array, GgufError, GgufFile, GgufWriter, Value};
use gguf_common::{all_values, sample_tensors, sample_writer, Rng};

#[test]
fn metadata_of_every_type_round_trips() {
    let w = sample_writer(1);
    let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
    assert_eq!(f.version(), 3);
    let want = all_values();
    assert_eq!(f.metadata().len(), want.len());
    for ((k, v), (wk, wv)) in f.metadata().zip(want.iter()) {
        assert_eq!(k, *wk);
        assert_eq!(v, wv, "key {k}");
    }
}

#[test]
fn tensors_round_trip_with_bytes() {
    let w = sample_writer(2);
    let bytes = w.to_bytes();
    let f = GgufFile::from_bytes(bytes.clone()).expect("parse");
    let want = sample_tensors();
    assert_eq!(f.tensors().len(), want.len());
    let mut rng = Rng(2 | 1);
    for (t, (name, ty, dims)) in f.tensors().iter().zip(want) {
        assert_eq!(t.name, name);
        assert_eq!(t.ty, ty);
        assert_eq!(t.dims, dims);
        let n: usize = dims.iter().product();
        assert_eq!(t.n_elements, n);
        let data = rng.bytes(n / ty.block_size() * ty.type_size());
        assert_eq!(f.tensor_data(t), &data[..], "{name}");
        assert_eq!(t.start % f.alignment(), 0);
        assert_eq!(&f.as_bytes()[t.range()], &data[..]);
        assert!(std::ptr::eq(
            f.tensor_data(t).as_ptr(),
            (*f.shared_bytes()).as_ref()[t.range()].as_ptr()
        ));
    }
    assert!(f.tensor("q4_k.weight").is_some());
    assert!(f.tensor("nope").is_none());
}

#[test]
fn every_tensor_type_round_trips() {
    let mut rng = Rng(99);
    let mut w = GgufWriter::new();
    for (i, ty) in GgmlType::ALL.iter().enumerate() {
        let dims = [ty.block_size() * 2, 3];
        let bytes = rng.bytes(2 * 3 * ty.type_size());
        w.add_tensor(&format!("t{i}"), *ty, &dims, bytes)
            .expect("add");
    }
    let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
    for (t, ty) in f.tensors().iter().zip(GgmlType::ALL) {
        assert_eq!(t.ty, ty);
        assert_eq!(t.n_bytes, 6 * ty.type_size());
    }
}

#[test]
fn alignments_round_trip() {
    for align in [1u32, 2, 8, 32, 64, 4096] {
        let mut w = sample_writer(3);
        w.set_alignment(align).expect("alignment");
        let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
        assert_eq!(f.alignment(), align as usize);
        assert_eq!(f.data_start() % align as usize, 0);
        for t in f.tensors() {
            assert_eq!(t.offset % align as usize, 0, "{}", t.name);
        }
    }
}

#[test]
fn open_maps_a_file() {
    let dir = std::env::temp_dir().join(format!("flint-gguf-open-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("s.gguf");
    sample_writer(4).write_file(&path).expect("write");
    let f = GgufFile::open(&path).expect("open");
    assert_eq!(f.tensors().len(), sample_tensors().len());
    assert_eq!(f.get_str("general.architecture").expect("arch"), "test");
    let missing = GgufFile::open(dir.join("missing.gguf")).expect_err("missing file");
    assert!(matches!(missing, GgufError::Io { .. }));
    assert!(missing.to_string().contains("missing.gguf"));
    let empty = dir.join("empty.gguf");
    std::fs::write(&empty, b"").expect("write");
    assert!(matches!(
        GgufFile::open(&empty),
        Err(GgufError::BadMagic { .. })
    ));
    std::fs::remove_dir_all(&dir).ok();
}

#[test]
fn writer_refuses_invalid_input() {
    let mut w = GgufWriter::new();
    w.add("k", 1u32).expect("first");
    assert!(w.add("k", 2u32).is_err());
    assert!(w.set_alignment(24).is_err());
    assert!(w.add("general.alignment", 16u64).is_err());
    assert!(w
        .add_tensor("q", GgmlType::Q4_K, &[128], vec![0u8; 72])
        .is_err());
    assert!(w
        .add_tensor("q", GgmlType::Q8_0, &[32], vec![0u8; 33])
        .is_err());
    assert!(w
        .add_tensor("q", GgmlType::F32, &[1, 1, 1, 1, 1], vec![0u8; 4])
        .is_err());
    w.add_tensor("q", GgmlType::Q8_0, &[32], vec![0u8; 34])
        .expect("valid");
    let e = w
        .add_tensor("q", GgmlType::Q8_0, &[32], vec![0u8; 34])
        .expect_err("duplicate");
    assert!(e.to_string().contains("'q'"));
}

#[test]
fn set_replaces_and_remove_deletes() {
    let mut w = GgufWriter::new();
    w.add("a", 1u32).expect("a");
    w.set("a", "x").expect("set");
    w.add("b", true).expect("b");
    w.remove("b");
    let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
    assert_eq!(f.get_str("a").expect("a"), "x");
    assert!(f.get("b").is_none());
}

#[test]
fn nested_array_values() {
    let f = GgufFile::from_bytes(sample_writer(5).to_bytes()).expect("parse");
    let a = f.get_array("a.nested").expect("nested");
    match a {
        Array::Array(v) => {
            assert_eq!(v.len(), 3);
            assert_eq!(
                v[2],
                Array::Array(vec![Array::F32(vec![1.0]), Array::Bool(vec![])])
            );
        }
        other => panic!("expected nested array, got {other:?}"),
    }
    assert_eq!(a.get(0), Some(Value::Array(Array::U32(vec![1, 2]))));
}

/// A file streamed tensor by tensor (`GgufWriter::stream_file`) is byte for byte the file
/// the in-memory writer makes with the same tensors, whether some tensors were added
/// before the stream started or none; the stream refuses a wrong size, a tensor too many
/// and an early finish.
#[test]
fn streamed_file_equals_the_in_memory_one() {
    let dir = std::env::temp_dir().join(format!("flint-gguf-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let full = sample_writer(5);
    let want = full.to_bytes();
    let tensors = sample_tensors();
    let mut rng = Rng(5 | 1);
    let datas: Vec<Vec<u8>> = tensors
        .iter()
        .map(|(_, ty, dims)| {
            let n: usize = dims.iter().product();
            rng.bytes(n / ty.block_size() * ty.type_size())
        })
        .collect();
    let declared: Vec<(String, GgmlType, Vec<usize>)> = tensors
        .iter()
        .map(|(n, ty, d)| (n.to_string(), *ty, d.clone()))
        .collect();
    let mut meta = GgufWriter::new();
    for (k, v) in all_values() {
        meta.add(k, v).expect("key");
    }
    for added in [0, 2] {
        let mut w = meta.clone();
        for ((name, ty, dims), data) in declared.iter().zip(&datas).take(added) {
            w.add_tensor(name, *ty, dims, data.clone()).expect("add");
        }
        let path = dir.join(format!("s{added}.gguf"));
        let mut s = w.stream_file(&path, &declared[added..]).expect("stream");
        for ((name, _, _), data) in declared.iter().zip(&datas).skip(added) {
            assert_eq!(s.next_tensor(), Some(name.as_str()));
            s.put(data).expect("put");
        }
        assert_eq!(s.next_tensor(), None);
        assert!(s.put(&[0u8; 4]).is_err(), "a tensor too many");
        s.finish().expect("finish");
        assert_eq!(
            std::fs::read(&path).expect("read"),
            want,
            "{added} added first"
        );
    }
    let path = dir.join("short.gguf");
    let mut s = meta.stream_file(&path, &declared).expect("stream");
    assert!(s.put(&datas[0][1..]).is_err(), "wrong size");
    let mut s = meta.stream_file(&path, &declared).expect("stream");
    s.put(&datas[0]).expect("put");
    assert!(s.finish().is_err(), "tensors missing");
    let mut dup = declared.clone();
    dup.push(declared[0].clone());
    assert!(meta.stream_file(&path, &dup).is_err(), "duplicate name");
    std::fs::remove_dir_all(&dir).ok();
}
