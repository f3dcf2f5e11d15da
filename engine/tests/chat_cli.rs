//! `flint chat` on the default model (Gemma 3 270M Q4_K_M), driven as a child process:
//! piped turns with history, `/reset` and `/exit` (and end of input); Ctrl-C (SIGINT
//! sent to the child) stops an answer and returns to the prompt, and two in a row at
//! the prompt end the program with status 0.

use std::io::{Read, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

fn chat(args: &[&str]) -> Command {
    let model = flint_engine::cli::model_path::resolve_path(None).expect("default model");
    let mut c = Command::new(env!("CARGO_BIN_EXE_flint"));
    c.arg("chat")
        .arg("-m")
        .arg(&model)
        .args(["--temperature", "0", "--verbose-prompt"])
        .args(args)
        .env("FLINT_THREADS", "2");
    c
}

/// The templated prompts `--verbose-prompt` printed, in order.
fn prompts(stderr: &str) -> Vec<String> {
    stderr
        .split("[prompt: ")
        .skip(1)
        .map(|p| {
            let body = p.split_once('\n').map_or("", |(_, b)| b);
            body.split("[end of prompt]")
                .next()
                .unwrap_or("")
                .to_string()
        })
        .collect()
}

#[test]
fn piped_turns_keep_history_and_reset_forgets_it() {
    let mut child = chat(&["-n", "12"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn flint chat");
    child
        .stdin
        .take()
        .unwrap()
        .write_all(
            b"What is the capital of France?\nAnd of Italy?\n/reset\nSay hi.\n/exit\nNever read.\n",
        )
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "status {}: {stderr}", out.status);
    let p = prompts(&stderr);
    assert_eq!(p.len(), 3, "three turns (nothing after /exit): {stderr}");
    assert!(p[0].contains("What is the capital of France?"), "{}", p[0]);
    // The second turn carries the first question and the first answer.
    assert!(p[1].contains("What is the capital of France?"), "{}", p[1]);
    assert!(p[1].contains("And of Italy?"), "{}", p[1]);
    let first_answer = stdout.split('\n').next().unwrap().trim();
    assert!(!first_answer.is_empty(), "no first answer: {stdout:?}");
    assert!(
        p[1].contains(first_answer),
        "the second prompt lacks the first answer {first_answer:?}: {}",
        p[1]
    );
    assert!(p[1].len() > p[0].len());
    // After /reset the history is gone.
    assert!(!p[2].contains("France"), "{}", p[2]);
    assert!(p[2].contains("Say hi."), "{}", p[2]);
    assert!(stderr.contains("(the conversation starts over)"));
    assert!(!stderr.contains("Never read."));
    // Only the answers are on stdout.
    assert!(
        !stdout.contains("flint chat:") && !stdout.contains("> "),
        "{stdout}"
    );
    assert!(stdout.matches('\n').count() >= 3, "{stdout:?}");
}

#[test]
fn end_of_input_ends_the_chat() {
    let out = chat(&["-n", "4"])
        .stdin(Stdio::null())
        .output()
        .expect("run flint chat");
    assert!(out.status.success(), "{out:?}");
    assert!(out.stdout.is_empty());
}

/// A running `flint chat` with its output gathered by reader threads.
struct Live {
    child: Child,
    stdin: ChildStdin,
    stdout: Arc<Mutex<String>>,
    stderr: Arc<Mutex<String>>,
}

impl Drop for Live {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

fn gather(mut r: impl Read + Send + 'static) -> Arc<Mutex<String>> {
    let buf = Arc::new(Mutex::new(String::new()));
    let b = buf.clone();
    std::thread::spawn(move || {
        let mut chunk = [0u8; 4096];
        while let Ok(n) = r.read(&mut chunk) {
            if n == 0 {
                break;
            }
            b.lock()
                .unwrap()
                .push_str(&String::from_utf8_lossy(&chunk[..n]));
        }
    });
    buf
}

impl Live {
    fn start(args: &[&str]) -> Self {
        let mut child = chat(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn flint chat");
        let stdin = child.stdin.take().unwrap();
        let stdout = gather(child.stdout.take().unwrap());
        let stderr = gather(child.stderr.take().unwrap());
        Self {
            child,
            stdin,
            stdout,
            stderr,
        }
    }

    fn stderr(&self) -> String {
        self.stderr.lock().unwrap().clone()
    }

    fn stdout(&self) -> String {
        self.stdout.lock().unwrap().clone()
    }

    /// Waits (at most `secs`) until `cond` holds for stdout and stderr.
    fn wait_for(&mut self, what: &str, secs: u64, cond: impl Fn(&str, &str) -> bool) {
        let t0 = Instant::now();
        loop {
            if cond(&self.stdout(), &self.stderr()) {
                return;
            }
            if let Ok(Some(st)) = self.child.try_wait() {
                panic!(
                    "flint chat exited ({st}) waiting for {what}: {}",
                    self.stderr()
                );
            }
            assert!(
                t0.elapsed() < Duration::from_secs(secs),
                "timed out waiting for {what}; stdout {:?}, stderr {:?}",
                self.stdout(),
                self.stderr()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn sigint(&self) {
        let st = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(st.success());
    }

    fn say(&mut self, line: &str) {
        self.stdin.write_all(line.as_bytes()).unwrap();
        self.stdin.write_all(b"\n").unwrap();
        self.stdin.flush().unwrap();
    }
}

#[test]
fn ctrl_c_stops_the_answer_not_the_program_and_twice_at_the_prompt_exits() {
    // Answers of up to 3,000 tokens: far longer than the test waits, so only Ctrl-C
    // ends them (greedy on this prompt, the model does not stop by itself early).
    let mut c = Live::start(&["-n", "3000"]);
    c.wait_for("the prompt", 300, |_, e| e.contains("> "));
    c.say("What is the capital of France?");
    c.wait_for("the answer to stream", 120, |o, _| o.len() >= 8);
    c.sigint();
    c.wait_for("the answer to stop", 60, |_, e| {
        e.contains("(answer stopped)")
    });
    assert!(
        c.child.try_wait().unwrap().is_none(),
        "Ctrl-C ended the program"
    );
    let stopped_answer = c.stdout();
    assert!(stopped_answer.ends_with('\n'), "{stopped_answer:?}");
    let partial = stopped_answer.trim().to_string();
    assert!(!partial.is_empty());

    // The next turn carries the stopped answer in its history and can be stopped too.
    c.say("And of Italy?");
    let before = stopped_answer.len();
    c.wait_for("the second answer to stream", 120, move |o, _| {
        o.len() >= before + 8
    });
    c.sigint();
    c.wait_for("the second answer to stop", 60, |_, e| {
        e.matches("(answer stopped)").count() == 2
    });
    let p = prompts(&c.stderr());
    assert_eq!(p.len(), 2);
    assert!(p[1].contains(&partial), "{partial:?} not in {}", p[1]);

    // At the prompt: the first Ctrl-C says how to quit, the second exits with 0.
    c.wait_for("the prompt after the stopped answer", 30, |_, e| {
        e.trim_end().ends_with('>')
    });
    c.sigint();
    c.wait_for("the hint", 30, |_, e| e.contains("(Ctrl-C again"));
    assert!(c.child.try_wait().unwrap().is_none());
    c.sigint();
    let t0 = Instant::now();
    let status = loop {
        if let Some(st) = c.child.try_wait().unwrap() {
            break st;
        }
        assert!(t0.elapsed() < Duration::from_secs(30), "still running");
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(status.success(), "{status}: {}", c.stderr());
}
