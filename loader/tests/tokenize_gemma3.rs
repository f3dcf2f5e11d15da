//! Gemma 3 (SentencePiece-style) against llama.cpp's token ids in
//! `shared/golden/gemma3-270m/tokenize.jsonl`, with the model obtained through the
//! default-model mechanism (fetched when the cache is fresh).

use std::path::PathBuf;

use flint_loader::gguf::GgufFile;
use flint_loader::tokenizer::{StreamDecoder, TokenAttr, Tokenizer};

fn golden_path() -> PathBuf {
    if let Some(p) = std::env::var_os("FLINT_SHARED") {
        return PathBuf::from(p).join("golden/gemma3-270m/tokenize.jsonl");
    }
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../shared/golden/gemma3-270m/tokenize.jsonl")
}

fn tokenizer() -> Tokenizer {
    let path = flint_loader::fetch::default_model_path().expect("default model");
    let f = GgufFile::open(&path).expect("open gguf");
    Tokenizer::from_gguf(&f).expect("tokenizer")
}

fn golden() -> Vec<(String, Vec<u32>)> {
    let p = golden_path();
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            let t = v["text"].as_str().expect("text").to_owned();
            let ids = v["ids"]
                .as_array()
                .expect("ids")
                .iter()
                .map(|x| x.as_u64().expect("id") as u32)
                .collect();
            (t, ids)
        })
        .collect()
}

#[test]
fn gemma3_reproduces_every_golden_line() {
    let tok = tokenizer();
    let lines = golden();
    assert_eq!(lines.len(), 30, "golden file changed size");
    let mut bad = Vec::new();
    for (text, ids) in &lines {
        let got = tok.tokenize(text, false, false);
        if &got != ids {
            bad.push(format!("{text:?}\n  want {ids:?}\n  got  {got:?}"));
        }
    }
    assert!(
        bad.is_empty(),
        "{} mismatches:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn gemma3_special_ids_and_flags() {
    let tok = tokenizer();
    assert_eq!(tok.n_vocab(), 262_144);
    assert_eq!(tok.bos(), Some(2));
    assert_eq!(tok.eos(), Some(1));
    assert_eq!(tok.unk(), Some(3));
    assert_eq!(tok.eot(), tok.token_id("<end_of_turn>"));
    assert_eq!(tok.eot(), Some(106));
    assert!(tok.is_eog(1) && tok.is_eog(106));
    assert!(!tok.is_eog(2));
    assert!(tok.add_bos());
    assert!(!tok.add_space_prefix());
    assert!(tok.token_attr(105).has(TokenAttr::CONTROL));
    assert!(tok.token_attr(217).has(TokenAttr::USER_DEFINED));
    // BOS only when asked for.
    assert_eq!(
        tok.tokenize("Hello world", true, false),
        vec![2, 9259, 1902]
    );
    // Control-token text becomes the token only with parse_special.
    assert_eq!(
        tok.tokenize("<start_of_turn>user\nHi<end_of_turn>", false, true),
        vec![105, 2364, 107, 10979, 106]
    );
}

#[test]
fn gemma3_round_trips_and_streams() {
    let tok = tokenizer();
    for (text, ids) in golden() {
        assert_eq!(
            tok.detokenize(&ids, false, false),
            text,
            "whole decode of {text:?}"
        );
        let mut dec = StreamDecoder::new();
        let mut streamed = String::new();
        for &id in &ids {
            let piece = dec.push(&tok, id);
            streamed.push_str(&piece);
        }
        streamed.push_str(&dec.finish());
        assert_eq!(streamed, text, "streamed decode of {text:?}");
    }
    // An emoji that only exists as byte tokens: no partial character ever comes out.
    let ids = tok.tokenize("\u{1FAE8}", false, false);
    assert!(ids.len() > 1, "expected byte fallback, got {ids:?}");
    let mut dec = StreamDecoder::new();
    let mut out = Vec::new();
    for &id in &ids {
        out.push(dec.push(&tok, id));
    }
    assert!(out[..out.len() - 1].iter().all(String::is_empty), "{out:?}");
    assert_eq!(out.last().map(String::as_str), Some("\u{1FAE8}"));
}
