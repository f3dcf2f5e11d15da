//! SentencePiece-style merging on a hand-built vocabulary, with answers worked out from
//! llama.cpp's algorithm: score-driven pair merges (stale pairs skipped), `▁` escaping,
//! the space prefix after specials, byte fallback, user-defined vs control tokens, and
//! decoding (whole and streamed).

use flint_loader::tokenizer::{StreamDecoder, Tokenizer, TokenizerConfig, TokenizerKind};

fn vocab(add_space_prefix: bool) -> Tokenizer {
    vocab_named(add_space_prefix, None)
}

fn vocab_named(add_space_prefix: bool, name: Option<&str>) -> Tokenizer {
    let mut tokens: Vec<String> = ["<unk>", "<s>", "</s>", "<ctrl>", "<ud>"]
        .iter()
        .map(|s| s.to_string())
        .collect();
    let mut types = vec![2, 3, 3, 3, 4];
    let mut scores = vec![0.0f32; 5];
    for b in 0..=255u32 {
        tokens.push(format!("<0x{b:02X}>"));
        types.push(6);
        scores.push(0.0);
    }
    // ids 261..
    for (t, s) in [
        ("\u{2581}", -1.0),
        ("a", -2.0),
        ("b", -2.0),
        ("c", -2.0),
        ("ab", -3.0),
        ("bc", -1.0),
        ("\u{2581}a", -4.0),
        ("abc", -5.0),
    ] {
        tokens.push(t.to_string());
        types.push(1);
        scores.push(s);
    }
    let cfg = TokenizerConfig {
        model: "llama".into(),
        tokens,
        scores: Some(scores),
        token_types: Some(types),
        add_space_prefix: Some(add_space_prefix),
        model_name: name.map(str::to_owned),
        ..TokenizerConfig::default()
    };
    Tokenizer::from_config(&cfg).expect("spm tokenizer")
}

const SPACE: u32 = 261;
const B: u32 = 263;
const C: u32 = 264;
const BC: u32 = 266;
const SP_A: u32 = 267;
const ABC: u32 = 268;
fn byte(b: u8) -> u32 {
    5 + b as u32
}

#[test]
fn spm_merges_by_score_and_skips_stale_pairs() {
    let t = vocab(true);
    assert_eq!(t.kind(), TokenizerKind::Spm);
    // "▁abc": bc (-1) merges first, which leaves "ab" stale; then ▁a (-4); "abc" (-5)
    // is stale because its left symbol was merged away.
    assert_eq!(t.tokenize("abc", false, false), vec![SP_A, BC]);
    let t = vocab(false);
    assert_eq!(t.tokenize("abc", false, false), vec![ABC]);
}

#[test]
fn spm_byte_fallback() {
    let t = vocab(false);
    assert_eq!(t.tokenize("é", false, false), vec![byte(0xC3), byte(0xA9)]);
}

#[test]
fn spm_user_defined_always_control_only_when_parsing() {
    let t = vocab(true);
    assert_eq!(
        t.tokenize("a<ud>b<ctrl>c", false, false),
        vec![
            SP_A,
            4,
            SPACE,
            B,
            byte(b'<'),
            C,
            byte(b't'),
            byte(b'r'),
            byte(b'l'),
            byte(b'>'),
            C
        ]
    );
    // With parsing, the text after each special gets the space prefix again.
    assert_eq!(
        t.tokenize("a<ud>b<ctrl>c", false, true),
        vec![SP_A, 4, SPACE, B, 3, SPACE, C]
    );
}

#[test]
fn spm_defaults_bos_eos_and_decoding() {
    let t = vocab(true);
    assert_eq!(t.bos(), Some(1));
    assert_eq!(t.eos(), Some(2));
    assert!(t.is_eog(2));
    assert!(t.add_bos());
    assert_eq!(t.tokenize("abc", true, false), vec![1, SP_A, BC]);
    assert_eq!(t.detokenize(&[SP_A, BC], false, false), "abc");
    // llama.cpp keeps the space when it removed a BOS in front of it.
    assert_eq!(t.detokenize(&[1, SP_A, BC], true, false), " abc");
    assert_eq!(t.detokenize(&[1, SP_A, BC], false, true), "<s> abc");
    assert_eq!(t.detokenize(&[1, SP_A, BC], false, false), " abc");
    assert_eq!(&*t.token_to_piece(3, false), b"");
    assert_eq!(&*t.token_to_piece(3, true), b"<ctrl>");
    assert_eq!(&*t.token_to_piece(4, false), b"<ud>");
}

#[test]
fn stream_decoder_holds_split_characters() {
    let t = vocab(true);
    let mut d = StreamDecoder::new();
    // First piece loses the prefix space, like the whole decode.
    assert_eq!(d.push(&t, SP_A), "a");
    // "€" = E2 82 AC over three byte tokens.
    assert_eq!(d.push(&t, byte(0xE2)), "");
    assert!(d.has_pending());
    assert_eq!(d.push(&t, byte(0x82)), "");
    assert_eq!(d.push(&t, byte(0xAC)), "\u{20AC}");
    assert!(!d.has_pending());
    // A byte that can never start a character is replaced, not held.
    assert_eq!(d.push(&t, byte(0xFF)), "\u{FFFD}");
    // An unfinished character at the end comes out as U+FFFD on finish.
    assert_eq!(d.push(&t, byte(0xF0)), "");
    assert_eq!(d.finish(), "\u{FFFD}");
    // An invalid continuation flushes the broken lead and keeps the rest.
    let mut d = StreamDecoder::new();
    assert_eq!(d.push_bytes(&[0xE2, 0x82]), "");
    assert_eq!(d.push_bytes(b"x"), "\u{FFFD}x");
}

#[test]
fn spm_phi3_specials_swallow_following_spaces() {
    // llama.cpp gives Phi-3's special tokens RSTRIP (by model name).
    let plain = vocab(true);
    assert_eq!(
        plain.tokenize("a<ctrl>  b", false, true),
        vec![SP_A, 3, SPACE, SPACE, SPACE, B]
    );
    let phi = vocab_named(true, Some("Phi-3 mini"));
    assert_eq!(
        phi.tokenize("a<ctrl>  b", false, true),
        vec![SP_A, 3, SPACE, B]
    );
    // <s> is exempt.
    assert_eq!(phi.tokenize("<s> b", false, true), vec![1, SPACE, SPACE, B]);
}
