//! The OpenAI-compatible routes.

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::sse::{Event as SseEvent, KeepAlive, Sse};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::Deserialize;
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{EngineHandle, Event, SubmitError};
use crate::sample::{FinishReason, SamplerConfig, StopConditions};
use crate::sched::RequestParams;

/// One chat message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ChatMessage {
    /// `system`, `user`, `assistant`, ...
    pub role: String,
    /// The text.
    pub content: String,
}

/// The text side of a served model: tokenizer and chat template.
pub trait TextSide: Send + Sync {
    /// Tokenizes a completion prompt (BOS as the model wants it).
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Renders chat messages with the model's template, ready for generation, and
    /// tokenizes the result.
    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, String>;
    /// Token ids that end generation.
    fn eog_ids(&self) -> Vec<u32>;
}

#[derive(Clone)]
struct AppState {
    engine: EngineHandle,
    text: Arc<dyn TextSide>,
}

/// The router with every route, over a running engine thread.
pub fn router(engine: EngineHandle, text: Arc<dyn TextSide>) -> Router {
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .route("/v1/models", get(models))
        .route("/v1/completions", post(completions))
        .route("/v1/chat/completions", post(chat_completions))
        .with_state(AppState { engine, text })
}

async fn health() -> impl IntoResponse {
    Json(json!({"status": "ok"}))
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
fn error(status: StatusCode, kind: &str, message: impl Into<String>) -> Response {
    let message = message.into();
    (
        status,
        Json(json!({"error": {"message": message, "type": kind, "param": null, "code": null}})),
    )
        .into_response()
}

fn bad_request(message: impl Into<String>) -> Response {
    error(StatusCode::BAD_REQUEST, "invalid_request_error", message)
}

/// `stop` is a string or a list of strings.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum StopField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
struct StreamOptions {
    #[serde(default)]
    include_usage: bool,
}

/// The sampling fields shared by both endpoints.
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
    seed: Option<u64>,
    presence_penalty: Option<f32>,
    frequency_penalty: Option<f32>,
    n: Option<u32>,
    #[serde(default)]
    stream: bool,
    stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
#[serde(untagged)]
enum PromptField {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Deserialize)]
struct CompletionRequest {
    prompt: PromptField,
    #[serde(flatten)]
    sampling: Sampling,
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
}

#[derive(Debug, Deserialize)]
struct ChatRequest {
    messages: Vec<MessageIn>,
    #[serde(flatten)]
    sampling: Sampling,
}

// The error side is the HTTP response itself, sent to the client at once; boxing it
// would only add an allocation on the error path.
#[allow(clippy::result_large_err)]
/// Parses a JSON body into `T`, turning every failure into a 400 that says what is wrong.
fn parse<T: for<'de> Deserialize<'de>>(body: &Bytes) -> Result<T, Response> {
    if body.is_empty() {
        return Err(bad_request("the request body is empty; send a JSON object"));
    }
    serde_json::from_slice::<T>(body).map_err(|e| {
        let what = if e.is_syntax() || e.is_eof() {
            "malformed JSON"
        } else {
            "invalid request"
        };
        bad_request(format!("{what}: {e}"))
    })
}

