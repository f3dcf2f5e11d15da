//! Pre-tokenizers of byte-level BPE: split text into words before merging.
//!
//! llama.cpp does not run the Hugging Face regexes with a regex engine for the common
//! presets; it walks code points by hand with its own Unicode class table, and its
//! behaviour (not the regex's) is what token ids are checked against. The splitters here
//! follow that behaviour: segment boundaries act as end of text for lookahead, a lone
//! trailing space becomes its own word, and so on.

use super::unicode_table::RANGES;

/// Unicode class bits (as in llama.cpp's code-point flags).
pub(crate) mod flag {
    pub const UNDEFINED: u8 = 0x01;
    pub const NUMBER: u8 = 0x02;
    pub const LETTER: u8 = 0x04;
    pub const ACCENT_MARK: u8 = 0x10;
    pub const PUNCTUATION: u8 = 0x20;
    pub const SYMBOL: u8 = 0x40;
}

/// Class of one code point plus whether it is white space; `None` means "outside the
/// segment" (the flags llama.cpp reads as all-zero).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct Flags {
    class: u8,
    space: bool,
}

impl Flags {
    pub(crate) fn of(c: char) -> Self {
        let cp = c as u32;
        let i = RANGES.partition_point(|&(start, _)| start <= cp);
        let class = if i == 0 {
            flag::UNDEFINED
        } else {
            RANGES[i - 1].1
        };
        Self {
            class,
            space: is_space(cp),
        }
    }
    fn letter(self) -> bool {
        self.class & flag::LETTER != 0
    }
    fn number(self) -> bool {
        self.class & flag::NUMBER != 0
    }
    fn punct(self) -> bool {
        self.class & flag::PUNCTUATION != 0
    }
    fn mark(self) -> bool {
        self.class & flag::ACCENT_MARK != 0
    }
    fn symbol(self) -> bool {
        self.class & flag::SYMBOL != 0
    }
    fn any(self) -> bool {
        self.class != 0 || self.space
    }
}

/// White space as llama.cpp's table lists it (Unicode `White_Space`).
fn is_space(cp: u32) -> bool {
    matches!(
        cp,
        0x09..=0x0D
            | 0x20
            | 0x85
            | 0xA0
            | 0x1680
            | 0x2000..=0x200A
            | 0x2028
            | 0x2029
            | 0x202F
            | 0x205F
            | 0x3000
    )
}

/// The pre-tokenizer presets this crate implements (values of `tokenizer.ggml.pre`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `default` (or absent): llama.cpp's fallback, four passes (punctuation runs,
    /// GPT-2 words, number runs, digit triples).
    Default,
    /// `gpt-2` (and `gpt2`, `mpt`, `olmo`, `phi-2`, ...): the GPT-2 word regex.
    Gpt2,
    /// `llama3`, `llama-bpe`, `llama-v3`, `dbrx`, `smaug-bpe`: the Llama 3 regex
    /// (numbers in groups of up to three digits).
    Llama3,
    /// `qwen2`, `stablelm2`, `deepseek-r1-qwen`: the Llama 3 regex with single digits.
    Qwen2,
    /// `qwen35`: the Qwen 2 regex with combining marks (`\p{M}`) counted as letters.
    Qwen35,
    /// `gpt-4o` (o200k), `llama4`, `minimax-m2`, `kanana2`, `talkie`: case-sensitive
    /// words (an upper-case run then a lower-case run, or the reverse) with the
    /// contraction glued on, digits in groups of up to three.
    Gpt4o,
    /// `glm4`, `glm5` (GLM-4.5 and later): the Llama 3 regex; whole-token words skip
    /// the merges, and there is no default BOS token.
    Glm4,
    /// `deepseek-llm`: six passes (each line break alone; a letter run of the Latin,
    /// Greek, Cyrillic, ... scripts DeepSeek lists, with one leading white space; an ASCII
    /// or full-width punctuation run, likewise; trailing white space; CJK and Hangul runs;
    /// number runs).
    DeepSeekLlm,
    /// `deepseek-v3`, `hunyuan-dense`, `hy_v4`, `joyai-llm`: three passes (numbers in
    /// groups of up to three; runs of CJK ideographs and kana; words with letters and
    /// marks, an ASCII punctuation character glued to ASCII letters, punctuation and
    /// symbol runs, white space as in Llama 3).
    DeepSeekV3,
    /// `gemma4` (the `gemma4` tokenizer model), `granite-embed-multi-311m`: SentencePiece
    /// style BPE. Spaces become `▁`, the text is cut only between runs of newlines and
    /// other characters, merges run on raw UTF-8 and unknown bytes fall back to `<0xXX>`.
    Gemma4,
}

