//! Split models: a llama file written whole and split into shards the way llama.cpp's
//! `gguf-split` lays them out (all metadata in the first shard, `split.no`,
//! `split.count`, `split.tensors.count` in each), opened from the first shard; and one
//! test per cross-shard refusal.

use std::path::{Path, PathBuf};

use flint_core::GgmlType;
use flint_loader::config::ModelDesc;
use flint_loader::gguf::split::{split_path, SPLIT_COUNT, SPLIT_NO, SPLIT_TENSORS_COUNT};
use flint_loader::gguf::{GgufError, GgufFile, GgufWriter, Value};

struct Tensor {
    name: String,
    ty: GgmlType,
    dims: Vec<usize>,
    data: Vec<u8>,
}

fn metadata() -> Vec<(String, Value)> {
    let mut m = vec![("general.architecture".to_string(), Value::from("llama"))];
    for (k, v) in [
        ("context_length", Value::U32(64)),
        ("embedding_length", Value::U32(32)),
        ("block_count", Value::U32(2)),
        ("feed_forward_length", Value::U32(48)),
        ("attention.head_count", Value::U32(4)),
        ("attention.head_count_kv", Value::U32(2)),
        ("attention.layer_norm_rms_epsilon", Value::F32(1e-5)),
    ] {
        m.push((format!("llama.{k}"), v));
    }
    m
}

/// The tensors of a 2-layer llama, each with its own bytes (the embedding in Q8_0).
fn tensors() -> Vec<Tensor> {
    let (d, v, ff) = (32, 12, 48);
    let mut shapes: Vec<(String, Vec<usize>)> = vec![
        ("token_embd.weight".into(), vec![d, v]),
        ("output_norm.weight".into(), vec![d]),
        ("output.weight".into(), vec![d, v]),
        ("rope_freqs.weight".into(), vec![4]),
    ];
    for i in 0..2 {
        for (n, dims) in [
            ("attn_norm.weight", vec![d]),
            ("attn_q.weight", vec![d, d]),
            ("attn_k.weight", vec![d, 16]),
            ("attn_v.weight", vec![d, 16]),
            ("attn_output.weight", vec![d, d]),
            ("ffn_norm.weight", vec![d]),
            ("ffn_gate.weight", vec![d, ff]),
            ("ffn_up.weight", vec![d, ff]),
            ("ffn_down.weight", vec![ff, d]),
        ] {
            shapes.push((format!("blk.{i}.{n}"), dims));
        }
    }
    shapes
        .into_iter()
        .enumerate()
        .map(|(ti, (name, dims))| {
            let n: usize = dims.iter().product();
            if name == "token_embd.weight" {
                let bytes = n / 32 * 34;
                let data = (0..bytes).map(|i| (i * 7 + ti) as u8).collect();
                Tensor {
                    name,
                    ty: GgmlType::Q8_0,
                    dims,
                    data,
                }
            } else {
                let data = (0..n)
                    .flat_map(|i| (i as f32 * 0.5 + ti as f32).to_le_bytes())
                    .collect();
                Tensor {
                    name,
                    ty: GgmlType::F32,
                    dims,
                    data,
                }
            }
        })
        .collect()
}

fn add_tensor(w: &mut GgufWriter, t: &Tensor) {
    w.add_tensor(&t.name, t.ty, &t.dims, t.data.clone())
        .expect("tensor");
}

/// One shard as gguf-split writes it. `edit` may change its keys before writing.
struct Shard {
    keys: Vec<(String, Value)>,
    tensors: Vec<usize>,
}

/// Splits the model into `count` shards of consecutive tensors.
fn shards(count: usize) -> Vec<Shard> {
    let n = tensors().len();
    let per = n.div_ceil(count);
    (0..count)
        .map(|no| {
            let mut keys = if no == 0 { metadata() } else { Vec::new() };
            keys.push((SPLIT_NO.into(), Value::U16(no as u16)));
            keys.push((SPLIT_COUNT.into(), Value::U16(count as u16)));
            keys.push((SPLIT_TENSORS_COUNT.into(), Value::I32(n as i32)));
            Shard {
                keys,
                tensors: (no * per..((no + 1) * per).min(n)).collect(),
            }
        })
        .collect()
}

