//! Drives a real `flint serve` router on 127.0.0.1 with a real HTTP client, over a small
//! deterministic model (the engine, scheduler, KV cache and HTTP layers are the real
//! ones; only the forward is a stand-in so these tests are fast). The same server over
//! the real default model is exercised in `server_model.rs`.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::kv::{groups_from_pattern, KvCacheManager};
use flint_engine::model::ModelError;
use flint_engine::sched::{Detokenizer, LLMEngine, StepModel, StepSeq};
use flint_engine::sched::{Scheduler, SchedulerConfig};
use flint_engine::serve::{
    self, ApiKey, ChatMessage, ChatPrompt, EngineHandle, ServerConfig, TextSide,
};
use serde_json::{json, Value};

/// Next token = last + 1 (mod 26), one letter per token; 'z' (25) is EOS. Its logits
/// row is `sharpness` at the next letter and 0 elsewhere.
struct Alphabet {
    sharpness: f32,
    /// Steps wait until it is set (a model still loading).
    open: Arc<AtomicBool>,
    /// Every step fails.
    broken: bool,
}

impl StepModel for Alphabet {
    fn vocab_size(&self) -> usize {
        26
    }
    fn step(&mut self, seqs: &[StepSeq<'_>], kv: &KvCacheManager) -> Result<Vec<f32>, ModelError> {
        while !self.open.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(2));
        }
        if self.broken {
            return Err(ModelError::new("the device is on fire"));
        }
        // Slow enough that a client can disconnect mid-stream.
        std::thread::sleep(Duration::from_millis(3));
        let mut out = Vec::new();
        for s in seqs {
            let pos: Vec<u32> = (s.start..s.start + s.tokens.len())
                .map(|p| p as u32)
                .collect();
            for g in 0..kv.num_groups() {
                let _ = kv.slot_mapping(s.id, g, &pos);
            }
            if s.sample {
                let last = *s.tokens.last().ok_or(ModelError::new("empty batch row"))? as usize;
                // Sharp enough that sampling at the API's default temperature (1.0)
                // is deterministic: with 10.0 the other 25 letters kept 0.11% between
                // them, and the 16-client test failed about one run in twelve.
                let mut row = vec![0.0; 26];
                row[(last + 1) % 26] = self.sharpness;
                out.extend(row);
            }
        }
        Ok(out)
    }
}

struct Letters;
impl Detokenizer for Letters {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        vec![b'a' + (id % 26) as u8]
    }
}

struct Text;
impl TextSide for Text {
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        text.bytes()
            .map(|b| match b {
                b'a'..=b'z' => Ok((b - b'a') as u32),
                _ => Err(format!("byte {b} is not a lower-case letter")),
            })
            .collect()
    }
    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        _tools: Option<&[Value]>,
        _vars: &serve::TemplateVars,
    ) -> Result<ChatPrompt, String> {
        let last = messages.last().ok_or("no messages")?;
        Ok(ChatPrompt {
            tokens: self.encode_prompt(&last.content)?,
            opens_reasoning: false,
        })
    }
    fn eog_ids(&self) -> Vec<u32> {
        vec![25]
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        Letters.token_bytes(id)
    }
}

struct Server {
    base: String,
    handle: EngineHandle,
    /// Sending on it starts the drain ([`serve::serve_on`]'s shutdown).
    shutdown: Option<tokio::sync::oneshot::Sender<()>>,
    served: Option<tokio::task::JoinHandle<std::io::Result<()>>>,
    rt: tokio::runtime::Runtime,
}

/// How a test server is set up.
struct Opts {
    max_queue: usize,
    blocks: usize,
    text: Arc<dyn TextSide>,
    sharpness: f32,
    api_key: Option<&'static str>,
    open: Arc<AtomicBool>,
    broken: bool,
    prefix_caching: bool,
}

impl Default for Opts {
    fn default() -> Self {
        Self {
            max_queue: 64,
            blocks: 64,
            text: Arc::new(Text),
            sharpness: 100.0,
            api_key: None,
            open: Arc::new(AtomicBool::new(true)),
            broken: false,
            prefix_caching: true,
        }
    }
}

/// A server whose KV manager caches prefixes or not.
fn start_over(
    max_queue: usize,
    blocks: usize,
    text: Arc<dyn TextSide>,
    prefix_caching: bool,
) -> Server {
    start_opts(Opts {
        max_queue,
        blocks,
        text,
        prefix_caching,
        ..Opts::default()
    })
}

fn start(max_queue: usize, blocks: usize) -> Server {
    start_opts(Opts {
        max_queue,
        blocks,
        ..Opts::default()
    })
}

fn start_with(max_queue: usize, blocks: usize, text: Arc<dyn TextSide>) -> Server {
    start_opts(Opts {
        max_queue,
        blocks,
        text,
        ..Opts::default()
    })
}

/// Starts a server and waits until `/health` says it is ready (when the model can
/// compute at all).
fn start_opts(o: Opts) -> Server {
    let wait = o.open.load(Ordering::Acquire) && !o.broken;
    let s = start_raw(o);
    if wait {
        common::wait_healthy(&s.base, Duration::from_secs(10));
    }
    s
}