impl PreTokenizer {
    /// The preset for a `tokenizer.ggml.pre` value, `None` when unsupported.
    pub fn from_name(name: Option<&str>) -> Option<Self> {
        Some(match name.unwrap_or("default") {
            "" | "default" => Self::Default,
            "gpt-2" | "gpt2" | "phi-2" | "mpt" | "olmo" | "jina-es" | "jina-de" | "gigachat"
            | "jina-v2-es" | "jina-v2-de" | "roberta-bpe" | "jina-v1-en" | "jina-v2-code" => {
                Self::Gpt2
            }
            "llama3" | "llama-v3" | "llama-bpe" | "falcon3" | "pixtral" | "dbrx" | "smaug-bpe" => {
                Self::Llama3
            }
            "qwen2" | "deepseek-r1-qwen" | "stablelm2" => Self::Qwen2,
            "qwen35" => Self::Qwen35,
            "gpt-4o" | "llama4" | "minimax-m2" | "kanana2" | "talkie" => Self::Gpt4o,
            "gemma4" | "granite-embed-multi-311m" => Self::Gemma4,
            "glm4" | "glm5" => Self::Glm4,
            "deepseek-llm" => Self::DeepSeekLlm,
            "deepseek-v3" | "hunyuan-dense" | "hy_v4" | "joyai-llm" => Self::DeepSeekV3,
            _ => return None,
        })
    }

    /// The name written to `tokenizer.ggml.pre` for this preset.
    pub fn name(self) -> &'static str {
        match self {
            Self::Default => "default",
            Self::Gpt2 => "gpt-2",
            Self::Llama3 => "llama-bpe",
            Self::Qwen2 => "qwen2",
            Self::Qwen35 => "qwen35",
            Self::Gpt4o => "gpt-4o",
            Self::Gemma4 => "gemma4",
            Self::Glm4 => "glm4",
            Self::DeepSeekLlm => "deepseek-llm",
            Self::DeepSeekV3 => "deepseek-v3",
        }
    }

    /// Whether words that are whole tokens skip the merges (llama.cpp's `ignore_merges`).
    pub(crate) fn ignore_merges(self) -> bool {
        matches!(self, Self::Llama3 | Self::Glm4)
    }

    /// Whether the model has a BOS token when the file names none (llama.cpp's default
    /// `special_bos_id` of byte-level BPE is 11; `glm4` clears it).
    pub(crate) fn default_bos(self) -> bool {
        !matches!(self, Self::Glm4)
    }

    /// Whether detokenization tidies spaces before punctuation (`clean_spaces`).
    pub(crate) fn clean_spaces(self) -> bool {
        !matches!(
            self,
            Self::Qwen2 | Self::Qwen35 | Self::Gpt4o | Self::DeepSeekLlm | Self::DeepSeekV3
        )
    }

    /// Whether words are byte-level: each byte becomes its GPT-2 stand-in character
    /// before merging. `false` for SentencePiece-style BPE, whose tokens hold raw UTF-8
    /// with `▁` for spaces.
    pub fn byte_level(self) -> bool {
        !matches!(self, Self::Gemma4)
    }

    /// Splits `text` into words (as `&str` slices of it).
    pub fn split(self, text: &str) -> Vec<&str> {
        let chars: Vec<(usize, char)> = text.char_indices().collect();
        let cps: Vec<char> = chars.iter().map(|&(_, c)| c).collect();
        let flags: Vec<Flags> = cps.iter().map(|&c| Flags::of(c)).collect();
        let mut segs = vec![cps.len()];
        match self {
            Self::Gpt2 => segs = split_gpt2(&cps, &flags, &segs),
            Self::Llama3 => segs = split_llama3(&cps, &flags, &segs, 3, false),
            Self::Qwen2 => segs = split_llama3(&cps, &flags, &segs, 1, false),
            Self::Qwen35 => segs = split_llama3(&cps, &flags, &segs, 1, true),
            Self::Gpt4o => segs = split_gpt4o(&cps, &flags, &segs),
            Self::Glm4 => segs = split_llama3(&cps, &flags, &segs, 3, false),
            Self::Gemma4 => segs = split_runs(&segs, usize::MAX, |i| cps[i] == '\n'),
            Self::Default => {
                segs = split_runs(&segs, usize::MAX, |i| default_punct(cps[i], flags[i]));
                segs = split_gpt2(&cps, &flags, &segs);
                segs = split_runs(&segs, usize::MAX, |i| collapsed_number(cps[i], flags[i]));
                segs = split_digit_triples(&cps, &segs);
            }
            Self::DeepSeekLlm => {
                let wide = |i: usize| wide(cps[i], flags[i]);
                let space = |i: usize| flags[i].space;
                segs = split_runs(&segs, 1, |i| matches!(cps[i], '\r' | '\n'));
                segs = split_lead_runs(&segs, space, |i| in_ranges(DEEPSEEK_LETTERS, wide(i)));
                segs = split_lead_runs(&segs, space, |i| in_ranges(DEEPSEEK_PUNCT, wide(i)));
                segs = split_trailing(&segs, space);
                segs = split_runs(&segs, usize::MAX, |i| {
                    in_ranges(DEEPSEEK_CJK_HANGUL, wide(i))
                });
                segs = split_runs(&segs, usize::MAX, |i| collapsed_number(cps[i], flags[i]));
            }
            Self::DeepSeekV3 => {
                segs = split_runs(&segs, 3, |i| collapsed_number(cps[i], flags[i]));
                segs = split_runs(&segs, usize::MAX, |i| {
                    in_ranges(DEEPSEEK3_CJK_KANA, wide(cps[i], flags[i]))
                });
                segs = split_deepseek3(&cps, &flags, &segs);
            }
        }
        let mut out = Vec::with_capacity(segs.len());
        let mut start = 0usize;
        for len in segs {
            let b0 = chars.get(start).map_or(text.len(), |c| c.0);
            let b1 = chars.get(start + len).map_or(text.len(), |c| c.0);
            out.push(&text[b0..b1]);
            start += len;
        }
        out
    }
}

