//! The OpenAI-compatible routes, `/tokenize` and `/detokenize` (vLLM's shapes), the
//! API key check and the drain gate.
//!
//! Every request field is implemented, accepted because it changes nothing here
//! ([`NO_EFFECT`]), or refused with a 400 that names it: the fields OpenAI defines that
//! Flint does not implement ([`asks_for_nothing`] lists the values of theirs that are
//! accepted because they ask for nothing), and any field the API does not define.

// The error side of the validation helpers is the HTTP response itself, sent to the
// client at once; boxing it would only add an allocation on the error path.
#![allow(clippy::result_large_err)]

use std::collections::HashMap;
use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::{Request, State};
use axum::http::{header, HeaderValue, StatusCode};
use axum::middleware::{self, Next};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use futures_util::stream::{self, BoxStream, StreamExt};
use serde::de::DeserializeOwned;
use serde::Deserialize;
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::harmony;
use super::tools::ToolCall;
use super::tools::{
    forced_call_grammar, ChatSyntax, ForcedCall, OutputParser, Piece, Think, ToolSyntax,
};
use super::{EngineHandle, Event, Phase, SubmitError};
use crate::sample::{
    Constraint, FinishReason, GrammarVocab, Rng, SamplerConfig, StopConditions, TokenLogprobs,
};
use crate::sched::{RequestOutput, RequestParams};

/// One chat message.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, `tool`, ...
    pub role: String,
    /// The text.
    pub content: String,
    /// An assistant message's earlier calls (OpenAI's `tool_calls`).
    pub tool_calls: Option<Vec<Value>>,
    /// A `tool` message: the call it answers.
    pub tool_call_id: Option<String>,
    /// The author's (or the tool's) name.
    pub name: Option<String>,
    /// An assistant message's reasoning, as the server returned it.
    pub reasoning_content: Option<String>,
}

impl ChatMessage {
    /// A message with this role and text.
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self {
            role: role.into(),
            content: content.into(),
            ..Self::default()
        }
    }

    /// The message in OpenAI's shape, as
    /// [`ChatTemplate::render_json`](flint_loader::chat::ChatTemplate::render_json)
    /// takes it.
    pub fn to_template(&self) -> Value {
        let mut m = json!({"role": self.role, "content": self.content});
        if let Some(calls) = &self.tool_calls {
            m["tool_calls"] = Value::Array(calls.clone());
        }
        if let Some(id) = &self.tool_call_id {
            m["tool_call_id"] = json!(id);
        }
        if let Some(n) = &self.name {
            m["name"] = json!(n);
        }
        if let Some(r) = &self.reasoning_content {
            m["reasoning_content"] = json!(r);
        }
        m
    }
}

/// A rendered, tokenized chat prompt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatPrompt {
    /// Its tokens.
    pub tokens: Vec<u32>,
    /// The template opened the model's reasoning (`<think>`) at its end.
    pub opens_reasoning: bool,
}

/// The text side of a served model: tokenizer and chat template.
pub trait TextSide: Send + Sync {
    /// Tokenizes a completion prompt (BOS as the model wants it).
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Renders chat messages and the offered function `tools` with the model's
    /// template, ready for generation, with the request's template variables `vars`
    /// (`chat_template_kwargs`, `reasoning_effort`), and tokenizes the result.
    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Value]>,
        vars: &TemplateVars,
    ) -> Result<ChatPrompt, String>;
    /// The tool-call and reasoning syntax of the model's answers (none by default).
    fn chat_syntax(&self) -> ChatSyntax {
        ChatSyntax::default()
    }
    /// Whether the chat template mentions the variable `name` (a request's template
    /// variables must: one the template never reads would be silently ignored). False
    /// by default.
    fn template_reads(&self, name: &str) -> bool {
        let _ = name;
        false
    }
    /// The vocabulary for constrained decoding (`response_format`), built on first use;
    /// an error when this text side has none.
    fn grammar_vocab(&self) -> Result<Arc<GrammarVocab>, String> {
        Err("this model cannot constrain its output".into())
    }
    /// Token ids that end generation.
    fn eog_ids(&self) -> Vec<u32>;
    /// The bytes of one token's text, control tokens written out (`<bos>`); nothing for
    /// an id outside the vocabulary.
    fn token_bytes(&self, id: u32) -> Vec<u8>;
}

#[derive(Clone)]
struct AppState {
    engine: EngineHandle,
    text: Arc<dyn TextSide>,
}

/// The most top log-probabilities a request may ask for per token.
pub const MAX_TOP_LOGPROBS: u32 = 20;
/// The most samples (`n`) one request may ask for.
pub const MAX_N: u32 = 128;
/// `Retry-After` seconds of a 503 while warming up or draining.
const RETRY_AFTER_S: &str = "5";
/// The log-probability written for a token of probability 0 (JSON has no -inf; vLLM
/// writes the same).
const LOGPROB_FLOOR: f32 = -9999.0;

/// The largest request body accepted (bytes); a larger one is a 413, refused from its
/// `Content-Length` before any of it is read (a body without one stops at the limit).
pub const MAX_BODY_BYTES: usize = 2 << 20;

/// The router with every route, over a running engine thread.
pub fn router(engine: EngineHandle, text: Arc<dyn TextSide>) -> Router {
    let st = AppState { engine, text };
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .fallback(not_found)
        .layer(axum::extract::DefaultBodyLimit::max(MAX_BODY_BYTES))
        .layer(middleware::from_fn_with_state(st.clone(), gate))
        .with_state(st)
}

/// In front of every route: counts the refusals (every 4xx and 503 answer but
/// `/health`'s and `/metrics`'), then checks the API key (all but `/health`), then the
/// drain (all but `/health` and `/metrics`).
async fn gate(State(st): State<AppState>, req: Request, next: Next) -> Response {
    let counted = !matches!(req.uri().path(), "/health" | "/metrics");
    let r = guard(&st, req, next).await;
    let status = r.status();
    if counted && (status.is_client_error() || status == StatusCode::SERVICE_UNAVAILABLE) {
        st.engine
            .metrics
            .requests_refused
            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    }
    r
}

async fn guard(st: &AppState, req: Request, next: Next) -> Response {
    let path = req.uri().path();
    if path == "/health" {
        return next.run(req).await;
    }
    if let Some(key) = &st.engine.config.api_key {
        let given = req.headers().get(header::AUTHORIZATION);
        let token = given
            .map(|v| v.as_bytes())
            .filter(|v| v.len() >= 7 && v[..7].eq_ignore_ascii_case(b"bearer "))
            .map(|v| &v[7..]);
        if !token.is_some_and(|t| key.matches(t)) {
            let message = if given.is_none() {
                "missing API key: send the header `Authorization: Bearer <key>`"
            } else {
                "invalid API key in the Authorization header (want `Bearer <key>`)"
            };
            let mut r = error_with(
                StatusCode::UNAUTHORIZED,
                "invalid_request_error",
                None,
                Some("invalid_api_key"),
                message,
            );
            r.headers_mut()
                .insert(header::WWW_AUTHENTICATE, HeaderValue::from_static("Bearer"));
            return r;
        }
    }
    if path != "/metrics" && st.engine.phase() == Phase::Draining {
        return draining();
    }
    let announced = req
        .headers()
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    if let Some(len) = announced.filter(|&l| l > MAX_BODY_BYTES as u64) {
        return error(
            StatusCode::PAYLOAD_TOO_LARGE,
            "invalid_request_error",
            format!("the request body of {len} bytes exceeds the limit of {MAX_BODY_BYTES} bytes"),
        );
    }
    next.run(req).await
}