fn start_raw(o: Opts) -> Server {
    let (max_queue, blocks, text) = (o.max_queue, o.blocks, o.text);
    let mut kv = KvCacheManager::new(
        groups_from_pattern(&[false, true], Some(8)),
        4,
        &[blocks, blocks],
    );
    kv.set_prefix_caching(o.prefix_caching);
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 32,
            max_num_batched_tokens: 64,
            max_model_len: 100,
        },
        kv,
    );
    let model = Alphabet {
        sharpness: o.sharpness,
        open: o.open,
        broken: o.broken,
    };
    let engine = LLMEngine::new(model, sched, Some(Box::new(Letters)));
    let handle = serve::spawn_engine(
        engine,
        ServerConfig {
            model_name: "alphabet".into(),
            max_model_len: 100,
            max_queue,
            api_key: o.api_key.map(|k| ApiKey(k.into())),
        },
    );
    let app = serve::router(handle.clone(), text);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    let (tx, rx) = tokio::sync::oneshot::channel::<()>();
    let served = rt.spawn(serve::serve_on(listener, app, handle.clone(), async move {
        let _ = rx.await;
    }));
    Server {
        base: format!("http://{addr}"),
        handle,
        shutdown: Some(tx),
        served: Some(served),
        rt,
    }
}

/// A GET with an optional bearer key: the status, the `Retry-After` header and the
/// body (JSON when it parses, else a string).
fn get(s: &Server, path: &str, key: Option<&str>) -> (u16, Option<String>, Value) {
    let mut req = agent().get(&format!("{}{path}", s.base));
    if let Some(k) = key {
        req = req.set("authorization", &format!("Bearer {k}"));
    }
    let resp = match req.call() {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = resp.status();
    let retry = resp.header("retry-after").map(str::to_string);
    let body = resp.into_string().unwrap();
    let v = serde_json::from_str(&body).unwrap_or(Value::String(body));
    (status, retry, v)
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build()
}

fn post(s: &Server, path: &str, body: &str) -> (u16, Value) {
    let r = agent()
        .post(&format!("{}{path}", s.base))
        .set("content-type", "application/json")
        .send_string(body);
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    let status = resp.status();
    let v: Value = resp.into_json().unwrap();
    (status, v)
}

/// Reads an SSE stream to the end: the data payloads, `[DONE]` included.
fn sse(s: &Server, path: &str, body: Value) -> Vec<String> {
    let resp = agent()
        .post(&format!("{}{path}", s.base))
        .send_json(body)
        .unwrap();
    assert_eq!(resp.status(), 200);
    let mut out = Vec::new();
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(d) = line.strip_prefix("data: ") {
            out.push(d.to_string());
            if d == "[DONE]" {
                break;
            }
        }
    }
    out
}

fn metric(s: &Server, name: &str) -> f64 {
    let text = agent()
        .get(&format!("{}/metrics", s.base))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    for line in text.lines() {
        if line.starts_with('#') {
            continue;
        }
        let mut it = line.split_whitespace();
        if it.next() == Some(name) {
            return it.next().unwrap().parse().unwrap();
        }
    }
    panic!("metric {name} not in:\n{text}");
}

#[test]
fn completions_non_streaming() {
    let s = start(64, 64);
    let (st, v) = post(
        &s,
        "/v1/completions",
        r#"{"model":"alphabet","prompt":"abc","max_tokens":5}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "defgh");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 5);
    assert_eq!(v["object"], "text_completion");
    // EOS ('z') stops with finish_reason "stop".
    let (_, v) = post(&s, "/v1/completions", r#"{"prompt":"w","max_tokens":50}"#);
    assert_eq!(v["choices"][0]["text"], "xy");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    // A stop string.
    let (_, v) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":"a","max_tokens":50,"stop":["fg"]}"#,
    );
    assert_eq!(v["choices"][0]["text"], "bcde");
}

#[test]
fn chat_non_streaming_and_models() {
    let s = start(64, 64);
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"mn"}],"max_tokens":3}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["object"], "chat.completion");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert_eq!(v["choices"][0]["message"]["content"], "opq");
    assert_eq!(v["usage"]["total_tokens"], 5);
    let m: Value = agent()
        .get(&format!("{}/v1/models", s.base))
        .call()
        .unwrap()
        .into_json()
        .unwrap();
    assert_eq!(m["data"][0]["id"], "alphabet");
    let h = agent().get(&format!("{}/health", s.base)).call().unwrap();
    assert_eq!(h.status(), 200);
}