/// `[\p{P}\$\+<=>\^~\|]` as llama.cpp's collapsed-text regex sees it: the ASCII set it
/// lists for `\p{P}` plus the symbols named, and any non-ASCII punctuation that is not
/// white space.
fn default_punct(c: char, f: Flags) -> bool {
    if c.is_ascii() {
        matches!(
            c,
            '!' | '"'
                | '#'
                | '%'..='*'
                | ','..='/'
                | ':'
                | ';'
                | '?'
                | '@'
                | '['..=']'
                | '_'
                | '{'
                | '}'
                | '$'
                | '+'
                | '<'
                | '='
                | '>'
                | '^'
                | '~'
                | '|'
        )
    } else {
        !f.space && f.punct() && !f.letter() && !f.number()
    }
}

/// `\p{N}` on the collapsed text: ASCII digits and non-ASCII numbers.
fn collapsed_number(c: char, f: Flags) -> bool {
    if c.is_ascii() {
        c.is_ascii_digit()
    } else {
        !f.space && f.number()
    }
}

/// Within each segment, every maximal run of code points matching `pred` becomes a word
/// (cut into pieces of at most `max`, from the left: `P{1,max}`) and so does each gap
/// between runs (regex split keeping both matches and gaps).
fn split_runs(segs: &[usize], max: usize, pred: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let end = start + len;
        let mut gap_start = start;
        let mut i = start;
        while i < end {
            if pred(i) {
                let m0 = i;
                while i < end && i - m0 < max && pred(i) {
                    i += 1;
                }
                if m0 > gap_start {
                    out.push(m0 - gap_start);
                }
                out.push(i - m0);
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if end > gap_start {
            out.push(end - gap_start);
        }
        start = end;
    }
    out
}

/// `L?R+` (an optional, greedy lead code point, then a run): within each segment, every
/// leftmost match becomes a word and so does each gap between matches.
fn split_lead_runs(
    segs: &[usize],
    lead: impl Fn(usize) -> bool,
    run: impl Fn(usize) -> bool,
) -> Vec<usize> {
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let end = start + len;
        let mut gap_start = start;
        let mut i = start;
        while i < end {
            let from = if lead(i) && i + 1 < end && run(i + 1) {
                i + 1
            } else if run(i) {
                i
            } else {
                i += 1;
                continue;
            };
            let mut j = from;
            while j < end && run(j) {
                j += 1;
            }
            if i > gap_start {
                out.push(i - gap_start);
            }
            out.push(j - i);
            i = j;
            gap_start = j;
        }
        if end > gap_start {
            out.push(end - gap_start);
        }
        start = end;
    }
    out
}

/// `P+$`: the run of code points matching `pred` that ends a segment becomes a word of
/// its own.
fn split_trailing(segs: &[usize], pred: impl Fn(usize) -> bool) -> Vec<usize> {
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let end = start + len;
        let mut q = end;
        while q > start && pred(q - 1) {
            q -= 1;
        }
        if q > start {
            out.push(q - start);
        }
        if end > q {
            out.push(end - q);
        }
        start = end;
    }
    out
}

/// A code point as llama.cpp's `std::wregex` passes (regexes with no `\p{..}` class)
/// see it: non-ASCII white space becomes `\v`, so that `\s` matches it and a bracket
/// listing it (U+3000 in DeepSeek's punctuation) does not.
fn wide(c: char, f: Flags) -> u32 {
    if !c.is_ascii() && f.space {
        0x0B
    } else {
        c as u32
    }
}

/// Whether `cp` lies in one of `ranges` (inclusive, sorted, disjoint).
fn in_ranges(ranges: &[(u32, u32)], cp: u32) -> bool {
    let i = ranges.partition_point(|&(_, last)| last < cp);
    ranges.get(i).is_some_and(|&(first, _)| first <= cp)
}

