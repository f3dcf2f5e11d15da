//! Constrained decoding: a grammar (here a JSON schema) decides, before each draw, which
//! tokens may come next; the sampler gives every other token probability 0. The grammar
//! engine is llguidance (the parser behind vLLM's and SGLang's `guidance` backends and
//! llama.cpp's `--grammar` successor in Guidance): an Earley parser over a lexer that
//! walks a trie of the vocabulary, so a mask over a 262k vocabulary costs well under a
//! millisecond a token and needs no precomputed table per schema.

use std::sync::Arc;

use llguidance::api::TopLevelGrammar;
use llguidance::toktrie::{ApproximateTokEnv, TokEnv, TokRxInfo, TokTrie};
use llguidance::{Matcher, ParserFactory};
use serde_json::{json, Value};

/// Why a grammar could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The vocabulary could not be indexed.
    #[error("cannot index the vocabulary for constrained decoding: {0}")]
    Vocab(String),
    /// The schema does not compile (unsupported keyword, unsatisfiable, too large).
    #[error("the JSON schema cannot be enforced: {0}")]
    Schema(String),
    /// A grammar (llguidance's Lark syntax) does not compile.
    #[error("the grammar cannot be enforced: {0}")]
    Grammar(String),
}

/// `schema` with the whitespace between JSON tokens fixed (`", "` between items, `": "`
/// after keys, none elsewhere), so that a model cannot spend its tokens on spaces: the
/// form [`GrammarVocab::json_schema`] enforces, and the one to embed (`%json`) in a
/// grammar for [`GrammarVocab::lark`].
pub fn fixed_whitespace(schema: &Value) -> Result<Value, ConstraintError> {
    let mut schema = schema.clone();
    if let Some(o) = schema.as_object_mut() {
        o.insert(
            "x-guidance".into(),
            json!({"whitespace_flexible": false, "item_separator": ", ",
                   "key_separator": ": "}),
        );
    } else if !schema.is_boolean() {
        return Err(ConstraintError::Schema(
            "a schema is a JSON object (or true / false)".into(),
        ));
    }
    Ok(schema)
}

/// A model's vocabulary as the grammar engine sees it; built once per model, shared by
/// every constrained request.
pub struct GrammarVocab {
    factory: ParserFactory,
    eog: Arc<[u32]>,
}

impl std::fmt::Debug for GrammarVocab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GrammarVocab")
            .field("eog", &self.eog)
            .finish_non_exhaustive()
    }
}

impl GrammarVocab {
    /// `tokens[id]`: the bytes token `id` adds to generated text, `None` for one that
    /// adds none (a control token: the grammar never allows it); `eog`: the tokens that
    /// end generation, allowed once the grammar is complete.
    pub fn new(tokens: &[Option<Vec<u8>>], eog: &[u32]) -> Result<Self, ConstraintError> {
        let first_eog = *eog.first().ok_or_else(|| {
            ConstraintError::Vocab("the model has no end-of-generation token".into())
        })?;
        let n = u32::try_from(tokens.len())
            .map_err(|_| ConstraintError::Vocab(format!("{} tokens", tokens.len())))?;
        if let Some(&bad) = eog.iter().find(|&&t| t >= n) {
            return Err(ConstraintError::Vocab(format!(
                "end-of-generation token {bad} is outside the vocabulary (0..{n})"
            )));
        }
        // Tokens that write nothing become llguidance's "special" tokens (0xFF, then a
        // name): no text the grammar reads can match them.
        let words: Vec<Vec<u8>> = tokens
            .iter()
            .enumerate()
            .map(|(id, t)| match t {
                Some(b) if !b.is_empty() => b.clone(),
                _ => {
                    let mut w = vec![0xFF];
                    w.extend(format!("<[{id}]>").bytes());
                    w
                }
            })
            .collect();
        let trie = TokTrie::from(&TokRxInfo::new(n, first_eog), &words).with_eos_tokens(eog);
        let env: TokEnv = Arc::new(ApproximateTokEnv::new(trie));
        let mut factory =
            ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Vocab(e.to_string()))?;
        factory.quiet();
        Ok(Self {
            factory,
            eog: eog.into(),
        })
    }

    /// A constraint that lets the model write one JSON value valid under `schema`
    /// (`{"type": "object"}` for any object), its whitespace fixed
    /// ([`fixed_whitespace`]).
    pub fn json_schema(&self, schema: &Value) -> Result<Constraint, ConstraintError> {
        let schema = fixed_whitespace(schema)?;
        let source: Arc<str> = schema.to_string().into();
        self.compile(
            source,
            TopLevelGrammar::from_json_schema(schema),
            ConstraintError::Schema,
        )
    }

    /// A constraint that lets the model write text of `grammar`, in llguidance's Lark
    /// syntax (rules, literals, `/regex/`, `%json {schema}`, `[lazy]` rules that end
    /// at their regex's first match).
    pub fn lark(&self, grammar: &str) -> Result<Constraint, ConstraintError> {
        self.compile(
            grammar.into(),
            TopLevelGrammar::from_lark(grammar.to_string()),
            ConstraintError::Grammar,
        )
    }

    fn compile(
        &self,
        source: Arc<str>,
        grammar: TopLevelGrammar,
        err: fn(String) -> ConstraintError,
    ) -> Result<Constraint, ConstraintError> {
        let parser = self
            .factory
            .create_parser(grammar)
            .map_err(|e| err(e.to_string()))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(err(e));
        }
        Ok(Constraint {
            matcher,
            source,
            eog: Arc::clone(&self.eog),
        })
    }
}

