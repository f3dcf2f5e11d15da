//! Tool calls and reasoning in generated chat text.
//!
//! A chat template that renders `tools` tells the model how to call them; the model
//! answers in its family's syntax ([`ToolSyntax`]), which [`OutputParser`] turns back
//! into OpenAI's `tool_calls`. Thinking models write their reasoning between markers
//! ([`Think`]: `<think>` and `</think>`, Gemma 4's `<|channel>thought` and
//! `<channel|>`); the parser returns it apart from the content (`reasoning_content`).
//! It works on text as it is generated, so that streamed and whole responses come from
//! the same code: it holds back only what could still become a marker. gpt-oss's
//! harmony format, where channels carry reasoning, answer and calls, has a parser of
//! its own ([`HarmonyParser`]) behind the same interface.

use serde_json::{Map, Value};

use super::harmony::{self, HarmonyParser};
use crate::sample::constrain::fixed_whitespace;

/// The text that opens a model's reasoning.
pub const THINK_OPEN: &str = "<think>";
/// The text that closes it.
pub const THINK_CLOSE: &str = "</think>";
const TOOL_OPEN: &str = "<tool_call>";
const TOOL_CLOSE: &str = "</tool_call>";
const ARG_KEY: (&str, &str) = ("<arg_key>", "</arg_key>");
const ARG_VALUE: (&str, &str) = ("<arg_value>", "</arg_value>");
const PYTHON_TAG: &str = "<|python_tag|>";
/// Qwen3-Coder / Qwen 3.5 XML calls: `<function=NAME>`, `<parameter=KEY>`.
const XML_FUNCTION: (&str, &str) = ("<function=", "</function>");
const XML_PARAMETER: (&str, &str) = ("<parameter=", "</parameter>");
/// Gemma 4: `<|tool_call>call:NAME{..}<tool_call|>`, strings quoted by `<|"|>`.
const G4_CALL_OPEN: &str = "<|tool_call>";
const G4_CALL_CLOSE: &str = "<tool_call|>";
const G4_CALL: &str = "call:";
const G4_QUOTE: &str = "<|\"|>";
/// Gemma 4's channel markers (its thought channel is `<|channel>thought`).
const G4_CHANNEL: (&str, &str) = ("<|channel>", "<channel|>");

/// The markers around a model's reasoning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Think {
    /// The text that opens it.
    pub open: &'static str,
    /// The text that closes it.
    pub close: &'static str,
}

/// `<think>` ... `</think>` (Qwen, DeepSeek, GLM).
pub const THINK: Think = Think {
    open: THINK_OPEN,
    close: THINK_CLOSE,
};

/// Gemma 4's thought channel: `<|channel>thought` ... `<channel|>`.
pub const GEMMA4_THOUGHT: Think = Think {
    open: "<|channel>thought",
    close: G4_CHANNEL.1,
};

/// The marker texts the parser reads: tokenizers that keep them as control tokens
/// must still write them out in generated text.
pub const MARKERS: &[&str] = &[
    THINK_OPEN,
    THINK_CLOSE,
    TOOL_OPEN,
    TOOL_CLOSE,
    ARG_KEY.0,
    ARG_KEY.1,
    ARG_VALUE.0,
    ARG_VALUE.1,
    PYTHON_TAG,
    G4_CHANNEL.0,
    G4_CHANNEL.1,
    G4_CALL_OPEN,
    G4_CALL_CLOSE,
    G4_QUOTE,
];

/// How a model family writes a tool call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ToolSyntax {
    /// Qwen / Hermes: `<tool_call>{"name": .., "arguments": {..}}</tool_call>`.
    Hermes,
    /// Llama 3: the whole answer is `{"name": .., "parameters": {..}}` (optionally
    /// after `<|python_tag|>`; several calls separated by `;`).
    Llama3Json,
    /// GLM 4.5: `<tool_call>NAME\n<arg_key>K</arg_key>\n<arg_value>V</arg_value>...</tool_call>`.
    Glm,
    /// Qwen3-Coder and Qwen 3.5 (XML): `<tool_call>\n<function=NAME>\n<parameter=K>\nV\n
    /// </parameter>\n...</function>\n</tool_call>`.
    QwenXml,
    /// Gemma 4: `<|tool_call>call:NAME{K:V,...}<tool_call|>`, strings between `<|"|>`.
    Gemma4,
    /// gpt-oss (harmony): a message to `functions.NAME` on the commentary channel,
    /// `<|channel|>commentary to=functions.NAME <|constrain|>json<|message|>{..}<|call|>`.
    Harmony,
}

/// What a chat template says about the model's output syntax.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ChatSyntax {
    /// The tool-call syntax, when the template renders `tools`.
    pub tools: Option<ToolSyntax>,
    /// The markers of the model's reasoning, when it writes any.
    pub reasoning: Option<Think>,
    /// Whether the model answers in harmony's channels (gpt-oss): reasoning on
    /// `analysis`, the answer on `final`, calls on `commentary`.
    pub harmony: bool,
}

impl ChatSyntax {
    /// Reads the syntax off a template's source: which tool-call markers it writes (and
    /// whether it reads `tools` at all), whether it knows `<think>`, whether it is
    /// harmony's (it writes `<|channel|>`) or Gemma 4's (it writes `'<|tool_call>call:'`;
    /// the loader's [`is_harmony`](flint_loader::chat::is_harmony) and
    /// [`is_gemma4`](flint_loader::chat::is_gemma4), as llama.cpp tells them apart).
    pub fn detect(template: &str) -> Self {
        let renders_tools = template.contains("tools");
        if flint_loader::chat::is_harmony(template) {
            return Self {
                tools: renders_tools.then_some(ToolSyntax::Harmony),
                reasoning: None,
                harmony: true,
            };
        }
        if flint_loader::chat::is_gemma4(template) {
            return Self {
                tools: renders_tools.then_some(ToolSyntax::Gemma4),
                reasoning: Some(GEMMA4_THOUGHT),
                harmony: false,
            };
        }
        let tools = if !renders_tools {
            None
        } else if template.contains(ARG_KEY.0) {
            Some(ToolSyntax::Glm)
        } else if template.contains(TOOL_OPEN)
            && template.contains(XML_FUNCTION.0)
            && template.contains(XML_PARAMETER.0)
        {
            Some(ToolSyntax::QwenXml)
        } else if template.contains(TOOL_OPEN) {
            Some(ToolSyntax::Hermes)
        } else if template.contains(PYTHON_TAG)
            || (template.contains("<|start_header_id|>") && template.contains("parameters"))
        {
            Some(ToolSyntax::Llama3Json)
        } else {
            None
        };
        Self {
            tools,
            reasoning: (template.contains(THINK_CLOSE) || template.contains(THINK_OPEN))
                .then_some(THINK),
            harmony: false,
        }
    }
}

/// Which tool call a request forces (OpenAI's `tool_choice`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ForcedCall {
    /// `"required"`: one or more calls, each of any offered function.
    Any,
    /// `{"type": "function", "function": {"name": ..}}`: one call of this function.
    Named(String),
}