/// The letters of DeepSeek LLM's `\s?[A-Za-zµÀ-ÖØ-öø-ƺ...]+` (llama.cpp's
/// `LLAMA_VOCAB_PRE_TYPE_DEEPSEEK_LLM`), as inclusive code point ranges.
#[rustfmt::skip]
const DEEPSEEK_LETTERS: &[(u32, u32)] = &[
    (0x41, 0x5A), (0x61, 0x7A), (0xB5, 0xB5), (0xC0, 0xD6), (0xD8, 0xF6), (0xF8, 0x1BA),
    (0x1BC, 0x1BF), (0x1C4, 0x293), (0x295, 0x2AF), (0x370, 0x373), (0x376, 0x377),
    (0x37B, 0x37D), (0x37F, 0x37F), (0x386, 0x386), (0x388, 0x38A), (0x38C, 0x38C),
    (0x38E, 0x3A1), (0x3A3, 0x3F5), (0x3F7, 0x481), (0x48A, 0x52F), (0x531, 0x556),
    (0x10A0, 0x10C5), (0x13A0, 0x13F5), (0x13F8, 0x13FD), (0x1C90, 0x1CBA), (0x1CBD, 0x1CBF),
    (0x1D00, 0x1D2B), (0x1D6B, 0x1D77), (0x1D79, 0x1D9A), (0x1E00, 0x1F15), (0x1F18, 0x1F1D),
    (0x1F20, 0x1F45), (0x1F48, 0x1F4D), (0x1F50, 0x1F57), (0x1F59, 0x1F59), (0x1F5B, 0x1F5B),
    (0x1F5D, 0x1F5D), (0x1F5F, 0x1F7D), (0x1F80, 0x1FB4), (0x1FB6, 0x1FBC), (0x1FBE, 0x1FBE),
    (0x1FC2, 0x1FC4), (0x1FC6, 0x1FCC), (0x1FD0, 0x1FD3), (0x1FD6, 0x1FDB), (0x1FE0, 0x1FEC),
    (0x1FF2, 0x1FF4), (0x1FF6, 0x1FFC), (0x2102, 0x2102), (0x2107, 0x2107), (0x210A, 0x2113),
    (0x2115, 0x2115), (0x2119, 0x211D), (0x2124, 0x2124), (0x2126, 0x2126), (0x2128, 0x2128),
    (0x212A, 0x212D), (0x212F, 0x2134), (0x2139, 0x2139), (0x213C, 0x213F), (0x2145, 0x2149),
    (0x214E, 0x214E), (0x2183, 0x2184), (0x2C00, 0x2C7B), (0x2C7E, 0x2CE4), (0x2CEB, 0x2CEE),
    (0x2CF2, 0x2CF3), (0xA640, 0xA66D), (0xA680, 0xA69B), (0xA722, 0xA76F), (0xA771, 0xA787),
    (0xA78B, 0xA78E), (0xAB70, 0xABBF), (0xFB00, 0xFB06), (0xFB13, 0xFB17), (0xFF21, 0xFF3A),
    (0xFF41, 0xFF5A), (0x10400, 0x1044F), (0x104B0, 0x104D3), (0x104D8, 0x104FB),
    (0x10C80, 0x10CB2), (0x10CC0, 0x10CF2), (0x118A0, 0x118DF), (0x1E900, 0x1E943),
];

/// DeepSeek LLM's `\s?[!-/:-~！-／：-～‘-‟　-。]+`: ASCII punctuation (and, from `:-~`,
/// the ASCII letters), its full-width forms, the curly quotes, and U+3000 to U+3002.
const DEEPSEEK_PUNCT: &[(u32, u32)] = &[
    (0x21, 0x2F),
    (0x3A, 0x7E),
    (0x2018, 0x201F),
    (0x3000, 0x3002),
    (0xFF01, 0xFF0F),
    (0xFF1A, 0xFF5E),
];

/// DeepSeek LLM's `[一-龥ࠀ-一가-퟿]+`: U+0800 to U+9FA5 and U+AC00 to U+D7FF.
const DEEPSEEK_CJK_HANGUL: &[(u32, u32)] = &[(0x800, 0x9FA5), (0xAC00, 0xD7FF)];

/// DeepSeek V3's `[一-龥぀-ゟ゠-ヿ]+`: CJK ideographs to U+9FA5, hiragana and katakana.
const DEEPSEEK3_CJK_KANA: &[(u32, u32)] = &[(0x3040, 0x30FF), (0x4E00, 0x9FA5)];

/// `[0-9][0-9][0-9]`: leftmost non-overlapping ASCII digit triples, gaps kept.
fn split_digit_triples(cps: &[char], segs: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let end = start + len;
        let mut gap_start = start;
        let mut i = start;
        while i + 3 <= end {
            if cps[i..i + 3].iter().all(|c| c.is_ascii_digit()) {
                if i > gap_start {
                    out.push(i - gap_start);
                }
                out.push(3);
                i += 3;
                gap_start = i;
            } else {
                i += 1;
            }
        }
        if end > gap_start {
            out.push(end - gap_start);
        }
        start = end;
    }
    out
}

/// A cursor over one segment: positions outside it read as "no character".
struct Seg<'a> {
    cps: &'a [char],
    flags: &'a [Flags],
    ini: usize,
    end: usize,
    prev_end: usize,
    out: Vec<usize>,
}

impl Seg<'_> {
    fn cpt(&self, pos: usize) -> Option<char> {
        (self.ini <= pos && pos < self.end).then(|| self.cps[pos])
    }
    fn flags(&self, pos: usize) -> Flags {
        if self.ini <= pos && pos < self.end {
            self.flags[pos]
        } else {
            Flags::default()
        }
    }
    /// Ends the current word at `end`; returns its length.
    fn add(&mut self, end: usize) -> usize {
        let len = end - self.prev_end;
        if len > 0 {
            self.out.push(len);
        }
        self.prev_end = end;
        len
    }
}

