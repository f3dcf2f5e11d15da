//! `flint serve` on the real default model (Gemma 3 270M Q4_K_M), driven over HTTP on
//! 127.0.0.1: both endpoints streaming and not, 16 concurrent streaming clients, a
//! disconnect mid-stream after which the KV pool is back to full, bad input, /metrics,
//! log-probabilities against `flint logits`, an API key, the official `openai` Python
//! client, and the drain on SIGTERM.

mod common;

use std::io::{BufRead, BufReader, Read};
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use common::ServeProcess as Server;

/// The API key the server is started with.
const KEY: &str = "test-key-29";

fn start() -> Server {
    start_with(&["--max-model-len", "256"])
}

fn start_with(args: &[&str]) -> Server {
    let model = flint_engine::cli::model_path::resolve_path(None).expect("default model");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flint"));
    cmd.args(["serve", "--port", "0", "--max-num-seqs", "8"])
        .args(args)
        .args(["--kv-memory", "64000000", "--served-model-name", "gemma3"])
        .arg("-m")
        .arg(&model)
        .env("FLINT_THREADS", "2")
        .env("FLINT_API_KEY", KEY);
    // Healthy once the warm-up request ran.
    common::spawn_serve(cmd)
}

fn authed(r: ureq::Request) -> ureq::Request {
    r.set("authorization", &format!("Bearer {KEY}"))
}

fn agent() -> ureq::Agent {
    ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(120))
        .build()
}

fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let resp = match authed(agent().post(&format!("{}{path}", s.base))).send_json(body) {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    (resp.status(), resp.into_json().unwrap())
}

fn sse_text(s: &Server, path: &str, body: Value) -> (String, Vec<Value>) {
    let resp = authed(agent().post(&format!("{}{path}", s.base)))
        .send_json(body)
        .unwrap();
    let mut chunks = Vec::new();
    let mut done = false;
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(d) = line.strip_prefix("data: ") {
            if d == "[DONE]" {
                done = true;
                break;
            }
            chunks.push(serde_json::from_str::<Value>(d).unwrap());
        }
    }
    assert!(done, "stream ended without [DONE]");
    let text = chunks
        .iter()
        .filter_map(|c| {
            let ch = c["choices"].get(0)?;
            ch["text"]
                .as_str()
                .or_else(|| ch["delta"]["content"].as_str())
                .map(str::to_string)
        })
        .collect();
    (text, chunks)
}

fn metric(s: &Server, name: &str) -> f64 {
    let text = authed(agent().get(&format!("{}/metrics", s.base)))
        .call()
        .unwrap()
        .into_string()
        .unwrap();
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let mut it = l.split_whitespace();
            (it.next() == Some(name)).then(|| it.next().unwrap().parse().unwrap())
        })
        .unwrap_or_else(|| panic!("{name} missing from /metrics:\n{text}"))
}