#[test]
fn streaming_both_endpoints_with_usage() {
    let s = start(64, 64);
    let ev = sse(
        &s,
        "/v1/completions",
        json!({"prompt":"a","max_tokens":4,"stream":true,"stream_options":{"include_usage":true}}),
    );
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"]
                .get(0)
                .and_then(|x| x["text"].as_str())
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "bcde");
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(usage["completion_tokens"], 4);

    let ev = sse(
        &s,
        "/v1/chat/completions",
        json!({"messages":[{"role":"user","content":"a"}],"max_tokens":3,"stream":true}),
    );
    assert_eq!(ev.last().unwrap(), "[DONE]");
    let chunks: Vec<Value> = ev[..ev.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect();
    assert_eq!(chunks[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = chunks
        .iter()
        .filter_map(|c| {
            c["choices"][0]["delta"]["content"]
                .as_str()
                .map(str::to_string)
        })
        .collect();
    assert_eq!(text, "bcd");
    assert_eq!(
        chunks.last().unwrap()["choices"][0]["finish_reason"],
        "length"
    );
    assert!(chunks
        .iter()
        .all(|c| c["object"] == "chat.completion.chunk"));
}

#[test]
fn sixteen_concurrent_streaming_clients_all_complete() {
    let s = Arc::new(start(64, 256));
    let threads: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let first = (b'a' + (i % 20) as u8) as char;
                let ev = sse(
                    &s,
                    "/v1/completions",
                    json!({"prompt": first.to_string(), "max_tokens": 5, "stream": true}),
                );
                let text: String = ev[..ev.len() - 1]
                    .iter()
                    .map(|d| serde_json::from_str::<Value>(d).unwrap())
                    .filter_map(|c| c["choices"][0]["text"].as_str().map(str::to_string))
                    .collect();
                let expect: String = (1..=5)
                    .map(|k| (b'a' + ((i % 20) as u8 + k) % 26) as char)
                    .collect();
                assert_eq!(text, expect, "client {i}");
            })
        })
        .collect();
    for t in threads {
        t.join().unwrap();
    }
    assert_eq!(metric(&s, "flint_requests_finished_total"), 16.0);
}

#[test]
fn disconnect_mid_stream_frees_the_pool() {
    let s = start(64, 64);
    let resp = agent()
        .post(&format!("{}/v1/completions", s.base))
        .send_json(json!({"prompt": "a", "max_tokens": 90, "stream": true, "stop": ["never"]}))
        .unwrap();
    let mut reader = resp.into_reader();
    let mut buf = [0u8; 64];
    let _ = reader.read(&mut buf).unwrap();
    assert!(
        metric(&s, "flint_kv_blocks_in_use") > 0.0,
        "the request holds blocks"
    );
    drop(reader);
    let t0 = Instant::now();
    while metric(&s, "flint_kv_blocks_in_use") > 0.0 {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "blocks not returned"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(metric(&s, "flint_requests_aborted_total"), 1.0);
}

#[test]
fn bad_input_gets_clear_errors() {
    let s = start(64, 64);
    let cases: Vec<(&str, &str, &str)> = vec![
        ("/v1/completions", "{not json", "malformed JSON"),
        ("/v1/completions", "", "empty"),
        ("/v1/completions", r#"{"prompt": 5}"#, "invalid request"),
        (
            "/v1/completions",
            r#"{"prompt":"a","max_tokens":"ten"}"#,
            "invalid request",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","model":"gpt-9"}"#,
            "unknown model 'gpt-9'",
        ),
        (
            "/v1/completions",
            r#"{"prompt":"a","temperature":-1}"#,
            "temperature",
        ),
        (
            "/v1/chat/completions",
            r#"{"messages":[]}"#,
            "at least one message",
        ),
        ("/v1/completions", r#"{"prompt":"A"}"#, "tokenize"),
    ];
    for (path, body, needle) in cases {
        let (st, v) = post(&s, path, body);
        assert_eq!(st, 400, "{body}: {v}");
        let msg = v["error"]["message"].as_str().unwrap();
        assert!(msg.contains(needle), "{body}: {msg}");
        assert_eq!(v["error"]["type"], "invalid_request_error");
    }
    // A prompt longer than the model allows names both numbers.
    let long = "a".repeat(101);
    let (st, v) = post(&s, "/v1/completions", &json!({"prompt": long}).to_string());
    assert_eq!(st, 400);
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains("101") && msg.contains("100"), "{msg}");
}

#[test]
fn full_queue_is_refused_with_503() {
    // A queue of 0 waiting requests refuses everything at once.
    let s = start(0, 64);
    let (st, v) = post(&s, "/v1/completions", r#"{"prompt":"a"}"#);
    assert_eq!(st, 503, "{v}");
    assert!(v["error"]["message"]
        .as_str()
        .unwrap()
        .contains("queue is full"));
}

/// Chat through a template from a hostile model file: it would loop for ever.
struct HostileTemplate(flint_loader::chat::ChatTemplate);

impl TextSide for HostileTemplate {
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        Text.encode_prompt(text)
    }
    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Value]>,
        vars: &serve::TemplateVars,
    ) -> Result<ChatPrompt, String> {
        let (text, opens_reasoning) = serve::render_chat(&self.0, messages, tools, vars)?;
        Ok(ChatPrompt {
            tokens: Text.encode_prompt(&text)?,
            opens_reasoning,
        })
    }
    fn eog_ids(&self) -> Vec<u32> {
        vec![25]
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        Letters.token_bytes(id)
    }
}