/// Length of a contraction (`'s`, `'t`, `'re`, `'ve`, `'m`, `'ll`, `'d`) at `pos`, or 0.
fn contraction(s: &Seg<'_>, pos: usize, fold_case: bool) -> usize {
    if s.cpt(pos) != Some('\'') || pos + 1 >= s.end {
        return 0;
    }
    let low = |p: usize| {
        s.cpt(p)
            .map(|c| if fold_case { c.to_ascii_lowercase() } else { c })
    };
    let n1 = low(pos + 1);
    if matches!(n1, Some('s' | 't' | 'm' | 'd')) {
        return 2;
    }
    if pos + 2 < s.end {
        let n2 = low(pos + 2);
        if matches!(
            (n1, n2),
            (Some('r'), Some('e')) | (Some('v'), Some('e')) | (Some('l'), Some('l'))
        ) {
            return 3;
        }
    }
    0
}

/// GPT-2: `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`.
fn split_gpt2(cps: &[char], flags: &[Flags], segs: &[usize]) -> Vec<usize> {
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let mut s = Seg {
            cps,
            flags,
            ini: start,
            end: start + len,
            prev_end: start,
            out: std::mem::take(&mut out),
        };
        let mut pos = s.ini;
        while pos < s.end {
            let cpt = s.cpt(pos);
            let fl = s.flags(pos);
            let c = contraction(&s, pos, false);
            if c > 0 {
                pos += s.add(pos + c);
                continue;
            }
            let lead_space = cpt == Some(' ');
            let mut f2 = if lead_space { s.flags(pos + 1) } else { fl };
            if f2.letter() {
                pos += usize::from(lead_space);
                while f2.letter() {
                    pos += 1;
                    f2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }
            if f2.number() {
                pos += usize::from(lead_space);
                while f2.number() {
                    pos += 1;
                    f2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }
            if !(f2.space || f2.letter() || f2.number()) && f2.any() {
                pos += usize::from(lead_space);
                while !(f2.space || f2.letter() || f2.number()) && f2.any() {
                    pos += 1;
                    f2 = s.flags(pos);
                }
                s.add(pos);
                continue;
            }
            let mut n_ws = 0;
            while s.flags(pos + n_ws).space {
                n_ws += 1;
            }
            if n_ws > 1 && s.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                s.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                s.add(pos);
                continue;
            }
            pos += 1;
            s.add(pos);
        }
        out = s.out;
        start += len;
    }
    out
}

/// Llama 3 (`max_digits` 3) and Qwen 2 (`max_digits` 1):
/// `(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max}|
/// ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+`.
/// With `marks` (Qwen 3.5), `\p{L}` reads `[\p{L}\p{M}]` in the word and punctuation
/// runs, as llama.cpp's `unicode_regex_split_custom_qwen35` does.
fn split_llama3(
    cps: &[char],
    flags: &[Flags],
    segs: &[usize],
    max_digits: usize,
    marks: bool,
) -> Vec<usize> {
    let word = |f: Flags| f.letter() || (marks && f.mark());
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let mut s = Seg {
            cps,
            flags,
            ini: start,
            end: start + len,
            prev_end: start,
            out: std::mem::take(&mut out),
        };
        let mut pos = s.ini;
        while pos < s.end {
            let cpt = s.cpt(pos);
            let fl = s.flags(pos);
            let c = contraction(&s, pos, true);
            if c > 0 {
                pos += s.add(pos + c);
                continue;
            }
            let is_crlf = |c: Option<char>| matches!(c, Some('\r' | '\n'));
            if !(is_crlf(cpt) || fl.number()) && (word(fl) || word(s.flags(pos + 1))) {
                pos += 1;
                while word(s.flags(pos)) {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }
            if fl.number() {
                let mut ini = pos;
                while s.flags(pos).number() {
                    pos += 1;
                    if pos - ini >= max_digits {
                        s.add(pos);
                        ini = pos;
                    }
                }
                s.add(pos);
                continue;
            }
            let lead_space = cpt == Some(' ');
            let mut f2 = if lead_space { s.flags(pos + 1) } else { fl };
            if !(f2.space || word(f2) || f2.number()) && fl.any() {
                pos += usize::from(lead_space);
                while !(f2.space || word(f2) || f2.number()) && f2.any() {
                    pos += 1;
                    f2 = s.flags(pos);
                }
                while is_crlf(s.cpt(pos)) {
                    pos += 1;
                }
                s.add(pos);
                continue;
            }
            let mut n_ws = 0;
            let mut last_crlf_end = 0;
            while s.flags(pos + n_ws).space {
                if is_crlf(s.cpt(pos + n_ws)) {
                    last_crlf_end = pos + n_ws + 1;
                }
                n_ws += 1;
            }
            if last_crlf_end > 0 {
                pos = last_crlf_end;
                s.add(pos);
                continue;
            }
            if n_ws > 1 && s.cpt(pos + n_ws).is_some() {
                pos += n_ws - 1;
                s.add(pos);
                continue;
            }
            if n_ws > 0 {
                pos += n_ws;
                s.add(pos);
                continue;
            }
            pos += 1;
            s.add(pos);
        }
        out = s.out;
        start += len;
    }
    out
}

