//! Drives a real `flint serve` router on 127.0.0.1 with a real HTTP client, over a small
//! deterministic model (the engine, scheduler, KV cache and HTTP layers are the real
//! ones; only the forward is a stand-in so these tests are fast). The same server over
//! the real default model is exercised in `server_model.rs`.

use std::io::{BufRead, BufReader, Read};
use std::sync::Arc;
use std::time::{Duration, Instant};

use flint_engine::kv::{groups_from_pattern, KvCacheManager};
use flint_engine::model::ModelError;
use flint_engine::sched::{Detokenizer, LLMEngine, StepModel, StepSeq};
use flint_engine::sched::{Scheduler, SchedulerConfig};
use flint_engine::serve::{self, ChatMessage, ServerConfig, TextSide};
use serde_json::{json, Value};

/// Next token = last + 1 (mod 26), one letter per token; 'z' (25) is EOS.
struct Alphabet;

impl StepModel for Alphabet {
    fn vocab_size(&self) -> usize {
        26
    }
    fn step(&mut self, seqs: &[StepSeq<'_>], kv: &KvCacheManager) -> Result<Vec<f32>, ModelError> {
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
                row[(last + 1) % 26] = 100.0;
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
    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, String> {
        let last = messages.last().ok_or("no messages")?;
        self.encode_prompt(&last.content)
    }
    fn eog_ids(&self) -> Vec<u32> {
        vec![25]
    }
}

struct Server {
    base: String,
    _rt: tokio::runtime::Runtime,
}

fn start(max_queue: usize, blocks: usize) -> Server {
    start_with(max_queue, blocks, Arc::new(Text))
}

fn start_with(max_queue: usize, blocks: usize, text: Arc<dyn TextSide>) -> Server {
    start_over(max_queue, blocks, text, true)
}

fn start_over(
    max_queue: usize,
    blocks: usize,
    text: Arc<dyn TextSide>,
    prefix_caching: bool,
) -> Server {
    let mut kv = KvCacheManager::new(
        groups_from_pattern(&[false, true], Some(8)),
        4,
        &[blocks, blocks],
    );
    kv.set_prefix_caching(prefix_caching);
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 32,
            max_num_batched_tokens: 64,
            max_model_len: 100,
        },
        kv,
    );
    let engine = LLMEngine::new(Alphabet, sched, Some(Box::new(Letters)));
    let handle = serve::spawn_engine(
        engine,
        ServerConfig {
            model_name: "alphabet".into(),
            max_model_len: 100,
            max_queue,
        },
    );
    let app = serve::router(handle, text);
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(serve::serve_on(listener, app));
    Server {
        base: format!("http://{addr}"),
        _rt: rt,
    }
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
    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, String> {
        let msgs: Vec<flint_loader::chat::ChatMessage> = messages
            .iter()
            .map(|m| flint_loader::chat::ChatMessage::new(m.role.clone(), m.content.clone()))
            .collect();
        let text = self.0.render(&msgs, true).map_err(|e| e.to_string())?;
        Text.encode_prompt(&text)
    }
    fn eog_ids(&self) -> Vec<u32> {
        vec![25]
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
        for _ in 0..2 {
            let (st, v) = post(&s, "/v1/completions", body);
            assert_eq!(st, 200, "{v}");
            assert_eq!(v["choices"][0]["text"], "ef");
        }
        let queries = metric(&s, "flint_prefix_cache_queries_total");
        let hits = metric(&s, "flint_prefix_cache_hits_total");
        let blocks = metric(&s, "flint_prefix_cache_blocks");
        if on {
            assert_eq!((queries, hits), (58.0, 28.0));
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