/// Validates the sampling fields and builds the request parameters.
#[allow(clippy::result_large_err)]
fn params(
    st: &AppState,
    s: &Sampling,
    prompt_len: usize,
    default_max: usize,
) -> Result<RequestParams, Response> {
    if let Some(m) = &s.model {
        if !m.is_empty() && *m != st.engine.config.model_name {
            return Err(bad_request(format!(
                "unknown model '{m}'; this server serves '{}'",
                st.engine.config.model_name
            )));
        }
    }
    if s.n.is_some_and(|n| n != 1) {
        return Err(bad_request("only n = 1 is supported"));
    }
    let max_len = st.engine.config.max_model_len;
    if prompt_len > max_len {
        return Err(bad_request(format!(
            "the prompt has {prompt_len} tokens but the model allows at most {max_len} \
             (max_model_len)"
        )));
    }
    let room = max_len - prompt_len;
    let max_tokens = s
        .max_completion_tokens
        .or(s.max_tokens)
        .map(|m| usize::try_from(m).unwrap_or(usize::MAX))
        .unwrap_or(default_max)
        .min(room);
    if max_tokens == 0 {
        return Err(bad_request(format!(
            "max_tokens must be at least 1 (the prompt has {prompt_len} tokens of the \
             {max_len} the model allows)"
        )));
    }
    let temperature = s.temperature.unwrap_or(1.0);
    if !(0.0..=2.0).contains(&temperature) {
        return Err(bad_request(format!(
            "temperature {temperature} is outside 0..=2"
        )));
    }
    let top_p = s.top_p.unwrap_or(1.0);
    if !(top_p > 0.0 && top_p <= 1.0) {
        return Err(bad_request(format!("top_p {top_p} is outside (0, 1]")));
    }
    let min_p = s.min_p.unwrap_or(0.0);
    if !(0.0..=1.0).contains(&min_p) {
        return Err(bad_request(format!("min_p {min_p} is outside [0, 1]")));
    }
    let top_k = match s.top_k {
        None | Some(-1) | Some(0) => 0,
        Some(k) if k > 0 => k as usize,
        Some(k) => return Err(bad_request(format!("top_k {k} must be -1, 0 or positive"))),
    };
    for (name, v) in [
        ("presence_penalty", s.presence_penalty),
        ("frequency_penalty", s.frequency_penalty),
    ] {
        if let Some(v) = v {
            if !(-2.0..=2.0).contains(&v) {
                return Err(bad_request(format!("{name} {v} is outside -2..=2")));
            }
        }
    }
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
    sampler.seed = s.seed.unwrap_or_else(|| {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    });
    Ok(RequestParams {
        sampler,
        max_tokens,
        stop: StopConditions {
            eog_ids: st.text.eog_ids(),
            stop_strings,
        },
    })
}

fn finish_str(f: FinishReason) -> &'static str {
    match f {
        FinishReason::Eos | FinishReason::Stop => "stop",
        FinishReason::Length => "length",
    }
}