async fn not_found(req: Request) -> Response {
    error(
        StatusCode::NOT_FOUND,
        "invalid_request_error",
        format!("no route for {} {}", req.method(), req.uri().path()),
    )
}

async fn health(State(st): State<AppState>) -> Response {
    match st.engine.phase() {
        Phase::Ready => Json(json!({"status": "ok"})).into_response(),
        Phase::WarmingUp => unavailable(
            "warming_up",
            "the model is warming up; it serves in a moment",
            RETRY_AFTER_S,
        ),
        Phase::Failed => unavailable(
            "engine_failed",
            "the warm-up request failed: the engine cannot compute (see the server log)",
            RETRY_AFTER_S,
        ),
        Phase::Draining => draining(),
    }
}

fn draining() -> Response {
    unavailable(
        "draining",
        "the server is shutting down: it finishes the requests in flight and takes no new ones",
        RETRY_AFTER_S,
    )
}

/// A 503 with `Retry-After`.
fn unavailable(code: &str, message: &str, retry_after: &'static str) -> Response {
    let mut r = error_with(
        StatusCode::SERVICE_UNAVAILABLE,
        "service_unavailable",
        None,
        Some(code),
        message,
    );
    r.headers_mut()
        .insert(header::RETRY_AFTER, HeaderValue::from_static(retry_after));
    r
}

async fn metrics(State(st): State<AppState>) -> impl IntoResponse {
    (
        [(header::CONTENT_TYPE, "text/plain; version=0.0.4")],
        st.engine.metrics.render(),
    )
}

async fn models(State(st): State<AppState>) -> impl IntoResponse {
    Json(json!({
        "object": "list",
        "data": [{
            "id": st.engine.config.model_name,
            "object": "model",
            "created": now(),
            "owned_by": "flint",
            "max_model_len": st.engine.config.max_model_len,
        }]
    }))
}

fn now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

/// An OpenAI-style error response.
fn error_with(
    status: StatusCode,
    kind: &str,
    param: Option<&str>,
    code: Option<&str>,
    message: impl Into<String>,
) -> Response {
    let message = message.into();
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "param": param, "code": code}})),
    )
        .into_response()
}

fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    error_with(status, kind, None, None, message)
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// A 400 about one field: `param` names it.
fn bad_param(param: &str, message: impl Into<String>) -> Response {
    error_with(
        StatusCode::BAD_REQUEST,
        "invalid_request_error",
        Some(param),
        None,
        message,
    )
}

// ---------------------------------------------------------------------------------
// Which fields exist.

/// Fields both generation endpoints implement.
const COMMON: &[&str] = &[
    "model",
    "max_tokens",
    "max_completion_tokens",
    "temperature",
    "top_p",
    "top_k",
    "min_p",
    "stop",
    "seed",
    "presence_penalty",
    "frequency_penalty",
    "repetition_penalty",
    "n",
    "stream",
    "stream_options",
    "logprobs",
    "logit_bias",
    "ignore_eos",
];

/// Fields OpenAI defines that change nothing here: accepted, not used.
pub const NO_EFFECT: &[&str] = &[
    "user",
    "metadata",
    "store",
    "service_tier",
    "parallel_tool_calls",
];

/// Chat fields OpenAI defines that Flint does not implement, then vLLM's and SGLang's
/// extensions that `vllm-router` writes into every chat request it forwards (with their
/// defaults, which are what Flint does).
const CHAT_UNSUPPORTED: &[&str] = &[
    "functions",
    "function_call",
    "audio",
    "modalities",
    "prediction",
    "web_search_options",
    "no_stop_trim",
    "skip_special_tokens",
    "return_hidden_states",
    "continue_final_message",
    "separate_reasoning",
    "stream_reasoning",
    "include_reasoning",
];

/// Completion fields OpenAI defines that Flint does not implement, then the extensions
/// `vllm-router` writes into every completion request it forwards.
const COMPLETION_UNSUPPORTED: &[&str] = &[
    "echo",
    "suffix",
    "best_of",
    "no_stop_trim",
    "skip_special_tokens",
    "return_hidden_states",
];

/// Message fields the chat template gets.
const MESSAGE_FIELDS: &[&str] = &[
    "role",
    "content",
    "name",
    "tool_calls",
    "tool_call_id",
    "reasoning_content",
];

/// Message fields OpenAI defines that Flint does not implement.
const MESSAGE_UNSUPPORTED: &[&str] = &["function_call", "refusal", "audio"];

/// True when the value of an unimplemented field asks for what Flint does anyway
/// (`null` always does).
fn asks_for_nothing(field: &str, v: &Value, obj: &Map<String, Value>) -> bool {
    if v.is_null() {
        return true;
    }
    match field {
        "functions" => v.as_array().is_some_and(|a| a.is_empty()),
        "function_call" => *v == json!("none"),
        "modalities" => *v == json!(["text"]),
        "echo" => *v == json!(false),
        "suffix" => *v == json!(""),
        "best_of" => v.as_u64() == Some(obj.get("n").and_then(Value::as_u64).unwrap_or(1)),
        // The stop string is left out of the text; special tokens are not written
        // (the tool-call and reasoning markers excepted: they are parsed); no hidden
        // states are returned; a generation prompt is added after the last message.
        "no_stop_trim" | "return_hidden_states" | "continue_final_message" => *v == json!(false),
        "skip_special_tokens" => *v == json!(true),
        // Reasoning is returned, apart from the content (`reasoning_content`), streamed.
        "separate_reasoning" | "stream_reasoning" | "include_reasoning" => *v == json!(true),
        _ => false,
    }
}

fn check_fields(
    obj: &Map<String, Value>,
    known: &[&[&str]],
    unsupported: &[&str],
    at: &str,
) -> Result<(), Response> {
    for (k, v) in obj {
        let name = format!("{at}{k}");
        if known.iter().any(|l| l.contains(&k.as_str())) {
            continue;
        }
        if unsupported.contains(&k.as_str()) {
            if asks_for_nothing(k, v, obj) {
                continue;
            }
            return Err(bad_param(
                &name,
                format!("{name} is not supported by this server (send null or leave it out)"),
            ));
        }
        return Err(bad_param(&name, format!("unknown field '{name}'")));
    }
    Ok(())
}

