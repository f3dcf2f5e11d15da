//! Reader validation and the typed getters.

mod gguf_common;

use flint_loader::gguf::{GgufError, GgufFile, GgufWriter, Value};
use gguf_common::{bad_files, raw, sample_bytes};

#[test]
fn every_bad_file_is_refused_with_a_named_cause() {
    for (name, bytes, fragment) in bad_files() {
        match GgufFile::from_bytes(bytes) {
            Ok(_) => panic!("{name}: accepted"),
            Err(e) => {
                let msg = e.to_string();
                assert!(
                    msg.contains(fragment),
                    "{name}: message {msg:?} lacks {fragment:?}"
                );
            }
        }
    }
}

#[test]
fn counts_are_bounded_before_allocation() {
    // A tensor count of 2^63 over an 8-byte tail must be refused by the count check,
    // not by an allocation failure (which would abort the process).
    let f = raw::file(3, 1 << 63, 0, &[], &[], 1, &[0; 8]);
    assert!(matches!(
        GgufFile::from_bytes(f),
        Err(GgufError::CountTooLarge { .. })
    ));
}

#[test]
fn version_2_is_read() {
    let mut f = sample_bytes();
    f[4..8].copy_from_slice(&2u32.to_le_bytes());
    let g = GgufFile::from_bytes(f).expect("v2");
    assert_eq!(g.version(), 2);
}

#[test]
fn file_without_tensors_or_padding_is_read() {
    let f = raw::file(3, 0, 1, &[raw::kv_u32("a", 1)], &[], 1, &[]);
    let g = GgufFile::from_bytes(f).expect("parse");
    assert!(g.tensors().is_empty());
    assert_eq!(g.get_u32("a").expect("a"), 1);
}

fn getters_file() -> GgufFile {
    let mut w = GgufWriter::new();
    w.add("u8", 7u8).expect("k");
    w.add("i32_neg", -5i32).expect("k");
    w.add("i32_pos", 5i32).expect("k");
    w.add("u64_big", u64::MAX).expect("k");
    w.add("u64_small", 12u64).expect("k");
    w.add("f32", 0.25f32).expect("k");
    w.add("f64", 0.5f64).expect("k");
    w.add("bool", true).expect("k");
    w.add("str", "hello").expect("k");
    w.add("strs", vec!["a", "b"]).expect("k");
    w.add("f32s", vec![1.0f32, 2.0]).expect("k");
    w.add("i32s", vec![-1i32, 2]).expect("k");
    w.add("u32s", vec![1u32, 2]).expect("k");
    w.add("i64s_big", vec![1i64 << 40]).expect("k");
    w.add("bools", vec![true, false]).expect("k");
    GgufFile::from_bytes(w.to_bytes()).expect("parse")
}

#[test]
fn integer_getters_accept_any_width_that_fits() {
    let f = getters_file();
    assert_eq!(f.get_u32("u8").expect("u8"), 7);
    assert_eq!(f.get_u32("i32_pos").expect("i32"), 5);
    assert_eq!(f.get_u32("u64_small").expect("u64"), 12);
    assert_eq!(f.get_i32("i32_neg").expect("i32"), -5);
    assert_eq!(f.get_u64("u64_big").expect("u64"), u64::MAX);
    assert_eq!(f.get_usize("u64_small").expect("usize"), 12);
    assert_eq!(f.get_i64("u8").expect("i64"), 7);
}

#[test]
fn getter_errors_name_the_key() {
    let f = getters_file();
    let e = f.get_u32("i32_neg").expect_err("negative");
    assert!(matches!(e, GgufError::OutOfRange { .. }));
    assert!(e.to_string().contains("'i32_neg'"), "{e}");
    let e = f.get_u32("u64_big").expect_err("too big");
    assert!(e.to_string().contains("'u64_big'"), "{e}");
    let e = f.get_u32("missing.key").expect_err("missing");
    assert!(matches!(e, GgufError::MissingKey { .. }));
    assert!(e.to_string().contains("'missing.key'"), "{e}");
    let e = f.get_str("u8").expect_err("type");
    assert!(
        e.to_string().contains("'u8'") && e.to_string().contains("string"),
        "{e}"
    );
    let e = f.get_f32("str").expect_err("type");
    assert!(e.to_string().contains("'str'"), "{e}");
    let e = f.get_str_array("f32s").expect_err("type");
    assert!(e.to_string().contains("array[f32]"), "{e}");
    let e = f.get_i32_array("i64s_big").expect_err("range");
    assert!(e.to_string().contains("'i64s_big'"), "{e}");
    assert!(f.get_bool("u8").is_err());
    assert!(f.get_bool_array("strs").is_err());
}