/// The grammar (llguidance's Lark syntax) of an answer that is nothing but the forced
/// tool call(s), in `syntax`, that [`OutputParser`] reads back: the name is one of the
/// offered functions (or the named one) and the arguments follow that function's
/// `parameters` schema (any object when it has none; Gemma 4's arguments, which are
/// not JSON, follow Gemma 4's value syntax whatever the schema, as llama.cpp's grammar
/// does). A model that writes reasoning (`reasoning`, its markers) may think first; one
/// whose prompt opened the reasoning (`in_reasoning`) must close it first. A harmony
/// model may write analysis messages first, and makes one call (`<|call|>` ends
/// generation). An error names a forced function that is not offered.
pub fn forced_call_grammar(
    syntax: ToolSyntax,
    tools: &[Value],
    forced: &ForcedCall,
    reasoning: Option<Think>,
    in_reasoning: bool,
) -> Result<String, String> {
    let functions: Vec<(&str, Value)> = tools
        .iter()
        .filter_map(|t| {
            let f = t.get("function")?;
            let name = f.get("name")?.as_str()?;
            let params = match f.get("parameters") {
                None | Some(Value::Null) => serde_json::json!({"type": "object"}),
                Some(p) => p.clone(),
            };
            Some((name, params))
        })
        .filter(|(name, _)| match forced {
            ForcedCall::Any => true,
            ForcedCall::Named(n) => n == name,
        })
        .collect();
    if functions.is_empty() {
        return Err(match forced {
            ForcedCall::Named(n) => format!("the function '{n}' is not among the offered tools"),
            ForcedCall::Any => "no function is offered".into(),
        });
    }
    let lit = |s: &str| Value::String(s.to_string()).to_string();
    let mut g = String::new();
    // What may come before the call(s).
    let think: String = if syntax == ToolSyntax::Harmony {
        // Analysis messages may come first; the call's `<|call|>` ends generation, so
        // there is one.
        format!(
            "{}start: (think {})* calls\n",
            harmony::ANALYSIS_RULE,
            lit(harmony::START)
        )
    } else {
        match reasoning {
            Some(th) if in_reasoning => format!(
                "think_end[lazy]: /(.|\\n)*{}/\nstart: think_end gap calls\n",
                regex_text(th.close)
            ),
            Some(th) => format!(
                "think[lazy]: /{}(.|\\n)*{}/\nstart: (think gap)? calls\n",
                regex_text(th.open),
                regex_text(th.close)
            ),
            None => "start: calls\n".into(),
        }
    };
    g.push_str(&think);
    g.push_str("gap: (\"\\n\" \"\\n\"?)?\n");
    let separator = match syntax {
        ToolSyntax::Hermes | ToolSyntax::Glm | ToolSyntax::QwenXml => Some("\n"),
        ToolSyntax::Llama3Json => Some("; "),
        ToolSyntax::Gemma4 => Some(""),
        ToolSyntax::Harmony => None,
    };
    match (forced, separator) {
        (ForcedCall::Any, Some("")) => g.push_str("calls: call+\n"),
        (ForcedCall::Any, Some(sep)) => g.push_str(&format!("calls: call ({} call)*\n", lit(sep))),
        _ => g.push_str("calls: call\n"),
    }
    if syntax == ToolSyntax::Gemma4 {
        g.push_str(&gemma4_value_rules());
    }
    let alternatives: Vec<String> = (0..functions.len()).map(|i| format!("call_{i}")).collect();
    g.push_str(&format!("call: {}\n", alternatives.join(" | ")));
    for (i, (name, params)) in functions.iter().enumerate() {
        if syntax == ToolSyntax::Gemma4 {
            g.push_str(&format!(
                "call_{i}: {} g4_dict {}\n",
                lit(&format!("{G4_CALL_OPEN}{G4_CALL}{name}")),
                lit(G4_CALL_CLOSE)
            ));
            continue;
        }
        let schema = fixed_whitespace(params).map_err(|e| format!("function '{name}': {e}"))?;
        match syntax {
            ToolSyntax::Hermes => g.push_str(&format!(
                "call_{i}: {} args_{i} {}\nargs_{i}: %json {schema}\n",
                lit(&format!(
                    "{TOOL_OPEN}\n{{\"name\": {}, \"arguments\": ",
                    lit(name)
                )),
                lit(&format!("}}\n{TOOL_CLOSE}")),
            )),
            ToolSyntax::Llama3Json => g.push_str(&format!(
                "call_{i}: {} args_{i} \"}}\"\nargs_{i}: %json {schema}\n",
                lit(&format!("{{\"name\": {}, \"parameters\": ", lit(name))),
            )),
            ToolSyntax::Glm => tagged_call(&mut g, i, name, params, &lit, &GLM_ARGS)?,
            ToolSyntax::QwenXml => tagged_call(&mut g, i, name, params, &lit, &XML_ARGS)?,
            ToolSyntax::Gemma4 => {}
            ToolSyntax::Harmony => g.push_str(&format!(
                "call_{i}: {} args_{i}\nargs_{i}: %json {schema}\n",
                lit(&format!(
                    "{}commentary to=functions.{name} {}json{}",
                    harmony::CHANNEL,
                    harmony::CONSTRAIN,
                    harmony::MESSAGE
                )),
            )),
        }
    }
    Ok(g)
}

/// `text` as a regular expression (Lark's `/.../`) that matches it literally.
fn regex_text(text: &str) -> String {
    let mut out = String::new();
    for c in text.chars() {
        match c {
            '\n' => out.push_str("\\n"),
            '\\' | '/' | '.' | '|' | '?' | '*' | '+' | '(' | ')' | '[' | ']' | '{' | '}' | '^'
            | '$' => {
                out.push('\\');
                out.push(c);
            }
            c => out.push(c),
        }
    }
    out
}

/// Gemma 4's argument values (rules `g4_*`), as llama.cpp's grammar admits them: an
/// object `{KEY:VALUE,...}` with bare keys, arrays, strings between `<|"|>`, JSON
/// numbers, `true`, `false`, `null`.
fn gemma4_value_rules() -> String {
    let q = regex_text(G4_QUOTE);
    format!(
        "g4_dict: \"{{\" (g4_kv (\",\" g4_kv)*)? \"}}\"\n\
         g4_kv: /[^:{{}}\\[\\],<\\s]+/ \":\" g4_value\n\
         g4_list: \"[\" (g4_value (\",\" g4_value)*)? \"]\"\n\
         g4_str[lazy]: /{q}(.|\\n)*{q}/\n\
         g4_value: g4_str | g4_dict | g4_list | /-?(0|[1-9][0-9]*)(\\.[0-9]+)?([eE][-+]?[0-9]+)?/ \
         | \"true\" | \"false\" | \"null\"\n"
    )
}

/// The tags of a call whose arguments are tagged one by one (GLM, Qwen's XML):
/// `call_open` NAME `call_name_end`, then per argument `key_open` KEY `key_close` VALUE
/// `value_close`, then `call_close`.
struct TaggedArgs {
    call_open: &'static str,
    call_name_end: &'static str,
    key_open: &'static str,
    key_close: &'static str,
    value_close: &'static str,
    call_close: &'static str,
}

