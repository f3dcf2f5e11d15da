//! Tokenizers built from GGUF metadata, matching llama.cpp token for token.
//!
//! Three models: SentencePiece-style (`tokenizer.ggml.model = "llama"`: score-driven pair
//! merges over characters with `▁` for spaces and `<0xXX>` byte fallback), byte-level
//! BPE (`"gpt2"`: a pre-tokenizer splits words, bytes become printable stand-ins, merges
//! apply by rank) and SentencePiece-style BPE (`"gemma4"`: `▁` for spaces, merges by rank
//! over raw UTF-8 between newlines, `<0xXX>` byte fallback). Before any of them runs, the
//! text is cut at occurrences of special tokens (longest first): user-defined tokens
//! always, control and unknown tokens only when special-token parsing is asked for, as
//! llama.cpp's `tokenizer_st_partition` does.
//!
//! Decoding is per token ([`Tokenizer::token_to_piece`], bytes) or whole
//! ([`Tokenizer::detokenize`]); [`StreamDecoder`] turns a stream of ids into text
//! without ever emitting half a UTF-8 character.

mod bpe;
mod index;
mod pretokenize;
mod spm;
mod spm_bpe;
mod stream;
mod unicode_table;

use std::borrow::Cow;
use std::collections::BTreeSet;

use thiserror::Error;

use crate::gguf::{Array, GgufError, GgufFile, Value};
use index::VocabIndex;

pub use bpe::{byte_to_char, char_to_byte};
pub use pretokenize::PreTokenizer;
pub use stream::StreamDecoder;

/// A token id.
pub type TokenId = u32;

/// GGUF metadata keys the tokenizer reads (and [`TokenizerConfig::to_metadata`] writes).
pub mod keys {
    /// `"llama"` (SentencePiece-style), `"gpt2"` (byte-level BPE) or `"gemma4"`
    /// (SentencePiece-style BPE).
    pub const MODEL: &str = "tokenizer.ggml.model";
    /// Pre-tokenizer preset of BPE models.
    pub const PRE: &str = "tokenizer.ggml.pre";
    /// Token texts.
    pub const TOKENS: &str = "tokenizer.ggml.tokens";
    /// Token scores (SentencePiece merge priority).
    pub const SCORES: &str = "tokenizer.ggml.scores";
    /// Token types (1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte).
    pub const TOKEN_TYPE: &str = "tokenizer.ggml.token_type";
    /// BPE merges, `"left right"` in rank order.
    pub const MERGES: &str = "tokenizer.ggml.merges";
    /// Beginning-of-sequence id.
    pub const BOS: &str = "tokenizer.ggml.bos_token_id";
    /// End-of-sequence id.
    pub const EOS: &str = "tokenizer.ggml.eos_token_id";
    /// End-of-turn id.
    pub const EOT: &str = "tokenizer.ggml.eot_token_id";
    /// End-of-message id.
    pub const EOM: &str = "tokenizer.ggml.eom_token_id";
    /// Unknown-token id.
    pub const UNK: &str = "tokenizer.ggml.unknown_token_id";
    /// Padding id.
    pub const PAD: &str = "tokenizer.ggml.padding_token_id";
    /// Whether encoding with special tokens adds BOS.
    pub const ADD_BOS: &str = "tokenizer.ggml.add_bos_token";
    /// Whether encoding with special tokens adds EOS.
    pub const ADD_EOS: &str = "tokenizer.ggml.add_eos_token";
    /// Whether SentencePiece text gets a leading space.
    pub const ADD_SPACE_PREFIX: &str = "tokenizer.ggml.add_space_prefix";
    /// The chat template (Jinja).
    pub const CHAT_TEMPLATE: &str = "tokenizer.chat_template";
}

/// Errors building a tokenizer. Each names the metadata key at fault.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum TokenizerError {
    /// A key could not be read (missing or of the wrong type).
    #[error("tokenizer metadata: {0}")]
    Gguf(#[from] GgufError),
    /// `tokenizer.ggml.model` names a model this crate does not implement.
    #[error(
        "unsupported tokenizer model '{0}' in key tokenizer.ggml.model (supported: llama, gpt2, gemma4)"
    )]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer this crate does not implement.
    #[error("unsupported pre-tokenizer '{0}' in key tokenizer.ggml.pre (supported: default, gpt-2, llama-bpe/llama3, qwen2, qwen35, gpt-4o, gemma4 and their aliases)")]
    UnsupportedPre(String),
    /// An array is shorter than the token list.
    #[error("key {key} has {found} entries but tokenizer.ggml.tokens has {expected}")]
    LengthMismatch {
        /// The key.
        key: &'static str,
        /// Its length.
        found: usize,
        /// The number of tokens.
        expected: usize,
    },
    /// The token list is empty or too long for 32-bit ids.
    #[error("key tokenizer.ggml.tokens holds {0} tokens; expected between 1 and 2^31")]
    BadVocabSize(usize),
    /// A BPE model without `tokenizer.ggml.merges`.
    #[error("key tokenizer.ggml.merges is missing; byte-level BPE needs its merges")]
    MissingMerges,
}

