//! A tokenizer configuration written into a GGUF with the crate's writer and read back
//! through `Tokenizer::from_gguf` tokenizes the same (the path a synthetic model takes).

use flint_loader::gguf::{GgufFile, GgufWriter};
use flint_loader::tokenizer::{byte_to_char, PreTokenizer, Tokenizer, TokenizerConfig};

fn small_bpe() -> TokenizerConfig {
    // 256 byte tokens, a few merges, one control token.
    let mut tokens: Vec<String> = (0..=255u8).map(|b| byte_to_char(b).to_string()).collect();
    let sp = byte_to_char(b' ');
    let merges = vec![
        format!("{sp} t"),
        "h e".to_string(),
        format!("{sp}t he"),
        "i s".to_string(),
    ];
    for m in &merges {
        tokens.push(m.replace(' ', ""));
    }
    tokens.push("<|end|>".into());
    let end = tokens.len() as u32 - 1;
    TokenizerConfig::bpe(PreTokenizer::Gpt2, tokens, merges, None, Some(end))
}

#[test]
fn tokenizer_metadata_round_trips_through_gguf() {
    let cfg = small_bpe();
    let mut w = GgufWriter::new();
    w.add("general.architecture", "flint".to_string())
        .expect("arch");
    for (k, v) in cfg.to_metadata() {
        w.add(&k, v).expect("add key");
    }
    let f = GgufFile::from_bytes(w.to_bytes()).expect("read back");
    let back = TokenizerConfig::from_gguf(&f).expect("config");
    assert_eq!(back, cfg);
    let a = Tokenizer::from_config(&cfg).expect("direct");
    let b = Tokenizer::from_gguf(&f).expect("from gguf");
    let text = "the thesis is this<|end|>";
    let ids = b.tokenize(text, false, true);
    assert_eq!(a.tokenize(text, false, true), ids);
    // " the" is one merged token; "<|end|>" is the control token.
    assert!(ids.contains(&(256 + 2)), "{ids:?}");
    assert_eq!(ids.last().copied(), b.eos());
    assert_eq!(b.detokenize(&ids, false, false), "the thesis is this");
}

#[test]
fn missing_keys_are_named() {
    let mut w = GgufWriter::new();
    w.add("tokenizer.ggml.model", "llama".to_string())
        .expect("model");
    let f = GgufFile::from_bytes(w.to_bytes()).expect("read back");
    let e = Tokenizer::from_gguf(&f).expect_err("no tokens").to_string();
    assert!(e.contains("tokenizer.ggml.tokens"), "{e}");
    let f = GgufFile::from_bytes(GgufWriter::new().to_bytes()).expect("empty");
    let e = Tokenizer::from_gguf(&f).expect_err("no model").to_string();
    assert!(e.contains("tokenizer.ggml.model"), "{e}");
}