#[test]
fn serve_the_default_model() {
    let s = start();

    // Non-streaming completion, greedy: llama.cpp's chain for this prompt begins
    // " the capital of the" (and its next step is a near-tie).
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"model": "gemma3", "prompt": "The capital of France is", "max_tokens": 4,
               "temperature": 0}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], " the capital of the", "{v}");
    assert_eq!(v["usage"]["prompt_tokens"], 6);
    assert_eq!(v["usage"]["completion_tokens"], 4);

    eprintln!("[server_model] Non-streaming chat");
    // Non-streaming chat.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 6,
               "temperature": 0}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["role"], "assistant");
    assert!(v["usage"]["completion_tokens"].as_u64().unwrap() >= 1);

    eprintln!("[server_model] Streaming both endpoints");
    // Streaming both endpoints; the streamed text equals the non-streamed one.
    let (text, chunks) = sse_text(
        &s,
        "/v1/completions",
        json!({"prompt": "The capital of France is", "max_tokens": 4, "temperature": 0,
               "stream": true, "stream_options": {"include_usage": true}}),
    );
    assert_eq!(text, " the capital of the");
    assert_eq!(chunks.last().unwrap()["usage"]["completion_tokens"], 4);
    let (text, _) = sse_text(
        &s,
        "/v1/chat/completions",
        json!({"messages": [{"role": "user", "content": "Hello!"}], "max_tokens": 6,
               "temperature": 0, "stream": true}),
    );
    assert!(!text.is_empty());

    eprintln!("[server_model] 16 concurrent streaming");
    // 16 concurrent streaming clients all complete, each with its own greedy answer.
    let s = Arc::new(s);
    let workers: Vec<_> = (0..16)
        .map(|i| {
            let s = s.clone();
            std::thread::spawn(move || {
                let (text, chunks) = sse_text(
                    &s,
                    "/v1/completions",
                    json!({"prompt": format!("Item number {i} on the list is"),
                           "max_tokens": 6, "temperature": 0, "stream": true}),
                );
                assert!(!text.is_empty(), "client {i}");
                let last = chunks.last().unwrap();
                assert_eq!(last["choices"][0]["finish_reason"], "length", "client {i}");
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }

    eprintln!("[server_model] A client that disconnects");
    // A client that disconnects mid-stream: its request is aborted and the pool is full
    // again.
    let resp = authed(agent().post(&format!("{}/v1/completions", s.base)))
        .send_json(json!({"prompt": "Once upon a time", "max_tokens": 200, "stream": true}))
        .unwrap();
    let mut reader = BufReader::new(resp.into_reader());
    let mut events = 0;
    let mut line = String::new();
    while events < 3 {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "stream ended early"
        );
        events += usize::from(line.starts_with("data: "));
    }
    assert!(
        metric(&s, "flint_kv_blocks_in_use") > 0.0,
        "the stream holds blocks"
    );
    drop(reader);
    let t0 = Instant::now();
    while metric(&s, "flint_requests_aborted_total") < 1.0
        || metric(&s, "flint_kv_blocks_in_use") > 0.0
    {
        assert!(
            t0.elapsed() < Duration::from_secs(60),
            "blocks not returned"
        );
        std::thread::sleep(Duration::from_millis(50));
    }

    eprintln!("[server_model] Bad input");
    // Bad input.
    let (st, v) = post(&s, "/v1/completions", json!({"prompt": "x".repeat(3000)}));
    assert_eq!(st, 400);
    let msg = v["error"]["message"].as_str().unwrap().to_string();
    assert!(msg.contains("256"), "{msg}");
    let (st, v) = post(&s, "/v1/chat/completions", json!({"messages": []}));
    assert_eq!(st, 400, "{v}");
    let (st, v) = post(
        &s,
        "/v1/completions",
        json!({"prompt": "a", "model": "other"}),
    );
    assert_eq!(st, 400, "{v}");

    eprintln!("[server_model] metrics parses");
    // /metrics parses and counts what happened.
    assert!(metric(&s, "flint_requests_total") >= 20.0);
    assert!(metric(&s, "flint_generation_tokens_total") >= 100.0);
    assert!(metric(&s, "flint_ttft_seconds_count") >= 20.0);

    eprintln!("[server_model] Log-probabilities against flint logits");
    logprobs_match_flint_logits(&s);

    eprintln!("[server_model] The API key");
    let r = agent().get(&format!("{}/v1/models", s.base)).call();
    assert!(matches!(r, Err(ureq::Error::Status(401, _))), "{r:?}");

    eprintln!("[server_model] The official openai client");
    // The official openai client (installed by .ci/run from tools/requirements.txt).
    let have_openai = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|st| st.success());
    if have_openai {
        openai_client(&s);
    } else {
        assert!(
            std::env::var_os("CI").is_none(),
            "the openai Python package must be installed in CI"
        );
        eprintln!("SKIPPED: the openai Python package is not installed here");
    }

    eprintln!("[server_model] SIGTERM drains");
    let s = Arc::try_unwrap(s).unwrap_or_else(|_| panic!("a client still holds the server"));
    sigterm_drains(s);
}

fn openai_client(s: &Server) {
    let script = concat!(env!("CARGO_MANIFEST_DIR"), "/../tools/serve/openai_chat.py");
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("{}/v1", s.base))
        .env("FLINT_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    // response_format on the real model: answers under several JSON schemas, sampled at
    // temperature 1, parse and fit their schema.
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tools/serve/openai_tools.py"
    );
    let out = Command::new("python3")
        .arg(script)
        .arg(format!("{}/v1", s.base))
        .arg("json_schema")
        .env("FLINT_API_KEY", KEY)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "openai client (json_schema) failed:\n{}\n{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    eprintln!("{}", String::from_utf8_lossy(&out.stdout));
}