/// Token attributes (llama.cpp's `llama_token_attr` bits).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct TokenAttr(pub u32);

impl TokenAttr {
    /// No type known.
    pub const UNDEFINED: u32 = 0;
    /// The unknown token.
    pub const UNKNOWN: u32 = 1 << 0;
    /// Reserved, never produced by training.
    pub const UNUSED: u32 = 1 << 1;
    /// Ordinary text.
    pub const NORMAL: u32 = 1 << 2;
    /// Control (BOS, EOS, turn markers): matched in text only when parsing specials.
    pub const CONTROL: u32 = 1 << 3;
    /// User-defined: always matched in text, rendered verbatim.
    pub const USER_DEFINED: u32 = 1 << 4;
    /// A raw byte (`<0xXX>`).
    pub const BYTE: u32 = 1 << 5;
    /// Swallows white space before it when matched in text.
    pub const LSTRIP: u32 = 1 << 7;
    /// Swallows white space after it when matched in text.
    pub const RSTRIP: u32 = 1 << 8;

    /// From a GGUF `token_type` value.
    pub fn from_gguf_type(t: i32) -> Self {
        Self(match t {
            1 => Self::NORMAL,
            2 => Self::UNKNOWN,
            3 => Self::CONTROL,
            4 => Self::USER_DEFINED,
            5 => Self::UNUSED,
            6 => Self::BYTE,
            _ => Self::UNDEFINED,
        })
    }

    /// Whether any of `bits` is set.
    pub fn has(self, bits: u32) -> bool {
        self.0 & bits != 0
    }
}

/// The tokenizer model family.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenizerKind {
    /// SentencePiece-style (`llama`).
    Spm,
    /// BPE with its pre-tokenizer: byte-level (`gpt2`), or SentencePiece-style (`gemma4`,
    /// always with [`PreTokenizer::Gemma4`]).
    Bpe(PreTokenizer),
}

/// Everything a tokenizer is built from: the `tokenizer.ggml.*` metadata as plain values.
/// Build one by hand (e.g. for a synthetic model), or read it with
/// [`TokenizerConfig::from_gguf`].
#[derive(Debug, Clone, Default, PartialEq)]
pub struct TokenizerConfig {
    /// `tokenizer.ggml.model`: `"llama"`, `"gpt2"` or `"gemma4"`.
    pub model: String,
    /// `tokenizer.ggml.pre` (BPE only).
    pub pre: Option<String>,
    /// Token texts, by id.
    pub tokens: Vec<String>,
    /// Scores, by id (zero when absent).
    pub scores: Option<Vec<f32>>,
    /// GGUF token types, by id (all normal when absent).
    pub token_types: Option<Vec<i32>>,
    /// BPE merges, `"left right"`, rank order.
    pub merges: Option<Vec<String>>,
    /// BOS id.
    pub bos: Option<u32>,
    /// EOS id.
    pub eos: Option<u32>,
    /// End-of-turn id.
    pub eot: Option<u32>,
    /// End-of-message id.
    pub eom: Option<u32>,
    /// Unknown-token id.
    pub unk: Option<u32>,
    /// Padding id.
    pub pad: Option<u32>,
    /// `tokenizer.ggml.add_bos_token`.
    pub add_bos: Option<bool>,
    /// `tokenizer.ggml.add_eos_token`.
    pub add_eos: Option<bool>,
    /// `tokenizer.ggml.add_space_prefix`.
    pub add_space_prefix: Option<bool>,
    /// `general.name`: llama.cpp gives some models' special tokens strip attributes by
    /// name (Phi-3).
    pub model_name: Option<String>,
}

