//! `flint serve` serves a qwen3moe file with its chat template: a synthetic qwen3moe
//! (`flint synth --arch qwen3moe --preset tiny`, llama.cpp's Qwen 2 vocabulary cut to
//! 2,048 tokens) carrying Qwen3's chat template (`models/templates/Qwen-Qwen3-0.6B.jinja`
//! from llama.cpp's sdist) answers a chat completion, and the prompt it evaluated is that
//! template's rendering of the messages (the template engine itself is checked against
//! llama.cpp in `loader/tests/chat_llamacpp.rs`).

mod common;

use std::process::Command;

use flint_engine::synth::dense::VocabSource;
use flint_engine::synth::moe::{synth_moe, MoeFamily, MoeRecipe};
use flint_loader::gguf::GgufFile;
use flint_loader::tokenizer::Tokenizer;
use serde_json::{json, Value};

use common::{llamacpp_src, ServeProcess as Server};

fn start(model: &std::path::Path) -> Server {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_flint"));
    cmd.args(["serve", "--port", "0", "--max-num-seqs", "4"])
        .args(["--max-model-len", "512", "--kv-memory", "32000000"])
        .args(["--served-model-name", "qwen3moe-tiny"])
        .arg("-m")
        .arg(model)
        .env("FLINT_THREADS", "2")
        .env_remove("FLINT_API_KEY");
    common::spawn_serve(cmd)
}

#[test]
fn serve_a_qwen3moe_file_with_its_chat_template() {
    let src = llamacpp_src();
    let vocab = GgufFile::open(src.join("models/ggml-vocab-qwen2.gguf")).expect("qwen2 vocab");
    let template = std::fs::read_to_string(src.join("models/templates/Qwen-Qwen3-0.6B.jinja"))
        .expect("Qwen3 template");
    let recipe = MoeRecipe::of(MoeFamily::Qwen3Moe, "tiny").expect("recipe");
    let (mut w, _) =
        synth_moe(&recipe, 21, VocabSource::File(&vocab, 2048), &|_, _| {}).expect("synth");
    // The vocabulary file carries Qwen 2's template; the model gets Qwen3's.
    w.set("tokenizer.chat_template", template)
        .expect("template key");
    let dir = std::env::temp_dir().join(format!("flint-moe-serve-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let path = dir.join("qwen3moe-tiny.gguf");
    w.write_file(&path).expect("write model");

    // What the server must have evaluated: Qwen3's rendering of the conversation.
    let file = GgufFile::open(&path).expect("reopen");
    let tok = Tokenizer::from_gguf(&file).expect("tokenizer");
    // Qwen3's template drops the reasoning of an assistant turn before the last user
    // message (a Qwen 2 template would keep it): the rendering tells the two apart.
    let rendered = "<|im_start|>system\nYou are terse.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n\
                    <|im_start|>assistant\nHello<|im_end|>\n<|im_start|>user\n\
                    Name a prime.<|im_end|>\n<|im_start|>assistant\n";
    let want_prompt = tok.tokenize(rendered, false, true).len();

    let s = start(&path);
    let body = json!({
        "model": "qwen3moe-tiny",
        "messages": [
            {"role": "system", "content": "You are terse."},
            {"role": "user", "content": "Hi"},
            {"role": "assistant", "content": "<think>greet back</think>Hello"},
            {"role": "user", "content": "Name a prime."}
        ],
        "max_tokens": 8,
        "temperature": 0
    });
    let r: Value = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .send_json(body)
        .expect("chat completion")
        .into_json()
        .expect("json");
    assert_eq!(r["model"], "qwen3moe-tiny", "{r}");
    assert_eq!(r["choices"][0]["message"]["role"], "assistant", "{r}");
    assert!(r["choices"][0]["message"]["content"].is_string(), "{r}");
    assert_eq!(
        r["usage"]["prompt_tokens"].as_u64(),
        Some(want_prompt as u64),
        "the prompt is Qwen3's template rendering ({want_prompt} tokens): {r}"
    );
    let completion = r["usage"]["completion_tokens"]
        .as_u64()
        .expect("completion tokens");
    assert!((1..=8).contains(&completion), "{r}");
    drop(s);
    let _ = std::fs::remove_dir_all(&dir);
}