/// A chat template that does not end is stopped (out of fuel) and answered with a 400
/// that says so; the server goes on serving.
#[test]
fn a_chat_template_that_loops_is_a_400() {
    let t = flint_loader::chat::ChatTemplate::new(
        "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "",
        "",
    )
    .expect("compiles");
    let s = start_with(8, 64, Arc::new(HostileTemplate(t)));
    let (status, v) = post(
        &s,
        "/v1/chat/completions",
        r#"{"messages": [{"role": "user", "content": "abc"}], "max_tokens": 3}"#,
    );
    assert_eq!(status, 400, "{v}");
    let msg = v["error"]["message"].as_str().unwrap_or("").to_owned();
    assert!(
        msg.contains("chat template") && msg.contains("instructions"),
        "{msg}"
    );
    let (status, v) = post(
        &s,
        "/v1/completions",
        r#"{"prompt": "abc", "max_tokens": 3}"#,
    );
    assert_eq!(status, 200, "{v}");
}

#[test]
fn prefix_cache_counters_move() {
    for on in [true, false] {
        let s = start_over(64, 64, Arc::new(Text), on);
        // 29 tokens: the second request finds 7 blocks of 4 (28 tokens) in both groups.
        let body = r#"{"prompt":"abcdefghijklmnopqrstuvwxyabcd","max_tokens":2}"#;
        let mut cached = Vec::new();
        for _ in 0..2 {
            let (st, v) = post(&s, "/v1/completions", body);
            assert_eq!(st, 200, "{v}");
            assert_eq!(v["choices"][0]["text"], "ef");
            cached.push(v["usage"]["prompt_tokens_details"]["cached_tokens"].clone());
        }
        // usage.prompt_tokens_details.cached_tokens, streamed too.
        let ev = sse(
            &s,
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "abcdefghijklmnopqrstuvwxyabcd"}],
                   "max_tokens": 2, "stream": true, "stream_options": {"include_usage": true}}),
        );
        let last = chunks(&ev).pop().unwrap();
        cached.push(last["usage"]["prompt_tokens_details"]["cached_tokens"].clone());
        if on {
            assert_eq!(cached, [json!(0), json!(28), json!(28)]);
        } else {
            assert_eq!(cached, [json!(0), json!(0), json!(0)]);
        }
        let queries = metric(&s, "flint_prefix_cache_queries_total");
        let hits = metric(&s, "flint_prefix_cache_hits_total");
        let blocks = metric(&s, "flint_prefix_cache_blocks");
        if on {
            assert_eq!((queries, hits), (87.0, 56.0));
            // 30 tokens computed by the first request: 7 full blocks in each group.
            assert_eq!(blocks, 14.0);
        } else {
            assert_eq!((queries, hits, blocks), (0.0, 0.0, 0.0));
        }
        assert_eq!(metric(&s, "vllm:prefix_cache_queries_total"), queries);
        assert_eq!(metric(&s, "vllm:prefix_cache_hits_total"), hits);
        assert_eq!(
            metric(&s, "flint_kv_blocks_in_use"),
            0.0,
            "cached blocks are free"
        );
    }
}