impl TokenizerConfig {
    /// Reads the tokenizer keys of a GGUF file; errors name the key.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        Ok(Self {
            model: f.get_str(keys::MODEL)?.to_owned(),
            pre: f.opt_str(keys::PRE)?.map(str::to_owned),
            tokens: f.get_str_array(keys::TOKENS)?.to_vec(),
            scores: f.opt_f32_array(keys::SCORES)?.map(Cow::into_owned),
            token_types: f.opt_i32_array(keys::TOKEN_TYPE)?.map(Cow::into_owned),
            merges: f.opt_str_array(keys::MERGES)?.map(<[String]>::to_vec),
            bos: f.opt_u32(keys::BOS)?,
            eos: f.opt_u32(keys::EOS)?,
            eot: f.opt_u32(keys::EOT)?,
            eom: f.opt_u32(keys::EOM)?,
            unk: f.opt_u32(keys::UNK)?,
            pad: f.opt_u32(keys::PAD)?,
            add_bos: f.opt_bool(keys::ADD_BOS)?,
            add_eos: f.opt_bool(keys::ADD_EOS)?,
            add_space_prefix: f.opt_bool(keys::ADD_SPACE_PREFIX)?,
            model_name: f.opt_str("general.name")?.map(str::to_owned),
        })
    }

    /// A byte-level BPE configuration from tokens and merges (all tokens normal except
    /// the ids given as specials, which become control tokens).
    pub fn bpe(
        pre: PreTokenizer,
        tokens: Vec<String>,
        merges: Vec<String>,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Self {
        let mut types = vec![1i32; tokens.len()];
        for id in [bos, eos].into_iter().flatten() {
            if let Some(t) = types.get_mut(id as usize) {
                *t = 3;
            }
        }
        Self {
            model: "gpt2".into(),
            pre: Some(pre.name().into()),
            tokens,
            token_types: Some(types),
            merges: Some(merges),
            bos,
            eos,
            add_bos: Some(bos.is_some()),
            add_eos: Some(false),
            ..Self::default()
        }
    }

    /// The metadata entries that describe this tokenizer, ready for a GGUF writer
    /// (absent options are left out).
    pub fn to_metadata(&self) -> Vec<(String, Value)> {
        let mut out = vec![(keys::MODEL.to_owned(), Value::String(self.model.clone()))];
        if let Some(p) = &self.pre {
            out.push((keys::PRE.into(), Value::String(p.clone())));
        }
        out.push((
            keys::TOKENS.into(),
            Value::Array(Array::String(self.tokens.clone())),
        ));
        if let Some(s) = &self.scores {
            out.push((keys::SCORES.into(), Value::Array(Array::F32(s.clone()))));
        }
        if let Some(t) = &self.token_types {
            out.push((keys::TOKEN_TYPE.into(), Value::Array(Array::I32(t.clone()))));
        }
        if let Some(m) = &self.merges {
            out.push((keys::MERGES.into(), Value::Array(Array::String(m.clone()))));
        }
        for (k, v) in [
            (keys::BOS, self.bos),
            (keys::EOS, self.eos),
            (keys::EOT, self.eot),
            (keys::EOM, self.eom),
            (keys::UNK, self.unk),
            (keys::PAD, self.pad),
        ] {
            if let Some(v) = v {
                out.push((k.into(), Value::U32(v)));
            }
        }
        for (k, v) in [
            (keys::ADD_BOS, self.add_bos),
            (keys::ADD_EOS, self.add_eos),
            (keys::ADD_SPACE_PREFIX, self.add_space_prefix),
        ] {
            if let Some(v) = v {
                out.push((k.into(), Value::Bool(v)));
            }
        }
        out
    }
}

/// A tokenizer: vocabulary, attributes, special ids and the model to split text with.
#[derive(Debug, Clone)]
pub struct Tokenizer {
    kind: TokenizerKind,
    index: VocabIndex,
    scores: Vec<f32>,
    attrs: Vec<TokenAttr>,
    merges: Option<VocabIndex>,
    /// Control, user-defined and unknown tokens, longest text first.
    specials: Vec<TokenId>,
    bos: Option<TokenId>,
    eos: Option<TokenId>,
    eot: Option<TokenId>,
    eom: Option<TokenId>,
    unk: Option<TokenId>,
    pad: Option<TokenId>,
    eog: BTreeSet<TokenId>,
    add_bos: bool,
    add_eos: bool,
    add_space_prefix: bool,
    clean_spaces: bool,
    /// The fallback token per byte: `<0xXX>` (or the single byte's token) for
    /// SentencePiece, `<0xXX>` for SentencePiece-style BPE, none for byte-level BPE.
    byte_tokens: Vec<Option<TokenId>>,
}

/// Text names llama.cpp treats as end of generation whatever the metadata says.
const EOG_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
];

/// Texts llama.cpp picks as the end-of-turn token when no key names one.
const EOT_NAMES: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "<|end_of_text|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "<｜end▁of▁sentence｜>",
    "<end_of_utterance>",
];

/// Fill-in-the-middle pad / repo / separator names; llama.cpp counts these as EOG too.
const FIM_EOG_NAMES: &[&[&str]] = &[
    &["<|fim_pad|>", "<fim-pad>", "<fim_pad>", "<PAD>", "[PAD]"],
    &[
        "<|fim_repo|>",
        "<|repo_name|>",
        "<fim-repo>",
        "<REPO>",
        "<reponame>",
    ],
    &["<|file_sep|>"],
];

impl Tokenizer {
    /// Builds the tokenizer a GGUF file describes.
    pub fn from_gguf(f: &GgufFile) -> Result<Self, TokenizerError> {
        Self::from_config(&TokenizerConfig::from_gguf(f)?)
    }

