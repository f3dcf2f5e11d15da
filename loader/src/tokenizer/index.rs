//! A compact text → id index over the whole vocabulary.
//!
//! A vocabulary of 262,144 strings in a `HashMap<String, u32>` costs one allocation per
//! token; here every token text lives in one byte buffer and an open-addressing table
//! holds ids only, so building the index is a single pass with two allocations.

/// FxHash-style mixing over bytes: fast, good enough for a table we own.
pub(crate) fn hash_bytes(bytes: &[u8]) -> u64 {
    const K: u64 = 0x51_7c_c1_b7_27_22_0a_95;
    let mut h: u64 = bytes.len() as u64;
    let mut chunks = bytes.chunks_exact(8);
    for c in &mut chunks {
        let mut w = [0u8; 8];
        w.copy_from_slice(c);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    let rest = chunks.remainder();
    if !rest.is_empty() {
        let mut w = [0u8; 8];
        w[..rest.len()].copy_from_slice(rest);
        h = (h.rotate_left(5) ^ u64::from_le_bytes(w)).wrapping_mul(K);
    }
    // Final avalanche so the low bits (the table slot) depend on every input bit.
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h
}

const EMPTY: u32 = u32::MAX;

/// Token texts stored back to back, with a hash index from text to id.
#[derive(Debug, Clone)]
pub(crate) struct VocabIndex {
    bytes: Vec<u8>,
    /// `offsets[i]..offsets[i + 1]` is token `i`'s text.
    offsets: Vec<usize>,
    table: Vec<u32>,
    mask: usize,
}

impl VocabIndex {
    /// Builds the index. When two entries share a text, the later id wins (as llama.cpp's
    /// `token_to_id[word] = i` does) unless `keep_first` (as its merge ranks, filled with
    /// `emplace`, do).
    pub(crate) fn build<S: AsRef<[u8]>>(texts: &[S], keep_first: bool) -> Self {
        let total: usize = texts.iter().map(|t| t.as_ref().len()).sum();
        let mut bytes = Vec::with_capacity(total);
        let mut offsets = Vec::with_capacity(texts.len() + 1);
        offsets.push(0);
        for t in texts {
            bytes.extend_from_slice(t.as_ref());
            offsets.push(bytes.len());
        }
        let cap = (texts.len().max(1) * 2).next_power_of_two();
        let mut idx = Self {
            bytes,
            offsets,
            table: vec![EMPTY; cap],
            mask: cap - 1,
        };
        for id in 0..texts.len() {
            idx.insert(id as u32, keep_first);
        }
        idx
    }

    fn insert(&mut self, id: u32, keep_first: bool) {
        let text = self.text(id);
        let mut slot = (hash_bytes(text) as usize) & self.mask;
        loop {
            let cur = self.table[slot];
            if cur == EMPTY {
                self.table[slot] = id;
                return;
            }
            if self.text(cur) == self.text(id) {
                if !keep_first {
                    self.table[slot] = id;
                }
                return;
            }
            slot = (slot + 1) & self.mask;
        }
    }

    /// Number of tokens.
    pub(crate) fn len(&self) -> usize {
        self.offsets.len() - 1
    }

    /// The text of token `id` (caller guarantees `id < len()`).
    pub(crate) fn text(&self, id: u32) -> &[u8] {
        let i = id as usize;
        &self.bytes[self.offsets[i]..self.offsets[i + 1]]
    }

    /// The id whose text is exactly `text`.
    pub(crate) fn find(&self, text: &[u8]) -> Option<u32> {
        let mut slot = (hash_bytes(text) as usize) & self.mask;
        loop {
            let cur = self.table[slot];
            if cur == EMPTY {
                return None;
            }
            if self.text(cur) == text {
                return Some(cur);
            }
            slot = (slot + 1) & self.mask;
        }
    }
}
