//! Byte-level BPE (GPT-2 style) as llama.cpp's `llm_tokenizer_bpe_session` runs it: split
//! into words with the pre-tokenizer, map every byte of a word to its printable stand-in
//! character, then merge adjacent symbols by lowest merge rank (ties: leftmost). The
//! merging itself ([`Session`]) also serves the SentencePiece-style BPE of `spm_bpe.rs`.

use std::cmp::Ordering;
use std::collections::BinaryHeap;
use std::sync::OnceLock;

use super::Tokenizer;

/// The GPT-2 byte → character table: printable Latin-1 bytes stand for themselves, the
/// rest are moved to U+0100 and up in byte order.
pub fn byte_to_char(b: u8) -> char {
    tables().0[b as usize]
}

/// The inverse of [`byte_to_char`].
pub fn char_to_byte(c: char) -> Option<u8> {
    tables().1.get(&c).copied()
}

fn tables() -> &'static ([char; 256], std::collections::HashMap<char, u8>) {
    static T: OnceLock<([char; 256], std::collections::HashMap<char, u8>)> = OnceLock::new();
    T.get_or_init(|| {
        let keeps = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let mut fwd = ['\0'; 256];
        let mut next = 256u32;
        for b in 0..=255u8 {
            fwd[b as usize] = if keeps(b) {
                char::from(b)
            } else {
                let c = char::from_u32(next).unwrap_or('\u{FFFD}');
                next += 1;
                c
            };
        }
        let back = fwd.iter().enumerate().map(|(b, &c)| (c, b as u8)).collect();
        (fwd, back)
    })
}

/// A word's bytes rewritten as their stand-in characters.
pub(crate) fn byte_encode(word: &str) -> String {
    word.bytes().map(byte_to_char).collect()
}

#[derive(Debug, Clone, Copy)]
struct Symbol {
    start: usize,
    n: usize,
    prev: isize,
    next: isize,
}

#[derive(Debug)]
struct Bigram {
    left: usize,
    right: usize,
    rank: u32,
    /// Where the two symbols' text started and how long it was when the pair was queued.
    start: usize,
    size: usize,
}

impl PartialEq for Bigram {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Bigram {}
impl PartialOrd for Bigram {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Bigram {
    /// The heap pops the greatest: lowest rank first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        other
            .rank
            .cmp(&self.rank)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Tokenizes one raw text fragment, appending to `out`.
pub(crate) fn tokenize(tok: &Tokenizer, pre: super::PreTokenizer, text: &str, out: &mut Vec<u32>) {
    let mut session = Session::default();
    for word in pre.split(text) {
        let word = byte_encode(word);
        let w = word.as_bytes();
        let whole = pre.ignore_merges() && tok.index.find(w).is_some();
        session.merge(tok, w, whole);
        for &(a, b) in &session.pieces {
            let piece = &w[a..b];
            match tok.index.find(piece) {
                Some(id) => out.push(id),
                None => {
                    // llama.cpp looks up each single byte of the encoded text; bytes that
                    // are not tokens by themselves are dropped.
                    for &b in piece {
                        if let Some(id) = tok.index.find(&[b]) {
                            out.push(id);
                        }
                    }
                }
            }
        }
    }
}

/// The merge state of one word, reused from word to word.
#[derive(Default)]
pub(crate) struct Session {
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    key: Vec<u8>,
    /// The byte ranges of the word's final symbols, in order.
    pub(crate) pieces: Vec<(usize, usize)>,
}

impl Session {
    /// Merges the word `w` (UTF-8 characters as the first symbols, or one symbol when
    /// `whole`) by merge rank and leaves its final symbols in `pieces`.
    pub(crate) fn merge(&mut self, tok: &Tokenizer, w: &[u8], whole: bool) {
        self.symbols.clear();
        self.queue.clear();
        self.pieces.clear();
        if whole {
            self.symbols.push(Symbol {
                start: 0,
                n: w.len(),
                prev: -1,
                next: -1,
            });
        } else {
            let mut offs = 0;
            while offs < w.len() {
                let n = super::spm::utf8_len(w[offs]).min(w.len() - offs);
                let idx = self.symbols.len() as isize;
                offs += n;
                self.symbols.push(Symbol {
                    start: offs - n,
                    n,
                    prev: idx - 1,
                    next: if offs == w.len() { -1 } else { idx + 1 },
                });
            }
        }
        for i in 1..self.symbols.len() {
            self.add(tok, w, i as isize - 1, i as isize);
        }
        while let Some(b) = self.queue.pop() {
            let (l, r) = (self.symbols[b.left], self.symbols[b.right]);
            if l.n == 0 || r.n == 0 {
                continue;
            }
            // Stale when the pair's text changed since it was queued (symbols are
            // contiguous, so same start and length means same text).
            if l.start != b.start || l.n + r.n != b.size || l.next != b.right as isize {
                continue;
            }
            self.symbols[b.left].n += r.n;
            self.symbols[b.right].n = 0;
            self.symbols[b.left].next = r.next;
            if r.next >= 0 {
                self.symbols[r.next as usize].prev = b.left as isize;
            }
            let (prev, next) = (self.symbols[b.left].prev, self.symbols[b.left].next);
            self.add(tok, w, prev, b.left as isize);
            self.add(tok, w, b.left as isize, next);
        }
        self.pieces.extend(
            self.symbols
                .iter()
                .filter(|s| s.n > 0)
                .map(|s| (s.start, s.start + s.n)),
        );
    }

    /// Queues the pair `l`, `r` when the merges list it.
    fn add(&mut self, tok: &Tokenizer, w: &[u8], l: isize, r: isize) {
        if l < 0 || r < 0 {
            return;
        }
        let (ls, rs) = (self.symbols[l as usize], self.symbols[r as usize]);
        self.key.clear();
        self.key.extend_from_slice(&w[ls.start..ls.start + ls.n]);
        self.key.push(0xFF);
        self.key.extend_from_slice(&w[rs.start..rs.start + rs.n]);
        if let Some(rank) = tok.merges.as_ref().and_then(|m| m.find(&self.key)) {
            self.queue.push(Bigram {
                left: l as usize,
                right: r as usize,
                rank,
                start: ls.start,
                size: ls.n + rs.n,
            });
        }
    }
}

/// A token's text decoded back from stand-in characters to bytes (llama.cpp's
/// `llama_decode_text`, including its marker for characters outside the table).
pub(crate) fn decode_text(text: &[u8]) -> Vec<u8> {
    let s = String::from_utf8_lossy(text);
    let mut out = Vec::with_capacity(s.len());
    for c in s.chars() {
        match char_to_byte(c) {
            Some(b) => out.push(b),
            None => {
                let mut buf = [0u8; 4];
                out.extend_from_slice(b"[UNK_BYTE_0x");
                for b in c.encode_utf8(&mut buf).bytes() {
                    out.extend_from_slice(format!("{b:02x}").as_bytes());
                }
                out.extend_from_slice(s.as_bytes());
                out.push(b']');
            }
        }
    }
    out
}