    /// Builds a tokenizer from plain metadata values.
    pub fn from_config(cfg: &TokenizerConfig) -> Result<Self, TokenizerError> {
        let n = cfg.tokens.len();
        if n == 0 || n > i32::MAX as usize {
            return Err(TokenizerError::BadVocabSize(n));
        }
        let kind = match cfg.model.as_str() {
            "llama" => TokenizerKind::Spm,
            "gpt2" => TokenizerKind::Bpe(PreTokenizer::from_name(cfg.pre.as_deref()).ok_or_else(
                || TokenizerError::UnsupportedPre(cfg.pre.clone().unwrap_or_default()),
            )?),
            // llama.cpp sets the pre-tokenizer of this model itself, whatever the key says.
            "gemma4" => TokenizerKind::Bpe(PreTokenizer::Gemma4),
            other => return Err(TokenizerError::UnsupportedModel(other.to_owned())),
        };
        if let Some(s) = &cfg.scores {
            if s.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    key: keys::SCORES,
                    found: s.len(),
                    expected: n,
                });
            }
        }
        if let Some(t) = &cfg.token_types {
            if t.len() < n {
                return Err(TokenizerError::LengthMismatch {
                    key: keys::TOKEN_TYPE,
                    found: t.len(),
                    expected: n,
                });
            }
        }
        // llama.cpp renames empty tokens so that no two collide on "".
        let texts: Vec<Cow<'_, str>> = cfg
            .tokens
            .iter()
            .enumerate()
            .map(|(i, t)| {
                if t.is_empty() {
                    Cow::Owned(format!("[EMPTY_{i}]"))
                } else {
                    Cow::Borrowed(t.as_str())
                }
            })
            .collect();
        let index = VocabIndex::build(
            &texts.iter().map(|t| t.as_bytes()).collect::<Vec<_>>(),
            false,
        );
        let scores = cfg
            .scores
            .as_ref()
            .map_or_else(|| vec![0.0; n], |s| s[..n].to_vec());
        let mut attrs: Vec<TokenAttr> = match &cfg.token_types {
            Some(t) => t[..n]
                .iter()
                .map(|&t| TokenAttr::from_gguf_type(t))
                .collect(),
            None => vec![TokenAttr(TokenAttr::NORMAL); n],
        };

        let merges = match kind {
            TokenizerKind::Bpe(_) => {
                let m = cfg.merges.as_ref().ok_or(TokenizerError::MissingMerges)?;
                let mut buf: Vec<Vec<u8>> = Vec::with_capacity(m.len());
                for line in m {
                    // Split at the first space after the first byte, as llama.cpp does; a
                    // line without one becomes an entry that can never match.
                    let b = line.as_bytes();
                    let key = match b.iter().skip(1).position(|&c| c == b' ') {
                        Some(p) => {
                            let mut k = b[..p + 1].to_vec();
                            k.push(0xFF);
                            k.extend_from_slice(&b[p + 2..]);
                            k
                        }
                        None => vec![0xFF],
                    };
                    buf.push(key);
                }
                Some(VocabIndex::build(&buf, true))
            }
            TokenizerKind::Spm => None,
        };

        let in_range = |id: Option<u32>| id.filter(|&i| (i as usize) < n);
        let (mut bos, mut eos, mut unk) = match (cfg.model.as_str(), kind) {
            ("llama", _) => (Some(1), Some(2), Some(0)),
            ("gpt2", TokenizerKind::Bpe(p)) => {
                (Some(11).filter(|_| p.default_bos()), Some(11), None)
            }
            _ => (None, None, None),
        };
        bos = in_range(bos);
        eos = in_range(eos);
        unk = in_range(unk);
        if let Some(v) = in_range(cfg.bos) {
            bos = Some(v);
        }
        if let Some(v) = in_range(cfg.eos) {
            eos = Some(v);
        }
        if let Some(v) = in_range(cfg.unk) {
            unk = Some(v);
        }
        let mut eot = in_range(cfg.eot);
        let mut eom = in_range(cfg.eom);
        let pad = in_range(cfg.pad);

        let (mut add_bos, mut add_eos, mut add_space_prefix) = match kind {
            TokenizerKind::Spm => (true, false, true),
            TokenizerKind::Bpe(p) => (matches!(p, PreTokenizer::Llama3), false, false),
        };
        if let Some(v) = cfg.add_space_prefix {
            add_space_prefix = v;
        }
        if let Some(v) = cfg.add_bos {
            add_bos = v;
        }
        if let Some(v) = cfg.add_eos {
            add_eos = v;
        }
        // llama.cpp overrides a `false` for Gemma 4.
        if kind == TokenizerKind::Bpe(PreTokenizer::Gemma4) {
            add_bos = true;
        }

        // Special-id detection by text, as llama.cpp does it after reading the keys.
        let mark_control = |attrs: &mut Vec<TokenAttr>, id: u32| {
            attrs[id as usize].0 |= TokenAttr::CONTROL;
        };
        let find = |name: &str| index.find(name.as_bytes());
        if eot.is_none() {
            if let Some(id) = EOT_NAMES
                .iter()
                .filter_map(|s| find(s))
                .min_by_key(|&id| id)
            {
                eot = Some(id);
                mark_control(&mut attrs, id);
            }
        }
        if eom.is_none() {
            if let Some(id) = find("<|eom_id|>") {
                eom = Some(id);
                mark_control(&mut attrs, id);
            }
        }
        for (id, a) in attrs.iter_mut().enumerate() {
            if a.has(TokenAttr::CONTROL) && index.text(id as u32).windows(6).any(|w| w == b"unused")
            {
                a.0 |= TokenAttr::UNUSED;
            }
        }
        let mut eog = BTreeSet::new();
        for names in FIM_EOG_NAMES {
            if let Some(id) = names.iter().filter_map(|s| find(s)).min() {
                eog.insert(id);
                mark_control(&mut attrs, id);
            }
        }
        for name in EOG_NAMES {
            if let Some(id) = find(name) {
                eog.insert(id);
                mark_control(&mut attrs, id);
            }
        }
        // gpt-oss (o200k-harmony): these always render, as user-defined tokens.
        for t in ["<|channel|>", "<|message|>", "<|start|>", "<|constrain|>"] {
            if let Some(id) = find(t) {
                attrs[id as usize] = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        eog.extend([eos, eot, eom].into_iter().flatten());
        // o200k-harmony and solar-open style vocabularies: "<|end|>" ends a message, not
        // the generation.
        let has = |eog: &BTreeSet<TokenId>, s: &str| find(s).is_some_and(|id| eog.contains(&id));
        if let Some(end) = find("<|end|>").filter(|id| eog.contains(id)) {
            if (has(&eog, "<|return|>") && has(&eog, "<|call|>"))
                || (has(&eog, "<|calls|>") && has(&eog, "<|flush|>"))
            {
                eog.remove(&end);
                attrs[end as usize] = TokenAttr(TokenAttr::USER_DEFINED);
            }
        }
        if has(&eog, "<|tool_response>") || has(&eog, "<|plamo:eos|>") {
            if let Some(s) = find("</s>").filter(|id| eog.contains(id)) {
                eog.remove(&s);
                attrs[s as usize] = TokenAttr(TokenAttr::NORMAL);
            }
        }

        let mut specials: Vec<TokenId> = (0..n as u32)
            .filter(|&id| {
                attrs[id as usize]
                    .has(TokenAttr::CONTROL | TokenAttr::USER_DEFINED | TokenAttr::UNKNOWN)
            })
            .collect();
        specials.sort_by_key(|&id| std::cmp::Reverse(index.text(id).len()));

        // Strip attributes llama.cpp sets by model or pre-tokenizer name.
        let name = cfg.model_name.as_deref().unwrap_or("").to_lowercase();
        let pre_name = cfg.pre.as_deref().unwrap_or("");
        let set = |attrs: &mut Vec<TokenAttr>, text: &str, bit: u32, on: bool| {
            if let Some(id) = find(text) {
                let a = &mut attrs[id as usize].0;
                *a = if on { *a | bit } else { *a & !bit };
            }
        };
        if ["jina-v2-de", "jina-v2-es", "jina-v2-code", "mmbert"]
            .iter()
            .any(|p| pre_name.contains(p))
        {
            set(&mut attrs, "<mask>", TokenAttr::LSTRIP, true);
        } else if name.contains("phi-3") || name.contains("phi3") {
            for &id in &specials {
                attrs[id as usize].0 |= TokenAttr::RSTRIP;
            }
            set(&mut attrs, "</s>", TokenAttr::RSTRIP, true);
            for t in ["<unk>", "<s>", "<|endoftext|>"] {
                set(&mut attrs, t, TokenAttr::RSTRIP, false);
            }
        } else if name.contains("modern-bert") {
            set(&mut attrs, "[MASK]", TokenAttr::LSTRIP, true);
        }

        let hex_token = |b: u8| index.find(format!("<0x{b:02X}>").as_bytes());
        let byte_tokens = match kind {
            TokenizerKind::Spm => (0..=255u8)
                .map(|b| hex_token(b).or_else(|| index.find(&[b])))
                .collect(),
            TokenizerKind::Bpe(p) if !p.byte_level() => (0..=255u8).map(hex_token).collect(),
            TokenizerKind::Bpe(_) => Vec::new(),
        };
        let clean_spaces = match kind {
            TokenizerKind::Spm => false,
            TokenizerKind::Bpe(p) => p.clean_spaces(),
        };

        Ok(Self {
            kind,
            index,
            scores,
            attrs,
            merges,
            specials,
            bos,
            eos,
            eot,
            eom,
            unk,
            pad,
            eog,
            add_bos,
            add_eos,
            add_space_prefix,
            clean_spaces,
            byte_tokens,
        })
    }

    /// The model family.
    pub fn kind(&self) -> TokenizerKind {
        self.kind
    }
    /// Vocabulary size.
    pub fn n_vocab(&self) -> usize {
        self.index.len()
    }
    /// Beginning-of-sequence id.
    pub fn bos(&self) -> Option<TokenId> {
        self.bos
    }
    /// End-of-sequence id.
    pub fn eos(&self) -> Option<TokenId> {
        self.eos
    }
    /// End-of-turn id (from the key, else found by its text, e.g. `<end_of_turn>`).
    pub fn eot(&self) -> Option<TokenId> {
        self.eot
    }
    /// End-of-message id.
    pub fn eom(&self) -> Option<TokenId> {
        self.eom
    }
    /// Unknown-token id.
    pub fn unk(&self) -> Option<TokenId> {
        self.unk
    }
    /// Padding id.
    pub fn pad(&self) -> Option<TokenId> {
        self.pad
    }
    /// Whether `id` ends generation (EOS, EOT, EOM and the end markers llama.cpp knows).
    pub fn is_eog(&self, id: TokenId) -> bool {
        self.eog.contains(&id)
    }
    /// All end-of-generation ids, ascending.
    pub fn eog_ids(&self) -> impl Iterator<Item = TokenId> + '_ {
        self.eog.iter().copied()
    }
    /// Whether the model wants BOS prepended (`tokenizer.ggml.add_bos_token`).
    pub fn add_bos(&self) -> bool {
        self.add_bos
    }
    /// Whether the model wants EOS appended.
    pub fn add_eos(&self) -> bool {
        self.add_eos
    }
    /// Whether SentencePiece text gets a leading space.
    pub fn add_space_prefix(&self) -> bool {
        self.add_space_prefix
    }
    /// The raw vocabulary text of `id` (with `▁` or byte stand-ins), `None` out of range.
    pub fn token_text(&self, id: TokenId) -> Option<&[u8]> {
        ((id as usize) < self.n_vocab()).then(|| self.index.text(id))
    }
    /// The attributes of `id`.
    pub fn token_attr(&self, id: TokenId) -> TokenAttr {
        self.attrs.get(id as usize).copied().unwrap_or_default()
    }
    /// The score of `id` (0 when out of range).
    pub fn token_score(&self, id: TokenId) -> f32 {
        self.scores.get(id as usize).copied().unwrap_or(0.0)
    }
    /// The id whose vocabulary text is exactly `text`.
    pub fn token_id(&self, text: &str) -> Option<TokenId> {
        self.index.find(text.as_bytes())
    }

    pub(crate) fn byte_token(&self, b: u8) -> Option<TokenId> {
        self.byte_tokens.get(b as usize).copied().flatten()
    }

    /// Tokenizes `text` as `llama_tokenize` does. `add_special` adds BOS (and EOS) when
    /// the model asks for them; `parse_special` lets control-token text (`<bos>`,
    /// `<start_of_turn>`) become those tokens. User-defined tokens are matched either way.
    pub fn tokenize(&self, text: &str, add_special: bool, parse_special: bool) -> Vec<TokenId> {
        let frags = self.partition(text, parse_special);
        let mut out = Vec::with_capacity(text.len() / 3 + 2);
        if add_special && self.add_bos {
            if let Some(b) = self.bos {
                out.push(b);
            }
        }
        match self.kind {
            TokenizerKind::Spm => {
                let mut prev_special = true;
                let mut buf = String::new();
                for f in &frags {
                    match *f {
                        Fragment::Text(a, b) => {
                            buf.clear();
                            if self.add_space_prefix && prev_special {
                                buf.push(' ');
                            }
                            buf.push_str(&text[a..b]);
                            let escaped = buf.replace(' ', "\u{2581}");
                            spm::tokenize(self, escaped.as_bytes(), &mut out);
                            prev_special = false;
                        }
                        Fragment::Token(id) => {
                            out.push(id);
                            prev_special = true;
                        }
                    }
                }
            }
            TokenizerKind::Bpe(pre) => {
                for f in &frags {
                    match *f {
                        Fragment::Text(a, b) if pre.byte_level() => {
                            bpe::tokenize(self, pre, &text[a..b], &mut out)
                        }
                        Fragment::Text(a, b) => spm_bpe::tokenize(self, &text[a..b], &mut out),
                        Fragment::Token(id) => out.push(id),
                    }
                }
            }
        }
        if add_special && self.add_eos {
            if let Some(e) = self.eos {
                out.push(e);
            }
        }
        out
    }

    /// Cuts `text` at special-token occurrences: for each special token, longest first,
    /// every remaining text fragment is searched left to right.
    fn partition(&self, text: &str, parse_special: bool) -> Vec<Fragment> {
        let mut frags = Vec::new();
        if text.is_empty() {
            return frags;
        }
        frags.push(Fragment::Text(0, text.len()));
        let bytes = text.as_bytes();
        let seen = BytePairs::of(bytes);
        let mut next = Vec::new();
        for &id in &self.specials {
            let attr = self.attrs[id as usize];
            if !parse_special && attr.has(TokenAttr::CONTROL | TokenAttr::UNKNOWN) {
                continue;
            }
            let needle = self.index.text(id);
            if needle.is_empty() {
                continue;
            }
            // Most specials occur nowhere: skip those whose first two bytes (or only
            // byte) never appear. Cutting fragments only removes occurrences, so a
            // skipped token could not have matched.
            let present = match needle {
                [a] => seen.single[*a as usize],
                [a, b, ..] => seen.has_pair(*a, *b),
                [] => false,
            };
            if !present {
                continue;
            }
            next.clear();
            for f in &frags {
                match *f {
                    Fragment::Text(mut a, b) => {
                        while let Some(p) = find_bytes(&bytes[a..b], needle) {
                            let mut left_end = a + p;
                            if attr.has(TokenAttr::LSTRIP) {
                                while left_end > a && is_c_space(bytes[left_end - 1]) {
                                    left_end -= 1;
                                }
                            }
                            if left_end > a {
                                next.push(Fragment::Text(a, left_end));
                            }
                            next.push(Fragment::Token(id));
                            a += p + needle.len();
                            if attr.has(TokenAttr::RSTRIP) {
                                while a < b && is_c_space(bytes[a]) {
                                    a += 1;
                                }
                            }
                        }
                        if a < b {
                            next.push(Fragment::Text(a, b));
                        }
                    }
                    tok => next.push(tok),
                }
            }
            std::mem::swap(&mut frags, &mut next);
        }
        frags
    }

    /// The bytes token `id` stands for. With `special` false, control and unknown tokens
    /// render as nothing; user-defined tokens always render as their text.
    pub fn token_to_piece(&self, id: TokenId, special: bool) -> Cow<'_, [u8]> {
        let Some(text) = self.token_text(id) else {
            return Cow::Borrowed(&[]);
        };
        let attr = self.attrs[id as usize];
        let specialish = TokenAttr::CONTROL | TokenAttr::UNKNOWN;
        if attr.has(specialish) {
            return if special {
                Cow::Borrowed(text)
            } else {
                Cow::Borrowed(&[])
            };
        }
        if attr.has(TokenAttr::USER_DEFINED) {
            return Cow::Borrowed(text);
        }
        if attr.has(TokenAttr::NORMAL) {
            return match self.kind {
                TokenizerKind::Bpe(p) if p.byte_level() => Cow::Owned(bpe::decode_text(text)),
                _ => {
                    if text.windows(3).any(|w| w == "\u{2581}".as_bytes()) {
                        Cow::Owned(unescape_space(text))
                    } else {
                        Cow::Borrowed(text)
                    }
                }
            };
        }
        if attr.has(TokenAttr::BYTE) {
            return match parse_byte_token(text) {
                Some(b) => Cow::Owned(vec![b]),
                None => Cow::Borrowed(&[]),
            };
        }
        Cow::Borrowed(&[])
    }

    /// Bytes of a whole sequence, as `llama_detokenize` builds them: the leading space
    /// the tokenizer added is removed, `remove_special` drops a leading BOS / trailing
    /// EOS the model adds, `unparse_special` renders control tokens as their text.
    pub fn detokenize_bytes(
        &self,
        ids: &[TokenId],
        remove_special: bool,
        unparse_special: bool,
    ) -> Vec<u8> {
        let mut ids = ids;
        let mut remove_space = self.add_space_prefix;
        if remove_special && self.add_bos && ids.first().is_some_and(|&t| Some(t) == self.bos) {
            remove_space = false;
            ids = &ids[1..];
        }
        if remove_special && self.add_eos && ids.last().is_some_and(|&t| Some(t) == self.eos) {
            ids = &ids[..ids.len() - 1];
        }
        let mut out = Vec::new();
        for &id in ids {
            let piece = self.token_to_piece(id, unparse_special);
            let piece: &[u8] = if remove_space && piece.first() == Some(&b' ') {
                &piece[1..]
            } else {
                &piece
            };
            out.extend_from_slice(piece);
            remove_space = false;
        }
        if self.clean_spaces {
            out = clean_spaces(&out);
        }
        out
    }

    /// [`Tokenizer::detokenize_bytes`] as text (invalid UTF-8 becomes U+FFFD).
    pub fn detokenize(
        &self,
        ids: &[TokenId],
        remove_special: bool,
        unparse_special: bool,
    ) -> String {
        String::from_utf8_lossy(&self.detokenize_bytes(ids, remove_special, unparse_special))
            .into_owned()
    }
}