#[test]
fn value_getters() {
    let f = getters_file();
    assert_eq!(f.get_f32("f32").expect("f32"), 0.25);
    assert_eq!(f.get_f32("f64").expect("f64"), 0.5);
    assert_eq!(f.get_f64("f32").expect("f64"), 0.25);
    assert!(f.get_bool("bool").expect("bool"));
    assert_eq!(f.get_str("str").expect("str"), "hello");
    assert_eq!(f.get_str_array("strs").expect("strs"), ["a", "b"]);
    assert_eq!(&*f.get_f32_array("f32s").expect("f32s"), &[1.0, 2.0]);
    assert_eq!(&*f.get_i32_array("i32s").expect("i32s"), &[-1, 2]);
    assert_eq!(&*f.get_i32_array("u32s").expect("u32s as i32"), &[1, 2]);
    assert_eq!(&*f.get_u32_array("u32s").expect("u32s"), &[1, 2]);
    assert_eq!(f.get_bool_array("bools").expect("bools"), &[true, false]);
    assert_eq!(f.get_array("strs").expect("arr").len(), 2);
    assert_eq!(f.get("bool"), Some(&Value::Bool(true)));
}

#[test]
fn optional_getters() {
    let f = getters_file();
    assert_eq!(f.opt_u32("nope").expect("absent"), None);
    assert_eq!(f.opt_u32("u8").expect("present"), Some(7));
    assert!(f.opt_u32("str").is_err());
    assert_eq!(f.opt_str("str").expect("s"), Some("hello"));
    assert_eq!(f.opt_f32("nope").expect("absent"), None);
    assert_eq!(f.opt_bool("bool").expect("b"), Some(true));
    assert!(f.opt_str_array("nope").expect("absent").is_none());
    assert!(f.opt_f32_array("f32s").expect("f").is_some());
    assert!(f.opt_i32_array("nope").expect("absent").is_none());
    assert!(f.opt_bool_array("bools").expect("b").is_some());
    assert!(f.opt_array("strs").expect("a").is_some());
    assert_eq!(f.opt_usize("u64_small").expect("u"), Some(12));
    assert_eq!(f.opt_u64("nope").expect("absent"), None);
    assert_eq!(f.opt_i32("i32_neg").expect("i"), Some(-5));
}

#[test]
fn long_arrays_are_summarised() {
    let mut w = GgufWriter::new();
    w.add("v", (0..1000u32).collect::<Vec<_>>()).expect("k");
    w.add("s", vec!["a"; 100]).expect("k");
    let f = GgufFile::from_bytes(w.to_bytes()).expect("parse");
    let s = f.get("v").expect("v").summary(3).to_string();
    assert_eq!(s, "[0, 1, 2, ... (1000 total)]");
    let s = f.get("s").expect("s").summary(2).to_string();
    assert_eq!(s, "[\"a\", \"a\", ... (100 total)]");
}

/// The committed corpus `tests/data/bad/` (used by the CLI tests and as fuzz seeds) is
/// exactly what [`bad_files`] generates; `FLINT_REGEN_BAD_GGUF=1` rewrites it.
#[test]
fn bad_corpus_on_disk_matches_generator() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/bad");
    let regen = std::env::var("FLINT_REGEN_BAD_GGUF").is_ok_and(|v| v == "1");
    let mut manifest = String::from("# file\tfragment the error message must contain\n");
    if regen {
        std::fs::create_dir_all(&dir).expect("create corpus dir");
    }
    for (name, bytes, fragment) in bad_files() {
        manifest.push_str(&format!("{name}\t{fragment}\n"));
        let path = dir.join(name);
        if regen {
            std::fs::write(&path, &bytes).expect("write corpus file");
        } else {
            let on_disk = std::fs::read(&path).unwrap_or_else(|e| {
                panic!("{}: {e} (run with FLINT_REGEN_BAD_GGUF=1)", path.display())
            });
            assert_eq!(
                on_disk, bytes,
                "{name} is stale (run with FLINT_REGEN_BAD_GGUF=1)"
            );
        }
    }
    // A valid file with metadata of every type and several tensor types: fuzz seed and
    // CLI test input.
    let sample = dir.join("../sample.gguf");
    if regen {
        std::fs::write(&sample, sample_bytes()).expect("write sample");
    } else {
        let on_disk = std::fs::read(&sample).expect("tests/data/sample.gguf");
        assert_eq!(on_disk, sample_bytes(), "sample.gguf is stale");
    }
    let mpath = dir.join("MANIFEST.tsv");
    if regen {
        std::fs::write(&mpath, &manifest).expect("write manifest");
    } else {
        let on_disk = std::fs::read_to_string(&mpath).expect("MANIFEST.tsv");
        assert_eq!(on_disk, manifest, "MANIFEST.tsv is stale");
    }
}