/// Checks the fields of a chat message list (each message, each content part).
fn check_messages(obj: &Map<String, Value>) -> Result<(), Response> {
    let Some(Value::Array(msgs)) = obj.get("messages") else {
        return Ok(());
    };
    for (i, m) in msgs.iter().enumerate() {
        let Some(m) = m.as_object() else { continue };
        check_fields(
            m,
            &[MESSAGE_FIELDS],
            MESSAGE_UNSUPPORTED,
            &format!("messages[{i}]."),
        )?;
        if let Some(Value::Array(parts)) = m.get("content") {
            for (j, p) in parts.iter().enumerate() {
                let Some(p) = p.as_object() else { continue };
                check_fields(
                    p,
                    &[&["type", "text"]],
                    &[],
                    &format!("messages[{i}].content[{j}]."),
                )?;
            }
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------
// Request bodies.

/// `stop` is a string or a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct StreamOptions {
    include_usage: Option<bool>,
}

/// The sampling fields shared by both endpoints (read from the whole body; the fields
/// of the endpoint are read on their own).
#[derive(Debug, Deserialize)]
struct Sampling {
    model: Option<String>,
    max_tokens: Option<u64>,
    max_completion_tokens: Option<u64>,
    temperature: Option<f32>,
    top_p: Option<f32>,
    top_k: Option<i64>,
    min_p: Option<f32>,
    stop: Option<StopField>,
    seed: Option<i64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    repetition_penalty: Option<f32>,
    n: Option<u32>,
    stream: Option<bool>,
    stream_options: Option<StreamOptions>,
    logit_bias: Option<HashMap<String, f32>>,
    ignore_eos: Option<bool>,
}

/// A completion prompt: text or token ids, one or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    Text(String),
    Texts(Vec<String>),
    Tokens(Vec<u32>),
    TokenLists(Vec<Vec<u32>>),
}

#[derive(Debug, Deserialize)]
struct CompletionFields {
    prompt: PromptField,
    /// How many top log-probabilities per token (0: only the drawn token's).
    logprobs: Option<u32>,
    response_format: Option<Value>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum ContentField {
    Text(String),
    Parts(Vec<ContentPart>),
}

#[derive(Debug, Deserialize)]
struct ContentPart {
    #[serde(rename = "type")]
    kind: String,
    text: Option<String>,
}

#[derive(Debug, Deserialize)]
struct MessageIn {
    role: String,
    content: Option<ContentField>,
    name: Option<String>,
    tool_calls: Option<Vec<Value>>,
    tool_call_id: Option<String>,
    reasoning_content: Option<String>,
}

#[derive(Debug, Deserialize)]
struct ChatFields {
    messages: Vec<MessageIn>,
    logprobs: Option<bool>,
    top_logprobs: Option<u32>,
    tools: Option<Vec<Value>>,
    tool_choice: Option<Value>,
    response_format: Option<Value>,
    reasoning_effort: Option<String>,
    chat_template_kwargs: Option<Map<String, Value>>,
}

/// Extra variables of a chat template's context, from the request.
pub type TemplateVars = Map<String, Value>;

/// The values of `reasoning_effort` (gpt-oss's template writes it as "Reasoning: ...").
const REASONING_EFFORTS: &[&str] = &["low", "medium", "high"];

/// The template variables of a chat request: `chat_template_kwargs` (as vLLM and
/// llama-server take them), then `reasoning_effort` over them. A variable the model's
/// template never mentions is a 400 naming it, rather than ignored.
fn template_vars(text: &dyn TextSide, fields: &mut ChatFields) -> Result<TemplateVars, Response> {
    let mut vars = fields.chat_template_kwargs.take().unwrap_or_default();
    if let Some(k) = vars.keys().find(|k| !text.template_reads(k)) {
        return Err(bad_param(
            &format!("chat_template_kwargs.{k}"),
            format!("this model's chat template does not read '{k}'"),
        ));
    }
    if let Some(e) = fields.reasoning_effort.take() {
        if !text.template_reads("reasoning_effort") {
            return Err(bad_param(
                "reasoning_effort",
                "this model's chat template does not read reasoning_effort",
            ));
        }
        if !REASONING_EFFORTS.contains(&e.as_str()) {
            return Err(bad_param(
                "reasoning_effort",
                format!("reasoning_effort '{e}' is not one of {REASONING_EFFORTS:?}"),
            ));
        }
        vars.insert("reasoning_effort".into(), Value::String(e));
    }
    Ok(vars)
}

/// Reads a JSON object body; every failure is a 400 that says what is wrong.
fn body_object(body: &Bytes) -> Result<Map<String, Value>, Response> {
    if body.is_empty() {
        return Err(bad_request("the request body is empty; send a JSON object"));
    }
    match serde_json::from_slice::<Value>(body) {
        Ok(Value::Object(m)) => Ok(m),
        Ok(_) => Err(bad_request("the request body must be a JSON object")),
        Err(e) => Err(bad_request(format!("malformed JSON: {e}"))),
    }
}

/// Reads `T` out of `v`; a field of the wrong type is a 400 naming it.
fn typed<T: DeserializeOwned>(v: &Value) -> Result<T, Response> {
    serde_path_to_error::deserialize::<_, T>(v).map_err(|e| {
        let path = e.path().to_string();
        bad_param(&path, format!("invalid request: {path}: {}", e.inner()))
    })
}

fn check_model(st: &AppState, model: Option<&str>) -> Result<(), Response> {
    if let Some(m) = model {
        if !m.is_empty() && m != st.engine.config.model_name {
            return Err(bad_param(
                "model",
                format!(
                    "unknown model '{m}'; this server serves '{}'",
                    st.engine.config.model_name
                ),
            ));
        }
    }
    Ok(())
}

/// Validates the sampling fields and builds the request parameters of one prompt.
fn params(
    st: &AppState,
    s: &Sampling,
    prompt_len: usize,
    default_max: usize,
    logprobs: Option<usize>,
) -> Result<RequestParams, Response> {
    let max_len = st.engine.config.max_model_len;
    if prompt_len > max_len {
        return Err(bad_param(
            "prompt",
            format!(
                "the prompt has {prompt_len} tokens but the model allows at most {max_len} \
                 (max_model_len)"
            ),
        ));
    }
    let room = max_len - prompt_len;
    let max_tokens = s
        .max_completion_tokens
        .or(s.max_tokens)
        .map(|m| usize::try_from(m).unwrap_or(usize::MAX))
        .unwrap_or(default_max)
        .min(room);
    if max_tokens == 0 {
        return Err(bad_param(
            "max_tokens",
            format!(
                "max_tokens must be at least 1 (the prompt has {prompt_len} tokens of the \
                 {max_len} the model allows)"
            ),
        ));
    }
    let temperature = s.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(bad_param(
            "temperature",
            format!("temperature {temperature} is outside 0..=2"),
        ));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad_param(
            "top_p",
            format!("top_p {top_p} is outside (0, 1]"),
        ));
    }
    let min_p = s.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(bad_param(
            "min_p",
            format!("min_p {min_p} is outside [0, 1]"),
        ));
    }
    let top_k = match s.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => usize::try_from(k).unwrap_or(usize::MAX),
        Some(k) => {
            return Err(bad_param(
                "top_k",
                format!("top_k {k} must be -1, 0 or positive"),
            ))
        }
    };
    for (name, v) in [
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ] {
        if let Some(v) = v {
            if !(-2.0..=2.0).contains(&v) {
                return Err(bad_param(name, format!("{name} {v} is outside -2..=2")));
            }
        }
    }
    let repetition_penalty = s.repetition_penalty.unwrap_or(1.0);
    if !(repetition_penalty > 0.0 && repetition_penalty <= 10.0) {
        return Err(bad_param(
            "repetition_penalty",
            format!("repetition_penalty {repetition_penalty} is outside (0, 10]"),
        ));
    }
    let mut logit_bias = Vec::new();
    let vocab = st.engine.vocab_size;
    for (k, &b) in s.logit_bias.iter().flatten() {
        let id = k
            .trim()
            .parse::<u32>()
            .ok()
            .filter(|&id| (id as usize) < vocab);
        let Some(id) = id else {
            return Err(bad_param(
                "logit_bias",
                format!("logit_bias key '{k}' is not a token id of this model (0..{vocab})"),
            ));
        };
        if !(-100.0..=100.0).contains(&b) {
            return Err(bad_param(
                "logit_bias",
                format!("logit_bias[{k}] = {b} is outside -100..=100"),
            ));
        }
        logit_bias.push((id, b));
    }
    logit_bias.sort_by_key(|&(id, _)| id);
    let stop_strings = match &s.stop {
        None => Vec::new(),
        Some(StopField::One(x)) => vec![x.clone()],
        Some(StopField::Many(v)) => v.clone(),
    };
    let mut sampler = SamplerConfig::greedy();
    sampler.temperature = temperature;
    sampler.top_k = top_k;
    sampler.top_p = top_p;
    sampler.min_p = min_p;
    sampler.presence_penalty = s.presence_penalty.unwrap_or(0.0);
    sampler.frequency_penalty = s.frequency_penalty.unwrap_or(0.0);
    sampler.repetition_penalty = repetition_penalty;
    sampler.logit_bias = logit_bias;
    sampler.logprobs = logprobs;
    sampler.seed = match s.seed {
        Some(x) => x as u64,
        None => SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    };
    let eog_ids = if s.ignore_eos.unwrap_or(false) {
        Vec::new()
    } else {
        st.text.eog_ids()
    };
    Ok(RequestParams {
        sampler,
        max_tokens,
        stop: StopConditions {
            eog_ids,
            stop_strings,
        },
    })
}