/// GLM 4.5's tags.
const GLM_ARGS: TaggedArgs = TaggedArgs {
    call_open: TOOL_OPEN,
    call_name_end: "\n",
    key_open: ARG_KEY.0,
    key_close: "</arg_key>\n<arg_value>",
    value_close: "</arg_value>\n",
    call_close: TOOL_CLOSE,
};

/// Qwen3-Coder's and Qwen 3.5's tags.
const XML_ARGS: TaggedArgs = TaggedArgs {
    call_open: "<tool_call>\n<function=",
    call_name_end: ">\n",
    key_open: XML_PARAMETER.0,
    key_close: ">\n",
    value_close: "\n</parameter>\n",
    call_close: "</function>\n</tool_call>",
};

/// A call of function `name` (rule `call_{i}`) with tagged arguments (`tags`): each
/// property of its schema in order, the required ones always, the others optionally;
/// a string value as raw text up to the value's closing tag, any other as JSON under
/// its schema. A schema without properties admits any keys with raw values.
fn tagged_call(
    g: &mut String,
    i: usize,
    name: &str,
    params: &Value,
    lit: &dyn Fn(&str) -> String,
    tags: &TaggedArgs,
) -> Result<(), String> {
    let key = |k: &str| lit(&format!("{}{k}{}", tags.key_open, tags.key_close));
    let close = lit(tags.value_close);
    // Raw text ending at the first closing tag (which it includes).
    g.push_str(&format!(
        "raw_{i}[lazy]: /(.|\\n)*{}/\n",
        regex_text(tags.value_close)
    ));
    let mut body = Vec::new();
    let props = params.get("properties").and_then(Value::as_object);
    match props {
        Some(props) if !props.is_empty() => {
            let required: Vec<&str> = params
                .get("required")
                .and_then(Value::as_array)
                .map(|r| r.iter().filter_map(Value::as_str).collect())
                .unwrap_or_default();
            for (j, (k, schema)) in props.iter().enumerate() {
                let rule = format!("arg_{i}_{j}");
                if is_string_schema(Some(schema)) {
                    g.push_str(&format!("{rule}: {} raw_{i}\n", key(k)));
                } else {
                    let schema =
                        fixed_whitespace(schema).map_err(|e| format!("'{name}'.{k}: {e}"))?;
                    g.push_str(&format!(
                        "{rule}: {} {rule}_v {close}\n{rule}_v: %json {schema}\n",
                        key(k)
                    ));
                }
                body.push(if required.contains(&k.as_str()) {
                    rule
                } else {
                    format!("{rule}?")
                });
            }
        }
        _ => {
            g.push_str(&format!(
                "any_{i}: {} /[A-Za-z0-9_\\-]+/ {} raw_{i}\n",
                lit(tags.key_open),
                lit(tags.key_close),
            ));
            body.push(format!("any_{i}*"));
        }
    }
    g.push_str(&format!(
        "call_{i}: {} {} {}\n",
        lit(&format!("{}{name}{}", tags.call_open, tags.call_name_end)),
        body.join(" "),
        lit(tags.call_close),
    ));
    Ok(())
}

/// Whether a property's schema makes its value a string (`"type": "string"`): GLM and
/// Qwen's XML write such values raw, not as JSON.
fn is_string_schema(schema: Option<&Value>) -> bool {
    schema
        .and_then(|p| p.get("type"))
        .is_some_and(|t| t == "string")
}

/// True when a rendered prompt leaves the model inside its reasoning (the template
/// opened it, `think.open`, for the model).
pub fn prompt_opens_reasoning(prompt: &str, think: Think) -> bool {
    prompt.trim_end().ends_with(think.open)
}

/// One function call the model made.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ToolCall {
    /// The function's name.
    pub name: String,
    /// Its arguments as JSON text (an object), as OpenAI sends them.
    pub arguments: String,
}

/// A piece of parsed output.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Piece {
    /// Answer text.
    Content(String),
    /// Reasoning text.
    Reasoning(String),
    /// A complete tool call.
    ToolCall(ToolCall),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum State {
    /// Before any output: reasoning may open, a Llama 3 call may start.
    Start,
    Reasoning,
    Content,
    /// Inside a call's markers (`<tool_call>`, Gemma 4's `<|tool_call>`).
    InCall,
    /// A Llama 3 JSON call: held whole until the end.
    Json,
}

/// Splits generated chat text into content, reasoning and tool calls, incrementally.
#[derive(Clone, Debug)]
pub struct OutputParser {
    tools: Option<ToolSyntax>,
    reasoning: Option<Think>,
    /// The `parameters` schema of each offered tool, by name (GLM's and Qwen XML's
    /// values are typed by it).
    schemas: Map<String, Value>,
    state: State,
    buf: String,
    /// A harmony answer's parser, which then does all the work.
    harmony: Option<HarmonyParser>,
}

impl OutputParser {
    /// A parser for one harmony (gpt-oss) answer; `tools`: the offered tools, `None`
    /// when the model was offered none.
    pub fn harmony(tools: Option<&[Value]>) -> Self {
        let mut p = Self::new(None, None, false);
        p.harmony = Some(HarmonyParser::new(tools));
        p
    }

    /// A parser for one answer. `tools`: the offered tools' syntax and definitions
    /// (OpenAI's `{"type": "function", "function": {...}}`), `None` when the model was
    /// offered none; `reasoning`: the markers of the model's reasoning, `None` when it
    /// writes none; `in_reasoning`: the prompt opened the reasoning already
    /// ([`prompt_opens_reasoning`]).
    pub fn new(
        tools: Option<(ToolSyntax, &[Value])>,
        reasoning: Option<Think>,
        in_reasoning: bool,
    ) -> Self {
        let mut schemas = Map::new();
        for t in tools.map_or(&[][..], |t| t.1) {
            let f = t.get("function");
            if let Some(name) = f.and_then(|f| f.get("name")).and_then(Value::as_str) {
                let params = f.and_then(|f| f.get("parameters")).cloned();
                schemas.insert(name.to_string(), params.unwrap_or(Value::Null));
            }
        }
        Self {
            tools: tools.map(|t| t.0),
            reasoning,
            schemas,
            state: if reasoning.is_some() && in_reasoning {
                State::Reasoning
            } else {
                State::Start
            },
            buf: String::new(),
            harmony: None,
        }
    }

    /// True when this parser changes nothing (plain content passes through).
    pub fn is_passthrough(&self) -> bool {
        self.tools.is_none() && self.reasoning.is_none() && self.harmony.is_none()
    }

    /// Feeds newly generated text; returns what became final.
    pub fn push(&mut self, text: &str) -> Vec<Piece> {
        if let Some(h) = &mut self.harmony {
            return h.push(text);
        }
        self.buf.push_str(text);
        let mut out = Vec::new();
        while self.step(&mut out, false) {}
        out
    }

    /// The answer ended: returns everything still held.
    pub fn finish(&mut self) -> Vec<Piece> {
        if let Some(h) = &mut self.harmony {
            return h.finish();
        }
        let mut out = Vec::new();
        while self.step(&mut out, true) {}
        out
    }