/// Writes the shards under `dir` as `model-0000i-of-0000N.gguf`; returns their paths.
fn write_shards(dir: &Path, shards: &[Shard]) -> Vec<PathBuf> {
    let all = tensors();
    let prefix = dir.join("model");
    let prefix = prefix.to_str().expect("utf-8 path");
    shards
        .iter()
        .enumerate()
        .map(|(no, s)| {
            let mut w = GgufWriter::new();
            for (k, v) in &s.keys {
                w.add(k, v.clone()).expect("key");
            }
            for &i in &s.tensors {
                add_tensor(&mut w, &all[i]);
            }
            let p = split_path(prefix, no, shards.len());
            w.write_file(&p).expect("write");
            p
        })
        .collect()
}

fn single(dir: &Path) -> PathBuf {
    let mut w = GgufWriter::new();
    for (k, v) in metadata() {
        w.add(&k, v).expect("key");
    }
    for t in &tensors() {
        add_tensor(&mut w, t);
    }
    let p = dir.join("single.gguf");
    w.write_file(&p).expect("write");
    p
}

#[test]
fn split_model_gives_the_single_files_tensors() {
    let dir = tempfile::tempdir().expect("tempdir");
    let whole = GgufFile::open(single(dir.path())).expect("single");
    assert_eq!(whole.shard_count(), 1);
    let paths = write_shards(dir.path(), &shards(3));
    assert!(paths[0].ends_with("model-00001-of-00003.gguf"));
    let split = GgufFile::open(&paths[0]).expect("split");
    assert_eq!(split.shard_count(), 3);
    let on_disk: u64 = paths
        .iter()
        .map(|p| std::fs::metadata(p).expect("size").len())
        .sum();
    assert_eq!(split.total_len(), on_disk);
    assert_eq!(whole.total_len(), whole.len() as u64);
    assert_eq!(split.tensors().len(), whole.tensors().len());
    for (a, b) in whole.tensors().iter().zip(split.tensors()) {
        assert_eq!((&a.name, a.ty, &a.dims), (&b.name, b.ty, &b.dims));
        assert_eq!(whole.tensor_data(a), split.tensor_data(b), "{}", a.name);
        let src = split.tensor_bytes(b);
        assert_eq!(
            &(*src.bytes).as_ref()[src.range.clone()],
            whole.tensor_data(a)
        );
        assert_eq!(split.tensor(&a.name), Some(b));
    }
    // Consecutive tensors per shard, as written.
    let per_shard: Vec<usize> = (0..3)
        .map(|s| split.tensors().iter().filter(|t| t.shard == s).count())
        .collect();
    assert_eq!(per_shard, vec![8, 8, 6]);
    // The whole file's tensors are all in its only shard.
    assert!(whole.tensors().iter().all(|t| t.shard == 0));
    // One description, the same from either.
    let a = ModelDesc::from_gguf(&whole).expect("single description");
    let b = ModelDesc::from_gguf(&split).expect("split description");
    assert_eq!(a, b);
    assert!(b.rope.freq_factors);
}

#[test]
fn each_shard_hands_its_own_pages_back() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_shards(dir.path(), &shards(2));
    let split = GgufFile::open(&paths[0]).expect("split");
    let last = split.tensors().last().expect("tensor");
    assert_eq!(last.shard, 1);
    let src = split.tensor_bytes(last);
    let before = (*src.bytes).as_ref()[src.range.clone()].to_vec();
    let release = src.release.expect("a mapped shard has a release hook");
    release(src.range.clone());
    // Still readable, unchanged, and from the second shard's bytes.
    assert_eq!((*src.bytes).as_ref()[src.range.clone()], before[..]);
    assert_eq!(split.tensor_data(last), &before[..]);
    assert_ne!(
        (*src.bytes).as_ref().len(),
        split.len(),
        "the tensor's bytes are its shard's, not the first file's"
    );
}

fn refused(path: &Path) -> GgufError {
    GgufFile::open(path).expect_err("must be refused")
}

#[test]
fn a_shard_other_than_the_first_is_refused_naming_the_first() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_shards(dir.path(), &shards(3));
    let e = refused(&paths[1]);
    assert!(matches!(
        e,
        GgufError::SplitNotFirst {
            no: 2,
            count: 3,
            ..
        }
    ));
    let msg = e.to_string();
    assert!(msg.contains("model-00001-of-00003.gguf"), "{msg}");
    assert!(msg.contains("is shard 2 of 3"), "{msg}");
}

#[test]
fn a_missing_shard_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_shards(dir.path(), &shards(3));
    std::fs::remove_file(&paths[2]).expect("remove");
    let e = refused(&paths[0]);
    assert!(matches!(e, GgufError::SplitMissingShard { no: 3, .. }));
    assert!(e.to_string().contains("model-00003-of-00003.gguf"), "{e}");
}

fn set(shard: &mut Shard, key: &str, v: Option<Value>) {
    shard.keys.retain(|(k, _)| k != key);
    if let Some(v) = v {
        shard.keys.push((key.to_string(), v));
    }
}