/// The top log-probabilities asked for, checked against [`MAX_TOP_LOGPROBS`].
fn top_count(field: &str, v: u32) -> Result<usize, Response> {
    if v > MAX_TOP_LOGPROBS {
        return Err(bad_param(
            field,
            format!("{field} {v} is outside 0..={MAX_TOP_LOGPROBS}"),
        ));
    }
    Ok(v as usize)
}

fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

/// A chat choice's `finish_reason`: `tool_calls` when it called a tool and was not cut
/// off.
fn chat_finish(f: FinishReason, called: bool) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::Stop if called => "tool_calls",
        f => finish_str(f),
    }
}

/// `usage`; `cached`: prompt tokens found in the prefix cache.
fn usage(prompt: usize, cached: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion,
           "prompt_tokens_details": {"cached_tokens": cached}})
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Completion,
    Chat,
}

/// Runs `f` (tokenizing a prompt, rendering a chat template: up to a second for a large
/// request or a template that runs out of fuel) on tokio's blocking pool, so that the
/// async workers keep serving the other requests meanwhile.
async fn off_the_runtime<T: Send + 'static>(
    f: impl FnOnce() -> Result<T, String> + Send + 'static,
) -> Result<T, String> {
    tokio::task::spawn_blocking(f)
        .await
        .unwrap_or_else(|e| Err(format!("the tokenizer task failed: {e}")))
}

/// Checks that every id of `tokens` is in the vocabulary.
fn check_ids(st: &AppState, field: &str, tokens: &[u32]) -> Result<(), Response> {
    let vocab = st.engine.vocab_size;
    match tokens.iter().position(|&t| t as usize >= vocab) {
        Some(i) => Err(bad_param(
            field,
            format!(
                "{field}: token id {} (at {i}) is outside the vocabulary (0..{vocab})",
                tokens[i]
            ),
        )),
        None => Ok(()),
    }
}

