//! Vocabularies of synthetic checkpoints.
//!
//! - [`build_vocab`]: a byte-level BPE learnt from a short English text, then grown with
//!   seeded random merges to the size asked for. Needs no file and no network.
//! - [`truncated_tokenizer`]: the tokenizer of a real GGUF (a `ggml-vocab-*.gguf` of
//!   llama.cpp's sources, or any model file), cut down so test files stay small: the first
//!   `n` ordinary tokens by id, every other token (control, user-defined, byte, unknown,
//!   unused, and any token a `*_token_id` key names) and, in SentencePiece vocabularies,
//!   the single ASCII characters (Gemma lists them last) survive, in their original order,
//!   renumbered densely; the id keys follow their tokens; BPE merges survive only when
//!   both parts and the result do; arrays with one entry per token (scores, types) are cut
//!   the same way; every other `tokenizer.*` key (the chat template among them) is copied.

use std::collections::{HashMap, HashSet};

use flint_loader::gguf::{Array, GgufFile, Value};
use flint_loader::tokenizer::keys;

use super::SynthError;
use crate::sample::Rng;

/// English text the BPE merges are learnt from (our own words; any text would do).
const CORPUS: &str = "The capital of France is Paris. The engine reads a model file, \
stages the weights on a device and runs the forward pass one token after another. \
A tokenizer splits the text into words and merges the most frequent pairs of symbols. \
Once upon a time there was a small model that wanted to write stories about the sea, \
the mountains and the people who lived between them. It learned numbers like 1, 2, 3, \
10, 42 and 2024, and punctuation such as commas, periods, questions? and answers! \
Every layer has attention and a feed forward network; some layers look at the whole \
context while others only see a sliding window of recent positions. Experts are chosen \
by a router, and a shared expert is always on. This is the end of the text, and the \
beginning of another one: hello world, good morning, thank you very much.";

/// A byte-level BPE vocabulary: the tokens (in GPT-2's printable byte stand-ins) and
/// the merges in rank order.
#[derive(Clone, Debug)]
pub struct SynthVocab {
    /// Token texts; ids are indices.
    pub tokens: Vec<String>,
    /// llama.cpp token types (1 normal, 3 control).
    pub types: Vec<i32>,
    /// `"a b"` merge rules by rank.
    pub merges: Vec<String>,
    /// BOS id.
    pub bos: u32,
    /// EOS id.
    pub eos: u32,
}

