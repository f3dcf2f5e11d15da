//! Gemma 3 prompts with BOS and the pieces of llama.cpp's greedy chains
//! (`shared/golden/gemma3-270m/greedy.jsonl`): tokenization with `add_special`, and
//! `token_to_piece` / the stream decoder on generated ids.

use std::path::PathBuf;

use flint_loader::gguf::GgufFile;
use flint_loader::tokenizer::{StreamDecoder, Tokenizer};

fn golden_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLINT_SHARED") {
        return PathBuf::from(p).join("golden/gemma3-270m/greedy.jsonl");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/gemma3-270m/greedy.jsonl")
}

#[test]
fn gemma3_greedy_prompts_and_pieces() {
    let path = flint_loader::fetch::default_model_path().expect("default model");
    let tok = Tokenizer::from_gguf(&GgufFile::open(&path).expect("open")).expect("tokenizer");
    let p = golden_path();
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut n = 0;
    for line in text.lines().filter(|l| !l.trim().is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("json");
        let prompt = v["prompt"].as_str().expect("prompt");
        let want: Vec<u32> = v["prompt_ids"]
            .as_array()
            .expect("prompt_ids")
            .iter()
            .map(|x| x.as_u64().expect("id") as u32)
            .collect();
        assert_eq!(tok.tokenize(prompt, true, false), want, "{prompt:?}");
        let mut dec = StreamDecoder::new();
        let mut streamed = String::new();
        let mut joined = String::new();
        for step in v["steps"].as_array().expect("steps") {
            let id = step["id"].as_u64().expect("id") as u32;
            let piece = step["piece"].as_str().expect("piece");
            let ours = tok.token_to_piece(id, true);
            assert_eq!(String::from_utf8_lossy(&ours), piece, "piece of {id}");
            streamed.push_str(&dec.push(&tok, id));
            joined.push_str(piece);
        }
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, joined, "stream of {prompt:?}");
        n += 1;
    }
    assert!(n >= 4);
}