/// One request's grammar state: which tokens may come next. Cloning gives a copy of
/// the state (each of `n` samples gets its own).
#[derive(Clone)]
pub struct Constraint {
    matcher: Matcher,
    source: Arc<str>,
    eog: Arc<[u32]>,
}

impl std::fmt::Debug for Constraint {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("Constraint").field(&self.source).finish()
    }
}

/// Two constraints are equal when they enforce the same grammar (whatever their state).
impl PartialEq for Constraint {
    fn eq(&self, other: &Self) -> bool {
        self.source == other.source
    }
}

impl Constraint {
    /// Sets the logit of every token the grammar does not allow now to minus infinity.
    /// Once the grammar is complete only the end-of-generation tokens are allowed; a
    /// grammar in an error state (which a drawn token cannot cause, since every drawn
    /// token was allowed) allows only those too, so the answer ends.
    pub fn mask(&mut self, logits: &mut [f32]) {
        match self.matcher.compute_mask_or_eos() {
            Ok(allowed) => {
                for (i, l) in logits.iter_mut().enumerate() {
                    let ok = u32::try_from(i)
                        .is_ok_and(|t| t < allowed.len() as u32 && allowed.is_allowed(t));
                    if !ok {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
            Err(e) => {
                tracing::warn!("constrained decoding: {e}; ending the answer");
                for (i, l) in logits.iter_mut().enumerate() {
                    if !u32::try_from(i).is_ok_and(|t| self.eog.contains(&t)) {
                        *l = f32::NEG_INFINITY;
                    }
                }
            }
        }
    }

    /// Moves the grammar past the drawn token.
    pub fn commit(&mut self, token: u32) {
        if self.matcher.is_stopped() {
            return;
        }
        if let Err(e) = self.matcher.consume_token(token) {
            tracing::warn!("constrained decoding: token {token}: {e}");
        }
    }

    /// True once the grammar is complete (only an end of generation may follow).
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes as tokens, 256 = the end.
    fn bytes_vocab() -> GrammarVocab {
        let mut t: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
        t.push(None);
        GrammarVocab::new(&t, &[256]).expect("vocab")
    }

    /// Draws greedily from `prefer` (a byte string the model "wants" to write) under
    /// the constraint: the preferred byte when allowed, else `}`, else `]`, else
    /// the lowest allowed token.
    fn run(c: &mut Constraint, prefer: &[u8]) -> String {
        let mut out = Vec::new();
        for i in 0..200 {
            let mut logits = vec![0.0f32; 257];
            logits[b'}' as usize] = 5.0;
            logits[b']' as usize] = 4.0;
            match prefer.get(i) {
                Some(&b) => logits[b as usize] = 10.0,
                None => logits[256] = 10.0,
            }
            c.mask(&mut logits);
            let t = crate::sample::argmax(&logits) as u32;
            assert!(
                logits[t as usize].is_finite(),
                "no token allowed after {out:?}"
            );
            c.commit(t);
            if t == 256 {
                break;
            }
            out.push(t as u8);
        }
        String::from_utf8(out).expect("utf-8")
    }

    #[test]
    fn json_schema_bends_an_answer_into_shape() {
        let v = bytes_vocab();
        let schema = json!({"type": "object",
            "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
            "required": ["name", "age"], "additionalProperties": false});
        let mut c = v.json_schema(&schema).expect("compiles");
        // Already valid: passes untouched.
        let good = r#"{"name": "Bob", "age": 42}"#;
        assert_eq!(run(&mut c.clone(), good.as_bytes()), good);
        // "age" as a string is refused; what comes out parses and fits the schema.
        let out = run(&mut c, br#"{"name": "Bob", "age": "old"}"#);
        let parsed: Value = serde_json::from_str(&out).expect(&out);
        assert_eq!(parsed["name"], "Bob");
        assert!(parsed["age"].is_number(), "{out}");
        let age = out
            .split("\"age\": ")
            .nth(1)
            .and_then(|a| a.strip_suffix('}'))
            .expect(&out);
        let digits = age.strip_prefix('-').unwrap_or(age);
        assert!(
            !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit()),
            "an integer: {out}"
        );
        assert!(c.is_complete());
    }

    #[test]
    fn the_end_waits_for_a_complete_value_and_bad_schemas_are_errors() {
        let v = bytes_vocab();
        let mut c = v.json_schema(&json!({"type": "object"})).expect("compiles");
        // The "model" wants to stop early: it may not before the object is closed.
        let out = run(&mut c, br#"{"a": [1"#);
        assert!(serde_json::from_str::<Value>(&out).expect(&out).is_object());
        assert!(v.json_schema(&json!("object")).is_err());
        let e = v
            .json_schema(&json!({"type": "object", "properties": {"a": {"type": "frob"}}}))
            .expect_err("unknown type");
        assert!(e.to_string().contains("JSON schema"), "{e}");
    }
}
