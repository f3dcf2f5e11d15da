//! gpt-oss's harmony output: messages on channels.
//!
//! A prompt rendered with the harmony template ends with `<|start|>assistant`, so the
//! answer starts at the header of its first message. Each message is a header, then
//! `<|message|>`, then its body up to `<|end|>` (more messages follow, each after
//! `<|start|>assistant`), `<|call|>` or `<|return|>` (both end generation):
//!
//! ```text
//! <|channel|>analysis<|message|>THINKING<|end|><|start|>assistant<|channel|>final<|message|>ANSWER
//! <|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{"arg": 1}
//!  to=functions.NAME<|channel|>commentary json<|message|>{"arg": 1}
//! ```
//!
//! The `analysis` channel is reasoning, `final` is the answer, `commentary` without a
//! recipient is a preamble the user sees (content, as llama.cpp returns it), and a
//! message to `functions.NAME` on `commentary` (or `analysis`) is a call of that
//! function with the body as its JSON arguments. Text that does not follow this shape, a call of a function
//! that was not offered, and a call whose arguments are not JSON stay content, as
//! written.

use serde_json::Value;

use super::tools::{held, push_piece, Piece, ToolCall};
use crate::sample::constrain::fixed_whitespace;

/// Opens an assistant message after the first.
pub const START: &str = "<|start|>assistant";
/// Names the channel in a header.
pub const CHANNEL: &str = "<|channel|>";
/// Ends a header.
pub const MESSAGE: &str = "<|message|>";
/// Names the type of a call's arguments in a header (`<|constrain|>json`).
pub const CONSTRAIN: &str = "<|constrain|>";
/// Ends a message that more may follow.
pub const END: &str = "<|end|>";
/// Ends a tool call, and generation.
pub const CALL: &str = "<|call|>";
/// Ends the answer, and generation.
pub const RETURN: &str = "<|return|>";
/// The recipient of a function call: ` to=functions.NAME`.
const TO: &str = " to=";
const FUNCTIONS: &str = "functions.";
/// What ends a message body.
const BODY_ENDS: [&str; 3] = [END, CALL, RETURN];
/// The longest header read (recipient, channel, type): longer text before
/// `<|message|>` is no header.
const MAX_HEADER: usize = 256;

/// The grammar rule (llguidance's Lark syntax) `think`: one analysis message, up to
/// its `<|end|>`; a constrained answer may start with any number of them, each
/// followed by `<|start|>assistant`.
pub const ANALYSIS_RULE: &str =
    "think[lazy]: /<\\|channel\\|>analysis<\\|message\\|>(.|\\n)*<\\|end\\|>/\n";

/// The grammar of an answer whose final message is one JSON value under `schema`
/// (`response_format`), its whitespace fixed as
/// [`GrammarVocab::json_schema`](crate::sample::GrammarVocab::json_schema) fixes it:
/// analysis messages first if the model wants them, then `<|channel|>final`, optionally
/// ` <|constrain|>json`, `<|message|>` and the value. An error says what is wrong with
/// the schema.
pub fn final_grammar(schema: &Value) -> Result<String, String> {
    let schema = fixed_whitespace(schema).map_err(|e| e.to_string())?;
    Ok(format!(
        "{ANALYSIS_RULE}start: (think \"{START}\")* \"{CHANNEL}final\" (\" {CONSTRAIN}json\")? \
         \"{MESSAGE}\" answer\nanswer: %json {schema}\n"
    ))
}

/// What a message's body is.
#[derive(Clone, Debug, PartialEq, Eq)]
enum Body {
    /// `analysis`: reasoning, passed on as it comes.
    Reasoning,
    /// `final`, or a preamble on `commentary`: content, passed on as it comes.
    Content,
    /// A call of `name`: held whole (with its header, `raw`) until it ends.
    Call { name: String, raw: String },
}

#[derive(Clone, Debug, PartialEq, Eq)]
enum State {
    /// Reading a header (`buf` holds it).
    Header,
    /// Inside a message's body.
    Body(Body),
    /// Text that is no harmony: all content.
    Raw,
}

/// Splits harmony output into content, reasoning and tool calls, incrementally.
#[derive(Clone, Debug)]
pub struct HarmonyParser {
    /// The names of the offered functions; calls of others stay content.
    functions: Vec<String>,
    state: State,
    buf: String,
}