/// Which bytes and adjacent byte pairs occur in a text.
struct BytePairs {
    single: [bool; 256],
    pairs: Vec<u64>,
}

impl BytePairs {
    fn of(text: &[u8]) -> Self {
        let mut single = [false; 256];
        let mut pairs = vec![0u64; 65_536 / 64];
        for (i, &b) in text.iter().enumerate() {
            single[b as usize] = true;
            if let Some(&c) = text.get(i + 1) {
                let k = (b as usize) << 8 | c as usize;
                pairs[k / 64] |= 1 << (k % 64);
            }
        }
        Self { single, pairs }
    }

    fn has_pair(&self, a: u8, b: u8) -> bool {
        let k = (a as usize) << 8 | b as usize;
        self.pairs[k / 64] & (1 << (k % 64)) != 0
    }
}

#[derive(Debug, Clone, Copy)]
enum Fragment {
    /// Byte range of the input still to be tokenized.
    Text(usize, usize),
    /// A special token matched in the text.
    Token(TokenId),
}

/// C's `isspace` in the "C" locale.
fn is_c_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | 0x0B | 0x0C | b'\r')
}

fn find_bytes(hay: &[u8], needle: &[u8]) -> Option<usize> {
    if needle.len() > hay.len() {
        return None;
    }
    let first = needle[0];
    let last_start = hay.len() - needle.len();
    let mut i = 0;
    while i <= last_start {
        match hay[i..=last_start].iter().position(|&c| c == first) {
            None => return None,
            Some(p) => {
                i += p;
                if &hay[i..i + needle.len()] == needle {
                    return Some(i);
                }
                i += 1;
            }
        }
    }
    None
}

