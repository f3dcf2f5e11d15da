//! SentencePiece-style BPE, the `gemma4` tokenizer model, as llama.cpp runs it
//! (`llm_tokenizer_bpe_session` with the `gemma4` pre-tokenizer): spaces become `▁`,
//! the text is cut only between runs of newlines and runs of other characters, and each
//! piece is merged by merge rank over its raw UTF-8 characters (no GPT-2 byte stand-ins).
//! A run of newlines that is a token by itself stays whole. A final symbol that is not a
//! token becomes the `<0xXX>` tokens of its bytes (bytes without one are dropped).

use super::bpe::Session;
use super::{PreTokenizer, Tokenizer};

/// Tokenizes one raw text fragment, appending to `out`.
pub(crate) fn tokenize(tok: &Tokenizer, text: &str, out: &mut Vec<u32>) {
    let mut session = Session::default();
    for word in PreTokenizer::Gemma4.split(text) {
        let escaped = word.replace(' ', "\u{2581}");
        let w = escaped.as_bytes();
        let whole = w.iter().all(|&b| b == b'\n') && tok.index.find(w).is_some();
        session.merge(tok, w, whole);
        for &(a, b) in &session.pieces {
            let piece = &w[a..b];
            match tok.index.find(piece) {
                Some(id) => out.push(id),
                None => out.extend(piece.iter().filter_map(|&b| tok.byte_token(b))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::tokenizer::{Tokenizer, TokenizerConfig};

    fn tok() -> Tokenizer {
        let tokens: Vec<String> = [
            "<pad>",
            "\n",
            "\n\n\n",
            "a",
            "\u{2581}",
            "\u{2581}a",
            "<0x62>",
        ]
        .map(String::from)
        .to_vec();
        let cfg = TokenizerConfig {
            model: "gemma4".into(),
            tokens,
            merges: Some(vec!["\u{2581} a".into()]),
            token_types: Some(vec![3, 1, 1, 1, 1, 1, 6]),
            add_bos: Some(false),
            ..TokenizerConfig::default()
        };
        Tokenizer::from_config(&cfg).expect("gemma4 tokenizer")
    }

    #[test]
    fn newline_runs_spaces_and_byte_fallback() {
        let t = tok();
        // A run of newlines that is a token stays whole; one that is not is cut into
        // characters (no merges here).
        assert_eq!(t.tokenize("\n\n\n", false, false), [2]);
        assert_eq!(t.tokenize("\n\n", false, false), [1, 1]);
        // Spaces become `▁` and merge; `b` has only its byte token, `c` has none.
        assert_eq!(t.tokenize("a a\nbc", false, false), [3, 5, 1, 6]);
        assert_eq!(t.detokenize(&[3, 5, 1, 6], false, false), "a a\nb");
        // llama.cpp adds BOS for Gemma 4 whatever the key says (here no BOS id is set).
        assert!(t.add_bos());
    }
}
