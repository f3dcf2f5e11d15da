//! Chat templates: render `tokenizer.chat_template` (Jinja) with minijinja, as Hugging
//! Face's `apply_chat_template` does (blocks trimmed, `raise_exception`, Python string
//! methods such as `.strip()` and `.startswith()`).
//!
//! The rendered prompt contains special-token text (`<bos>`, `<start_of_turn>`), so
//! tokenize it with special-token parsing on and without adding BOS again:
//! `tokenizer.tokenize(&prompt, false, true)`.
//!
//! Gemma 3 files converted without a template (the 270M one among them) get a built-in
//! Gemma template; any other architecture without one is an error.

use minijinja::value::Kwargs;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::gguf::GgufFile;
use crate::tokenizer::{keys, Tokenizer};

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant` (or what the template accepts).
    pub role: String,
    /// The text.
    pub content: String,
}

impl ChatMessage {
    /// A message with this role and content.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
        }
    }
}

/// Chat template failures.
#[derive(Debug, Error)]
#[non_exhaustive]
pub enum ChatError {
    /// No `tokenizer.chat_template` key and no built-in template for the architecture.
    #[error("the model has no chat template (key tokenizer.chat_template is absent) and architecture '{0}' has no built-in one; use a plain prompt instead of chat mode")]
    Missing(String),
    /// The template does not parse.
    #[error("tokenizer.chat_template does not compile: {0}")]
    Compile(String),
    /// Rendering failed (including the template's own `raise_exception`).
    #[error("rendering the chat template failed: {0}")]
    Render(String),
    /// Reading the key failed.
    #[error("chat template metadata: {0}")]
    Gguf(#[from] crate::gguf::GgufError),
}

/// Gemma's turn format, written for Flint: an optional system message is folded into
/// the first user turn, `assistant` is called `model`, and roles must alternate.
pub const GEMMA_TEMPLATE: &str = r#"{{ bos_token }}
{%- if messages and messages[0].role == 'system' -%}
  {%- set prefix = messages[0].content | trim ~ '\n\n' -%}
  {%- set turns = messages[1:] -%}
{%- else -%}
  {%- set prefix = '' -%}
  {%- set turns = messages -%}
{%- endif -%}
{%- for m in turns -%}
  {%- if (m.role == 'user') != (loop.index0 % 2 == 0) -%}
    {{ raise_exception('Gemma conversations must alternate user / assistant turns, starting with user') }}
  {%- endif -%}
  {{ '<start_of_turn>' ~ ('model' if m.role == 'assistant' else m.role) ~ '\n' }}
  {%- if loop.first %}{{ prefix }}{% endif -%}
  {{ m.content | trim }}{{ '<end_of_turn>\n' }}
{%- endfor -%}
{%- if add_generation_prompt -%}
  {{ '<start_of_turn>model\n' }}
{%- endif -%}"#;

const NAME: &str = "chat";

/// A compiled chat template with the BOS / EOS texts it is rendered with.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    bos_token: String,
    eos_token: String,
    builtin: bool,
}

/// Template instructions one render may execute (minijinja's fuel). A chat template
/// comes from the model file, and a hostile one can loop for ever: two nested
/// `range(100000)` loops ran for minutes and would have written 10 GB. The built-in
/// Gemma template spends 36 per message (`render_fuel_of_the_gemma_template` measures
/// it), so this leaves room for conversations of a million turns, and a loop that does
/// not end stops in under a second.
pub const RENDER_FUEL: u64 = 50_000_000;

/// Bytes a rendered prompt may take beyond twice the messages' own: far more than any
/// context holds, far less than a hostile template could write (a string of 100 MB
/// repeated in a loop).
pub const RENDER_EXTRA_BYTES: usize = 16 << 20;

impl ChatTemplate {
    /// Compiles `source`.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<Self, ChatError> {
        let source = source.into();
        let mut env = Environment::new();
        env.set_trim_blocks(true);
        env.set_lstrip_blocks(true);
        env.set_fuel(Some(RENDER_FUEL));
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(NAME, source.clone())
            .map_err(|e| ChatError::Compile(describe(&e)))?;
        Ok(Self {
            env,
            source,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
            builtin: false,
        })
    }

    /// The built-in Gemma template.
    pub fn gemma(bos_token: impl Into<String>, eos_token: impl Into<String>) -> Self {
        let mut t = Self::new(GEMMA_TEMPLATE, bos_token, eos_token)
            .unwrap_or_else(|e| unreachable!("the built-in Gemma template compiles: {e}"));
        t.builtin = true;
        t
    }

    /// Picks the template: the file's own when present, else the built-in one for
    /// Gemma architectures, else [`ChatError::Missing`].
    pub fn select(
        template: Option<&str>,
        architecture: &str,
        bos_token: &str,
        eos_token: &str,
    ) -> Result<Self, ChatError> {
        match template {
            Some(src) => Self::new(src, bos_token, eos_token),
            None if architecture.starts_with("gemma") => Ok(Self::gemma(bos_token, eos_token)),
            None => Err(ChatError::Missing(architecture.to_owned())),
        }
    }

    /// The template of a GGUF file, with BOS / EOS texts from its tokenizer.
    pub fn from_gguf(f: &GgufFile, tok: &Tokenizer) -> Result<Self, ChatError> {
        let text = |id: Option<u32>| {
            id.and_then(|i| tok.token_text(i))
                .map(|b| String::from_utf8_lossy(b).into_owned())
                .unwrap_or_default()
        };
        let arch = f.opt_str("general.architecture")?.unwrap_or("");
        Self::select(
            f.opt_str(keys::CHAT_TEMPLATE)?,
            arch,
            &text(tok.bos()),
            &text(tok.eos()),
        )
    }

    /// Whether this is the built-in fallback rather than the file's template.
    pub fn is_builtin(&self) -> bool {
        self.builtin
    }

    /// The Jinja source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// Whether this is a harmony template (gpt-oss): it writes `<|channel|>`, as
    /// llama.cpp tells it apart.
    pub fn is_harmony(&self) -> bool {
        is_harmony(&self.source)
    }

    /// Whether this is a Gemma 4 template ([`is_gemma4`]).
    pub fn is_gemma4(&self) -> bool {
        is_gemma4(&self.source)
    }

    /// Renders `messages`; with `add_generation_prompt` the assistant turn is opened.
    ///
    /// A template that runs past [`RENDER_FUEL`] instructions, or whose output passes
    /// twice the messages' bytes plus [`RENDER_EXTRA_BYTES`], is stopped with
    /// [`ChatError::Render`] saying which.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        let input: usize = messages
            .iter()
            .map(|m| m.role.len() + m.content.len())
            .sum();
        self.render_ctx(
            Value::from_serialize(messages),
            Value::from(()),
            input,
            add_generation_prompt,
            Value::from(()),
        )
    }

    /// Renders messages given as JSON objects in OpenAI's shape (`role`, `content`,
    /// and what templates read besides: `tool_calls`, `tool_call_id`, `name`,
    /// `reasoning_content`) with the function `tools` offered to the model (`tools` in
    /// the template's context, as Hugging Face's `apply_chat_template(tools=...)`
    /// passes them; `None` leaves it `none`). Messages and tools reach the template as
    /// llama.cpp hands them over ([`template_message`], [`template_tool`]). The same limits as
    /// [`render`](Self::render), over the JSON text of the messages and tools.
    pub fn render_json(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
    ) -> Result<String, ChatError> {
        self.render_json_with(
            messages,
            tools,
            add_generation_prompt,
            &serde_json::Map::new(),
        )
    }

    /// [`render_json`](Self::render_json) with more variables in the template's context
    /// (a request's `chat_template_kwargs` and `reasoning_effort`, which gpt-oss's template
    /// reads). The template's own variables (`messages`, `tools`,
    /// `add_generation_prompt`, `bos_token`, `eos_token`) take precedence over them.
    pub fn render_json_with(
        &self,
        messages: &[serde_json::Value],
        tools: Option<&[serde_json::Value]>,
        add_generation_prompt: bool,
        vars: &serde_json::Map<String, serde_json::Value>,
    ) -> Result<String, ChatError> {
        let size = |v: &serde_json::Value| serde_json::to_string(v).map_or(0, |s| s.len());
        let input = messages.iter().map(size).sum::<usize>()
            + tools.map_or(0, |t| t.iter().map(size).sum())
            + vars.values().map(size).sum::<usize>();
        let tools = match tools {
            Some(t) => Value::from_serialize(t.iter().map(template_tool).collect::<Vec<_>>()),
            None => Value::from(()),
        };
        let harmony = self.is_harmony();
        let mut messages: Vec<serde_json::Value> = messages
            .iter()
            .map(|m| template_message(m, harmony))
            .collect();
        let gemma4 = self.is_gemma4();
        if gemma4 && !self.source.contains(GEMMA4_OPENAI_TOOLS) {
            messages = gemma4_tool_responses(messages);
        }
        let mut text = self.render_ctx(
            Value::from_serialize(&messages),
            tools,
            input,
            add_generation_prompt,
            Value::from_serialize(vars),
        )?;
        // Gemma 4's templates leave the model turn closed after an answer that follows
        // tool results; llama.cpp opens it, so that the model starts its turn as trained.
        if gemma4 && add_generation_prompt && text.ends_with(GEMMA4_TURN_END) {
            text.push_str(GEMMA4_MODEL_TURN);
        }
        Ok(text)
    }

    fn render_ctx(
        &self,
        messages: Value,
        tools: Value,
        input: usize,
        add_generation_prompt: bool,
        vars: Value,
    ) -> Result<String, ChatError> {
        let tmpl = self
            .env
            .get_template(NAME)
            .map_err(|e| ChatError::Render(describe(&e)))?;
        // llama.cpp's default (llama-server's, for a template that reads it): the model
        // may think; a request's `chat_template_kwargs` switch it off.
        let vars =
            minijinja::value::merge_maps([minijinja::context! { enable_thinking => true }, vars]);
        let mut out = CappedWriter {
            buf: Vec::new(),
            cap: input.saturating_mul(2).saturating_add(RENDER_EXTRA_BYTES),
        };
        tmpl.render_captured_to(
            minijinja::context! {
                messages => messages,
                tools => tools,
                add_generation_prompt => add_generation_prompt,
                bos_token => &self.bos_token,
                eos_token => &self.eos_token,
                ..vars
            },
            &mut out,
        )
        .map_err(|e| match e.kind() {
            ErrorKind::OutOfFuel => ChatError::Render(format!(
                "the template ran more than {RENDER_FUEL} instructions (a loop that does not \
                 end?)"
            )),
            _ => ChatError::Render(describe(&e)),
        })?;
        String::from_utf8(out.buf)
            .map_err(|_| ChatError::Render("the rendered prompt is not UTF-8".into()))
    }
}

/// The marker that tells a harmony (gpt-oss) template apart.
pub const HARMONY_CHANNEL: &str = "<|channel|>";

/// What tells a Gemma 4 template apart, as llama.cpp does: it writes a tool call as
/// the quoted `'<|tool_call>call:'`.
pub const GEMMA4_TOOL_CALL: &str = "'<|tool_call>call:'";

/// The comment of the Gemma 4 templates that read OpenAI's `tool` messages
/// themselves; the older ones read `tool_responses` on the calling message
/// ([`gemma4_tool_responses`]).
pub const GEMMA4_OPENAI_TOOLS: &str = "{#- OpenAI Chat Completions:";

const GEMMA4_TURN_END: &str = "<turn|>\n";
const GEMMA4_MODEL_TURN: &str = "<|turn>model\n";

/// Whether `source` is a harmony (gpt-oss) template: it writes [`HARMONY_CHANNEL`].
pub fn is_harmony(source: &str) -> bool {
    source.contains(HARMONY_CHANNEL)
}

/// Whether `source` is a Gemma 4 template: it writes [`GEMMA4_TOOL_CALL`].
pub fn is_gemma4(source: &str) -> bool {
    source.contains(GEMMA4_TOOL_CALL)
}

/// Messages as the older Gemma 4 templates read them, as llama.cpp hands them over:
/// an assistant message with tool calls, the `tool` messages after it and an
/// assistant answer after those (one without calls and with content) become one
/// assistant message with `tool_calls`, `tool_responses` (`{name, response}`: the
/// name of the call at the same place, else the `tool_call_id`; the response the JSON
/// a text holds, else the text), `content` and `reasoning_content`.
pub fn gemma4_tool_responses(messages: Vec<serde_json::Value>) -> Vec<serde_json::Value> {
    use serde_json::{json, Value as J};
    let calls_of = |m: &J| -> Option<Vec<J>> {
        match m.get("tool_calls") {
            Some(J::Array(c)) if !c.is_empty() => Some(c.clone()),
            _ => None,
        }
    };
    let role = |m: &J| m.get("role").and_then(J::as_str).unwrap_or("").to_string();
    let has_content = |m: &J| match m.get("content") {
        Some(J::String(s)) => !s.is_empty(),
        Some(J::Array(a)) => !a.is_empty(),
        _ => false,
    };
    let mut out = Vec::with_capacity(messages.len());
    let mut i = 0;
    while i < messages.len() {
        let m = &messages[i];
        let calls = match calls_of(m) {
            Some(c) if role(m) == "assistant" => c,
            _ => {
                out.push(m.clone());
                i += 1;
                continue;
            }
        };
        let reasoning = m
            .get("reasoning_content")
            .filter(|r| r.is_string())
            .cloned();
        i += 1;
        let mut responses = Vec::new();
        while i < messages.len() && role(&messages[i]) == "tool" {
            let t = &messages[i];
            let response = match t.get("content") {
                Some(J::String(s)) => {
                    serde_json::from_str(s).unwrap_or_else(|_| J::String(s.clone()))
                }
                Some(c) => c.clone(),
                None => J::Null,
            };
            let name = calls
                .get(responses.len())
                .and_then(|c| c.pointer("/function/name"))
                .and_then(J::as_str)
                .filter(|n| !n.is_empty())
                .or_else(|| t.get("tool_call_id").and_then(J::as_str))
                .unwrap_or("");
            responses.push(json!({"name": name, "response": response}));
            i += 1;
        }
        let mut content = None;
        if let Some(next) = messages.get(i) {
            if role(next) == "assistant" && calls_of(next).is_none() && has_content(next) {
                content = next.get("content").cloned();
                i += 1;
            }
        }
        let mut msg = json!({"role": "assistant", "tool_calls": calls});
        if !responses.is_empty() {
            msg["tool_responses"] = J::Array(responses);
        }
        if let Some(c) = content {
            msg["content"] = c;
        }
        if let Some(r) = reasoning {
            msg["reasoning_content"] = r;
        }
        out.push(msg);
    }
    out
}

/// A message in OpenAI's shape as chat templates read it (what llama.cpp hands them):
/// each tool call's `arguments`, JSON text in OpenAI's API, as the object it holds
/// (templates write it with `tojson`); for a `harmony` template, `reasoning_content` as
/// `thinking`, the field gpt-oss's template reads, and an assistant turn that calls a
/// tool and has reasoning loses its `content` (the template takes one or the other).
pub fn template_message(m: &serde_json::Value, harmony: bool) -> serde_json::Value {
    use serde_json::Value as J;
    let mut m = m.clone();
    if let Some(J::Array(calls)) = m.get_mut("tool_calls") {
        for c in calls {
            let parsed = c
                .pointer("/function/arguments")
                .and_then(J::as_str)
                .and_then(|a| serde_json::from_str::<J>(a).ok());
            if let (Some(args), Some(f)) = (parsed, c.get_mut("function")) {
                f["arguments"] = args;
            }
        }
    }
    if harmony {
        if let Some(J::String(r)) = m.get("reasoning_content").cloned() {
            let calls = m
                .get("tool_calls")
                .and_then(J::as_array)
                .is_some_and(|c| !c.is_empty());
            if let Some(o) = m.as_object_mut() {
                o.insert("thinking".into(), J::String(r));
                if calls {
                    o.remove("content");
                }
            }
        }
    }
    m
}

/// A function tool as chat templates read it (what llama.cpp hands them): `{"type":
/// "function", "function": {"name", "description", "parameters"}}`, a missing
/// description as `""` and missing parameters as `{}` (templates write them without
/// asking whether they are there), other fields left out.
pub fn template_tool(t: &serde_json::Value) -> serde_json::Value {
    let f = t.get("function");
    let field = |k: &str| f.and_then(|f| f.get(k)).filter(|v| !v.is_null());
    serde_json::json!({
        "type": "function",
        "function": {
            "name": field("name").cloned().unwrap_or_else(|| "".into()),
            "description": field("description").cloned().unwrap_or_else(|| "".into()),
            "parameters": field("parameters").cloned().unwrap_or_else(|| serde_json::json!({})),
        }
    })
}

/// A `Vec` that refuses to grow past `cap` bytes (the rendered prompt's limit).
struct CappedWriter {
    buf: Vec<u8>,
    cap: usize,
}

impl std::io::Write for CappedWriter {
    fn write(&mut self, data: &[u8]) -> std::io::Result<usize> {
        if self.buf.len().saturating_add(data.len()) > self.cap {
            return Err(std::io::Error::other(format!(
                "the rendered prompt would pass {} bytes",
                self.cap
            )));
        }
        self.buf.extend_from_slice(data);
        Ok(data.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn describe(e: &JinjaError) -> String {
    let mut s = e.to_string();
    let mut src = std::error::Error::source(e);
    while let Some(inner) = src {
        s.push_str(": ");
        s.push_str(&inner.to_string());
        src = inner.source();
    }
    s
}

/// `tojson` as Hugging Face's renderer (and llama.cpp's) defines it: Python's
/// `json.dumps(value, ensure_ascii=False)`, so `{"a": 1, "b": [1, 2]}` with spaces after
/// the separators, keys in their order, nothing HTML-escaped; `indent=N` (also the
/// first positional argument), `separators=(item, key)`, `sort_keys` and
/// `ensure_ascii` as Python reads them.
fn tojson(value: Value, indent: Option<Value>, kwargs: Kwargs) -> Result<Value, JinjaError> {
    let bad = |m: String| JinjaError::new(ErrorKind::InvalidOperation, m);
    let indent = match kwargs.get::<Option<Value>>("indent")?.or(indent) {
        Some(v) if v.is_none() || v.is_undefined() => None,
        Some(v) => match (v.as_usize(), v.as_str()) {
            (Some(n), _) => Some(" ".repeat(n)),
            (_, Some(s)) => Some(s.to_string()),
            _ => {
                return Err(bad(format!(
                    "tojson: indent must be a number or a string, not {v}"
                )))
            }
        },
        None => None,
    };
    let (item, key) = match kwargs.get::<Option<Vec<String>>>("separators")? {
        Some(s) if s.len() == 2 => (s[0].clone(), s[1].clone()),
        Some(s) => {
            return Err(bad(format!(
                "tojson: separators must be two strings, not {s:?}"
            )))
        }
        None if indent.is_some() => (",".into(), ": ".into()),
        None => (", ".into(), ": ".into()),
    };
    let sort = kwargs.get::<Option<bool>>("sort_keys")?.unwrap_or(false);
    let ascii = kwargs.get::<Option<bool>>("ensure_ascii")?.unwrap_or(false);
    kwargs.assert_all_used()?;
    let v = serde_json::to_value(&value).map_err(|e| bad(format!("tojson: {e}")))?;
    let style = PyJson {
        indent,
        item,
        key,
        sort,
    };
    let mut out = String::new();
    style.write(&v, 0, &mut out);
    if ascii {
        out = out
            .chars()
            .flat_map(|c| {
                let mut units = [0u16; 2];
                let esc: Vec<char> = if c.is_ascii() {
                    vec![c]
                } else {
                    c.encode_utf16(&mut units)
                        .iter()
                        .flat_map(|u| format!("\\u{u:04x}").chars().collect::<Vec<_>>())
                        .collect()
                };
                esc
            })
            .collect();
    }
    Ok(Value::from_safe_string(out))
}

/// How Python's `json.dumps` lays JSON out.
struct PyJson {
    indent: Option<String>,
    item: String,
    key: String,
    sort: bool,
}

impl PyJson {
    fn newline(&self, depth: usize, out: &mut String) {
        if let Some(ind) = &self.indent {
            out.push('\n');
            for _ in 0..depth {
                out.push_str(ind);
            }
        }
    }

    fn write(&self, v: &serde_json::Value, depth: usize, out: &mut String) {
        use serde_json::Value as J;
        match v {
            J::Array(a) if !a.is_empty() => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    self.write(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push(']');
            }
            J::Object(m) if !m.is_empty() => {
                let mut entries: Vec<(&String, &J)> = m.iter().collect();
                if self.sort {
                    entries.sort_by(|a, b| a.0.cmp(b.0));
                }
                out.push('{');
                for (i, (k, x)) in entries.into_iter().enumerate() {
                    if i > 0 {
                        out.push_str(&self.item);
                    }
                    self.newline(depth + 1, out);
                    out.push_str(&J::String(k.clone()).to_string());
                    out.push_str(&self.key);
                    self.write(x, depth + 1, out);
                }
                self.newline(depth, out);
                out.push('}');
            }
            other => out.push_str(&other.to_string()),
        }
    }
}

fn raise_exception(msg: String) -> Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, msg))
}

/// `strftime_now(format)` as Llama 3 templates call it; supports `%Y %m %d %B %b %%` (UTC).
fn strftime_now(fmt: String) -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    let (y, m, d) = civil_from_days((secs / 86_400) as i64);
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    let month = MONTHS[(m - 1) as usize];
    let mut out = String::new();
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('B') => out.push_str(month),
            Some('b') => out.push_str(&month[..3]),
            Some('%') => out.push('%'),
            Some(o) => {
                out.push('%');
                out.push(o);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 → (year, month 1..=12, day 1..=31), proleptic Gregorian.
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (y, m, d)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates() {
        assert_eq!(civil_from_days(0), (1970, 1, 1));
        assert_eq!(civil_from_days(19_723), (2024, 1, 1));
        assert_eq!(civil_from_days(11_016), (2000, 2, 29));
    }

    fn turns(n: usize) -> Vec<ChatMessage> {
        (0..n)
            .map(|i| {
                let role = if i % 2 == 0 { "user" } else { "assistant" };
                ChatMessage::new(role, format!("message number {i}, with some text in it"))
            })
            .collect()
    }

    /// `tojson` writes what Python's `json.dumps(..., ensure_ascii=False)` writes (the
    /// expected strings are Python's output), keys in their given order.
    #[test]
    fn tojson_is_pythons() {
        let v = serde_json::json!({"b": [1, 2.5, {"x": null}], "a": "é<\"\n", "e": [], "o": {}});
        let t = |expr: &str| {
            let src = format!("{{{{ messages | {expr} }}}}");
            ChatTemplate::new(src, "", "")
                .expect("compiles")
                .render_ctx(
                    Value::from_serialize(&v),
                    Value::from(()),
                    0,
                    false,
                    Value::from(()),
                )
                .expect("renders")
        };
        assert_eq!(
            t("tojson"),
            r#"{"b": [1, 2.5, {"x": null}], "a": "é<\"\n", "e": [], "o": {}}"#
        );
        assert_eq!(
            t("tojson(indent=2)"),
            "{\n  \"b\": [\n    1,\n    2.5,\n    {\n      \"x\": null\n    }\n  ],\n  \"a\": \
             \"é<\\\"\\n\",\n  \"e\": [],\n  \"o\": {}\n}"
        );
        assert_eq!(
            t("tojson(ensure_ascii=true, sort_keys=true, separators=[',', ':'])"),
            r#"{"a":"\u00e9<\"\n","b":[1,2.5,{"x":null}],"e":[],"o":{}}"#
        );
    }

    /// What the built-in Gemma template spends per message, against [`RENDER_FUEL`]: a
    /// conversation of 20,000 turns must fit with room to spare.
    #[test]
    fn render_fuel_of_the_gemma_template() {
        let t = ChatTemplate::gemma("<bos>", "<eos>");
        let tmpl = t.env.get_template(NAME).expect("template");
        let fuel_of = |n: usize| {
            let ctx = minijinja::context! {
                messages => turns(n),
                add_generation_prompt => true,
                bos_token => "<bos>",
                eos_token => "<eos>",
            };
            let c = tmpl.render_captured_to(ctx, Vec::new()).expect("render");
            c.state().fuel_levels().expect("fuel is on").0
        };
        let per_message = (fuel_of(200) - fuel_of(100)) as f64 / 100.0;
        eprintln!("Gemma template: {per_message:.1} instructions per message");
        assert!(per_message > 0.0);
        assert!(
            per_message * 20_000.0 * 5.0 < RENDER_FUEL as f64,
            "{per_message} instructions per message"
        );
        let long = t.render(&turns(20_000), true).expect("20,000 turns render");
        assert!(long.contains("message number 19999"));
    }

    /// A template that would loop for ever stops with an error that says so, and one
    /// whose output would not end stops at the size limit.
    #[test]
    fn hostile_templates_stop_with_an_error() {
        let msgs = [ChatMessage::new("user", "hi")];
        let t = ChatTemplate::new(
            "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
            "<s>",
            "</s>",
        )
        .expect("compiles");
        let start = std::time::Instant::now();
        let e = t.render(&msgs, true).expect_err("out of fuel");
        assert!(e.to_string().contains("instructions"), "{e}");
        // Not a timing test: a bound far above the ~1 s it takes, far below the
        // minutes the loops ran without fuel.
        assert!(start.elapsed().as_secs() < 60);
        let t = ChatTemplate::new(
            "{% for i in range(1000) %}{{ 'x' * 1000000 }}{% endfor %}",
            "<s>",
            "</s>",
        )
        .expect("compiles");
        let e = t.render(&msgs, true).expect_err("too large");
        assert!(e.to_string().contains("bytes"), "{e}");
        // Just under the limit renders.
        let t = ChatTemplate::new("{{ 'x' * 1000000 }}", "<s>", "</s>").expect("compiles");
        assert_eq!(t.render(&msgs, true).expect("1 MB").len(), 1_000_000);
    }
}