/// What llama.cpp's `std::regex` sees of one code point when it runs a regex with
/// `\p{..}` classes (GPT-4o, DeepSeek V3) on the collapsed text: ASCII stays itself (and
/// `\s` is C's `isspace`), every other code point becomes one byte for its class (white
/// space, letter, number, mark, punctuation, symbol, other).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Collapsed {
    /// `A-Z`: a letter, not lower case.
    Upper,
    /// `a-z`: a letter, not upper case.
    Lower,
    /// A non-ASCII letter: the regex's `[^a-z]` and `[^A-Z]` both accept it.
    Letter,
    /// `0-9` or a non-ASCII number.
    Number,
    /// `\r` or `\n`.
    Newline,
    /// The space character.
    Space,
    /// Other white space: tab, vertical tab, form feed, non-ASCII white space.
    White,
    /// A non-ASCII combining mark (`\p{M}`).
    Mark,
    /// Punctuation or a symbol (`\p{P}`, `\p{S}`): ASCII graphic characters other than
    /// letters and digits, non-ASCII punctuation and symbols.
    Punct,
    /// Anything else.
    Other,
}

impl Collapsed {
    fn of(c: char, f: Flags) -> Self {
        match c {
            'A'..='Z' => Self::Upper,
            'a'..='z' => Self::Lower,
            '0'..='9' => Self::Number,
            '\r' | '\n' => Self::Newline,
            ' ' => Self::Space,
            '\t' | '\x0B' | '\x0C' => Self::White,
            _ if c.is_ascii_punctuation() => Self::Punct,
            _ if c.is_ascii() => Self::Other,
            _ if f.space => Self::White,
            _ if f.letter() => Self::Letter,
            _ if f.number() => Self::Number,
            _ if f.mark() => Self::Mark,
            _ if f.punct() || f.symbol() => Self::Punct,
            _ => Self::Other,
        }
    }
    /// `[A-Za-z]`.
    fn ascii_letter(self) -> bool {
        matches!(self, Self::Upper | Self::Lower)
    }
    /// `[\p{L}\p{M}]`.
    fn letter_or_mark(self) -> bool {
        self.letter() || self == Self::Mark
    }
    fn punct(self) -> bool {
        self == Self::Punct
    }
    fn space(self) -> bool {
        matches!(self, Self::Newline | Self::Space | Self::White)
    }
    fn letter(self) -> bool {
        matches!(self, Self::Upper | Self::Lower | Self::Letter)
    }
    /// `(?=[\p{L}])([^a-z])`.
    fn upper(self) -> bool {
        matches!(self, Self::Upper | Self::Letter)
    }
    /// `(?=[\p{L}])([^A-Z])`.
    fn lower(self) -> bool {
        matches!(self, Self::Lower | Self::Letter)
    }
    /// `[^\r\n\p{L}\p{N}]`.
    fn lead(self) -> bool {
        !matches!(self, Self::Newline | Self::Number) && !self.letter()
    }
    /// `[^\s\p{L}\p{N}]`.
    fn symbol(self) -> bool {
        !self.space() && !self.letter() && self != Self::Number
    }
}

/// GPT-4o (o200k) as llama.cpp runs it: `std::regex` (ECMAScript: the first alternative
/// that matches wins, quantifiers greedy with backtracking) over the collapsed text, of
/// `[^\r\n\p{L}\p{N}]?U*L+C?|[^\r\n\p{L}\p{N}]?U+L*C?|\p{N}{1,3}|
/// ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+`, where `U` is a letter other
/// than `a-z`, `L` a letter other than `A-Z` and `C` an ASCII contraction (`'s`, `'T`,
/// `'re`, ...: each letter in either case). The Hugging Face regex has `\p{M}` in `U` and
/// `L` and Unicode case classes; llama.cpp's has neither, and its behaviour is the one
/// checked here.
fn split_gpt4o(cps: &[char], flags: &[Flags], segs: &[usize]) -> Vec<usize> {
    let class: Vec<Collapsed> = cps
        .iter()
        .zip(flags)
        .map(|(&c, &f)| Collapsed::of(c, f))
        .collect();
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let end = start + len;
        let at = |p: usize| (p < end).then(|| class[p]);
        let run = |mut p: usize, pred: fn(Collapsed) -> bool| {
            while at(p).is_some_and(pred) {
                p += 1;
            }
            p
        };
        // `(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])?` at `p`.
        let contraction = |p: usize| -> usize {
            if p >= end || cps[p] != '\'' {
                return p;
            }
            let low = |q: usize| (q < end).then(|| cps[q].to_ascii_lowercase());
            match (low(p + 1), low(p + 2)) {
                (Some('s' | 't' | 'm' | 'd'), _) => p + 2,
                (Some('r' | 'v'), Some('e')) | (Some('l'), Some('l')) => p + 3,
                _ => p,
            }
        };
        let mut pos = start;
        while pos < end {
            let c = class[pos];
            // The optional leading character of the two word alternatives. Without it
            // neither can match either: it is not a letter.
            let w = if c.lead() { pos + 1 } else { pos };
            let ups = run(w, Collapsed::upper);
            // U*L+: U* gives back characters until one the L+ can start on.
            let lower_from = if at(ups) == Some(Collapsed::Lower) {
                Some(ups)
            } else {
                (w..ups).rev().find(|&p| class[p] == Collapsed::Letter)
            };
            let next = if let Some(l) = lower_from {
                contraction(run(l, Collapsed::lower))
            } else if ups > w {
                // U+L*.
                contraction(run(ups, Collapsed::lower))
            } else if c == Collapsed::Number {
                let mut p = pos + 1;
                while p < end && p < pos + 3 && class[p] == Collapsed::Number {
                    p += 1;
                }
                p
            } else if c.symbol()
                || (c == Collapsed::Space && at(pos + 1).is_some_and(Collapsed::symbol))
            {
                let p = run(if c.symbol() { pos } else { pos + 1 }, Collapsed::symbol);
                let mut p = p;
                while p < end && matches!(cps[p], '\r' | '\n' | '/') {
                    p += 1;
                }
                p
            } else {
                white_space_word(&class, pos, end)
            };
            out.push(next - pos);
            pos = next;
        }
        start = end;
    }
    out
}