/// A POST with a bearer key: the status and the JSON body.
fn post_key(s: &Server, path: &str, body: &str, key: Option<&str>) -> (u16, Value) {
    let mut req = agent()
        .post(&format!("{}{path}", s.base))
        .set("content-type", "application/json");
    if let Some(k) = key {
        req = req.set("authorization", &format!("Bearer {k}"));
    }
    let resp = match req.send_string(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    (resp.status(), resp.into_json().unwrap())
}

/// The chunks of an SSE answer, `[DONE]` left out (and required).
fn chunks(ev: &[String]) -> Vec<Value> {
    assert_eq!(ev.last().map(String::as_str), Some("[DONE]"), "{ev:?}");
    ev[..ev.len() - 1]
        .iter()
        .map(|d| serde_json::from_str(d).unwrap())
        .collect()
}

/// Asserts a 400 whose error names `param`.
fn assert_400(s: &Server, path: &str, body: Value, param: &str) {
    let (st, v) = post(s, path, &body.to_string());
    assert_eq!(st, 400, "{body}: {v}");
    assert_eq!(v["error"]["param"], param, "{body}: {v}");
    assert_eq!(v["error"]["type"], "invalid_request_error");
    let msg = v["error"]["message"].as_str().unwrap();
    assert!(msg.contains(param), "{body}: {msg}");
}

#[test]
fn every_field_is_used_harmless_or_refused_by_name() {
    let s = start(64, 64);
    let chat = |extra: Value| {
        let mut b = json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 2});
        for (k, v) in extra.as_object().unwrap() {
            b[k] = v.clone();
        }
        b
    };
    // Fields that change nothing, and unimplemented ones sent with values that ask
    // for nothing.
    for extra in [
        json!({"user": "u1", "metadata": {"k": "v"}, "store": false, "service_tier": "auto"}),
        json!({"tools": [], "tool_choice": "none", "response_format": {"type": "text"}}),
        json!({"parallel_tool_calls": true, "modalities": ["text"], "audio": null}),
        // What vllm-router 0.1.17 adds to every chat request it forwards.
        json!({"logprobs": false, "no_stop_trim": false, "ignore_eos": false,
               "continue_final_message": false, "skip_special_tokens": true,
               "separate_reasoning": true, "stream_reasoning": true,
               "return_hidden_states": false, "include_reasoning": true}),
    ] {
        let (st, v) = post(&s, "/v1/chat/completions", &chat(extra.clone()).to_string());
        assert_eq!(st, 200, "{extra}: {v}");
    }
    let (st, v) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 2, "echo": false, "suffix": null, "best_of": 1,
                "user": "u"})
        .to_string(),
    );
    assert_eq!(st, 200, "{v}");
    // What vllm-router 0.1.17 adds to every completion request it forwards.
    let (st, v) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "a", "max_tokens": 2, "stream": false, "echo": false,
                "no_stop_trim": false, "ignore_eos": false, "skip_special_tokens": true,
                "return_hidden_states": false})
        .to_string(),
    );
    assert_eq!(st, 200, "{v}");
    // Unimplemented fields that ask for something, and unknown fields: 400 naming them.
    let tool = json!([{"type": "function", "function": {"name": "f"}}]);
    for (extra, param) in [
        (
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
        ),
        // This model's template renders no tools.
        (json!({"tools": tool}), "tools"),
        (json!({"tool_choice": "required"}), "tool_choice"),
        (json!({"reasoning_effort": "high"}), "reasoning_effort"),
        (json!({"frobnicate": 1}), "frobnicate"),
        (json!({"echo": true}), "echo"),
        (json!({"max_tokens": "ten"}), "max_tokens"),
        (
            json!({"stream_options": {"include_usage": true, "x": 1}}),
            "stream_options.x",
        ),
        (json!({"n": 0}), "n"),
        (json!({"repetition_penalty": 0}), "repetition_penalty"),
        (json!({"no_stop_trim": true}), "no_stop_trim"),
        (json!({"skip_special_tokens": false}), "skip_special_tokens"),
        (
            json!({"continue_final_message": true}),
            "continue_final_message",
        ),
        (json!({"include_reasoning": false}), "include_reasoning"),
        (
            json!({"return_hidden_states": true}),
            "return_hidden_states",
        ),
    ] {
        assert_400(&s, "/v1/chat/completions", chat(extra), param);
    }
    assert_400(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "a", "refusal": "no"}]}),
        "messages[0].refusal",
    );
    assert_400(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": [{"type": "text", "text": "a", "x": 1}]}]}),
        "messages[0].content[0].x",
    );
    for (body, param) in [
        (json!({"prompt": "a", "suffix": "zz"}), "suffix"),
        (json!({"prompt": "a", "best_of": 3}), "best_of"),
        (
            json!({"prompt": "a", "skip_special_tokens": false}),
            "skip_special_tokens",
        ),
        (
            json!({"prompt": "a", "separate_reasoning": true}),
            "separate_reasoning",
        ),
        (json!({"prompt": "a", "top_logprobs": 2}), "top_logprobs"),
        (json!({"prompt": "a", "messages": []}), "messages"),
        (json!({"prompt": [0, 26]}), "prompt"),
        (json!({"prompt": []}), "prompt"),
    ] {
        assert_400(&s, "/v1/completions", body, param);
    }
    // Nothing of the refused requests is left in the engine.
    assert_eq!(metric(&s, "flint_kv_blocks_in_use"), 0.0);
}