async fn completions(State(st): State<AppState>, body: Bytes) -> Response {
    let obj = match body_object(&body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if let Err(e) = check_fields(
        &obj,
        &[COMMON, &["prompt", "response_format"], NO_EFFECT],
        COMPLETION_UNSUPPORTED,
        "",
    ) {
        return e;
    }
    let v = Value::Object(obj);
    let (sampling, fields) = match (typed::<Sampling>(&v), typed::<CompletionFields>(&v)) {
        (Ok(s), Ok(f)) => (s, f),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    if let Err(e) = check_model(&st, sampling.model.as_deref()) {
        return e;
    }
    let logprobs = match fields
        .logprobs
        .map(|n| top_count("logprobs", n))
        .transpose()
    {
        Ok(l) => l,
        Err(e) => return e,
    };
    let prompts: Vec<Vec<u32>> = match fields.prompt {
        PromptField::Tokens(t) => vec![t],
        PromptField::TokenLists(l) => l,
        PromptField::Text(p) => {
            let text = Arc::clone(&st.text);
            match off_the_runtime(move || text.encode_prompt(&p)).await {
                Ok(t) => vec![t],
                Err(e) => {
                    return bad_param("prompt", format!("could not tokenize the prompt: {e}"))
                }
            }
        }
        PromptField::Texts(ps) => {
            let text = Arc::clone(&st.text);
            let r = off_the_runtime(move || {
                ps.iter()
                    .enumerate()
                    .map(|(i, p)| {
                        text.encode_prompt(p)
                            .map_err(|e| format!("prompt[{i}]: {e}"))
                    })
                    .collect::<Result<Vec<_>, _>>()
            })
            .await;
            match r {
                Ok(t) => t,
                Err(e) => {
                    return bad_param("prompt", format!("could not tokenize the prompt: {e}"))
                }
            }
        }
    };
    if prompts.is_empty() || prompts.iter().any(|p| p.is_empty()) {
        return bad_param(
            "prompt",
            "prompt must hold at least one token in each prompt",
        );
    }
    for p in &prompts {
        if let Err(e) = check_ids(&st, "prompt", p) {
            return e;
        }
    }
    let constraint = match response_constraint(&st, fields.response_format, false).await {
        Ok(c) => c,
        Err(e) => return e,
    };
    let opts = RunOpts {
        logprobs,
        parse: None,
        constraint,
    };
    run(st, prompts, &sampling, Kind::Completion, 16, opts).await
}

/// The chat messages of a request, their content parts joined.
fn chat_messages(msgs: Vec<MessageIn>) -> Result<Vec<ChatMessage>, Response> {
    if msgs.is_empty() {
        return Err(bad_param(
            "messages",
            "messages must hold at least one message",
        ));
    }
    let mut messages = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.into_iter().enumerate() {
        let content = match m.content {
            None => String::new(),
            Some(ContentField::Text(t)) => t,
            Some(ContentField::Parts(parts)) => {
                let mut s = String::new();
                for (j, p) in parts.into_iter().enumerate() {
                    if p.kind != "text" {
                        return Err(bad_param(
                            &format!("messages[{i}].content[{j}].type"),
                            format!(
                                "messages[{i}]: content part of type '{}' is not supported",
                                p.kind
                            ),
                        ));
                    }
                    s.push_str(p.text.as_deref().unwrap_or(""));
                }
                s
            }
        };
        messages.push(ChatMessage {
            role: m.role,
            content,
            tool_calls: m.tool_calls,
            tool_call_id: m.tool_call_id,
            name: m.name,
            reasoning_content: m.reasoning_content,
        });
    }
    Ok(messages)
}

async fn chat_completions(State(st): State<AppState>, body: Bytes) -> Response {
    let obj = match body_object(&body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if let Err(e) = check_fields(
        &obj,
        &[
            COMMON,
            &[
                "messages",
                "top_logprobs",
                "tools",
                "tool_choice",
                "response_format",
                "reasoning_effort",
                "chat_template_kwargs",
            ],
            NO_EFFECT,
        ],
        CHAT_UNSUPPORTED,
        "",
    )
    .and_then(|()| check_messages(&obj))
    {
        return e;
    }
    let v = Value::Object(obj);
    let (sampling, mut fields) = match (typed::<Sampling>(&v), typed::<ChatFields>(&v)) {
        (Ok(s), Ok(f)) => (s, f),
        (Err(e), _) | (_, Err(e)) => return e,
    };
    let vars = match template_vars(&*st.text, &mut fields) {
        Ok(v) => v,
        Err(e) => return e,
    };
    if let Err(e) = check_model(&st, sampling.model.as_deref()) {
        return e;
    }
    let logprobs = match (fields.logprobs.unwrap_or(false), fields.top_logprobs) {
        (false, None) => None,
        (false, Some(_)) => {
            return bad_param("top_logprobs", "top_logprobs needs \"logprobs\": true")
        }
        (true, top) => match top_count("top_logprobs", top.unwrap_or(0)) {
            Ok(n) => Some(n),
            Err(e) => return e,
        },
    };
    let messages = match chat_messages(fields.messages) {
        Ok(m) => m,
        Err(e) => return e,
    };
    let tools = match offered_tools(&st, fields.tools, fields.tool_choice.as_ref()) {
        Ok(t) => t,
        Err(e) => return e,
    };
    let forced = tools.as_ref().and_then(|t| t.forced.clone());
    let has_format = fields
        .response_format
        .as_ref()
        .is_some_and(|f| !f.is_null() && f.get("type") != Some(&json!("text")));
    if forced.is_some() && has_format {
        return bad_param(
            "response_format",
            "response_format cannot go with a tool_choice that forces a call (the answer is \
             the call)",
        );
    }
    let harmony = st.text.chat_syntax().harmony;
    let mut constraint = match response_constraint(&st, fields.response_format, harmony).await {
        Ok(c) => c,
        Err(e) => return e,
    };
    let text = Arc::clone(&st.text);
    let rendered = tools.as_ref().map(|t| Arc::clone(&t.tools));
    let prompt = match off_the_runtime(move || {
        text.encode_chat(&messages, rendered.as_deref().map(Vec::as_slice), &vars)
    })
    .await
    {
        Ok(t) => t,
        Err(e) => {
            return bad_param(
                "messages",
                format!("could not apply the chat template: {e}"),
            )
        }
    };
    if let (Some(forced), Some(offered)) = (forced, tools.as_ref()) {
        match forced_constraint(&st, offered, forced, prompt.opens_reasoning).await {
            Ok(c) => constraint = Some(c),
            Err(e) => return e,
        }
    }
    let syntax = st.text.chat_syntax();
    let parse = ParseSpec {
        tools: tools.map(|t| (t.syntax, t.tools)),
        reasoning: syntax.reasoning,
        in_reasoning: prompt.opens_reasoning,
        harmony: syntax.harmony,
    };
    let default_max = st.engine.config.max_model_len;
    let opts = RunOpts {
        logprobs,
        parse: Some(parse),
        constraint,
    };
    run(
        st,
        vec![prompt.tokens],
        &sampling,
        Kind::Chat,
        default_max,
        opts,
    )
    .await
}

/// The function tools a chat request offers the model, checked, and the call
/// `tool_choice` forces (`"required"`, or a named function that must be among them);
/// `None` when it offers none or `tool_choice` is `"none"`. Each must be `{"type":
/// "function", "function": {"name": ..}}`, and the model's template must render them
/// in a syntax the output parser reads.
fn offered_tools(
    st: &AppState,
    tools: Option<Vec<Value>>,
    choice: Option<&Value>,
) -> Result<Option<Offered>, Response> {
    let tools = tools.unwrap_or_default();
    for (i, t) in tools.iter().enumerate() {
        let name = t.pointer("/function/name").and_then(Value::as_str);
        if t.get("type").and_then(Value::as_str) != Some("function")
            || name.is_none_or(str::is_empty)
        {
            let at = format!("tools[{i}]");
            return Err(bad_param(
                &at,
                format!("{at} must be {{\"type\": \"function\", \"function\": {{\"name\": ...}}}}"),
            ));
        }
    }
    let forced = match choice {
        None | Some(Value::Null) => None,
        Some(Value::String(c)) if c == "auto" => None,
        Some(Value::String(c)) if c == "none" => return Ok(None),
        Some(Value::String(c)) if c == "required" => Some(ForcedCall::Any),
        Some(c) => match (
            c.get("type").and_then(Value::as_str),
            c.pointer("/function/name").and_then(Value::as_str),
        ) {
            (Some("function"), Some(name)) => {
                if !tools
                    .iter()
                    .any(|t| t.pointer("/function/name") == Some(&json!(name)))
                {
                    return Err(bad_param(
                        "tool_choice",
                        format!(
                            "tool_choice: the function '{name}' is not among the offered tools"
                        ),
                    ));
                }
                Some(ForcedCall::Named(name.to_string()))
            }
            _ => {
                return Err(bad_param(
                    "tool_choice",
                    "tool_choice must be \"auto\", \"none\", \"required\" or {\"type\": \
                     \"function\", \"function\": {\"name\": ...}}",
                ))
            }
        },
    };
    if tools.is_empty() {
        return match forced {
            Some(_) => Err(bad_param(
                "tool_choice",
                "tool_choice forces a call, but no tools are offered",
            )),
            None => Ok(None),
        };
    }
    match st.text.chat_syntax().tools {
        Some(syntax) => Ok(Some(Offered {
            syntax,
            tools: Arc::new(tools),
            forced,
        })),
        None => Err(bad_param(
            "tools",
            "tools: the model's chat template does not render tools in a syntax this server \
             parses (Hermes/Qwen <tool_call>, Qwen 3.5 / Qwen3-Coder XML, Llama 3 JSON, GLM, \
             Gemma 4, gpt-oss harmony)",
        )),
    }
}

/// The tools a chat request offers, and the call it forces.
struct Offered {
    syntax: ToolSyntax,
    tools: Arc<Vec<Value>>,
    forced: Option<ForcedCall>,
}

/// The grammar of a forced call (`tool_choice`), compiled on the blocking pool.
async fn forced_constraint(
    st: &AppState,
    offered: &Offered,
    forced: ForcedCall,
    in_reasoning: bool,
) -> Result<Constraint, Response> {
    let text = Arc::clone(&st.text);
    let (syntax, tools) = (offered.syntax, Arc::clone(&offered.tools));
    let reasoning = st.text.chat_syntax().reasoning;
    off_the_runtime(move || {
        let grammar = forced_call_grammar(syntax, &tools, &forced, reasoning, in_reasoning)?;
        let vocab = text.grammar_vocab()?;
        vocab.lark(&grammar).map_err(|e| e.to_string())
    })
    .await
    .map_err(|e| bad_param("tool_choice", format!("tool_choice: {e}")))
}

/// The tools offered to the model and the syntax of its calls.
type OfferedTools = (ToolSyntax, Arc<Vec<Value>>);

/// How a chat answer is split into content, reasoning and tool calls.
#[derive(Clone)]
struct ParseSpec {
    /// The offered tools and the syntax of their calls.
    tools: Option<OfferedTools>,
    /// The markers of the model's reasoning, when it writes any.
    reasoning: Option<Think>,
    /// The prompt opened the reasoning.
    in_reasoning: bool,
    /// The model answers in harmony's channels (gpt-oss).
    harmony: bool,
}

impl ParseSpec {
    /// A parser for one choice; `None` when it would change nothing.
    fn parser(&self) -> Option<OutputParser> {
        if self.harmony {
            return Some(OutputParser::harmony(
                self.tools.as_ref().map(|(_, t)| t.as_slice()),
            ));
        }
        let tools = self.tools.as_ref().map(|(s, t)| (*s, t.as_slice()));
        let p = OutputParser::new(tools, self.reasoning, self.in_reasoning);
        (!p.is_passthrough()).then_some(p)
    }
}

/// What a generation request asks for beyond the sampling fields.
struct RunOpts {
    /// Top log-probabilities per token, when asked for.
    logprobs: Option<usize>,
    /// Chat: how answers are parsed.
    parse: Option<ParseSpec>,
    /// The grammar of `response_format`, or of a call `tool_choice` forces.
    constraint: Option<Constraint>,
}

/// The grammar a request's `response_format` asks for, compiled (on the blocking pool:
/// the first one indexes the vocabulary); `None` for plain text. A `harmony` answer
/// writes the value on its final channel ([`harmony::final_grammar`]).
async fn response_constraint(
    st: &AppState,
    format: Option<Value>,
    harmony: bool,
) -> Result<Option<Constraint>, Response> {
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(None);
    };
    let schema = match format.get("type").and_then(Value::as_str) {
        Some("text") => return Ok(None),
        Some("json_object") => json!({"type": "object"}),
        Some("json_schema") => match format.get("json_schema") {
            // OpenAI's `json_schema` holds `name`, `description`, `strict` and the
            // `schema`; without one any JSON value goes.
            Some(Value::Object(j)) => j.get("schema").cloned().unwrap_or(json!({})),
            _ => {
                return Err(bad_param(
                    "response_format.json_schema",
                    "response_format.json_schema must be an object holding the \"schema\"",
                ))
            }
        },
        other => {
            return Err(bad_param(
                "response_format.type",
                format!(
                    "response_format.type {} is not one of \"text\", \"json_object\", \
                     \"json_schema\"",
                    other.map_or("(missing)".to_string(), |t| format!("'{t}'"))
                ),
            ))
        }
    };
    let text = Arc::clone(&st.text);
    off_the_runtime(move || {
        let vocab = text.grammar_vocab()?;
        if harmony {
            let grammar = harmony::final_grammar(&schema)?;
            return vocab.lark(&grammar).map_err(|e| e.to_string());
        }
        vocab.json_schema(&schema).map_err(|e| e.to_string())
    })
    .await
    .map(Some)
    .map_err(|e| bad_param("response_format", format!("response_format: {e}")))
}

/// One choice of a response: a (prompt, sample) pair.
struct Job {
    /// The choice's index: prompt index × n + sample index.
    index: usize,
    rx: mpsc::UnboundedReceiver<Event>,
}

async fn run(
    st: AppState,
    prompts: Vec<Vec<u32>>,
    s: &Sampling,
    kind: Kind,
    default_max: usize,
    opts: RunOpts,
) -> Response {
    let n = s.n.unwrap_or(1);
    if !(1..=MAX_N).contains(&n) {
        return bad_param("n", format!("n {n} is outside 1..={MAX_N}"));
    }
    let n = n as usize;
    let prompt_tokens: usize = prompts.iter().map(Vec::len).sum();
    let mut planned = Vec::with_capacity(prompts.len() * n);
    for (p, tokens) in prompts.into_iter().enumerate() {
        let mut base = match params(&st, s, tokens.len(), default_max, opts.logprobs) {
            Ok(b) => b,
            Err(e) => return e,
        };
        base.sampler.constraint = opts.constraint.clone();
        for i in 0..n {
            // Independent samples: each its own seed (reproducible when `seed` is set).
            let mut params = base.clone();
            params.sampler.seed = base.sampler.seed.wrapping_add(i as u64);
            planned.push((p * n + i, tokens.clone(), params));
        }
    }
    let mut jobs = Vec::with_capacity(planned.len());
    let mut first_id = None;
    for (index, tokens, params) in planned {
        // A refusal drops the jobs already queued: the engine aborts them.
        match st.engine.submit(tokens, params).await {
            Ok((id, rx)) => {
                first_id.get_or_insert(id);
                jobs.push(Job { index, rx });
            }
            Err(SubmitError::Draining) => return draining(),
            Err(SubmitError::QueueFull(n)) => {
                return unavailable(
                    "queue_full",
                    &format!("the request queue is full ({n} waiting); retry later"),
                    "1",
                )
            }
            Err(SubmitError::Refused(m)) => return bad_request(m),
            Err(SubmitError::EngineGone) => {
                return error(
                    StatusCode::INTERNAL_SERVER_ERROR,
                    "server_error",
                    "the engine thread has stopped",
                )
            }
        }
    }
    let prefix = if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let resp = Resp {
        rid: format!("{prefix}-{}", first_id.unwrap_or(0)),
        model: st.engine.config.model_name.clone(),
        created: now(),
        kind,
        prompt_tokens,
        choices: jobs.len(),
        text: Arc::clone(&st.text),
        parse: opts.parse,
        n,
        call_seed: SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0),
    };
    if s.stream.unwrap_or(false) {
        let include_usage = s
            .stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false);
        stream(jobs, resp, include_usage)
    } else {
        collect(jobs, resp).await
    }
}