/// The end of the word `\s*[\r\n]+|\s+(?!\S)|\s+` matches at `pos` on the collapsed
/// text, the segment ending at `end`: through the last newline of the white-space run,
/// else all of the run but its last character when something follows, else all of it
/// (at least the character at `pos`).
fn white_space_word(class: &[Collapsed], pos: usize, end: usize) -> usize {
    let mut ws = pos;
    while ws < end && class[ws].space() {
        ws += 1;
    }
    if let Some(nl) = (pos..ws).rev().find(|&p| class[p] == Collapsed::Newline) {
        nl + 1
    } else if ws < end && ws - pos > 1 {
        ws - 1
    } else {
        ws.max(pos + 1)
    }
}

/// DeepSeek V3's last pass as llama.cpp runs it: `std::regex` (ECMAScript: leftmost match,
/// the first alternative that matches there) over the collapsed text, of
/// `[!-/:-@\[-`{-~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|
/// \s*[\r\n]+|\s+(?!\S)|\s+` (its first class lists the ASCII punctuation and
/// symbols). Code points where no alternative matches (control characters, numbers,
/// unassigned ones) stay between the words, a run of them one word.
fn split_deepseek3(cps: &[char], flags: &[Flags], segs: &[usize]) -> Vec<usize> {
    let class: Vec<Collapsed> = cps
        .iter()
        .zip(flags)
        .map(|(&c, &f)| Collapsed::of(c, f))
        .collect();
    let mut out = Vec::with_capacity(segs.len());
    let mut start = 0;
    for &len in segs {
        let end = start + len;
        let at = |p: usize| (p < end).then(|| class[p]);
        let run = |mut p: usize, pred: fn(Collapsed) -> bool| {
            while at(p).is_some_and(pred) {
                p += 1;
            }
            p
        };
        // `[\r\n]*` after a punctuation run.
        let newlines = |mut p: usize| {
            while at(p) == Some(Collapsed::Newline) {
                p += 1;
            }
            p
        };
        let mut gap_start = start;
        let mut pos = start;
        while pos < end {
            let c = class[pos];
            // `[^\r\n\p{L}\p{P}\p{S}]`: the optional lead of a letter-and-mark run.
            let lead = c != Collapsed::Newline && !c.letter() && !c.punct();
            let next = if c.punct()
                && cps[pos].is_ascii()
                && at(pos + 1).is_some_and(Collapsed::ascii_letter)
            {
                Some(run(pos + 1, Collapsed::ascii_letter))
            } else if lead && at(pos + 1).is_some_and(Collapsed::letter_or_mark) {
                Some(run(pos + 1, Collapsed::letter_or_mark))
            } else if c.letter_or_mark() {
                Some(run(pos, Collapsed::letter_or_mark))
            } else if c == Collapsed::Space && at(pos + 1).is_some_and(Collapsed::punct) {
                Some(newlines(run(pos + 1, Collapsed::punct)))
            } else if c.punct() {
                Some(newlines(run(pos, Collapsed::punct)))
            } else if c.space() {
                Some(white_space_word(&class, pos, end))
            } else {
                None
            };
            match next {
                Some(next) => {
                    if pos > gap_start {
                        out.push(pos - gap_start);
                    }
                    out.push(next - pos);
                    pos = next;
                    gap_start = next;
                }
                None => pos += 1,
            }
        }
        if end > gap_start {
            out.push(end - gap_start);
        }
        start = end;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpt2_words() {
        let w = PreTokenizer::Gpt2.split("Hello world's  end 123!!\n");
        assert_eq!(
            w,
            ["Hello", " world", "'s", " ", " end", " 123", "!!", "\n"]
        );
    }

    #[test]
    fn llama3_digits_and_newlines() {
        let w = PreTokenizer::Llama3.split("x 12345\n\n  y");
        assert_eq!(w, ["x", " ", "123", "45", "\n\n", " ", " y"]);
        let w = PreTokenizer::Qwen2.split("ab12");
        assert_eq!(w, ["ab", "1", "2"]);
    }

    #[test]
    fn qwen35_marks_join_letters() {
        let w = PreTokenizer::Qwen35.split("e\u{301}x \u{301}\u{301}!");
        assert_eq!(w, ["e\u{301}x", " \u{301}\u{301}", "!"]);
        let w = PreTokenizer::Qwen2.split("e\u{301}x \u{301}\u{301}!");
        assert_eq!(w, ["e", "\u{301}x", " \u{301}\u{301}!"]);
    }

    #[test]
    fn gpt4o_case_runs() {
        let w = PreTokenizer::Gpt4o.split("HTTPServer camelCase DON'T it's 12345");
        assert_eq!(
            w,
            [
                "HTTPServer",
                " camel",
                "Case",
                " DON'T",
                " it's",
                " ",
                "123",
                "45"
            ]
        );
        // A non-ASCII letter is both upper and lower case to the collapsed regex.
        let w = PreTokenizer::Gpt4o.split("AΓB a/b//\n/x");
        assert_eq!(w, ["AΓ", "B", " a", "/b", "//\n/", "x"]);
    }

    #[test]
    fn deepseek_llm_passes() {
        // Non-ASCII letters outside DeepSeek's ranges fall out of the letter runs and
        // the punctuation pass (whose `:-~` holds the ASCII letters) cuts the rest.
        let w = PreTokenizer::DeepSeekLlm.split("café It's x1y22 \u{3000}、");
        assert_eq!(
            w,
            ["caf", "é", " It", "'", "s", " x", "1", "y", "22", " ", "\u{3000}", "、"]
        );
        let w = PreTokenizer::DeepSeekLlm.split("a\r\n\r\nb  ");
        assert_eq!(w, ["a", "\r", "\n", "\r", "\n", "b", "  "]);
    }

    #[test]
    fn deepseek_v3_passes() {
        // An ASCII punctuation character joins the ASCII letters after it, but not after
        // a space; CJK and kana runs are cut out before the letters are.
        let w = PreTokenizer::DeepSeekV3.split("!abc café It's x12345 !a ぁゟ゠ヿ\r\n\r\nb");
        assert_eq!(
            w,
            [
                "!abc", " café", " It", "'s", " x", "123", "45", " !", "a", " ", "ぁゟ", "゠",
                "ヿ", "\r\n\r\n", "b"
            ]
        );
        // Control characters lead a letter run or stay between the words.
        let w = PreTokenizer::DeepSeekV3.split("\0abc \u{1}\u{2} def");
        assert_eq!(w, ["\0abc", " ", "\u{1}\u{2}", " def"]);
    }

    /// `in_ranges` needs sorted, disjoint ranges.
    #[test]
    fn range_tables_are_sorted() {
        for t in [
            DEEPSEEK_LETTERS,
            DEEPSEEK_PUNCT,
            DEEPSEEK_CJK_HANGUL,
            DEEPSEEK3_CJK_KANA,
        ] {
            assert!(t.iter().all(|&(a, b)| a <= b));
            assert!(t.windows(2).all(|w| w[0].1 < w[1].0), "{t:x?}");
        }
        assert!(in_ranges(DEEPSEEK_LETTERS, 'é' as u32));
        assert!(!in_ranges(DEEPSEEK_LETTERS, 'ƻ' as u32));
        assert!(in_ranges(DEEPSEEK_LETTERS, 0x1E943));
        assert!(!in_ranges(DEEPSEEK_LETTERS, 0x1E944));
    }

    #[test]
    fn gemma4_newline_runs() {
        let w = PreTokenizer::Gemma4.split("a b\n\nc\n");
        assert_eq!(w, ["a b", "\n\n", "c", "\n"]);
    }

    /// Every preset cuts any text into non-empty words that make it up again.
    #[test]
    fn words_make_up_the_text() {
        let pool = [
            'A', 'Z', 'a', 's', 'T', 'Γ', 'γ', '日', '1', '٣', '²', ' ', '\t', '\n', '\r', '\x0B',
            '\u{301}', '\'', '/', '!', '\u{3000}', '\u{85}', '😀', '\0', '\u{1C}', 'é', 'ア', '한',
            '。', '！', '‘',
        ];
        let presets = [
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
        ];
        let mut x: u64 = 0x2545_f491_4f6c_dd1d;
        let mut next = || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        for _ in 0..3000 {
            let len = (next() % 24) as usize;
            let text: String = (0..len)
                .map(|_| pool[(next() % pool.len() as u64) as usize])
                .collect();
            for pre in presets {
                let words = pre.split(&text);
                assert!(words.iter().all(|w| !w.is_empty()), "{pre:?} {text:?}");
                assert_eq!(words.concat(), text, "{pre:?}");
            }
        }
    }

    #[test]
    fn default_passes() {
        let w = PreTokenizer::Default.split("a,b 1234");
        assert_eq!(w, ["a", ",", "b", " ", "123", "4"]);
    }

    #[test]
    fn classes() {
        assert!(Flags::of('é').letter());
        assert!(Flags::of('٣').number());
        assert!(Flags::of('\u{3000}').space);
        assert!(Flags::of('。').punct());
    }
}
