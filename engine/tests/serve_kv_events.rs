//! `flint serve --kv-events`: a subscriber sees the blocks of a served prompt stored, in
//! vLLM's KV event format (decoded here with `rmpv`); bad settings are refused by name.
//! On the tiny synthetic checkpoint.

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use rmpv::Value;
use zeromq::{Socket, SocketRecv};

fn flint() -> Command {
    Command::new(env!("CARGO_BIN_EXE_flint"))
}

fn tiny_model(tag: &str) -> std::path::PathBuf {
    let d = std::env::temp_dir().join(format!("flint-kv-events-{tag}-{}", std::process::id()));
    std::fs::create_dir_all(&d).expect("temp dir");
    let model = d.join("tiny.gguf");
    let out = flint()
        .args(["synth", "--preset", "tiny", "--out"])
        .arg(&model)
        .output()
        .expect("flint runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    model
}

/// The server process, killed when dropped.
struct Server(Child);

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The value under `key` in a MessagePack map.
fn field<'a>(map: &'a Value, key: &str) -> &'a Value {
    map.as_map()
        .and_then(|m| m.iter().find(|(k, _)| k.as_str() == Some(key)))
        .map(|(_, v)| v)
        .unwrap_or_else(|| panic!("no {key} in {map}"))
}

#[test]
fn a_served_prompt_s_blocks_are_published_as_stored() {
    let model = tiny_model("stored");
    let mut child = flint()
        .args(["serve", "--host", "127.0.0.1", "--port", "0"])
        .args(["--kv-events", "tcp://127.0.0.1:0", "-m"])
        .arg(&model)
        .env("FLINT_THREADS", "1")
        .env("FLINT_DEVICE", "cpu")
        .stderr(Stdio::piped())
        .spawn()
        .expect("flint serve starts");
    let stderr = child.stderr.take().unwrap();
    let server = Server(child);
    // Its two lines: the events endpoint, then the HTTP address.
    let mut lines = BufReader::new(stderr).lines();
    let (mut events, mut http) = (None, None);
    while events.is_none() || http.is_none() {
        let line = lines
            .next()
            .expect("flint serve printed its addresses")
            .unwrap();
        if let Some(rest) = line.strip_prefix("flint serve: KV events on ") {
            events = rest.split(' ').next().map(str::to_string);
            assert!(rest.contains("(block size 16)"), "{line}");
        } else if let Some(i) = line.find("on http://") {
            http = line[i + 3..].split(' ').next().map(str::to_string);
        }
    }
    let (events, http) = (events.unwrap(), http.unwrap());
    // Keep reading stderr so that the server never blocks on it.
    std::thread::spawn(move || for _ in lines {});

    let rt = tokio::runtime::Runtime::new().unwrap();
    let mut sub = zeromq::SubSocket::new();
    rt.block_on(async {
        sub.connect(&events).await.unwrap();
        sub.subscribe("").await.unwrap();
    });
    let deadline = Instant::now() + Duration::from_secs(60);
    while ureq::get(&format!("{http}/health")).call().is_err() {
        assert!(Instant::now() < deadline, "/health never answered 200");
        std::thread::sleep(Duration::from_millis(50));
    }
    // 40-token prompts: two full blocks of 16 each once computed.
    let stored = rt.block_on(async {
        for k in 0u32.. {
            // Until the subscription has reached the publisher, batches are dropped:
            // ask again, with a new prompt (a cached one stores nothing), until a
            // BlockStored arrives.
            let prompt: Vec<u32> = (0..40).map(|i| 20 + i + 3 * k).collect();
            let r = ureq::post(&format!("{http}/v1/completions")).send_json(
                serde_json::json!({"prompt": prompt, "max_tokens": 1, "temperature": 0}),
            );
            assert!(r.is_ok(), "the completion failed: {r:?}");
            while let Ok(Ok(m)) = tokio::time::timeout(Duration::from_millis(300), sub.recv()).await
            {
                let frames: Vec<Vec<u8>> = m.iter().map(|f| f.to_vec()).collect();
                assert_eq!(frames.len(), 3, "topic, sequence number, payload");
                assert_eq!(frames[1].len(), 8, "a big-endian u64");
                let batch = rmpv::decode::read_value(&mut frames[2].as_slice()).unwrap();
                let batch = batch.as_array().expect("a batch is an array").clone();
                assert_eq!(batch.len(), 3, "[ts, events, data_parallel_rank]");
                for e in batch[1].as_array().expect("a list of events") {
                    if field(e, "type").as_str() == Some("BlockStored") {
                        return e.clone();
                    }
                }
            }
            assert!(Instant::now() < deadline, "no BlockStored event arrived");
        }
        unreachable!("the loop returns or fails")
    });
    let tokens: Vec<u64> = field(&stored, "token_ids")
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t.as_u64().unwrap())
        .collect();
    // The first two blocks of one of the prompts sent (the one whose first token it is).
    let first = tokens.first().copied().unwrap_or(0);
    let want: Vec<u64> = (0..32).map(|i| first + i).collect();
    assert!(first >= 20 && (first - 20) % 3 == 0, "{tokens:?}");
    assert_eq!(tokens, want, "a prompt's two full blocks");
    assert_eq!(field(&stored, "block_hashes").as_array().unwrap().len(), 2);
    assert!(field(&stored, "parent_block_hash").is_nil());
    assert_eq!(field(&stored, "block_size").as_u64(), Some(16));
    drop(server);
}

#[test]
fn bad_kv_event_settings_are_refused_by_name() {
    let model = tiny_model("bad");
    for (extra, says) in [
        (
            vec!["--kv-events", "ipc:///tmp/x"],
            "--kv-events ipc:///tmp/x",
        ),
        (vec!["--kv-events", "tcp://127.0.0.1"], "no port"),
        (
            vec!["--kv-events", "tcp://127.0.0.1:0", "--no-prefix-cache"],
            "the prefix cache is off",
        ),
    ] {
        let out = flint()
            .args(["serve", "--host", "127.0.0.1", "--port", "0", "-m"])
            .arg(&model)
            .args(&extra)
            .env("FLINT_THREADS", "1")
            .env("FLINT_DEVICE", "cpu")
            .output()
            .expect("flint runs");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{extra:?} was accepted");
        assert!(err.contains(says), "{extra:?}: {err}");
    }
}