#[test]
fn api_key_guards_everything_but_health() {
    let s = start_opts(Opts {
        api_key: Some("sekret"),
        ..Opts::default()
    });
    assert_eq!(get(&s, "/health", None).0, 200);
    for key in [None, Some("wrong"), Some("sekre"), Some("sekret2")] {
        for path in ["/v1/models", "/metrics"] {
            let (st, _, v) = get(&s, path, key);
            assert_eq!(st, 401, "{path} {key:?}: {v}");
            assert_eq!(v["error"]["code"], "invalid_api_key", "{v}");
            assert!(v["error"]["message"].as_str().unwrap().contains("API key"));
        }
        let (st, v) = post_key(&s, "/v1/completions", r#"{"prompt":"a"}"#, key);
        assert_eq!(st, 401, "{v}");
    }
    // A key in another scheme is no key.
    let r = agent()
        .get(&format!("{}/v1/models", s.base))
        .set("authorization", "Basic sekret")
        .call();
    assert!(matches!(r, Err(ureq::Error::Status(401, _))));
    assert_eq!(get(&s, "/v1/models", Some("sekret")).0, 200);
    let (st, v) = post_key(
        &s,
        "/v1/completions",
        r#"{"prompt":"abc","max_tokens":2}"#,
        Some("sekret"),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "de");
}

#[test]
fn health_is_503_until_the_warm_up_request_ran() {
    let open = Arc::new(AtomicBool::new(false));
    let s = start_opts(Opts {
        open: open.clone(),
        ..Opts::default()
    });
    let (st, retry, v) = get(&s, "/health", None);
    assert_eq!(st, 503, "{v}");
    assert_eq!(v["error"]["code"], "warming_up");
    assert!(retry.is_some());
    // The warm-up request is the only one the engine has seen.
    assert_eq!(s.handle.in_flight(), 0);
    open.store(true, Ordering::Release);
    let t0 = Instant::now();
    while get(&s, "/health", None).0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(5));
    }
    // It left nothing behind and counted as no client's request.
    assert_eq!(metric(&s, "flint_kv_blocks_in_use"), 0.0);
    assert_eq!(metric(&s, "flint_requests_total"), 0.0);
    let (st, v) = post(&s, "/v1/completions", r#"{"prompt":"a","max_tokens":2}"#);
    assert_eq!((st, v["choices"][0]["text"].as_str()), (200, Some("bc")));

    // A model that cannot compute never reports healthy.
    let s = start_opts(Opts {
        broken: true,
        ..Opts::default()
    });
    let t0 = Instant::now();
    loop {
        let (st, _, v) = get(&s, "/health", None);
        assert_eq!(st, 503);
        if v["error"]["code"] == "engine_failed" {
            break;
        }
        assert!(t0.elapsed() < Duration::from_secs(10), "{v}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

#[test]
fn drain_finishes_in_flight_requests_and_refuses_new_ones() {
    let mut s = start(64, 64);
    let base = s.base.clone();
    // ~90 steps of 3 ms: still running when the drain starts.
    let streaming = std::thread::spawn(move || {
        let resp = agent()
            .post(&format!("{base}/v1/completions"))
            .send_json(json!({"prompt": "a", "max_tokens": 90, "stream": true,
                              "ignore_eos": true}))
            .unwrap();
        let mut text = String::new();
        let mut done = false;
        for line in BufReader::new(resp.into_reader()).lines() {
            let line = line.unwrap();
            if let Some(d) = line.strip_prefix("data: ") {
                if d == "[DONE]" {
                    done = true;
                    break;
                }
                let c: Value = serde_json::from_str(d).unwrap();
                text.push_str(c["choices"][0]["text"].as_str().unwrap_or(""));
            }
        }
        (text, done)
    });
    let t0 = Instant::now();
    while s.handle.in_flight() == 0 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(2));
    }
    s.shutdown.take().unwrap().send(()).unwrap();
    let t0 = Instant::now();
    while get(&s, "/health", None).0 == 200 {
        assert!(t0.elapsed() < Duration::from_secs(10));
        std::thread::sleep(Duration::from_millis(2));
    }
    let (st, retry, v) = get(&s, "/health", None);
    assert_eq!(
        (st, v["error"]["code"].as_str()),
        (503, Some("draining")),
        "{v}"
    );
    assert!(retry.is_some());
    let resp = agent()
        .post(&format!("{}/v1/completions", s.base))
        .send_string(r#"{"prompt":"a"}"#);
    let Err(ureq::Error::Status(503, r)) = resp else {
        panic!("a new request during the drain: {resp:?}");
    };
    assert!(r.header("retry-after").is_some());
    let (text, done) = streaming.join().unwrap();
    assert!(done, "the stream in flight ended without [DONE]");
    assert_eq!(text.len(), 90, "{text}");
    // Once nothing is in flight the server stops.
    let served = s.served.take().unwrap();
    let r =
        s.rt.block_on(async { tokio::time::timeout(Duration::from_secs(10), served).await });
    assert!(matches!(r, Ok(Ok(Ok(())))), "{r:?}");
}

/// The log-probabilities of the alphabet model: `sharpness` at the next letter.
fn alphabet_logprobs(sharpness: f32) -> (f64, f64) {
    let lse = ((sharpness as f64).exp() + 25.0).ln();
    (sharpness as f64 - lse, -lse)
}

#[test]
fn logprobs_chat_and_completions_streamed_and_not() {
    let sharp = 3.0;
    let s = start_opts(Opts {
        sharpness: sharp,
        ..Opts::default()
    });
    let (next, other) = alphabet_logprobs(sharp);
    let close = |v: &Value, want: f64| (v.as_f64().unwrap() - want).abs() < 1e-5;
    // Chat, not streamed, greedy: b c d.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        &json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 3,
                "temperature": 0, "logprobs": true, "top_logprobs": 2})
        .to_string(),
    );
    assert_eq!(st, 200, "{v}");
    let content = v["choices"][0]["logprobs"]["content"].as_array().unwrap();
    assert_eq!(content.len(), 3);
    for (t, want) in content.iter().zip(["b", "c", "d"]) {
        assert_eq!(t["token"], want);
        assert_eq!(t["bytes"], json!([want.as_bytes()[0]]));
        assert!(close(&t["logprob"], next), "{t}");
        let top = t["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 2);
        assert_eq!(top[0]["token"], want);
        assert!(close(&top[0]["logprob"], next));
        // The runner-up: every other letter ties; the lowest id wins, 'a'.
        assert_eq!(top[1]["token"], "a");
        assert!(close(&top[1]["logprob"], other), "{t}");
    }
    // Without logprobs: null.
    let (_, v) = post(
        &s,
        "/v1/chat/completions",
        r#"{"messages":[{"role":"user","content":"a"}],"max_tokens":1}"#,
    );
    assert!(v["choices"][0]["logprobs"].is_null());
    assert_400(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "a"}], "top_logprobs": 2}),
        "top_logprobs",
    );
    assert_400(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "a"}], "logprobs": true,
               "top_logprobs": 21}),
        "top_logprobs",
    );
    // Completions: tokens, token_logprobs, top_logprobs, text_offset.
    let (st, v) = post(
        &s,
        "/v1/completions",
        &json!({"prompt": "w", "max_tokens": 3, "temperature": 0, "logprobs": 1}).to_string(),
    );
    assert_eq!(st, 200, "{v}");
    let lp = &v["choices"][0]["logprobs"];
    assert_eq!(lp["tokens"], json!(["x", "y", "z"]));
    assert_eq!(lp["text_offset"], json!([0, 1, 2]));
    for i in 0..3 {
        assert!(close(&lp["token_logprobs"][i], next), "{lp}");
    }
    assert!(close(&lp["top_logprobs"][0]["x"], next), "{lp}");
    // Streamed: one entry per token, across the chunks.
    let ev = sse(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 4,
               "temperature": 0, "stream": true, "logprobs": true}),
    );
    let toks: Vec<String> = chunks(&ev)
        .iter()
        .filter_map(|c| c["choices"][0]["logprobs"]["content"].as_array().cloned())
        .flatten()
        .map(|t| {
            assert!(close(&t["logprob"], next), "{t}");
            t["token"].as_str().unwrap().to_string()
        })
        .collect();
    assert_eq!(toks, ["b", "c", "d", "e"]);
    let ev = sse(
        &s,
        "/v1/completions",
        json!({"prompt": "a", "max_tokens": 3, "temperature": 0, "stream": true,
               "logprobs": 0}),
    );
    let offsets: Vec<Value> = chunks(&ev)
        .iter()
        .filter_map(|c| {
            c["choices"][0]["logprobs"]["text_offset"]
                .as_array()
                .cloned()
        })
        .flatten()
        .collect();
    assert_eq!(offsets, [json!(0), json!(1), json!(2)]);
}

