//! Incremental detokenization: text out as soon as it is whole UTF-8.

use super::{TokenId, Tokenizer};

/// Turns generated token ids into text while streaming.
///
/// Byte tokens can split one character over several steps (`<0xF0>` `<0x9F>` `<0x98>`
/// `<0x80>` is one emoji); the decoder holds back an incomplete UTF-8 tail until it is
/// complete, and replaces bytes that can never become valid with U+FFFD. The first
/// piece loses its leading space when the tokenizer adds a space prefix (as
/// [`Tokenizer::detokenize`] does), so streamed and whole decodes agree.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    pending: Vec<u8>,
    started: bool,
    special: bool,
}

impl StreamDecoder {
    /// A decoder that renders control tokens as nothing.
    pub fn new() -> Self {
        Self::default()
    }

    /// A decoder that renders control tokens as their text when `special` is true.
    pub fn with_special(special: bool) -> Self {
        Self {
            special,
            ..Self::default()
        }
    }

    /// Feeds one token; returns the text that became complete (possibly empty).
    pub fn push(&mut self, tok: &Tokenizer, id: TokenId) -> String {
        let piece = tok.token_to_piece(id, self.special);
        let mut piece: &[u8] = &piece;
        if !self.started {
            if tok.add_space_prefix() && piece.first() == Some(&b' ') {
                piece = &piece[1..];
            }
            self.started = true;
        }
        self.push_bytes(piece)
    }

    /// Feeds raw bytes; returns the text that became complete.
    pub fn push_bytes(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        loop {
            match std::str::from_utf8(&self.pending) {
                Ok(s) => {
                    out.push_str(s);
                    self.pending.clear();
                    return out;
                }
                Err(e) => {
                    let good = e.valid_up_to();
                    // The prefix was just validated.
                    out.push_str(&String::from_utf8_lossy(&self.pending[..good]));
                    match e.error_len() {
                        // Incomplete sequence at the end: wait for more bytes.
                        None => {
                            self.pending.drain(..good);
                            return out;
                        }
                        // Bytes that no continuation can fix.
                        Some(bad) => {
                            out.push('\u{FFFD}');
                            self.pending.drain(..good + bad);
                        }
                    }
                }
            }
        }
    }

    /// Ends the stream: returns what is still held (an incomplete character becomes
    /// U+FFFD) and resets the decoder.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        self.started = false;
        s
    }

    /// Whether bytes of an incomplete character are held back.
    pub fn has_pending(&self) -> bool {
        !self.pending.is_empty()
    }
}