#[test]
fn split_count_must_agree() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = shards(3);
    set(&mut s[2], SPLIT_COUNT, Some(Value::U16(4)));
    let paths = write_shards(dir.path(), &s);
    let e = refused(&paths[0]);
    assert!(matches!(
        e,
        GgufError::SplitMismatch {
            key: SPLIT_COUNT,
            ..
        }
    ));
    let msg = e.to_string();
    assert!(
        msg.contains("model-00003-of-00003.gguf: split.count is 4, expected 3"),
        "{msg}"
    );
    // A shard without split keys at all is no shard of this split.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = shards(2);
    set(&mut s[1], SPLIT_COUNT, None);
    let paths = write_shards(dir.path(), &s);
    let e = refused(&paths[0]);
    assert!(
        e.to_string().contains("split.count is absent, expected 2"),
        "{e}"
    );
}

#[test]
fn split_no_must_match_the_name() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = shards(3);
    set(&mut s[1], SPLIT_NO, Some(Value::U16(2)));
    let paths = write_shards(dir.path(), &s);
    let e = refused(&paths[0]);
    assert!(
        e.to_string()
            .contains("model-00002-of-00003.gguf: split.no is 2, expected 1"),
        "{e}"
    );
    // The first shard's own number must be below the count.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = shards(2);
    set(&mut s[0], SPLIT_NO, Some(Value::U16(5)));
    let paths = write_shards(dir.path(), &s);
    let e = refused(&paths[0]);
    assert!(e.to_string().contains("split.no is 5"), "{e}");
}

#[test]
fn split_tensor_count_must_equal_the_total() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = shards(3);
    set(&mut s[1], SPLIT_TENSORS_COUNT, Some(Value::I32(21)));
    let paths = write_shards(dir.path(), &s);
    let e = refused(&paths[0]);
    assert!(
        e.to_string()
            .contains("model-00002-of-00003.gguf: split.tensors.count is 21, expected 22"),
        "{e}"
    );
    // A tensor left out of every shard: the first shard's count no longer matches.
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = shards(3);
    s[2].tensors.pop();
    let paths = write_shards(dir.path(), &s);
    let e = refused(&paths[0]);
    assert!(
        e.to_string()
            .contains("model-00001-of-00003.gguf: split.tensors.count is 22, expected 21"),
        "{e}"
    );
}

#[test]
fn a_tensor_in_two_shards_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut s = shards(3);
    let dup = s[0].tensors[3];
    s[2].tensors.push(dup);
    let paths = write_shards(dir.path(), &s);
    let e = refused(&paths[0]);
    assert!(matches!(e, GgufError::SplitDuplicateTensor { .. }));
    let msg = e.to_string();
    assert!(
        msg.contains("tensor 'rope_freqs.weight' is in two shards")
            && msg.contains("00001-of-00003")
            && msg.contains("00003-of-00003"),
        "{msg}"
    );
}

#[test]
fn an_invalid_shard_is_named() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_shards(dir.path(), &shards(2));
    let bytes = std::fs::read(&paths[1]).expect("read");
    std::fs::write(&paths[1], &bytes[..bytes.len() - 8]).expect("truncate");
    let e = refused(&paths[0]);
    assert!(matches!(e, GgufError::SplitShard { .. }));
    let msg = e.to_string();
    assert!(
        msg.starts_with("shard ") && msg.contains("model-00002-of-00002.gguf"),
        "{msg}"
    );
}

#[test]
fn a_first_shard_with_another_name_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_shards(dir.path(), &shards(2));
    let renamed = dir.path().join("model.gguf");
    std::fs::rename(&paths[0], &renamed).expect("rename");
    let e = refused(&renamed);
    assert!(matches!(e, GgufError::SplitName { count: 2, .. }));
    assert!(e.to_string().contains("-00001-of-00002.gguf"), "{e}");
}

#[test]
fn a_shard_given_as_bytes_is_refused() {
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_shards(dir.path(), &shards(2));
    let e = GgufFile::from_bytes(std::fs::read(&paths[0]).expect("read")).expect_err("shard");
    assert!(matches!(e, GgufError::SplitInMemory { no: 1, count: 2 }));
    // split.count = 1 is a whole model in one file.
    let dir = tempfile::tempdir().expect("tempdir");
    let paths = write_shards(dir.path(), &shards(1));
    let f = GgufFile::open(&paths[0]).expect("one shard");
    assert_eq!((f.shard_count(), f.tensors().len()), (1, 22));
}