    /// One move of the state machine over `buf`; false when it needs more text.
    fn step(&mut self, out: &mut Vec<Piece>, end: bool) -> bool {
        match self.state {
            State::Start => {
                let t = self.buf.trim_start();
                if t.is_empty() && !end {
                    return false;
                }
                if let Some(th) = self.reasoning.filter(|th| t.starts_with(th.open)) {
                    self.buf = t[th.open.len()..].to_string();
                    self.state = State::Reasoning;
                    return true;
                }
                if self.tools == Some(ToolSyntax::Llama3Json)
                    && (t.starts_with('{') || t.starts_with(PYTHON_TAG))
                {
                    self.state = State::Json;
                    return true;
                }
                let undecided = self.reasoning.is_some_and(|th| th.open.starts_with(t))
                    || (self.tools == Some(ToolSyntax::Llama3Json) && PYTHON_TAG.starts_with(t));
                if undecided && !end {
                    return false;
                }
                self.state = State::Content;
                true
            }
            State::Reasoning => {
                let close = self.reasoning.map_or(THINK_CLOSE, |th| th.close);
                // Qwen's XML calls may start without closing the reasoning (llama.cpp
                // reads `<tool_call>` as its end too).
                let call = (self.tools == Some(ToolSyntax::QwenXml)).then_some(TOOL_OPEN);
                let closed = self.buf.find(close).map(|at| (at, close.len()));
                let called = call.and_then(|c| self.buf.find(c)).map(|at| (at, 0));
                if let Some((at, skip)) = match (closed, called) {
                    (Some(a), Some(b)) => Some(if b.0 < a.0 { b } else { a }),
                    (a, b) => a.or(b),
                } {
                    let r = self.buf[..at].to_string();
                    self.buf.drain(..at + skip);
                    push_piece(out, Piece::Reasoning(r));
                    self.state = State::Content;
                    return true;
                }
                let keep = if end {
                    0
                } else {
                    held(&self.buf, close).max(call.map_or(0, |c| held(&self.buf, c)))
                };
                let n = self.buf.len() - keep;
                let r: String = self.buf.drain(..n).collect();
                push_piece(out, Piece::Reasoning(r));
                false
            }
            State::Content => {
                // What ends this stretch of content: a call's opening marker; for Gemma 4
                // also another thought block, or a stray `<channel|>` (dropped), which
                // llama.cpp reads the same way.
                let opener = self.tools.and_then(call_markers).map(|m| m.0);
                let gemma4 = self.reasoning == Some(GEMMA4_THOUGHT);
                let ends = [
                    opener.map(|m| (m, State::InCall)),
                    gemma4.then_some((GEMMA4_THOUGHT.open, State::Reasoning)),
                    gemma4.then_some((G4_CHANNEL.1, State::Content)),
                ];
                let first = ends
                    .iter()
                    .flatten()
                    .filter_map(|&(m, next)| self.buf.find(m).map(|at| (at, m, next)))
                    .min_by_key(|&(at, m, _)| (at, usize::MAX - m.len()));
                if let Some((at, m, next)) = first {
                    let c = self.buf[..at].to_string();
                    self.buf.drain(..at + m.len());
                    push_piece(out, Piece::Content(c));
                    self.state = next;
                    return true;
                }
                let keep = if end {
                    0
                } else {
                    ends.iter()
                        .flatten()
                        .map(|&(m, _)| held(&self.buf, m))
                        .max()
                        .unwrap_or(0)
                };
                let n = self.buf.len() - keep;
                let c: String = self.buf.drain(..n).collect();
                push_piece(out, Piece::Content(c));
                false
            }
            State::InCall => {
                let (open, close) = self
                    .tools
                    .and_then(call_markers)
                    .unwrap_or((TOOL_OPEN, TOOL_CLOSE));
                let Some(at) = self.buf.find(close) else {
                    if end {
                        // An unclosed call is not a call: give the text back as it was.
                        let raw = format!("{open}{}", self.buf);
                        self.buf.clear();
                        push_piece(out, Piece::Content(raw));
                        self.state = State::Content;
                    }
                    return false;
                };
                let body = self.buf[..at].to_string();
                self.buf.drain(..at + close.len());
                let call = match self.tools {
                    Some(ToolSyntax::Glm) => self.parse_glm(&body),
                    Some(ToolSyntax::QwenXml) => self.parse_xml(&body),
                    Some(ToolSyntax::Gemma4) => parse_gemma4_call(&body),
                    _ => parse_json_call(&body),
                };
                match call {
                    Some(c) => out.push(Piece::ToolCall(c)),
                    None => push_piece(out, Piece::Content(format!("{open}{body}{close}"))),
                }
                self.state = State::Content;
                true
            }
            State::Json => {
                if !end {
                    return false;
                }
                let raw = std::mem::take(&mut self.buf);
                let body = raw.trim();
                let body = body.strip_prefix(PYTHON_TAG).unwrap_or(body);
                let calls: Option<Vec<ToolCall>> = body
                    .split(';')
                    .filter(|s| !s.trim().is_empty())
                    .map(parse_json_call)
                    .collect();
                match calls.filter(|c| !c.is_empty()) {
                    Some(calls) => out.extend(calls.into_iter().map(Piece::ToolCall)),
                    None => push_piece(out, Piece::Content(raw)),
                }
                self.state = State::Content;
                false
            }
        }
    }

    /// GLM's call body: the name, then `<arg_key>K</arg_key><arg_value>V</arg_value>`
    /// pairs. A value is a string when the tool's schema says so (or when it is not
    /// JSON), else the JSON it holds.
    fn parse_glm(&self, body: &str) -> Option<ToolCall> {
        let (name, mut rest) = match body.find(ARG_KEY.0) {
            Some(at) => (body[..at].trim(), &body[at..]),
            None => (body.trim(), ""),
        };
        if name.is_empty() || name.contains(char::is_whitespace) {
            return None;
        }
        let mut args = Map::new();
        while !rest.trim().is_empty() {
            let (key, after) = between(rest.trim_start(), ARG_KEY)?;
            let (value, after) = between(after.trim_start(), ARG_VALUE)?;
            args.insert(key.trim().to_string(), self.typed(name, key.trim(), value));
            rest = after;
        }
        Some(ToolCall {
            name: name.to_string(),
            arguments: Value::Object(args).to_string(),
        })
    }