/// Completion log-probabilities equal the log-softmax of the teacher-forced logits of
/// `flint logits` over the prompt and the completion.
fn logprobs_match_flint_logits(s: &Server) {
    let prompt = "The capital of France is";
    let (st, v) = post(
        s,
        "/v1/completions",
        json!({"prompt": prompt, "max_tokens": 4, "temperature": 0, "logprobs": 3}),
    );
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    let lp = &v["choices"][0]["logprobs"];
    let dir = std::env::temp_dir().join(format!("flint-logprobs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("text.txt");
    std::fs::write(&file, format!("{prompt}{text}")).unwrap();
    let model = flint_engine::cli::model_path::resolve_path(None).expect("default model");
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["logits", "--top", "3", "--json", "--text-file"])
        .arg(&file)
        .arg("-m")
        .arg(&model)
        .env("FLINT_THREADS", "2")
        .output()
        .unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let logits: Value = serde_json::from_slice(&out.stdout).unwrap();
    let (_, tok) = post(s, "/tokenize", json!({"prompt": prompt}));
    let n_prompt = tok["count"].as_u64().unwrap() as usize;
    let ids = logits["ids"].as_array().unwrap();
    assert_eq!(
        ids.len(),
        n_prompt + 4,
        "the text re-tokenizes to other tokens"
    );
    for i in 0..4 {
        // Position p's logits predict token p + 1.
        let row = &logits["positions"][n_prompt - 1 + i];
        let lse = row["lse"].as_f64().unwrap();
        let top = row["top"].as_array().unwrap();
        // Greedy: the drawn token is the top one.
        assert_eq!(top[0][0], ids[n_prompt + i], "position {i}");
        let want = top[0][1].as_f64().unwrap() - lse;
        let got = lp["token_logprobs"][i].as_f64().unwrap();
        assert!(
            (got - want).abs() < 2e-2,
            "token {i}: served {got}, flint logits {want}"
        );
        let served_top: Vec<f64> = lp["top_logprobs"][i]
            .as_object()
            .unwrap()
            .values()
            .map(|x| x.as_f64().unwrap())
            .collect();
        for e in top {
            let want = e[1].as_f64().unwrap() - lse;
            assert!(
                served_top.iter().any(|g| (g - want).abs() < 2e-2),
                "token {i}: {want} not among {served_top:?}"
            );
        }
    }
}

/// SIGTERM: the request in flight finishes, a new one gets 503, and the server exits 0.
fn sigterm_drains(mut s: Server) {
    let resp = authed(agent().post(&format!("{}/v1/completions", s.base)))
        .send_json(
            json!({"prompt": "Once upon a time", "max_tokens": 48, "stream": true,
                          "temperature": 0, "ignore_eos": true}),
        )
        .unwrap();
    let mut reader = BufReader::new(resp.into_reader());
    let mut line = String::new();
    while !line.starts_with("data: ") {
        line.clear();
        assert!(
            reader.read_line(&mut line).unwrap() > 0,
            "stream ended early"
        );
    }
    let killed = Command::new("kill")
        .args(["-TERM", &s.child.id().to_string()])
        .status()
        .unwrap();
    assert!(killed.success());
    let t0 = Instant::now();
    loop {
        match agent().get(&format!("{}/health", s.base)).call() {
            Err(ureq::Error::Status(503, r)) => {
                assert!(r.header("retry-after").is_some());
                break;
            }
            Ok(_) => {}
            Err(e) => panic!("/health while draining: {e}"),
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "never draining");
        std::thread::sleep(Duration::from_millis(10));
    }
    let (st, v) = post(&s, "/v1/completions", json!({"prompt": "Hi"}));
    assert_eq!(st, 503, "{v}");
    let mut rest = String::new();
    reader.read_to_string(&mut rest).unwrap();
    assert!(
        rest.contains("[DONE]") && rest.contains("\"length\""),
        "{rest}"
    );
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = s.child.try_wait().unwrap() {
            break st;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "did not exit after the drain"
        );
        std::thread::sleep(Duration::from_millis(20));
    };
    assert!(status.success(), "{status:?}");
}

#[test]
fn prefix_cache_on_and_off() {
    // A shared preamble of a few hundred tokens, then two different questions.
    let preamble = "You are a helpful assistant who answers in one short sentence. ".repeat(30);
    let mut answers = Vec::new();
    for args in [&[][..], &["--no-prefix-cache"][..]] {
        let s = start_with(args);
        let mut texts = Vec::new();
        for q in ["What is the capital of France?", "What colour is the sky?"] {
            let (st, v) = post(
                &s,
                "/v1/completions",
                json!({"prompt": format!("{preamble}{q}"), "max_tokens": 8, "temperature": 0}),
            );
            assert_eq!(st, 200, "{v}");
            texts.push(v["choices"][0]["text"].as_str().unwrap().to_string());
        }
        let (queries, hits) = (
            metric(&s, "flint_prefix_cache_queries_total"),
            metric(&s, "flint_prefix_cache_hits_total"),
        );
        eprintln!("{args:?}: queries {queries}, hits {hits}, answers {texts:?}");
        if args.is_empty() {
            assert!(queries > 600.0, "{queries}");
            assert!(
                hits * 3.0 > queries,
                "the preamble was not reused: {hits} of {queries}"
            );
        } else {
            assert_eq!((queries, hits), (0.0, 0.0), "--no-prefix-cache");
        }
        answers.push(texts);
    }
    assert_eq!(
        answers[0], answers[1],
        "greedy answers differ with the cache on and off"
    );
}
