//! The real Gemma 3 270M file, when present (the default-model fetch puts it in the
//! cache; `FLINT_GEMMA_GGUF` overrides the path). Without it the test says so and passes.

use flint_core::GgmlType;
use flint_loader::gguf::GgufFile;

fn gemma_path() -> Option<std::path::PathBuf> {
    if let Ok(p) = std::env::var("FLINT_GEMMA_GGUF") {
        return Some(p.into());
    }
    let home = std::env::var_os("HOME")?;
    let p = std::path::Path::new(&home).join(".cache/flint/gemma-3-270m-q4_k_m.gguf");
    p.exists().then_some(p)
}

#[test]
fn gemma_file_parses() {
    let Some(path) = gemma_path() else {
        eprintln!("SKIPPED: Gemma 3 270M GGUF not found (set FLINT_GEMMA_GGUF)");
        return;
    };
    let f = GgufFile::open(&path).expect("open gemma");
    assert_eq!(f.tensors().len(), 236);
    assert_eq!(f.architecture().expect("arch"), "gemma3");
    let emb = f.tensor("token_embd.weight").expect("token_embd");
    assert_eq!(emb.ty, GgmlType::Q8_0);
    assert_eq!(emb.dims, vec![640, 262144]);
    assert_eq!(f.tensor_data(emb).len(), emb.n_bytes);
    let toks = f.get_str_array("tokenizer.ggml.tokens").expect("tokens");
    assert_eq!(toks.len(), 262144);
    let scores = f.get_f32_array("tokenizer.ggml.scores").expect("scores");
    assert_eq!(scores.len(), 262144);
    let types = f.get_i32_array("tokenizer.ggml.token_type").expect("types");
    assert_eq!(types.len(), 262144);
    // Tensor data ends inside the file, which has nothing past the last padded tensor.
    let end = f
        .tensors()
        .iter()
        .map(|t| t.start + t.n_bytes)
        .max()
        .expect("tensors");
    assert!(end <= f.len());
}

/// The huge-page copy holds the same bytes as the mapping, at offsets that keep every
/// tensor's alignment.
#[test]
fn gemma_file_copied_into_huge_pages_equals_the_mapping() {
    use flint_loader::gguf::{LoadMode, Residence};
    let Some(path) = gemma_path() else {
        eprintln!("SKIPPED: Gemma 3 270M GGUF not found (set FLINT_GEMMA_GGUF)");
        return;
    };
    let mapped = GgufFile::open_with(&path, LoadMode::Map, &mut |_, _| {}).expect("map");
    let mut last = (0, 0);
    let copied =
        GgufFile::open_with(&path, LoadMode::Copy, &mut |d, t| last = (d, t)).expect("copy");
    assert_eq!(mapped.residence(), Residence::Mapped);
    assert_eq!(copied.residence(), Residence::HugePages);
    assert_eq!(last, (mapped.len() as u64, mapped.len() as u64));
    assert!(
        mapped.as_bytes() == copied.as_bytes(),
        "the copy differs from the file"
    );
    for t in copied.tensors() {
        let data = copied.tensor_data(t);
        assert_eq!(data.as_ptr() as usize % copied.alignment(), 0, "{}", t.name);
    }
}