    /// Qwen's XML call body: `<function=NAME>`, then `<parameter=K>\nV\n</parameter>`
    /// pairs, then `</function>`; values typed as GLM's are ([`Self::typed`]).
    fn parse_xml(&self, body: &str) -> Option<ToolCall> {
        let rest = body.trim_start().strip_prefix(XML_FUNCTION.0)?;
        let (name, rest) = rest.split_once('>')?;
        let name = name.trim();
        if name.is_empty() || name.contains(char::is_whitespace) {
            return None;
        }
        let mut rest = rest.trim_start();
        let mut args = Map::new();
        while let Some(after) = rest.strip_prefix(XML_PARAMETER.0) {
            let (key, after) = after.split_once('>')?;
            let at = after.find(XML_PARAMETER.1)?;
            let value = &after[..at];
            let value = value.strip_prefix('\n').unwrap_or(value);
            let value = value.strip_suffix('\n').unwrap_or(value);
            args.insert(key.trim().to_string(), self.typed(name, key.trim(), value));
            rest = after[at + XML_PARAMETER.1.len()..].trim_start();
        }
        if rest.strip_prefix(XML_FUNCTION.1)?.trim().is_empty() {
            Some(ToolCall {
                name: name.to_string(),
                arguments: Value::Object(args).to_string(),
            })
        } else {
            None
        }
    }

    /// Argument `key` of function `name` written as text: a string when the tool's
    /// schema says so (or when it is not JSON), else the JSON it holds.
    fn typed(&self, name: &str, key: &str, value: &str) -> Value {
        let schema = self
            .schemas
            .get(name)
            .and_then(|s| s.get("properties"))
            .and_then(|p| p.get(key));
        match serde_json::from_str::<Value>(value) {
            Ok(v) if !is_string_schema(schema) => v,
            _ => Value::String(value.to_string()),
        }
    }
}

/// The markers around one call in `syntax`, for the syntaxes whose calls sit between
/// markers.
fn call_markers(syntax: ToolSyntax) -> Option<(&'static str, &'static str)> {
    match syntax {
        ToolSyntax::Hermes | ToolSyntax::Glm | ToolSyntax::QwenXml => Some((TOOL_OPEN, TOOL_CLOSE)),
        ToolSyntax::Gemma4 => Some((G4_CALL_OPEN, G4_CALL_CLOSE)),
        ToolSyntax::Llama3Json | ToolSyntax::Harmony => None,
    }
}

/// Gemma 4's call body `call:NAME{K:V,...}`, its arguments as JSON.
fn parse_gemma4_call(body: &str) -> Option<ToolCall> {
    let rest = body.trim_start().strip_prefix(G4_CALL)?;
    let at = rest.find('{')?;
    let name = rest[..at].trim();
    if name.is_empty() || name.contains(char::is_whitespace) {
        return None;
    }
    let (args, rest) = gemma4_value(&rest[at..])?;
    if !args.is_object() || !rest.trim().is_empty() {
        return None;
    }
    Some(ToolCall {
        name: name.to_string(),
        arguments: args.to_string(),
    })
}

/// One Gemma 4 value at the start of `s` (white space before it skipped), as JSON, and
/// what follows it: `<|"|>TEXT<|"|>` a string, `{K:V,...}` an object (keys bare or
/// quoted), `[V,...]` an array, JSON's numbers, `true`, `false` and `null`.
fn gemma4_value(s: &str) -> Option<(Value, &str)> {
    let s = s.trim_start();
    if let Some(r) = s.strip_prefix(G4_QUOTE) {
        let at = r.find(G4_QUOTE)?;
        return Some((
            Value::String(r[..at].to_string()),
            &r[at + G4_QUOTE.len()..],
        ));
    }
    if let Some(mut r) = s.strip_prefix('{') {
        let mut map = Map::new();
        r = r.trim_start();
        if let Some(r) = r.strip_prefix('}') {
            return Some((Value::Object(map), r));
        }
        loop {
            let r0 = r.trim_start();
            let (key, after) = match r0.strip_prefix(G4_QUOTE) {
                Some(q) => {
                    let at = q.find(G4_QUOTE)?;
                    let after = q[at + G4_QUOTE.len()..].trim_start().strip_prefix(':')?;
                    (&q[..at], after)
                }
                None => {
                    let at = r0.find([':', '}'])?;
                    (r0[..at].trim(), r0[at..].strip_prefix(':')?)
                }
            };
            if key.is_empty() {
                return None;
            }
            let (v, after) = gemma4_value(after)?;
            map.insert(key.to_string(), v);
            let after = after.trim_start();
            if let Some(a) = after.strip_prefix(',') {
                r = a;
            } else {
                return Some((Value::Object(map), after.strip_prefix('}')?));
            }
        }
    }
    if let Some(mut r) = s.strip_prefix('[') {
        let mut items = Vec::new();
        r = r.trim_start();
        if let Some(r) = r.strip_prefix(']') {
            return Some((Value::Array(items), r));
        }
        loop {
            let (v, after) = gemma4_value(r)?;
            items.push(v);
            let after = after.trim_start();
            if let Some(a) = after.strip_prefix(',') {
                r = a;
            } else {
                return Some((Value::Array(items), after.strip_prefix(']')?));
            }
        }
    }
    for (word, v) in [
        ("true", Value::Bool(true)),
        ("false", Value::Bool(false)),
        ("null", Value::Null),
    ] {
        if let Some(r) = s.strip_prefix(word) {
            return Some((v, r));
        }
    }
    let end = s
        .find(|c: char| !(c.is_ascii_digit() || "+-.eE".contains(c)))
        .unwrap_or(s.len());
    let n: serde_json::Number = serde_json::from_str(&s[..end]).ok()?;
    Some((Value::Number(n), &s[end..]))
}

/// `s` starts with `open`, TEXT, `close`: TEXT and what follows.
fn between<'a>(s: &'a str, (open, close): (&str, &str)) -> Option<(&'a str, &'a str)> {
    let s = s.strip_prefix(open)?;
    let at = s.find(close)?;
    Some((&s[..at], &s[at + close.len()..]))
}

/// A JSON call `{"name": .., "arguments" | "parameters": {..}}`.
fn parse_json_call(body: &str) -> Option<ToolCall> {
    let v: Value = serde_json::from_str(body.trim()).ok()?;
    let name = v.get("name")?.as_str()?.to_string();
    let args = v.get("arguments").or_else(|| v.get("parameters"));
    let arguments = match args {
        None | Some(Value::Null) => "{}".to_string(),
        Some(Value::String(s)) => s.clone(),
        Some(a @ Value::Object(_)) => a.to_string(),
        Some(_) => return None,
    };
    Some(ToolCall { name, arguments })
}

/// How many bytes at the end of `text` could be the start of `marker`.
pub(super) fn held(text: &str, marker: &str) -> usize {
    (1..marker.len().min(text.len() + 1))
        .rev()
        .find(|&n| text.is_char_boundary(text.len() - n) && text.ends_with(&marker[..n]))
        .unwrap_or(0)
}