impl HarmonyParser {
    /// A parser for one answer; `tools`: the offered tools (OpenAI's `{"type":
    /// "function", "function": {...}}`), `None` when the model was offered none.
    pub fn new(tools: Option<&[Value]>) -> Self {
        let functions = tools
            .unwrap_or_default()
            .iter()
            .filter_map(|t| t.pointer("/function/name").and_then(Value::as_str))
            .map(str::to_string)
            .collect();
        Self {
            functions,
            state: State::Header,
            buf: String::new(),
        }
    }

    /// Feeds newly generated text; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The answer ended: returns everything still held.
    pub fn finish(&mut self) -> Vec<Piece> {
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    /// One move over `buf`; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>, end: bool) -> bool {
        match std::mem::replace(&mut self.state, State::Raw) {
            State::Raw => {
                push_piece(out, Piece::Content(std::mem::take(&mut self.buf)));
                false
            }
            State::Header => {
                if self.buf.is_empty() {
                    self.state = State::Header;
                    return false;
                }
                let Some(at) = self.buf.find(MESSAGE) else {
                    // A header so far, or not one at all.
                    let short = self.buf.len() < MAX_HEADER + MESSAGE.len();
                    if !end && short && header_start(&self.buf) {
                        self.state = State::Header;
                        return false;
                    }
                    return true;
                };
                let header_end = at + MESSAGE.len();
                let header = (at <= MAX_HEADER).then(|| &self.buf[..at]);
                match header.and_then(|h| read_header(h, &self.functions)) {
                    Some(Body::Call { name, .. }) => {
                        let raw: String = self.buf.drain(..header_end).collect();
                        self.state = State::Body(Body::Call { name, raw });
                    }
                    Some(body) => {
                        self.buf.drain(..header_end);
                        self.state = State::Body(body);
                    }
                    // Stays raw: the header comes back as content.
                    None => {}
                }
                true
            }
            State::Body(body) => {
                let ends = BODY_ENDS
                    .iter()
                    .filter_map(|m| self.buf.find(m).map(|at| (at, *m)))
                    .min();
                if let Some((at, marker)) = ends {
                    let text: String = self.buf.drain(..at).collect();
                    self.buf.drain(..marker.len());
                    push_piece(out, body.piece(text, marker));
                    // The next message's header (after `<|start|>assistant`) follows.
                    self.state = State::Header;
                    return true;
                }
                match body {
                    Body::Call { .. } if !end => self.state = State::Body(body),
                    Body::Call { .. } => {
                        let text = std::mem::take(&mut self.buf);
                        push_piece(out, body.piece(text, ""));
                    }
                    Body::Reasoning | Body::Content => {
                        let keep = if end {
                            0
                        } else {
                            BODY_ENDS
                                .iter()
                                .map(|m| held(&self.buf, m))
                                .max()
                                .unwrap_or(0)
                        };
                        let n = self.buf.len() - keep;
                        let text: String = self.buf.drain(..n).collect();
                        push_piece(out, body.clone().piece(text, ""));
                        self.state = State::Body(body);
                    }
                }
                false
            }
        }
    }
}

impl Body {
    /// The piece of a body's `text`, which `marker` ended (`""`: the answer did). A
    /// call whose arguments are not a JSON object is the message as written: its
    /// header, `text` and `marker`, as content.
    fn piece(self, text: String, marker: &str) -> Piece {
        match self {
            Body::Reasoning => Piece::Reasoning(text),
            Body::Content => Piece::Content(text),
            Body::Call { name, raw } => match serde_json::from_str::<Value>(text.trim()) {
                Ok(v @ Value::Object(_)) => Piece::ToolCall(ToolCall {
                    name,
                    arguments: v.to_string(),
                }),
                _ => Piece::Content(format!("{raw}{text}{marker}")),
            },
        }
    }
}

/// True when `text` is the start of a header, or could become one.
fn header_start(text: &str) -> bool {
    let t = text.strip_prefix(START).unwrap_or(text);
    [START, CHANNEL, TO]
        .iter()
        .any(|m| t.starts_with(m) || m.starts_with(t))
}

