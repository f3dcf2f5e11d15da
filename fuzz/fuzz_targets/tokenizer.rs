//! Fuzz target: a tokenizer built from hostile GGUF metadata (any token texts, merges,
//! scores, token types and special ids) must be built or refused with an error, never a
//! panic; a tokenizer that is built must tokenize any text (special-token parsing on and
//! off) into ids inside its vocabulary and turn any ids, in range or not, back into text
//! without a panic, an out-of-memory abort or a hang. Byte-level BPE keeps every byte
//! (each of the 256 byte tokens is in the vocabulary here), so its tokens' pieces must
//! give the text back exactly; SentencePiece-style BPE (`gemma4`) is only run.
//!
//! Input layout (one line each, `\n`-separated): byte 0 picks the model (`llama` SPM or
//! `gpt2` BPE) and the pre-tokenizer; line 1 is the text; every further line is a token
//! text, or a merge when it starts with `m `. Scores, types and special ids come from the
//! line numbers and bytes, so that every field sees odd values (NaN scores, unknown
//! types, ids past the vocabulary).
//!
//! Run (nightly): `cargo +nightly fuzz run tokenizer` from `fuzz/` (see docs/gguf.md).

#![no_main]

use flint_loader::tokenizer::{PreTokenizer, Tokenizer, TokenizerConfig};
use libfuzzer_sys::fuzz_target;

/// GPT-2's printable stand-in for each byte (`bytes_to_unicode`), so that the BPE
/// vocabulary can hold all 256 byte tokens.
fn byte_token(b: u8) -> String {
    let c = b as u32;
    let printable = (33..=126).contains(&c) || (161..=172).contains(&c) || (174..=255).contains(&c);
    if printable {
        char::from_u32(c).map(String::from).unwrap_or_default()
    } else {
        let offset = (0..c)
            .filter(|&x| !((33..=126).contains(&x) || (161..=172).contains(&x) || (174..=255).contains(&x)))
            .count() as u32;
        char::from_u32(256 + offset).map(String::from).unwrap_or_default()
    }
}

fuzz_target!(|data: &[u8]| {
    let Some((&head, rest)) = data.split_first() else {
        return;
    };
    let mut lines = rest.split(|&b| b == b'\n');
    let text = String::from_utf8_lossy(lines.next().unwrap_or(&[])).into_owned();
    let mut tokens = Vec::new();
    let mut merges = Vec::new();
    for l in lines.take(4096) {
        let s = String::from_utf8_lossy(l).into_owned();
        match s.strip_prefix("m ") {
            Some(m) => merges.push(m.to_owned()),
            None => tokens.push(s),
        }
    }
    let spm = head & 1 == 1;
    let pre = [
        PreTokenizer::Default,
        PreTokenizer::Gpt2,
        PreTokenizer::Llama3,
        PreTokenizer::Qwen2,
        PreTokenizer::Qwen35,
        PreTokenizer::Gpt4o,
        PreTokenizer::Gemma4,
        PreTokenizer::Glm4,
        PreTokenizer::DeepSeekLlm,
        PreTokenizer::DeepSeekV3,
    ][(head as usize >> 1) % 10];
    let mut cfg = if spm {
        TokenizerConfig {
            model: "llama".into(),
            ..TokenizerConfig::default()
        }
    } else {
        // Every byte first (a byte-level BPE vocabulary has them all), then the input's.
        let mut all: Vec<String> = (0..=255u8).map(byte_token).collect();
        all.extend(tokens.iter().cloned());
        tokens = all;
        TokenizerConfig::bpe(pre, Vec::new(), merges.clone(), None, None)
    };
    let n = tokens.len() as u32;
    cfg.scores = Some(
        (0..tokens.len())
            .map(|i| match (i + head as usize) % 7 {
                0 => f32::NAN,
                1 => f32::NEG_INFINITY,
                _ => -(i as f32) * 0.5,
            })
            .collect(),
    );
    // Types 0..=7: every GGUF token type and a couple of unknown ones; or all normal
    // (the BPE round trip is checked then: a byte or control token among the merges'
    // results would rightly render as something else).
    let all_normal = head & 0x30 == 0;
    cfg.token_types = Some(
        (0..tokens.len())
            .map(|i| {
                if all_normal || (i < 256 && !spm) {
                    1
                } else {
                    ((i + head as usize / 8) % 8) as i32
                }
            })
            .collect(),
    );
    cfg.tokens = tokens;
    let id = |k: u32| Some((head as u32).wrapping_mul(k) % (n + 3));
    cfg.bos = id(3);
    cfg.eos = id(5);
    cfg.unk = id(7);
    cfg.add_bos = Some(head & 2 == 2);
    cfg.add_space_prefix = Some(head & 4 == 4);
    let Ok(tok) = Tokenizer::from_config(&cfg) else {
        return;
    };
    let nv = tok.n_vocab() as u32;
    for parse_special in [false, true] {
        let ids = tok.tokenize(&text, false, parse_special);
        assert!(ids.iter().all(|&i| i < nv), "id past the vocabulary");
        let _ = tok.detokenize(&ids, false, parse_special);
        if !spm && pre.byte_level() && !parse_special && all_normal {
            // Byte-level BPE with no special tokens in play: the pieces give every byte
            // back (`detokenize` itself may clean spaces before punctuation, as
            // llama.cpp does for some vocabularies).
            let pieces: Vec<u8> = ids
                .iter()
                .flat_map(|&i| tok.token_to_piece(i, false).into_owned())
                .collect();
            assert_eq!(pieces, text.as_bytes(), "BPE round trip");
        }
    }
    // Any ids, in range or not.
    let ids: Vec<u32> = data.iter().map(|&b| (b as u32) * 3 % (nv + 10)).collect();
    let _ = tok.detokenize(&ids, true, true);
    for &i in ids.iter().take(64) {
        let _ = tok.token_to_piece(i, true);
    }
});