/// What every response and chunk of one request shares.
struct Resp {
    rid: String,
    model: String,
    created: u64,
    kind: Kind,
    prompt_tokens: usize,
    choices: usize,
    text: Arc<dyn TextSide>,
    parse: Option<ParseSpec>,
    /// Seeds the tool call ids.
    call_seed: u64,
    /// Samples per prompt.
    n: usize,
}

impl Resp {
    fn object(&self, chunk: bool) -> &'static str {
        match (self.kind, chunk) {
            (Kind::Completion, _) => "text_completion",
            (Kind::Chat, false) => "chat.completion",
            (Kind::Chat, true) => "chat.completion.chunk",
        }
    }

    /// The prompt tokens found in the prefix cache, given each choice's count: the
    /// first sample's of each prompt (`usage.prompt_tokens` counts each prompt once).
    fn cached(&self, per_choice: &[usize]) -> usize {
        per_choice.iter().step_by(self.n.max(1)).sum()
    }

    /// A parser for one chat choice; `None` when the text is all content.
    fn parser(&self) -> Option<OutputParser> {
        self.parse.as_ref().and_then(ParseSpec::parser)
    }

    /// A tool call as OpenAI writes it; its id is unique to the response, the choice and
    /// the call.
    fn call_json(&self, call: &ToolCall, choice: usize, k: usize) -> Value {
        let mut rng = Rng::new(self.call_seed ^ ((choice as u64) << 32) ^ k as u64);
        json!({"id": format!("call_{:016x}", rng.next_u64()), "type": "function",
               "function": {"name": call.name, "arguments": call.arguments}})
    }

    /// A whole chat answer as a message: content, `reasoning_content` and `tool_calls`
    /// split out; true when it called a tool.
    fn message(&self, text: &str, choice: usize) -> (Value, bool) {
        let Some(mut p) = self.parser() else {
            return (json!({"role": "assistant", "content": text}), false);
        };
        let mut pieces = p.push(text);
        pieces.extend(p.finish());
        let (mut content, mut reasoning, mut calls) = (String::new(), None, Vec::new());
        for piece in pieces {
            match piece {
                Piece::Content(c) => content.push_str(&c),
                Piece::Reasoning(r) => reasoning.get_or_insert_with(String::new).push_str(&r),
                Piece::ToolCall(c) => calls.push(self.call_json(&c, choice, calls.len())),
            }
        }
        let called = !calls.is_empty();
        let content = if content.is_empty() && called {
            Value::Null
        } else {
            json!(content)
        };
        let mut m = json!({"role": "assistant", "content": content});
        if let Some(r) = reasoning {
            m["reasoning_content"] = json!(r);
        }
        if called {
            m["tool_calls"] = Value::Array(calls);
        }
        (m, called)
    }

    fn token_text(&self, id: u32) -> (String, Vec<u8>) {
        let bytes = self.text.token_bytes(id);
        (String::from_utf8_lossy(&bytes).into_owned(), bytes)
    }

    /// The `logprobs` of a choice over `lps`; `offset` is the completion text's length
    /// in characters before them (completions' `text_offset`), advanced past them.
    fn logprobs(&self, lps: &[TokenLogprobs], offset: &mut usize) -> Value {
        let lp = |x: f32| x.max(LOGPROB_FLOOR);
        match self.kind {
            Kind::Chat => {
                let content: Vec<Value> = lps
                    .iter()
                    .map(|t| {
                        let (token, bytes) = self.token_text(t.token);
                        let top: Vec<Value> = t
                            .top
                            .iter()
                            .map(|&(id, l)| {
                                let (token, bytes) = self.token_text(id);
                                json!({"token": token, "logprob": lp(l), "bytes": bytes})
                            })
                            .collect();
                        json!({"token": token, "logprob": lp(t.logprob), "bytes": bytes,
                               "top_logprobs": top})
                    })
                    .collect();
                json!({"content": content})
            }
            Kind::Completion => {
                let mut tokens = Vec::new();
                let mut token_logprobs = Vec::new();
                let mut top_logprobs = Vec::new();
                let mut text_offset = Vec::new();
                for t in lps {
                    let (token, _) = self.token_text(t.token);
                    text_offset.push(*offset);
                    *offset += token.chars().count();
                    let mut top = Map::new();
                    for &(id, l) in &t.top {
                        top.insert(self.token_text(id).0, json!(lp(l)));
                    }
                    if !t.top.is_empty() {
                        // vLLM's convention: the drawn token is always among them.
                        top.entry(token.clone()).or_insert(json!(lp(t.logprob)));
                    }
                    tokens.push(token);
                    token_logprobs.push(lp(t.logprob));
                    top_logprobs.push(Value::Object(top));
                }
                json!({"tokens": tokens, "token_logprobs": token_logprobs,
                       "top_logprobs": top_logprobs, "text_offset": text_offset})
            }
        }
    }
}

