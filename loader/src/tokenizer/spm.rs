//! SentencePiece-style merging as llama.cpp's `llm_tokenizer_spm` does it: start from
//! UTF-8 characters, repeatedly merge the adjacent pair whose concatenation is the
//! vocabulary entry with the highest score (ties: leftmost), then emit each final symbol
//! as its token or, failing that, as byte tokens.

use std::cmp::Ordering;
use std::collections::{BinaryHeap, HashMap};

use super::Tokenizer;

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
    score: f32,
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
    /// The heap pops the greatest: highest score first, then the leftmost pair.
    fn cmp(&self, other: &Self) -> Ordering {
        self.score
            .total_cmp(&other.score)
            .then_with(|| other.left.cmp(&self.left))
    }
}

/// Length of the UTF-8 sequence a lead byte announces (1 for stray continuation bytes).
pub(crate) fn utf8_len(b: u8) -> usize {
    match b >> 4 {
        0xC | 0xD => 2,
        0xE => 3,
        0xF => 4,
        _ => 1,
    }
}

/// Tokenizes one already-escaped text fragment, appending to `out`.
pub(crate) fn tokenize(tok: &Tokenizer, text: &[u8], out: &mut Vec<u32>) {
    let mut symbols: Vec<Symbol> = Vec::with_capacity(text.len());
    let mut offs = 0;
    while offs < text.len() {
        let n = utf8_len(text[offs]).min(text.len() - offs);
        let idx = symbols.len() as isize;
        offs += n;
        symbols.push(Symbol {
            start: offs - n,
            n,
            prev: idx - 1,
            next: if offs == text.len() { -1 } else { idx + 1 },
        });
    }
    if symbols.is_empty() {
        return;
    }

    let mut session = Session {
        tok,
        text,
        symbols,
        queue: BinaryHeap::new(),
        rev_merge: HashMap::new(),
    };
    for i in 1..session.symbols.len() {
        session.try_add_bigram(i as isize - 1, i as isize);
    }
    while let Some(b) = session.queue.pop() {
        let (l, r) = (session.symbols[b.left], session.symbols[b.right]);
        if l.n == 0 || r.n == 0 || l.n + r.n != b.size {
            continue;
        }
        session.symbols[b.left].n += r.n;
        session.symbols[b.right].n = 0;
        session.symbols[b.left].next = r.next;
        if r.next >= 0 {
            session.symbols[r.next as usize].prev = b.left as isize;
        }
        let prev = session.symbols[b.left].prev;
        let next = session.symbols[b.left].next;
        session.try_add_bigram(prev, b.left as isize);
        session.try_add_bigram(b.left as isize, next);
    }
    let mut i: isize = 0;
    while i != -1 {
        let sym = session.symbols[i as usize];
        session.resegment(sym, out);
        i = sym.next;
    }
}

struct Session<'a> {
    tok: &'a Tokenizer,
    text: &'a [u8],
    symbols: Vec<Symbol>,
    queue: BinaryHeap<Bigram>,
    /// Keyed by text, not position, exactly as llama.cpp keeps it: a later pair with the
    /// same text replaces an earlier one.
    rev_merge: HashMap<&'a [u8], (usize, usize)>,
}

impl<'a> Session<'a> {
    fn try_add_bigram(&mut self, left: isize, right: isize) {
        if left < 0 || right < 0 {
            return;
        }
        let (l, r) = (self.symbols[left as usize], self.symbols[right as usize]);
        let text: &'a [u8] = &self.text[l.start..l.start + l.n + r.n];
        let Some(id) = self.tok.index.find(text) else {
            return;
        };
        self.queue.push(Bigram {
            left: left as usize,
            right: right as usize,
            score: self.tok.scores[id as usize],
            size: text.len(),
        });
        self.rev_merge.insert(text, (left as usize, right as usize));
    }

    fn resegment(&self, sym: Symbol, out: &mut Vec<u32>) {
        let text = &self.text[sym.start..sym.start + sym.n];
        if let Some(id) = self.tok.index.find(text) {
            out.push(id);
            return;
        }
        match self.rev_merge.get(text) {
            Some(&(l, r)) => {
                self.resegment(self.symbols[l], out);
                self.resegment(self.symbols[r], out);
            }
            None => {
                for &b in text {
                    if let Some(id) = self.tok.byte_token(b) {
                        out.push(id);
                    }
                }
            }
        }
    }
}
