//! The tokenizers of the synthetic family files (`flint synth --vocab`: llama.cpp's
//! llama-bpe and qwen2 vocabularies and Gemma 3's, cut to 2048 ordinary tokens) give the
//! ids llama.cpp's `llama-tokenize` gave for the golden text
//! (`engine/tests/data/families/*/ids.json`, made by `tools/golden/dense_goldens.sh`;
//! the tokenizer is read from the committed llama-quantize'd file of each case; the
//! glm4moe cases' built-in vocabulary runs the `glm4` pre-tokenizer).

use std::path::PathBuf;

use flint_loader::gguf::GgufFile;
use flint_loader::tokenizer::Tokenizer;

#[test]
fn family_files_tokenize_the_golden_text_as_llamacpp() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../engine/tests/data/families");
    let mut checked = Vec::new();
    let mut entries: Vec<_> = std::fs::read_dir(&root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .map(|e| e.expect("dir entry").path())
        .collect();
    entries.sort();
    for dir in entries {
        // The Q8_0 file, else the Q4_K_M one (the MoE variants keep only that); cases
        // without quantized files (gemma3-tiny-27b) share their vocabulary settings with
        // a case that has them.
        let Some(model) = ["model-q8_0.gguf", "model-q4_k_m.gguf"]
            .iter()
            .map(|m| dir.join(m))
            .find(|m| m.is_file())
        else {
            continue;
        };
        let golden: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(dir.join("ids.json")).expect("ids.json"))
                .expect("json");
        let text = golden["text"].as_str().expect("text");
        let want: Vec<u32> = golden["ids"]
            .as_array()
            .expect("ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        let f = GgufFile::open(&model).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
        let tok = Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{}: {e}", model.display()));
        let got = tok.tokenize(text, true, false);
        assert!(got.len() >= want.len(), "{}: too few tokens", dir.display());
        let first_diff = got.iter().zip(&want).position(|(a, b)| a != b);
        assert_eq!(
            first_diff,
            None,
            "{}: ids differ from llama.cpp's from position {:?}",
            dir.display(),
            first_diff
        );
        checked.push(dir);
    }
    assert!(
        checked.len() >= 5,
        "only {} family cases found",
        checked.len()
    );
    let glm4 = checked
        .iter()
        .filter(|d| {
            d.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("glm4moe"))
        })
        .count();
    assert!(
        glm4 >= 2,
        "only {glm4} glm4moe cases (the glm4 pre-tokenizer) checked"
    );
}
