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