/// Appends a text piece, merging it into the last one of its kind and dropping empty
/// ones.
pub(super) fn push_piece(out: &mut Vec<Piece>, p: Piece) {
    match (out.last_mut(), p) {
        (_, Piece::Content(s) | Piece::Reasoning(s)) if s.is_empty() => {}
        (Some(Piece::Content(a)), Piece::Content(b)) => a.push_str(&b),
        (Some(Piece::Reasoning(a)), Piece::Reasoning(b)) => a.push_str(&b),
        (_, p) => out.push(p),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// Feeds `text` in pieces of `step` bytes (on character boundaries), then finishes.
    fn parse(p: &mut OutputParser, text: &str, step: usize) -> Vec<Piece> {
        let mut out = Vec::new();
        let mut i = 0;
        while i < text.len() {
            let mut j = (i + step).min(text.len());
            while !text.is_char_boundary(j) {
                j += 1;
            }
            for piece in p.push(&text[i..j]) {
                push_piece(&mut out, piece);
            }
            i = j;
        }
        for piece in p.finish() {
            push_piece(&mut out, piece);
        }
        out
    }

    /// The same pieces whatever the chunking.
    fn parse_all(make: impl Fn() -> OutputParser, text: &str) -> Vec<Piece> {
        let whole = parse(&mut make(), text, text.len().max(1));
        for step in [1, 2, 3, 5, 7, 13] {
            assert_eq!(parse(&mut make(), text, step), whole, "step {step}");
        }
        whole
    }

    fn weather() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}}}}}),
        ]
    }

    fn call(name: &str, args: Value) -> Piece {
        Piece::ToolCall(ToolCall {
            name: name.into(),
            arguments: args.to_string(),
        })
    }

    #[test]
    fn hermes_calls_between_content() {
        let tools = weather();
        let make = || OutputParser::new(Some((ToolSyntax::Hermes, &tools)), None, false);
        let text = "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": \
                    {\"city\": \"Paris\", \"days\": 3}}\n</tool_call>\n<tool_call>\n{\"name\": \
                    \"get_weather\", \"arguments\": {\"city\": \"Köln\"}}\n</tool_call>";
        assert_eq!(
            parse_all(make, text),
            [
                Piece::Content("Let me look.\n".into()),
                call("get_weather", json!({"city": "Paris", "days": 3})),
                Piece::Content("\n".into()),
                call("get_weather", json!({"city": "Köln"})),
            ]
        );
        // Not JSON, or unclosed: the text comes back as content.
        let bad = "<tool_call>{\"name\": oops}</tool_call> and <tool_call>{\"name\"";
        assert_eq!(parse_all(make, bad), [Piece::Content(bad.into())]);
        // A '<' that is no marker is not held back for ever.
        assert_eq!(
            parse_all(make, "a < b <tool"),
            [Piece::Content("a < b <tool".into())]
        );
    }

    #[test]
    fn llama3_json_calls() {
        let tools = weather();
        let make = || OutputParser::new(Some((ToolSyntax::Llama3Json, &tools)), None, false);
        let text = " {\"name\": \"get_weather\", \"parameters\": {\"city\": \"Oslo\"}}";
        assert_eq!(
            parse_all(make, text),
            [call("get_weather", json!({"city": "Oslo"}))]
        );
        let two = "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \
                   \"parameters\": {\"x\": 1}}";
        assert_eq!(
            parse_all(make, two),
            [call("a", json!({})), call("b", json!({"x": 1}))]
        );
        // Plain answers, and JSON that is no call, stay content.
        assert_eq!(
            parse_all(make, "Hello {x}"),
            [Piece::Content("Hello {x}".into())]
        );
        let obj = "{\"answer\": 4}";
        assert_eq!(parse_all(make, obj), [Piece::Content(obj.into())]);
    }

    #[test]
    fn glm_calls_typed_by_the_schema() {
        let tools = weather();
        let make = || OutputParser::new(Some((ToolSyntax::Glm, &tools)), Some(THINK), false);
        let text =
            "<think>cold?</think>\nChecking.<tool_call>get_weather\n<arg_key>city</arg_key>\n\
                    <arg_value>123</arg_value>\n<arg_key>days</arg_key>\n<arg_value>2</arg_value>\n\
                    </tool_call>";
        assert_eq!(
            parse_all(make, text),
            [
                Piece::Reasoning("cold?".into()),
                Piece::Content("\nChecking.".into()),
                call("get_weather", json!({"city": "123", "days": 2})),
            ]
        );
    }

    fn forced_tools() -> Vec<Value> {
        vec![
            json!({"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"], "additionalProperties": false}}}),
            json!({"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                "required": ["zone"], "additionalProperties": false}}}),
        ]
    }

    /// What a greedy stand-in model writes under a forced call's grammar (bytes as
    /// tokens, 256 the end): `want`'s next byte where allowed, else a byte that closes
    /// what is open; then the pieces the parser reads from it.
    fn forced(
        syntax: ToolSyntax,
        which: ForcedCall,
        (reasoning, in_reasoning): (Option<Think>, bool),
        want: &str,
    ) -> (String, Vec<Piece>) {
        use crate::sample::GrammarVocab;
        let mut t: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
        t.push(None);
        let vocab = GrammarVocab::new(&t, &[256]).expect("vocab");
        let tools = forced_tools();
        let g =
            forced_call_grammar(syntax, &tools, &which, reasoning, in_reasoning).expect("grammar");
        let mut c = vocab.lark(&g).unwrap_or_else(|e| panic!("{e}\n{g}"));
        let mut out = Vec::new();
        for i in 0..400 {
            let mut logits = vec![0.0f32; 257];
            for (rank, b) in b"1<]}\"".iter().enumerate() {
                logits[usize::from(*b)] = 1.0 + rank as f32;
            }
            match want.as_bytes().get(i) {
                Some(&b) => logits[usize::from(b)] = 10.0,
                None => logits[256] = 10.0,
            }
            c.mask(&mut logits);
            let tok = crate::sample::argmax(&logits);
            assert!(logits[tok].is_finite(), "nothing allowed after {out:?}");
            c.commit(tok as u32);
            if tok == 256 {
                break;
            }
            out.push(tok as u8);
        }
        let text = String::from_utf8(out).expect("utf-8");
        let mut p = if syntax == ToolSyntax::Harmony {
            OutputParser::harmony(Some(&tools))
        } else {
            OutputParser::new(Some((syntax, &tools)), reasoning, in_reasoning)
        };
        let mut pieces = p.push(&text);
        pieces.extend(p.finish());
        (text, pieces)
    }

    fn calls(pieces: &[Piece]) -> Vec<(String, Value)> {
        pieces
            .iter()
            .filter_map(|p| match p {
                Piece::ToolCall(c) => Some((
                    c.name.clone(),
                    serde_json::from_str(&c.arguments).expect("arguments are JSON"),
                )),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn forced_calls_follow_the_schema_in_each_syntax() {
        let none = (None, false);
        // Hermes, a named function: the wanted call's string "days" becomes an integer.
        let want = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \
                    \"Paris\", \"days\": \"three\"}}\n</tool_call>";
        let (text, pieces) = forced(
            ToolSyntax::Hermes,
            ForcedCall::Named("get_weather".into()),
            none,
            want,
        );
        assert_eq!(
            calls(&pieces),
            [("get_weather".into(), json!({"city": "Paris", "days": 1}))],
            "{text}"
        );
        assert!(
            pieces.iter().all(|p| matches!(p, Piece::ToolCall(_))),
            "{text}"
        );
        // A model that wants to answer in words calls the named function all the same.
        let (text, pieces) = forced(
            ToolSyntax::Hermes,
            ForcedCall::Named("get_time".into()),
            none,
            "Hi.",
        );
        let c = calls(&pieces);
        assert_eq!(c.len(), 1, "{text}");
        assert_eq!(c[0].0, "get_time");
        assert!(c[0].1["zone"].is_string(), "{text}");
        // Llama 3 JSON, any function: the wanted one.
        let want = "{\"name\": \"get_time\", \"parameters\": {\"zone\": \"CET\"}}";
        let (text, pieces) = forced(ToolSyntax::Llama3Json, ForcedCall::Any, none, want);
        assert_eq!(text, want);
        assert_eq!(
            calls(&pieces),
            [("get_time".into(), json!({"zone": "CET"}))]
        );
        // GLM: raw string values, JSON for the rest.
        let want =
            "<tool_call>get_weather\n<arg_key>city</arg_key>\n<arg_value>Paris</arg_value>\n\
                    <arg_key>days</arg_key>\n<arg_value>two</arg_value>\n</tool_call>";
        let (text, pieces) = forced(
            ToolSyntax::Glm,
            ForcedCall::Named("get_weather".into()),
            none,
            want,
        );
        assert_eq!(
            calls(&pieces),
            [("get_weather".into(), json!({"city": "Paris", "days": 1}))],
            "{text}"
        );
        // A thinking model whose prompt opened the reasoning closes it, then calls.
        let want = "Hmm.</think>\n\n<tool_call>\n{\"name\": \"get_time\", \"arguments\": \
                    {\"zone\": \"UTC\"}}\n</tool_call>";
        let (text, pieces) = forced(
            ToolSyntax::Hermes,
            ForcedCall::Any,
            (Some(THINK), true),
            want,
        );
        assert_eq!(text, want);
        assert_eq!(pieces[0], Piece::Reasoning("Hmm.".into()));
        assert_eq!(
            calls(&pieces),
            [("get_time".into(), json!({"zone": "UTC"}))]
        );
        // Harmony: the call on commentary, after analysis if the model wants it.
        let want = "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                    {\"city\": \"Paris\", \"days\": \"three\"}";
        let (text, pieces) = forced(
            ToolSyntax::Harmony,
            ForcedCall::Named("get_weather".into()),
            none,
            want,
        );
        assert_eq!(
            pieces,
            [Piece::ToolCall(ToolCall {
                name: "get_weather".into(),
                arguments: json!({"city": "Paris", "days": 1}).to_string()
            })],
            "{text}"
        );
        let want = "<|channel|>analysis<|message|>Hmm.<|end|><|start|>assistant<|channel|>\
                    commentary to=functions.get_time <|constrain|>json<|message|>{\"zone\": \"UTC\"}";
        let (text, pieces) = forced(ToolSyntax::Harmony, ForcedCall::Any, none, want);
        assert_eq!(text, want);
        assert_eq!(pieces[0], Piece::Reasoning("Hmm.".into()));
        assert_eq!(
            calls(&pieces),
            [("get_time".into(), json!({"zone": "UTC"}))]
        );
        // A forced function must be offered.
        let e = forced_call_grammar(
            ToolSyntax::Hermes,
            &forced_tools(),
            &ForcedCall::Named("get_stock".into()),
            None,
            false,
        )
        .expect_err("not offered");
        assert!(e.contains("get_stock"), "{e}");
    }

    #[test]
    fn reasoning_is_split_from_content() {
        let make = || OutputParser::new(None, Some(THINK), false);
        let text = "<think>\nTwo and two.\n</think>\n\nFour.";
        assert_eq!(
            parse_all(make, text),
            [
                Piece::Reasoning("\nTwo and two.\n".into()),
                Piece::Content("\n\nFour.".into()),
            ]
        );
        // The prompt opened the reasoning: only the close comes.
        let opened = || OutputParser::new(None, Some(THINK), true);
        assert_eq!(
            parse_all(opened, "hm</think>ok"),
            [Piece::Reasoning("hm".into()), Piece::Content("ok".into())]
        );
        // Cut off while thinking: all of it is reasoning.
        assert_eq!(
            parse_all(opened, "still </thi"),
            [Piece::Reasoning("still </thi".into())]
        );
        // `<think>` later than the start is content; without reasoning it is all content.
        assert_eq!(
            parse_all(make, "a<think>b"),
            [Piece::Content("a<think>b".into())]
        );
        let plain = || OutputParser::new(None, None, false);
        assert!(plain().is_passthrough());
        assert_eq!(
            parse_all(plain, "<think>x</think>"),
            [Piece::Content("<think>x</think>".into())]
        );
    }

    #[test]
    fn syntax_is_read_off_the_template() {
        let qwen = "{% if tools %}<tools>{% for t in tools %}{{ t | tojson }}{% endfor %}</tools>\
                    <tool_call>{% endif %}<think></think>";
        assert_eq!(
            ChatSyntax::detect(qwen),
            ChatSyntax {
                tools: Some(ToolSyntax::Hermes),
                reasoning: Some(THINK),
                harmony: false,
            }
        );
        // gpt-oss: harmony's channels, calls on commentary; a harmony template without
        // tools offers none.
        let oss = "{%- if tools %}{{ tools }}{% endif %}<|start|>assistant<|channel|>final";
        assert_eq!(
            ChatSyntax::detect(oss),
            ChatSyntax {
                tools: Some(ToolSyntax::Harmony),
                reasoning: None,
                harmony: true,
            }
        );
        assert_eq!(
            ChatSyntax::detect("<|channel|>final").tools,
            None,
            "no tools rendered"
        );
        let glm = "{% for t in tools %}{% endfor %}<tool_call><arg_key>";
        assert_eq!(ChatSyntax::detect(glm).tools, Some(ToolSyntax::Glm));
        let llama = "{% if tools %}<|start_header_id|>{\"parameters\"}{% endif %}";
        assert_eq!(
            ChatSyntax::detect(llama).tools,
            Some(ToolSyntax::Llama3Json)
        );
        assert_eq!(
            ChatSyntax::detect(flint_loader::chat::GEMMA_TEMPLATE),
            ChatSyntax::default()
        );
        assert!(prompt_opens_reasoning(
            "<|im_start|>assistant\n<think>\n",
            THINK
        ));
        assert!(!prompt_opens_reasoning("<think>\n\n</think>\n\n", THINK));
        // Qwen 3.5 and Qwen3-Coder: XML calls; Gemma 4: its own calls and thought
        // channel (the sdist's templates themselves: `engine/tests/serve_tools.rs`).
        let qwen35 = "{% if tools %}<tool_call>\n<function=x>\n<parameter=y>{% endif %}<think>";
        assert_eq!(ChatSyntax::detect(qwen35).tools, Some(ToolSyntax::QwenXml));
        let gemma4 = "{% if tools %}{{- '<|tool_call>call:' + name }}{% endif %}";
        assert_eq!(
            ChatSyntax::detect(gemma4),
            ChatSyntax {
                tools: Some(ToolSyntax::Gemma4),
                reasoning: Some(GEMMA4_THOUGHT),
                harmony: false,
            }
        );
        assert!(!prompt_opens_reasoning(
            "<|turn>model\n<|channel>thought\n<channel|>",
            GEMMA4_THOUGHT
        ));
    }

    #[test]
    fn qwen_xml_calls_typed_by_the_schema() {
        let tools = weather();
        // The Qwen 3.5 prompt opens the reasoning.
        let make = || OutputParser::new(Some((ToolSyntax::QwenXml, &tools)), Some(THINK), true);
        let text =
            "Paris, then Köln.\n</think>\n\nLooking.\n\n<tool_call>\n<function=get_weather>\n\
                    <parameter=city>\n123\n</parameter>\n<parameter=days>\n2\n</parameter>\n\
                    </function>\n</tool_call>\n<tool_call>\n<function=get_weather>\n\
                    <parameter=city>\nKöln\nam Rhein\n</parameter>\n</function>\n</tool_call>";
        assert_eq!(
            parse_all(make, text),
            [
                Piece::Reasoning("Paris, then Köln.\n".into()),
                Piece::Content("\n\nLooking.\n\n".into()),
                call("get_weather", json!({"city": "123", "days": 2})),
                Piece::Content("\n".into()),
                call("get_weather", json!({"city": "Köln\nam Rhein"})),
            ]
        );
        // A call that starts without closing the reasoning ends it (as llama.cpp reads it).
        let text = "hm<tool_call>\n<function=get_weather>\n</function>\n</tool_call>";
        assert_eq!(
            parse_all(make, text),
            [
                Piece::Reasoning("hm".into()),
                call("get_weather", json!({}))
            ]
        );
        // Not a function block: the text comes back as content.
        let make = || OutputParser::new(Some((ToolSyntax::QwenXml, &tools)), Some(THINK), false);
        let bad = "<tool_call>\n{\"name\": \"get_weather\"}\n</tool_call>";
        assert_eq!(parse_all(make, bad), [Piece::Content(bad.into())]);
    }

    #[test]
    fn gemma4_thought_and_calls() {
        let tools = weather();
        let make = || {
            OutputParser::new(
                Some((ToolSyntax::Gemma4, &tools)),
                Some(GEMMA4_THOUGHT),
                false,
            )
        };
        let text =
            "<|channel>thought\nCold in Köln?<channel|>Checking.<|tool_call>call:get_weather{\
                    city:<|\"|>Köln, {am} Rhein<|\"|>,days:2,where:{lat:50.9,lon:-6.9e0},\
                    hours:[9,12.5],ok:true,none:null,tags:[<|\"|>a<|\"|>,{}]}<tool_call|>\
                    <|tool_call>call:get_time{}<tool_call|>";
        assert_eq!(
            parse_all(make, text),
            [
                Piece::Reasoning("\nCold in Köln?".into()),
                Piece::Content("Checking.".into()),
                call(
                    "get_weather",
                    json!({"city": "Köln, {am} Rhein", "days": 2,
                           "where": {"lat": 50.9, "lon": -6.9}, "hours": [9, 12.5],
                           "ok": true, "none": null, "tags": ["a", {}]})
                ),
                call("get_time", json!({})),
            ]
        );
        // Another thought block after some content is reasoning too, and a stray
        // `<channel|>` is dropped, as llama.cpp reads Gemma 4's answers.
        assert_eq!(
            parse_all(
                make,
                "Four.<|channel>thought\nsure<channel|> Yes.<channel|>"
            ),
            [
                Piece::Content("Four.".into()),
                Piece::Reasoning("\nsure".into()),
                Piece::Content(" Yes.".into()),
            ]
        );
        // A plain answer; a broken call comes back as content.
        assert_eq!(
            parse_all(make, "Hi <b>there</b>"),
            [Piece::Content("Hi <b>there</b>".into())]
        );
        let bad = "<|tool_call>call:get_weather{city:Paris}<tool_call|>";
        assert_eq!(parse_all(make, bad), [Piece::Content(bad.into())]);
        // Without tools the thought channel is still split off.
        let plain = || OutputParser::new(None, Some(GEMMA4_THOUGHT), false);
        assert_eq!(
            parse_all(plain, "<|channel>thought\nx<channel|>Four."),
            [
                Piece::Reasoning("\nx".into()),
                Piece::Content("Four.".into())
            ]
        );
    }

    #[test]
    fn forced_calls_in_qwen_xml_and_gemma4() {
        // Qwen 3.5: the prompt opened the reasoning; string values raw, others JSON.
        let want = "Hmm.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n\
                    Paris\n</parameter>\n<parameter=days>\ntwo\n</parameter>\n</function>\n\
                    </tool_call>";
        let (text, pieces) = forced(
            ToolSyntax::QwenXml,
            ForcedCall::Any,
            (Some(THINK), true),
            want,
        );
        assert_eq!(pieces[0], Piece::Reasoning("Hmm.\n".into()), "{text}");
        let c = calls(&pieces);
        assert_eq!(c.len(), 1, "{text}");
        assert_eq!(c[0].0, "get_weather", "{text}");
        assert_eq!(c[0].1["city"], "Paris", "{text}");
        assert!(
            c[0].1["days"].is_i64(),
            "the word 'two' became a number: {text}"
        );
        // A named function without reasoning.
        let want = "<tool_call>\n<function=get_time>\n<parameter=zone>\nCET\n</parameter>\n\
                    </function>\n</tool_call>";
        let (text, pieces) = forced(
            ToolSyntax::QwenXml,
            ForcedCall::Named("get_time".into()),
            (None, false),
            want,
        );
        assert_eq!(text, want);
        assert_eq!(
            calls(&pieces),
            [("get_time".into(), json!({"zone": "CET"}))]
        );
        // Gemma 4: thought first if the model wants, then the call in Gemma 4's values.
        let want = "<|channel>thought\nHmm.<channel|><|tool_call>call:get_weather{city:<|\"|>Paris\
                    <|\"|>,days:2,where:{lat:1.5}}<tool_call|><|tool_call>call:get_time{zone:<|\"|>\
                    UTC<|\"|>}<tool_call|>";
        let (text, pieces) = forced(
            ToolSyntax::Gemma4,
            ForcedCall::Any,
            (Some(GEMMA4_THOUGHT), false),
            want,
        );
        assert_eq!(text, want);
        assert_eq!(pieces[0], Piece::Reasoning("\nHmm.".into()));
        assert_eq!(
            calls(&pieces),
            [
                (
                    "get_weather".into(),
                    json!({"city": "Paris", "days": 2, "where": {"lat": 1.5}})
                ),
                ("get_time".into(), json!({"zone": "UTC"}))
            ]
        );
        // Named: the function's name is forced, whatever the model wanted.
        let want = "<|tool_call>call:get_weather{city:<|\"|>Oslo<|\"|>}<tool_call|>";
        let (text, pieces) = forced(
            ToolSyntax::Gemma4,
            ForcedCall::Named("get_time".into()),
            (Some(GEMMA4_THOUGHT), false),
            want,
        );
        let c = calls(&pieces);
        assert_eq!(c.len(), 1, "{text}");
        assert_eq!(c[0].0, "get_time", "{text}");
    }
}