#[test]
fn logit_bias_and_ignore_eos() {
    let s = start(64, 64);
    // 'b' pushed down to the others' level: the tie goes to the lowest id, 'a'.
    let (st, v) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":"a","max_tokens":1,"temperature":0,"logit_bias":{"1":-100}}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], "a");
    for bias in [
        json!({"1": 101}),
        json!({"26": 1}),
        json!({"b": 1}),
        json!({"-1": 1}),
    ] {
        assert_400(
            &s,
            "/v1/completions",
            json!({"prompt": "a", "logit_bias": bias}),
            "logit_bias",
        );
    }
    // 'z' ends generation, unless ignore_eos.
    let (_, v) = post(&s, "/v1/completions", r#"{"prompt":"x","max_tokens":5}"#);
    assert_eq!(v["choices"][0]["text"], "y");
    let (_, v) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":"x","max_tokens":5,"ignore_eos":true}"#,
    );
    assert_eq!(v["choices"][0]["text"], "yzabc");
    assert_eq!(v["choices"][0]["finish_reason"], "length");
}

#[test]
fn n_samples_and_prompt_lists() {
    let s = start_opts(Opts {
        sharpness: 1.0,
        ..Opts::default()
    });
    // n = 3 independent samples at temperature 1 (a flat model: they differ).
    let body = json!({"prompt": "a", "max_tokens": 8, "n": 3, "seed": 7, "ignore_eos": true});
    let (st, v) = post(&s, "/v1/completions", &body.to_string());
    assert_eq!(st, 200, "{v}");
    let texts: Vec<&str> = (0..3)
        .map(|i| {
            assert_eq!(v["choices"][i]["index"], i);
            v["choices"][i]["text"].as_str().unwrap()
        })
        .collect();
    assert!(texts[0] != texts[1] && texts[1] != texts[2], "{texts:?}");
    assert_eq!(v["usage"]["prompt_tokens"], 1);
    assert_eq!(v["usage"]["completion_tokens"], 24);
    // The same seed gives the same samples.
    let (_, again) = post(&s, "/v1/completions", &body.to_string());
    assert_eq!(again["choices"], v["choices"]);
    // Streamed chat, n = 2: both indices, one [DONE], usage over both.
    let ev = sse(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "a"}], "max_tokens": 4, "n": 2,
               "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}}),
    );
    let cs = chunks(&ev);
    let mut texts = [String::new(), String::new()];
    let mut finished = 0;
    for c in &cs {
        if let Some(ch) = c["choices"].get(0) {
            let i = ch["index"].as_u64().unwrap() as usize;
            texts[i].push_str(ch["delta"]["content"].as_str().unwrap_or(""));
            finished += usize::from(!ch["finish_reason"].is_null());
        }
    }
    assert_eq!(finished, 2);
    assert!(texts.iter().all(|t| t.len() == 4), "{texts:?}");
    assert_eq!(cs.last().unwrap()["usage"]["completion_tokens"], 8);

    // A list of prompts (text or token ids), each n times: index = prompt × n + sample.
    let s = start(64, 64);
    let (st, v) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":["a","mn"],"max_tokens":3,"n":2}"#,
    );
    assert_eq!(st, 200, "{v}");
    let texts: Vec<&str> = (0..4)
        .map(|i| v["choices"][i]["text"].as_str().unwrap())
        .collect();
    assert_eq!(texts, ["bcd", "bcd", "opq", "opq"]);
    assert_eq!(v["usage"]["prompt_tokens"], 3);
    assert_eq!(v["usage"]["completion_tokens"], 12);
    let (_, v) = post(
        &s,
        "/v1/completions",
        r#"{"prompt":[[0,1,2],[12]],"max_tokens":2}"#,
    );
    assert_eq!(v["choices"][0]["text"], "de");
    assert_eq!(v["choices"][1]["text"], "no");
}