fn unescape_space(text: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(text.len());
    let mut i = 0;
    while i < text.len() {
        if text[i..].starts_with("\u{2581}".as_bytes()) {
            out.push(b' ');
            i += 3;
        } else {
            out.push(text[i]);
            i += 1;
        }
    }
    out
}

/// `<0xAB>` → 0xAB.
fn parse_byte_token(text: &[u8]) -> Option<u8> {
    let s = std::str::from_utf8(text).ok()?;
    let hex = s.strip_prefix("<0x")?.strip_suffix('>')?;
    u8::from_str_radix(hex, 16).ok()
}

/// llama.cpp's three clean-up passes over detokenized BPE text.
fn clean_spaces(text: &[u8]) -> Vec<u8> {
    // Pass 1: " ?", " !", " .", " ," lose the space.
    let mut a: Vec<u8> = Vec::with_capacity(text.len());
    for (i, &x) in text.iter().enumerate() {
        if i > 0 && text[i - 1] == b' ' && matches!(x, b'?' | b'!' | b'.' | b',') {
            a.pop();
        }
        a.push(x);
    }
    // Pass 2: a lone apostrophe between spaces loses both spaces. llama.cpp blanks the
    // dropped space in place, so the character after it no longer sees a space before it.

    let mut b: Vec<u8> = Vec::with_capacity(a.len());
    if let Some(&first) = a.first() {
        b.push(first);
    }
    let mut i = 1;
    while i < a.len() {
        let x = a[i];
        if x == b'\'' && i + 1 < a.len() && a[i - 1] == b' ' && a[i + 1] == b' ' {
            b.pop();
            i += 1;
            a[i] = 0;
        }
        b.push(x);
        i += 1;
    }
    // Pass 3: " 's", " 'm", " 're", " 've" lose the space.
    let mut c: Vec<u8> = Vec::with_capacity(b.len());
    for (i, &x) in b.iter().enumerate() {
        if i > 0 && b[i - 1] == b' ' && x == b'\'' && i + 1 < b.len() {
            let x1 = b[i + 1];
            let drop = matches!(x1, b's' | b'm')
                || (i + 2 < b.len() && matches!((x1, b[i + 2]), (b'r', b'e') | (b'v', b'e')));
            if drop {
                c.pop();
            }
        }
        c.push(x);
    }
    c
}

#[cfg(test)]
mod tests {
    use super::*;

    /// gpt-oss's `<|channel|>` is user-defined whatever its type says, as llama.cpp makes
    /// it: matched in text without special-token parsing and always rendered.
    #[test]
    fn harmony_markers_are_user_defined() {
        let tokens = ["a", "<|channel|>", "<|return|>"]
            .map(String::from)
            .to_vec();
        let mut cfg = TokenizerConfig::bpe(PreTokenizer::Gpt4o, tokens, Vec::new(), None, None);
        cfg.token_types = Some(vec![1, 3, 3]);
        let t = Tokenizer::from_config(&cfg).expect("tokenizer");
        assert_eq!(t.token_attr(1), TokenAttr(TokenAttr::USER_DEFINED));
        assert_eq!(t.tokenize("a<|channel|>a", false, false), [0, 1, 0]);
        assert_eq!(t.detokenize(&[1, 2], false, false), "<|channel|>");
        assert!(t.is_eog(2));
    }
}