/// The events of every job, each tagged with its choice index, as they come.
fn merged(jobs: Vec<Job>) -> stream::SelectAll<BoxStream<'static, (usize, Event)>> {
    stream::select_all(jobs.into_iter().map(|j| {
        let index = j.index;
        stream::unfold(j.rx, move |mut rx| async move {
            rx.recv().await.map(|e| ((index, e), rx))
        })
        .boxed()
    }))
}

#[derive(Default)]
struct Choice {
    text: String,
    finish: Option<FinishReason>,
    completion: usize,
    logprobs: Option<Vec<TokenLogprobs>>,
}

async fn collect(jobs: Vec<Job>, resp: Resp) -> Response {
    let mut choices: Vec<Choice> = (0..resp.choices).map(|_| Choice::default()).collect();
    let mut cached = vec![0; resp.choices];
    let mut events = merged(jobs);
    while let Some((i, ev)) = events.next().await {
        match ev {
            Event::Output(o) => {
                let Some(c) = choices.get_mut(i) else {
                    continue;
                };
                c.text.push_str(&o.text);
                c.completion = o.completion_tokens;
                if let Some(k) = cached.get_mut(i) {
                    *k = o.cached_tokens;
                }
                if let Some(lp) = o.logprobs {
                    c.logprobs.get_or_insert_with(Vec::new).push(lp);
                }
                if let Some(f) = o.finished {
                    c.finish = Some(f);
                }
            }
            Event::Failed(m) => return error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m),
        }
    }
    let completion: usize = choices.iter().map(|c| c.completion).sum();
    let out: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(i, c)| {
            let logprobs = match &c.logprobs {
                Some(l) => resp.logprobs(l, &mut 0),
                None => Value::Null,
            };
            let finish = c.finish.unwrap_or(FinishReason::Length);
            match resp.kind {
                Kind::Completion => json!({"index": i, "text": c.text, "logprobs": logprobs,
                                           "finish_reason": finish_str(finish)}),
                Kind::Chat => {
                    let (message, called) = resp.message(&c.text, i);
                    json!({"index": i, "message": message, "logprobs": logprobs,
                           "finish_reason": chat_finish(finish, called)})
                }
            }
        })
        .collect();
    Json(json!({
        "id": resp.rid, "object": resp.object(false), "created": resp.created,
        "model": resp.model, "choices": out,
        "usage": usage(resp.prompt_tokens, resp.cached(&cached), completion),
    }))
    .into_response()
}