fn usage(prompt: usize, completion: usize) -> Value {
    json!({"prompt_tokens": prompt, "completion_tokens": completion,
           "total_tokens": prompt + completion})
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

async fn completions(State(st): State<AppState>, body: Bytes) -> Response {
    let req: CompletionRequest = match parse(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    let prompt = match req.prompt {
        PromptField::One(p) => p,
        PromptField::Many(mut v) if v.len() == 1 => v.remove(0),
        PromptField::Many(_) => {
            return bad_request("prompt must be a string or a list of exactly one string")
        }
    };
    let text = Arc::clone(&st.text);
    let tokens = match off_the_runtime(move || text.encode_prompt(&prompt)).await {
        Ok(t) => t,
        Err(e) => return bad_request(format!("could not tokenize the prompt: {e}")),
    };
    run(st, tokens, &req.sampling, Kind::Completion, 16).await
}

async fn chat_completions(State(st): State<AppState>, body: Bytes) -> Response {
    let req: ChatRequest = match parse(&body) {
        Ok(r) => r,
        Err(e) => return e,
    };
    if req.messages.is_empty() {
        return bad_request("messages must hold at least one message");
    }
    let mut messages = Vec::with_capacity(req.messages.len());
    for (i, m) in req.messages.into_iter().enumerate() {
        let content = match m.content {
            None => String::new(),
            Some(ContentField::Text(t)) => t,
            Some(ContentField::Parts(parts)) => {
                let mut s = String::new();
                for p in parts {
                    if p.kind != "text" {
                        return bad_request(format!(
                            "messages[{i}]: content part of type '{}' is not supported",
                            p.kind
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
        });
    }
    let text = Arc::clone(&st.text);
    let tokens = match off_the_runtime(move || text.encode_chat(&messages)).await {
        Ok(t) => t,
        Err(e) => return bad_request(format!("could not apply the chat template: {e}")),
    };
    let default_max = st.engine.config.max_model_len;
    run(st, tokens, &req.sampling, Kind::Chat, default_max).await
}

async fn run(
    st: AppState,
    tokens: Vec<u32>,
    s: &Sampling,
    kind: Kind,
    default_max: usize,
) -> Response {
    let prompt_tokens = tokens.len();
    let p = match params(&st, s, prompt_tokens, default_max) {
        Ok(p) => p,
        Err(e) => return e,
    };
    let (id, rx) = match st.engine.submit(tokens, p).await {
        Ok(x) => x,
        Err(SubmitError::QueueFull(n)) => {
            return error(
                StatusCode::SERVICE_UNAVAILABLE,
                "server_busy",
                format!("the request queue is full ({n} waiting); retry later"),
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
    };
    let model = st.engine.config.model_name.clone();
    let prefix = if kind == Kind::Chat {
        "chatcmpl"
    } else {
        "cmpl"
    };
    let rid = format!("{prefix}-{id}");
    if s.stream {
        let include_usage = s.stream_options.as_ref().is_some_and(|o| o.include_usage);
        stream(rx, rid, model, kind, include_usage, prompt_tokens)
    } else {
        collect(rx, rid, model, kind, prompt_tokens).await
    }
}

async fn collect(
    mut rx: mpsc::UnboundedReceiver<Event>,
    rid: String,
    model: String,
    kind: Kind,
    prompt_tokens: usize,
) -> Response {
    let mut text = String::new();
    let mut completion = 0;
    let mut finish = FinishReason::Length;
    loop {
        match rx.recv().await {
            Some(Event::Output(o)) => {
                text.push_str(&o.text);
                completion = o.completion_tokens;
                if let Some(f) = o.finished {
                    finish = f;
                    break;
                }
            }
            Some(Event::Failed(m)) => {
                return error(StatusCode::INTERNAL_SERVER_ERROR, "server_error", m)
            }
            None => break,
        }
    }
    let choice = match kind {
        Kind::Completion => json!({"index": 0, "text": text, "logprobs": null,
                                   "finish_reason": finish_str(finish)}),
        Kind::Chat => json!({"index": 0, "message": {"role": "assistant", "content": text},
                             "logprobs": null, "finish_reason": finish_str(finish)}),
    };
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion",
    };
    Json(json!({
        "id": rid, "object": object, "created": now(), "model": model,
        "choices": [choice], "usage": usage(prompt_tokens, completion),
    }))
    .into_response()
}

fn stream(
    rx: mpsc::UnboundedReceiver<Event>,
    rid: String,
    model: String,
    kind: Kind,
    include_usage: bool,
    prompt_tokens: usize,
) -> Response {
    let object = match kind {
        Kind::Completion => "text_completion",
        Kind::Chat => "chat.completion.chunk",
    };
    let created = now();
    let chunk = move |choices: Value, usage_v: Option<Value>| {
        let mut v = json!({"id": rid, "object": object, "created": created, "model": model,
                           "choices": choices});
        if let Some(u) = usage_v {
            v["usage"] = u;
        }
        SseEvent::default().data(v.to_string())
    };
    struct St<F> {
        rx: mpsc::UnboundedReceiver<Event>,
        chunk: F,
        started: bool,
        done: bool,
        pending: std::collections::VecDeque<SseEvent>,
    }
    let st = St {
        rx,
        chunk,
        started: false,
        done: false,
        pending: Default::default(),
    };
    let events = futures_util::stream::unfold(st, move |mut st| async move {
        loop {
            if let Some(e) = st.pending.pop_front() {
                return Some((Ok::<_, Infallible>(e), st));
            }
            if st.done {
                return None;
            }
            if kind == Kind::Chat && !st.started {
                st.started = true;
                let delta = json!([{"index": 0, "delta": {"role": "assistant", "content": ""},
                                    "finish_reason": null}]);
                st.pending.push_back((st.chunk)(delta, None));
                continue;
            }
            match st.rx.recv().await {
                Some(Event::Output(o)) => {
                    let finish = o.finished.map(finish_str);
                    if !o.text.is_empty() || finish.is_some() {
                        let choices = match kind {
                            Kind::Completion => json!([{"index": 0, "text": o.text,
                                                        "logprobs": null, "finish_reason": finish}]),
                            Kind::Chat => {
                                let delta = if o.text.is_empty() {
                                    json!({})
                                } else {
                                    json!({"content": o.text})
                                };
                                json!([{"index": 0, "delta": delta, "logprobs": null,
                                        "finish_reason": finish}])
                            }
                        };
                        st.pending.push_back((st.chunk)(choices, None));
                    }
                    if finish.is_some() {
                        if include_usage {
                            st.pending.push_back((st.chunk)(
                                json!([]),
                                Some(usage(prompt_tokens, o.completion_tokens)),
                            ));
                        }
                        st.pending.push_back(SseEvent::default().data("[DONE]"));
                        st.done = true;
                    }
                }
                Some(Event::Failed(m)) => {
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