/// GPT-2's byte → printable char mapping.
fn byte_char(b: u8) -> char {
    let printable =
        (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || (0xAE..=0xFF).contains(&b);
    if printable {
        return b as char;
    }
    // Non-printable bytes map, in order, to U+0100 and up.
    let mut n = 0u32;
    for c in 0u8..b {
        let p =
            (b'!'..=b'~').contains(&c) || (0xA1..=0xAC).contains(&c) || (0xAE..=0xFF).contains(&c);
        if !p {
            n += 1;
        }
    }
    char::from_u32(256 + n).unwrap_or('?')
}

/// Builds a byte-level BPE vocabulary of `size` tokens: 3 specials, 256 bytes, merges
/// learnt from [`CORPUS`] by pair frequency, then (to reach the size) merges of pairs of
/// earlier tokens drawn by a seeded PRNG. Every merge joins two existing tokens into a
/// new one, so the tokenizer built from it is a valid BPE.
pub fn build_vocab(size: usize, seed: u64) -> SynthVocab {
    let mut tokens: Vec<String> = vec!["<pad>".into(), "<bos>".into(), "<eos>".into()];
    let mut types = vec![3, 3, 3];
    for b in 0..=255u8 {
        tokens.push(byte_char(b).to_string());
        types.push(1);
    }
    let mut known: HashSet<String> = tokens.iter().cloned().collect();
    let mut merges = Vec::new();
    // Words as GPT-2 sees them: a leading space belongs to the word.
    let mut words: HashMap<Vec<String>, usize> = HashMap::new();
    for (i, w) in CORPUS.split(' ').enumerate() {
        let text = if i == 0 {
            w.to_string()
        } else {
            format!(" {w}")
        };
        let syms: Vec<String> = text.bytes().map(|b| byte_char(b).to_string()).collect();
        *words.entry(syms).or_insert(0) += 1;
    }
    let mut words: Vec<(Vec<String>, usize)> = words.into_iter().collect();
    words.sort();
    while tokens.len() < size {
        let mut counts: HashMap<(String, String), usize> = HashMap::new();
        for (w, n) in &words {
            for p in w.windows(2) {
                *counts.entry((p[0].clone(), p[1].clone())).or_insert(0) += n;
            }
        }
        // Most frequent pair; ties broken by the pair's text for determinism.
        let Some(best) = counts
            .into_iter()
            .max_by(|a, b| a.1.cmp(&b.1).then_with(|| b.0.cmp(&a.0)))
            .map(|(p, _)| p)
        else {
            break;
        };
        let joined = format!("{}{}", best.0, best.1);
        for (w, _) in words.iter_mut() {
            let mut i = 0;
            while i + 1 < w.len() {
                if w[i] == best.0 && w[i + 1] == best.1 {
                    w[i] = joined.clone();
                    w.remove(i + 1);
                }
                i += 1;
            }
        }
        merges.push(format!("{} {}", best.0, best.1));
        if known.insert(joined.clone()) {
            tokens.push(joined);
            types.push(1);
        }
    }
    let mut rng = Rng::new(seed ^ 0x5eed_b0c5);
    let first_normal = 3;
    let mut tries = 0usize;
    while tokens.len() < size && tries < size * 100 {
        tries += 1;
        let n = tokens.len() - first_normal;
        let a = first_normal + (rng.next_u64() % n as u64) as usize;
        let b = first_normal + (rng.next_u64() % n as u64) as usize;
        let joined = format!("{}{}", tokens[a], tokens[b]);
        if joined.chars().count() > 16 || known.contains(&joined) {
            continue;
        }
        merges.push(format!("{} {}", tokens[a], tokens[b]));
        known.insert(joined.clone());
        tokens.push(joined);
        types.push(1);
    }
    SynthVocab {
        tokens,
        types,
        merges,
        bos: 1,
        eos: 2,
    }
}

/// The `tokenizer.*` metadata of `file` with its vocabulary cut to the first `n_ordinary`
/// ordinary tokens plus every other token (see the module docs), in the file's key order.
/// Returns the entries and the new vocabulary size.
pub fn truncated_tokenizer(
    file: &GgufFile,
    n_ordinary: usize,
) -> Result<(Vec<(String, Value)>, usize), SynthError> {
    let err = |e: flint_loader::gguf::GgufError| SynthError(format!("vocabulary file: {e}"));
    let tokens = file.get_str_array(keys::TOKENS).map_err(err)?;
    let n = tokens.len();
    let types = file.opt_i32_array(keys::TOKEN_TYPE).map_err(err)?;
    if let Some(t) = &types {
        if t.len() != n {
            return Err(SynthError(format!(
                "vocabulary file: {} has {} entries for {n} tokens",
                keys::TOKEN_TYPE,
                t.len()
            )));
        }
    }
    let is_id_key = |k: &str| k.starts_with("tokenizer.") && k.ends_with("_token_id");
    let mut keep = vec![false; n];
    for (k, v) in file.metadata() {
        if is_id_key(k) {
            let id = v
                .as_i128()
                .and_then(|i| usize::try_from(i).ok())
                .filter(|&i| i < n)
                .ok_or_else(|| {
                    SynthError(format!(
                        "vocabulary file: key {k} is not a token id below {n}"
                    ))
                })?;
            keep[id] = true;
        }
    }
    // SentencePiece vocabularies (Gemma's) keep their single characters at the end; without
    // the ASCII ones every word outside the kept pieces would fall back to byte tokens.
    let spm = file.opt_str(keys::MODEL).map_err(err)? == Some("llama");
    let mut ordinary = 0usize;
    for (i, k) in keep.iter_mut().enumerate() {
        let normal = types.as_ref().is_none_or(|t| t[i] == 1);
        if !normal {
            *k = true;
        } else if ordinary < n_ordinary {
            ordinary += 1;
            *k = true;
        } else if spm && tokens[i].len() == 1 && tokens[i].is_ascii() {
            *k = true;
        }
    }
    let mut new_id = vec![None; n];
    let mut next = 0u32;
    for (i, &k) in keep.iter().enumerate() {
        if k {
            new_id[i] = Some(next);
            next += 1;
        }
    }
    let n_kept = next as usize;
    let kept_texts: HashSet<&str> = tokens
        .iter()
        .zip(&keep)
        .filter(|(_, &k)| k)
        .map(|(t, _)| t.as_str())
        .collect();

    let mut out = Vec::new();
    for (k, v) in file.metadata() {
        if !k.starts_with("tokenizer.") {
            continue;
        }
        let value = if is_id_key(k) {
            let id = v.as_i128().and_then(|i| usize::try_from(i).ok());
            match id.and_then(|i| new_id.get(i).copied().flatten()) {
                Some(id) => Value::U32(id),
                None => {
                    return Err(SynthError(format!(
                        "vocabulary file: key {k} lost its token"
                    )))
                }
            }
        } else if k == keys::MERGES {
            let merges = file.get_str_array(k).map_err(err)?;
            let kept: Vec<String> = merges
                .iter()
                .filter(|m| {
                    // llama.cpp splits a merge at the first space after its first byte.
                    let Some(pos) = m.bytes().skip(1).position(|b| b == b' ').map(|p| p + 1) else {
                        return false;
                    };
                    let (a, b) = (&m[..pos], &m[pos + 1..]);
                    kept_texts.contains(a)
                        && kept_texts.contains(b)
                        && kept_texts.contains(format!("{a}{b}").as_str())
                })
                .cloned()
                .collect();
            Value::Array(Array::String(kept))
        } else if let Value::Array(a) = v {
            if a.len() == n {
                let idx: Vec<usize> = (0..n).filter(|&i| keep[i]).collect();
                Value::Array(filter_array(a, &idx).ok_or_else(|| {
                    SynthError(format!(
                        "vocabulary file: key {k} is a per-token array of an unexpected type"
                    ))
                })?)
            } else {
                v.clone()
            }
        } else {
            v.clone()
        };
        out.push((k.to_string(), value));
    }
    Ok((out, n_kept))
}

/// The entries of `a` at `idx`.
fn filter_array(a: &Array, idx: &[usize]) -> Option<Array> {
    fn pick<T: Clone>(v: &[T], idx: &[usize]) -> Vec<T> {
        idx.iter().map(|&i| v[i].clone()).collect()
    }
    Some(match a {
        Array::U8(v) => Array::U8(pick(v, idx)),
        Array::I8(v) => Array::I8(pick(v, idx)),
        Array::U16(v) => Array::U16(pick(v, idx)),
        Array::I16(v) => Array::I16(pick(v, idx)),
        Array::U32(v) => Array::U32(pick(v, idx)),
        Array::I32(v) => Array::I32(pick(v, idx)),
        Array::F32(v) => Array::F32(pick(v, idx)),
        Array::Bool(v) => Array::Bool(pick(v, idx)),
        Array::String(v) => Array::String(pick(v, idx)),
        Array::U64(v) => Array::U64(pick(v, idx)),
        Array::I64(v) => Array::I64(pick(v, idx)),
        Array::F64(v) => Array::F64(pick(v, idx)),
        _ => return None,
    })
}

/// The `tokenizer.*` entries of a llama.cpp-family checkpoint and its vocabulary size:
/// the built-in byte-level BPE of `builtin` tokens (seeded by `seed`) written under the
/// pre-tokenizer `pre`, or `source`'s file cut as [`truncated_tokenizer`] cuts it.
pub fn tokenizer_entries(
    source: super::dense::VocabSource<'_>,
    builtin: usize,
    pre: flint_loader::tokenizer::PreTokenizer,
    seed: u64,
) -> Result<(Vec<(String, Value)>, usize), SynthError> {
    match source {
        super::dense::VocabSource::Builtin => {
            let v = build_vocab(builtin, seed);
            let n = v.tokens.len();
            let mut t = flint_loader::tokenizer::TokenizerConfig::bpe(
                pre,
                v.tokens,
                v.merges,
                Some(v.bos),
                Some(v.eos),
            );
            t.token_types = Some(v.types);
            t.pad = Some(0);
            Ok((t.to_metadata(), n))
        }
        super::dense::VocabSource::File(file, n) => truncated_tokenizer(file, n),
    }
}