/// What the body of a message with `header` (the text before `<|message|>`, after
/// an optional `<|start|>assistant`) is; `None` when it is no harmony header, or a
/// call of a function not among `functions`.
fn read_header(header: &str, functions: &[String]) -> Option<Body> {
    let h = header.strip_prefix(START).unwrap_or(header);
    if !h.starts_with(CHANNEL) && !h.starts_with(TO) {
        return None;
    }
    // The channel: the last one named (gpt-oss sometimes writes a stray
    // `<|channel|>commentary` before the real one).
    let at = h.rfind(CHANNEL)?;
    let channel: String = h[at + CHANNEL.len()..]
        .chars()
        .take_while(char::is_ascii_alphanumeric)
        .collect();
    // The recipient, before or after the channel.
    let recipient = h.find(TO).map(|i| {
        h[i + TO.len()..]
            .chars()
            .take_while(|c| !c.is_whitespace() && *c != '<')
            .collect::<String>()
    });
    match (channel.as_str(), recipient.as_deref()) {
        ("analysis" | "commentary", Some(r)) if r.starts_with(FUNCTIONS) => {
            let name = &r[FUNCTIONS.len()..];
            functions.iter().any(|f| f == name).then(|| Body::Call {
                name: name.to_string(),
                raw: String::new(),
            })
        }
        ("analysis", None | Some("assistant")) => Some(Body::Reasoning),
        ("final" | "commentary", None | Some("assistant")) => Some(Body::Content),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// The pieces of `text`, merged, fed in two parts split at `at` (bytes, on a
    /// character boundary).
    fn split_at(make: &dyn Fn() -> HarmonyParser, text: &str, at: usize) -> Vec<Piece> {
        let mut p = make();
        let mut out = Vec::new();
        for piece in p
            .push(&text[..at])
            .into_iter()
            .chain(p.push(&text[at..]))
            .chain(p.finish())
        {
            push_piece(&mut out, piece);
        }
        out
    }

    /// The pieces of `text`: the same whether it comes whole, split at any point, or
    /// one character at a time.
    fn parse_all(make: &dyn Fn() -> HarmonyParser, text: &str) -> Vec<Piece> {
        let whole = split_at(make, text, text.len());
        for at in (0..text.len()).filter(|&i| text.is_char_boundary(i)) {
            assert_eq!(split_at(make, text, at), whole, "split at {at} of {text:?}");
        }
        let mut p = make();
        let mut out = Vec::new();
        let mut buf = [0u8; 4];
        for c in text.chars() {
            for piece in p.push(c.encode_utf8(&mut buf)) {
                push_piece(&mut out, piece);
            }
        }
        for piece in p.finish() {
            push_piece(&mut out, piece);
        }
        assert_eq!(out, whole, "one character at a time: {text:?}");
        whole
    }

    fn tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}),
        ]
    }

    fn call(args: Value) -> Piece {
        Piece::ToolCall(ToolCall {
            name: "get_weather".into(),
            arguments: args.to_string(),
        })
    }

    fn content(s: &str) -> Piece {
        Piece::Content(s.into())
    }

    fn reasoning(s: &str) -> Piece {
        Piece::Reasoning(s.into())
    }

    /// With an o200k-harmony vocabulary (its markers control tokens, as gpt-oss's file
    /// has them), the text the server parses carries the markers the parser reads, and
    /// generation ends at `<|return|>` and `<|call|>`, not at `<|end|>`.
    #[test]
    fn the_tokenizer_writes_the_markers_and_stops_at_return_and_call() {
        use crate::sched::Detokenizer;
        use flint_loader::tokenizer::{PreTokenizer, Tokenizer, TokenizerConfig};
        let markers = ["<|start|>", CHANNEL, MESSAGE, CONSTRAIN, END, CALL, RETURN];
        let tokens: Vec<String> = ["a"].into_iter().chain(markers).map(String::from).collect();
        let mut cfg = TokenizerConfig::bpe(PreTokenizer::Gpt4o, tokens, Vec::new(), None, None);
        cfg.token_types = Some([1].into_iter().chain([3; 7]).collect());
        let tok = std::sync::Arc::new(Tokenizer::from_config(&cfg).expect("tokenizer"));
        let id = |t: &str| tok.token_id(t).expect(t);
        let eog: Vec<u32> = tok.eog_ids().collect();
        assert_eq!(eog, [id(CALL), id(RETURN)]);
        let detok = crate::serve::TokenizerDetok::new(std::sync::Arc::clone(&tok));
        for m in ["<|start|>", CHANNEL, MESSAGE, CONSTRAIN, END] {
            assert_eq!(detok.token_bytes(id(m)), m.as_bytes(), "{m}");
        }
    }

    #[test]
    fn analysis_is_reasoning_and_final_is_content() {
        let make = || HarmonyParser::new(None);
        let text = "<|channel|>analysis<|message|>Two and two.\nFour.<|end|><|start|>assistant\
                    <|channel|>final<|message|>It is 4 <|a|> <|en.";
        assert_eq!(
            parse_all(&make, text),
            [
                reasoning("Two and two.\nFour."),
                content("It is 4 <|a|> <|en.")
            ]
        );
        // With `<|return|>` written out; a stray commentary before the analysis.
        let text = "<|channel|>commentary to=assistant<|channel|>analysis<|message|>Hm.<|end|>\
                    <|start|>assistant<|channel|>final<|message|>Ja.<|return|>";
        assert_eq!(parse_all(&make, text), [reasoning("Hm."), content("Ja.")]);
        // Cut off while thinking: all of it is reasoning, a partial marker included.
        assert_eq!(
            parse_all(&make, "<|channel|>analysis<|message|>still <|en"),
            [reasoning("still <|en")]
        );
        // A preamble on commentary is content.
        assert_eq!(
            parse_all(
                &make,
                "<|channel|>commentary<|message|>Let me see.<|end|><|start|>assistant\
                 <|channel|>final<|message|>Done."
            ),
            [content("Let me see.Done.")]
        );
    }

    #[test]
    fn calls_on_commentary() {
        let tools = tools();
        let make = || HarmonyParser::new(Some(&tools));
        // The recipient after the channel, `<|constrain|>`, cut by the end of generation
        // (`<|call|>` is an end-of-generation token, not written).
        let text = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
                    <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                    {\"city\": \"Köln\"}";
        assert_eq!(
            parse_all(&make, text),
            [
                reasoning("Need the weather."),
                call(json!({"city": "Köln"}))
            ]
        );
        // The recipient in the role, `<|call|>` written out.
        let text =
            " to=functions.get_weather<|channel|>commentary json<|message|>{\"city\":\"Oslo\"}\
                    <|call|>";
        assert_eq!(parse_all(&make, text), [call(json!({"city": "Oslo"}))]);
        // Two calls, the first ended by `<|end|>`.
        let one = "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": \"A\"}";
        let text = format!("{one}<|end|><|start|>assistant{one}");
        assert_eq!(
            parse_all(&make, &text),
            [call(json!({"city": "A"})), call(json!({"city": "A"}))]
        );
    }

    #[test]
    fn what_is_no_harmony_stays_content() {
        let tools = tools();
        let with = || HarmonyParser::new(Some(&tools));
        let without = || HarmonyParser::new(None);
        let call = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                    {\"city\": \"Paris\"}";
        for (make, text) in [
            // Plain text, a marker later in it.
            (
                &with as &dyn Fn() -> HarmonyParser,
                "Hello <|channel|>final<|message|>x",
            ),
            // Arguments that are not JSON, or not an object.
            (
                &with,
                "<|channel|>commentary to=functions.get_weather<|message|>{\"city\": oops}<|call|>",
            ),
            (
                &with,
                "<|channel|>commentary to=functions.get_weather<|message|>[1]",
            ),
            // A function not offered, or no tools at all.
            (
                &with,
                "<|channel|>commentary to=functions.get_time<|message|>{}",
            ),
            (&without, call),
            // An unknown channel; a header cut off; a header that does not end.
            (&with, "<|channel|>secret<|message|>x"),
            (&with, "<|channel|>analy"),
            (&with, " to=functions.get_weather"),
        ] {
            assert_eq!(parse_all(make, text), [content(text)], "{text}");
        }
        let long = format!("<|channel|>final{}<|message|>x", " ".repeat(MAX_HEADER));
        assert_eq!(parse_all(&with, &long), [content(&long)]);
        // After a well-formed message, text that is no harmony is content, as written.
        assert_eq!(
            parse_all(
                &with,
                "<|channel|>analysis<|message|>a<|end|>b<|channel|>final<|message|>c"
            ),
            [reasoning("a"), content("b<|channel|>final<|message|>c")]
        );
    }
}