fn stream(jobs: Vec<Job>, resp: Resp, include_usage: bool) -> Response {
    struct St {
        events: stream::SelectAll<BoxStream<'static, (usize, Event)>>,
        resp: Resp,
        /// Per choice: tokens so far, characters so far, finished.
        completion: Vec<usize>,
        offset: Vec<usize>,
        /// Per chat choice: its parser (when it splits the text) and its calls so far.
        parsers: Vec<Option<OutputParser>>,
        calls: Vec<usize>,
        /// Per choice: prompt tokens found in the prefix cache.
        cached: Vec<usize>,
        finished: usize,
        done: bool,
        pending: std::collections::VecDeque<SseEvent>,
    }
    impl St {
        fn chunk(&self, choices: Value, usage_v: Option<Value>) -> SseEvent {
            let mut v = json!({"id": self.resp.rid, "object": self.resp.object(true),
                               "created": self.resp.created, "model": self.resp.model,
                               "choices": choices});
            if let Some(u) = usage_v {
                v["usage"] = u;
            }
            SseEvent::default().data(v.to_string())
        }

        /// Queues the chunks of one chat output of choice `i`: one per parsed piece
        /// (content, reasoning, a tool call), the log-probabilities on the first and
        /// the finish reason on the last.
        fn chat_deltas(&mut self, i: usize, o: &RequestOutput, logprobs: Value) {
            let mut deltas = Vec::new();
            match self.parsers.get_mut(i).and_then(Option::as_mut) {
                None => {
                    if !o.text.is_empty() {
                        deltas.push(json!({"content": o.text}));
                    }
                }
                Some(p) => {
                    let mut pieces = p.push(&o.text);
                    if o.finished.is_some() {
                        pieces.extend(p.finish());
                    }
                    for piece in pieces {
                        deltas.push(match piece {
                            Piece::Content(c) => json!({"content": c}),
                            Piece::Reasoning(r) => json!({"reasoning_content": r}),
                            Piece::ToolCall(c) => {
                                let k = self.calls.get(i).copied().unwrap_or(0);
                                if let Some(n) = self.calls.get_mut(i) {
                                    *n += 1;
                                }
                                let mut call = self.resp.call_json(&c, i, k);
                                call["index"] = json!(k);
                                json!({"tool_calls": [call]})
                            }
                        });
                    }
                }
            }
            let called = self.calls.get(i).is_some_and(|&n| n > 0);
            let finish = o.finished.map(|f| chat_finish(f, called));
            if deltas.is_empty() && (finish.is_some() || !logprobs.is_null()) {
                deltas.push(json!({}));
            }
            let last = deltas.len();
            let mut logprobs = Some(logprobs);
            for (j, delta) in deltas.into_iter().enumerate() {
                let lp = logprobs.take().unwrap_or(Value::Null);
                let f = if j + 1 == last { finish } else { None };
                let c = self.chunk(
                    json!([{"index": i, "delta": delta, "logprobs": lp, "finish_reason": f}]),
                    None,
                );
                self.pending.push_back(c);
            }
        }
    }
    let n = resp.choices;
    let mut st = St {
        events: merged(jobs),
        completion: vec![0; n],
        offset: vec![0; n],
        parsers: (0..n).map(|_| resp.parser()).collect(),
        calls: vec![0; n],
        cached: vec![0; n],
        finished: 0,
        done: false,
        pending: Default::default(),
        resp,
    };
    if st.resp.kind == Kind::Chat {
        for i in 0..n {
            let c = st.chunk(
                json!([{"index": i, "delta": {"role": "assistant", "content": ""},
                        "logprobs": null, "finish_reason": null}]),
                None,
            );
            st.pending.push_back(c);
        }
    }
    let events = futures_util::stream::unfold(st, move |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                return Some((Ok::<_, Infallible>(e), st));
            }
            if st.done {
                return None;
            }
            match st.events.next().await {
                Some((i, Event::Output(o))) => {
                    if let Some(c) = st.completion.get_mut(i) {
                        *c = o.completion_tokens;
                    }
                    if let Some(k) = st.cached.get_mut(i) {
                        *k = o.cached_tokens;
                    }
                    let logprobs = match (&o.logprobs, st.offset.get_mut(i)) {
                        (Some(lp), Some(off)) => st.resp.logprobs(std::slice::from_ref(lp), off),
                        _ => Value::Null,
                    };
                    if st.resp.kind == Kind::Completion {
                        let finish = o.finished.map(finish_str);
                        if !o.text.is_empty() || finish.is_some() || !logprobs.is_null() {
                            let c = st.chunk(
                                json!([{"index": i, "text": o.text, "logprobs": logprobs,
                                        "finish_reason": finish}]),
                                None,
                            );
                            st.pending.push_back(c);
                        }
                    } else {
                        st.chat_deltas(i, &o, logprobs);
                    }
                    if o.finished.is_some() {
                        st.finished += 1;
                    }
                    if st.finished == n {
                        if include_usage {
                            let total = st.completion.iter().sum();
                            let cached = st.resp.cached(&st.cached);
                            let u = usage(st.resp.prompt_tokens, cached, total);
                            let c = st.chunk(json!([]), Some(u));
                            st.pending.push_back(c);
                        }
                        st.pending.push_back(SseEvent::default().data("[DONE]"));
                        st.done = true;
                    }
                }
                Some((_, Event::Failed(m))) => {
                    st.pending.push_back(SseEvent::default().data(
                        json!({"error": {"message": m, "type": "server_error"}}).to_string(),
                    ));
                    st.pending.push_back(SseEvent::default().data("[DONE]"));
                    st.done = true;
                }
                None => {
                    st.pending.push_back(SseEvent::default().data("[DONE]"));
                    st.done = true;
                }
            }
        }
    });
    Sse::new(events)
        .keep_alive(KeepAlive::default())
        .into_response()
}

// ---------------------------------------------------------------------------------
// /tokenize and /detokenize (vLLM's shapes).

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<MessageIn>>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    return_token_strs: Option<bool>,
    tools: Option<Vec<Value>>,
}

async fn tokenize(State(st): State<AppState>, body: Bytes) -> Response {
    let obj = match body_object(&body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if let Err(e) = check_fields(
        &obj,
        &[&[
            "model",
            "prompt",
            "messages",
            "add_special_tokens",
            "add_generation_prompt",
            "return_token_strs",
            "tools",
        ]],
        &[],
        "",
    )
    .and_then(|()| check_messages(&obj))
    {
        return e;
    }
    let req: TokenizeRequest = match typed(&Value::Object(obj)) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Err(e) = check_model(&st, req.model.as_deref()) {
        return e;
    }
    let text = Arc::clone(&st.text);
    let tokens = match (req.prompt, req.messages) {
        (Some(_), None) if req.tools.is_some() => Err(bad_param(
            "tools",
            "tools go with messages, not with a prompt",
        )),
        (Some(p), None) => {
            if req.add_special_tokens == Some(false) {
                return bad_param(
                    "add_special_tokens",
                    "add_special_tokens: false is not supported for a prompt (BOS is added \
                     as the model wants it)",
                );
            }
            if req.add_generation_prompt.is_some() {
                return bad_param(
                    "add_generation_prompt",
                    "add_generation_prompt goes with messages, not with a prompt",
                );
            }
            off_the_runtime(move || text.encode_prompt(&p))
                .await
                .map_err(|e| bad_param("prompt", format!("could not tokenize the prompt: {e}")))
        }
        (None, Some(m)) => {
            if req.add_special_tokens == Some(true) {
                return bad_param(
                    "add_special_tokens",
                    "add_special_tokens: true is not supported for messages (the chat \
                     template writes the special tokens)",
                );
            }
            if req.add_generation_prompt == Some(false) {
                return bad_param(
                    "add_generation_prompt",
                    "add_generation_prompt: false is not supported (the template is rendered \
                     ready for generation)",
                );
            }
            let messages = match chat_messages(m) {
                Ok(m) => m,
                Err(e) => return e,
            };
            let tools = req.tools;
            off_the_runtime(move || {
                text.encode_chat(&messages, tools.as_deref(), &TemplateVars::new())
                    .map(|p| p.tokens)
            })
            .await
            .map_err(|e| {
                bad_param(
                    "messages",
                    format!("could not apply the chat template: {e}"),
                )
            })
        }
        _ => Err(bad_request(
            "send exactly one of \"prompt\" and \"messages\"",
        )),
    };
    let tokens = match tokens {
        Ok(t) => t,
        Err(e) => return e,
    };
    let mut out = json!({"count": tokens.len(),
                         "max_model_len": st.engine.config.max_model_len,
                         "tokens": tokens});
    if req.return_token_strs.unwrap_or(false) {
        let strs: Vec<String> = tokens
            .iter()
            .map(|&t| String::from_utf8_lossy(&st.text.token_bytes(t)).into_owned())
            .collect();
        out["token_strs"] = json!(strs);
    }
    Json(out).into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

async fn detokenize(State(st): State<AppState>, body: Bytes) -> Response {
    let obj = match body_object(&body) {
        Ok(o) => o,
        Err(e) => return e,
    };
    if let Err(e) = check_fields(&obj, &[&["model", "tokens"]], &[], "") {
        return e;
    }
    let req: DetokenizeRequest = match typed(&Value::Object(obj)) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if let Err(e) = check_model(&st, req.model.as_deref()) {
        return e;
    }
    if let Err(e) = check_ids(&st, "tokens", &req.tokens) {
        return e;
    }
    let bytes: Vec<u8> = req
        .tokens
        .iter()
        .flat_map(|&t| st.text.token_bytes(t))
        .collect();
    Json(json!({"prompt": String::from_utf8_lossy(&bytes)})).into_response()
}