#[test]
fn tokenize_and_detokenize() {
    let s = start(64, 64);
    let (st, v) = post(
        &s,
        "/tokenize",
        r#"{"prompt":"abc","return_token_strs":true}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tokens"], json!([0, 1, 2]));
    assert_eq!(v["count"], 3);
    assert_eq!(v["max_model_len"], 100);
    assert_eq!(v["token_strs"], json!(["a", "b", "c"]));
    let (st, v) = post(
        &s,
        "/tokenize",
        r#"{"messages":[{"role":"user","content":"xy"}]}"#,
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["tokens"], json!([23, 24]));
    let (st, v) = post(&s, "/detokenize", r#"{"tokens":[7,8]}"#);
    assert_eq!((st, v["prompt"].as_str()), (200, Some("hi")));
    assert_400(&s, "/detokenize", json!({"tokens": [1, 26]}), "tokens");
    assert_400(&s, "/detokenize", json!({"tokens": [1], "x": 1}), "x");
    assert_400(
        &s,
        "/tokenize",
        json!({"prompt": "a", "add_special_tokens": false}),
        "add_special_tokens",
    );
    let (st, _) = post(&s, "/tokenize", r#"{"prompt":"a","messages":[]}"#);
    assert_eq!(st, 400);
}

/// Every 4xx and 503 answer counts in `flint_requests_refused_total` (a request the
/// engine never saw included); a preemption counts in `flint_preemptions_total`.
#[test]
fn refusals_and_preemptions_are_counted() {
    let s = start(64, 12);
    let refused = |s: &Server| metric(s, "flint_requests_refused_total");
    assert_eq!(refused(&s), 0.0);
    assert_eq!(post(&s, "/v1/completions", "{").0, 400);
    assert_eq!(
        post(&s, "/v1/completions", r#"{"prompt":"a","n":0}"#).0,
        400
    );
    let long = json!({"prompt": "a".repeat(150)}).to_string();
    assert_eq!(post(&s, "/v1/completions", &long).0, 400);
    assert_eq!(get(&s, "/nowhere", None).0, 404);
    // A body announced over the limit: the server answers 413 from the header alone.
    // Only the header is sent: a client still writing a body the server will not read
    // may see its connection reset before it reads the answer.
    let addr = s.base.trim_start_matches("http://");
    let mut tcp = std::net::TcpStream::connect(addr).expect("connect");
    tcp.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("read timeout");
    std::io::Write::write_all(
        &mut tcp,
        format!(
            "POST /v1/completions HTTP/1.1\r\nHost: {addr}\r\nContent-Type: application/json\r\n\
             Content-Length: {}\r\nConnection: close\r\n\r\n",
            3 << 20
        )
        .as_bytes(),
    )
    .expect("request head");
    let mut status_line = String::new();
    BufReader::new(&mut tcp)
        .read_line(&mut status_line)
        .expect("status line");
    assert!(
        status_line.starts_with("HTTP/1.1 413"),
        "a body over the limit: {status_line:?}"
    );
    assert_eq!(refused(&s), 5.0);
    assert_eq!(metric(&s, "flint_requests_total"), 0.0);
    assert_eq!(post(&s, "/v1/completions", r#"{"prompt":"a"}"#).0, 200);
    assert_eq!(refused(&s), 5.0, "a served request is no refusal");

    // Four requests that cannot all hold their blocks in 12 (of 4 tokens) at once.
    assert_eq!(metric(&s, "flint_preemptions_total"), 0.0);
    let s = Arc::new(s);
    let clients: Vec<_> = (0..4)
        .map(|_| {
            let s = Arc::clone(&s);
            std::thread::spawn(move || {
                post(
                    &s,
                    "/v1/completions",
                    r#"{"prompt":"abcdefgh","max_tokens":30,"temperature":0}"#,
                )
            })
        })
        .collect();
    for c in clients {
        let (st, v) = c.join().unwrap();
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["text"], "ijklmnopqrstuvwxy");
    }
    assert!(metric(&s, "flint_preemptions_total") > 0.0);
    assert_eq!(metric(&s, "flint_kv_blocks_in_use"), 0.0);
}
