//! Tools, reasoning and `response_format` through the real router, engine, sampler and
//! chat template: a Qwen-style
//! template (rendered by the loader's minijinja, as a model file's would be) over a
//! byte-level stand-in model that plays back a scripted answer, so that the answer is
//! a known tool call or a known piece of reasoning. gpt-oss's harmony template, Gemma
//! 4's and Qwen 3.5's (from llama.cpp's sdist) go through the same stand-in. The parsers' own cases are unit
//! tests in `engine/src/serve/tools.rs` and `engine/src/serve/harmony.rs`.

mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::process::Command;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use flint_engine::kv::{groups_from_pattern, KvCacheManager, RequestId};
use flint_engine::model::ModelError;
use flint_engine::sample::GrammarVocab;
use flint_engine::sched::{Detokenizer, LLMEngine, StepModel, StepSeq};
use flint_engine::sched::{Scheduler, SchedulerConfig};
use flint_engine::serve::tools::ChatSyntax;
use flint_engine::serve::{self, ChatMessage, ChatPrompt, ServerConfig, TextSide};
use flint_loader::chat::ChatTemplate;
use serde_json::{json, Value};

/// Byte `b` is token `b`; this is the end of the answer.
const EOS: u32 = 256;
const VOCAB: usize = 257;
/// Bytes the stand-in prefers, least first, to any other byte but the scripted one.
const FALLBACK: &[u8] = b"1]}\"";

/// Plays `script` back, one byte per step, then EOS, to every request (byte `i` at the
/// `i`-th step, whatever was drawn before).
struct Script {
    script: Arc<Mutex<Vec<u8>>>,
    sent: HashMap<RequestId, usize>,
}

impl StepModel for Script {
    fn vocab_size(&self) -> usize {
        VOCAB
    }
    fn step(&mut self, seqs: &[StepSeq<'_>], kv: &KvCacheManager) -> Result<Vec<f32>, ModelError> {
        let script = self
            .script
            .lock()
            .map_err(|_| ModelError::new("poisoned"))?;
        let mut out = Vec::new();
        for s in seqs {
            let pos: Vec<u32> = (s.start..s.start + s.tokens.len())
                .map(|p| p as u32)
                .collect();
            for g in 0..kv.num_groups() {
                let _ = kv.slot_mapping(s.id, g, &pos);
            }
            if s.sample {
                let k = self.sent.entry(s.id).or_insert(0);
                let next = script.get(*k).map_or(EOS, |&b| u32::from(b));
                *k += 1;
                let mut row = vec![0.0; VOCAB];
                // Where a grammar refuses the scripted byte: rather close what is open
                // than write on.
                for (rank, b) in FALLBACK.iter().enumerate() {
                    row[usize::from(*b)] = 1.0 + rank as f32;
                }
                row[next as usize] = 100.0;
                out.extend(row);
            }
        }
        Ok(out)
    }
}

struct Bytes;
impl Detokenizer for Bytes {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        u8::try_from(id).map(|b| vec![b]).unwrap_or_default()
    }
}

/// The text side of the stand-in: bytes as tokens, a real chat template.
struct Templated(ChatTemplate);

impl TextSide for Templated {
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(text.bytes().map(u32::from).collect())
    }
    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[Value]>,
        vars: &serve::TemplateVars,
    ) -> Result<ChatPrompt, String> {
        let (text, opens_reasoning) = serve::render_chat(&self.0, messages, tools, vars)?;
        Ok(ChatPrompt {
            tokens: self.encode_prompt(&text)?,
            opens_reasoning,
        })
    }
    fn chat_syntax(&self) -> ChatSyntax {
        ChatSyntax::detect(self.0.source())
    }
    fn template_reads(&self, name: &str) -> bool {
        self.0.source().contains(name)
    }
    fn grammar_vocab(&self) -> Result<Arc<GrammarVocab>, String> {
        let mut tokens: Vec<Option<Vec<u8>>> = (0..=255u8).map(|b| Some(vec![b])).collect();
        tokens.push(None);
        GrammarVocab::new(&tokens, &[EOS])
            .map(Arc::new)
            .map_err(|e| e.to_string())
    }
    fn eog_ids(&self) -> Vec<u32> {
        vec![EOS]
    }
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        Bytes.token_bytes(id)
    }
}

/// Qwen 2.5 / 3's template, cut down to what these tests read: the tools block, the
/// tool-call history, tool responses, and earlier reasoning dropped from history.
const QWEN: &str = r##"{%- if tools %}
{{- '<|im_start|>system\n' }}
{%- if messages[0].role == 'system' %}{{- messages[0].content + '\n\n' }}{%- endif %}
{{- "# Tools\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
{%- for tool in tools %}{{- "\n" }}{{- tool | tojson }}{%- endfor %}
{{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- elif messages[0].role == 'system' %}
{{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
{%- if message.role == 'user' or (message.role == 'system' and not loop.first) %}
{{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>\n' }}
{%- elif message.role == 'assistant' %}
{%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
{{- '<|im_start|>assistant\n' + content }}
{%- for tc in message.tool_calls or [] %}
{{- '\n<tool_call>\n{"name": "' + tc.function.name + '", "arguments": ' + (tc.function.arguments | tojson) + '}\n</tool_call>' }}
{%- endfor %}
{{- '<|im_end|>\n' }}
{%- elif message.role == 'tool' %}
{{- '<|im_start|>user\n<tool_response>\n' + message.content + '\n</tool_response><|im_end|>\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}{%- endif %}"##;

struct Server {
    base: String,
    script: Arc<Mutex<Vec<u8>>>,
    _rt: tokio::runtime::Runtime,
}

fn start(template: &str) -> Server {
    let kv = KvCacheManager::new(
        groups_from_pattern(&[false, true], Some(8)),
        16,
        &[256, 256],
    );
    let sched = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: 8,
            max_num_batched_tokens: 512,
            max_model_len: 4096,
        },
        kv,
    );
    let script = Arc::new(Mutex::new(Vec::new()));
    let model = Script {
        script: Arc::clone(&script),
        sent: HashMap::new(),
    };
    let engine = LLMEngine::new(model, sched, Some(Box::new(Bytes)));
    let handle = serve::spawn_engine(
        engine,
        ServerConfig {
            model_name: "script".into(),
            max_model_len: 4096,
            max_queue: 16,
            api_key: None,
        },
    );
    let template = ChatTemplate::new(template, "", "<|im_end|>").unwrap();
    let app = serve::router(handle.clone(), Arc::new(Templated(template)));
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = rt
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let addr = listener.local_addr().unwrap();
    rt.spawn(serve::serve_on(
        listener,
        app,
        handle,
        std::future::pending(),
    ));
    let s = Server {
        base: format!("http://{addr}"),
        script,
        _rt: rt,
    };
    let t0 = Instant::now();
    while post(&s, "/tokenize", json!({"prompt": "x"})).0 != 200 {
        assert!(t0.elapsed() < Duration::from_secs(10), "never became ready");
        std::thread::sleep(Duration::from_millis(5));
    }
    s
}

impl Server {
    fn answer(&self, text: &str) {
        *self.script.lock().unwrap() = text.as_bytes().to_vec();
    }
}

fn post(s: &Server, path: &str, body: Value) -> (u16, Value) {
    let r = ureq::post(&format!("{}{path}", s.base)).send_json(body);
    let resp = match r {
        Ok(r) => r,
        Err(ureq::Error::Status(_, r)) => r,
        Err(e) => panic!("{e}"),
    };
    (resp.status(), resp.into_json().unwrap())
}

/// The chunks of a streamed chat answer, `[DONE]` excluded.
fn stream(s: &Server, mut body: Value) -> Vec<Value> {
    body["stream"] = json!(true);
    let resp = ureq::post(&format!("{}/v1/chat/completions", s.base))
        .send_json(body)
        .unwrap();
    let mut out = Vec::new();
    for line in BufReader::new(resp.into_reader()).lines() {
        let line = line.unwrap();
        if let Some(d) = line.strip_prefix("data: ") {
            if d == "[DONE]" {
                break;
            }
            out.push(serde_json::from_str(d).unwrap());
        }
    }
    out
}

fn weather_tool() -> Value {
    json!({"type": "function", "function": {"name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}})
}

fn ask(tools: bool) -> Value {
    let mut b = json!({"messages": [{"role": "user", "content": "Weather in Paris?"}],
                       "temperature": 0});
    if tools {
        b["tools"] = json!([weather_tool()]);
    }
    b
}

const CALL: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

fn detok(s: &Server, tokens: &Value) -> String {
    let (st, v) = post(s, "/detokenize", json!({"tokens": tokens}));
    assert_eq!(st, 200, "{v}");
    v["prompt"].as_str().unwrap().to_string()
}

/// The prompt the template renders for `messages` with the weather tool offered, read
/// back through `/tokenize` and `/detokenize`.
fn prompt_with_weather_tool(s: &Server, messages: &Value) -> String {
    let (st, v) = post(
        s,
        "/tokenize",
        json!({"messages": messages, "tools": [weather_tool()]}),
    );
    assert_eq!(st, 200, "{v}");
    detok(s, &v["tokens"])
}

#[test]
fn tools_and_tool_history_go_through_the_template() {
    let s = start(QWEN);
    let prompt = prompt_with_weather_tool(&s, &ask(true)["messages"]);
    assert!(prompt.contains("<tools>\n{"), "{prompt}");
    assert!(prompt.contains("\"name\": \"get_weather\""), "{prompt}");
    assert!(prompt.ends_with("<|im_start|>assistant\n"), "{prompt}");
    // Without tools the template writes no tools block.
    let (_, v) = post(&s, "/tokenize", json!({"messages": ask(false)["messages"]}));
    assert!(!detok(&s, &v["tokens"]).contains("<tools>"));

    // A conversation that called a tool: the call's arguments (JSON text, as clients
    // send them) reach the template as an object, and the tool's answer is rendered.
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "get_weather", "content": "sunny, 21 C"},
    ]);
    let prompt = prompt_with_weather_tool(&s, &history);
    assert!(
        prompt.contains("{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}"),
        "{prompt}"
    );
    assert!(
        prompt.contains("<tool_response>\nsunny, 21 C\n</tool_response>"),
        "{prompt}"
    );
    // And a chat request with that history is served.
    s.answer("It is sunny.");
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        json!({"messages": history, "tools": [weather_tool()], "temperature": 0}),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["content"], "It is sunny.");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[test]
fn tool_calls_parsed_streamed_and_not() {
    let s = start(QWEN);
    s.answer(&format!("Let me check.\n{CALL}"));
    let (st, v) = post(&s, "/v1/chat/completions", ask(true));
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert_eq!(c["message"]["content"], "Let me check.\n");
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["type"], "function");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    assert_eq!(
        v["usage"]["completion_tokens"].as_u64(),
        Some(format!("Let me check.\n{CALL}").len() as u64 + 1),
        "every byte and the end token"
    );

    // Streamed: the same content in pieces, the call whole in one delta, the finish
    // reason on the last chunk.
    let chunks = stream(&s, ask(true));
    let mut content = String::new();
    let mut calls = Vec::new();
    let mut finish = Vec::new();
    for ch in &chunks {
        let c = &ch["choices"][0];
        content.push_str(c["delta"]["content"].as_str().unwrap_or(""));
        calls.extend(
            c["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        if !c["finish_reason"].is_null() {
            finish.push(c["finish_reason"].clone());
        }
    }
    assert_eq!(content, "Let me check.\n");
    assert_eq!(finish, [json!("tool_calls")]);
    assert_eq!(calls.len(), 1, "{chunks:?}");
    assert_eq!(calls[0]["index"], 0);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert!(calls[0]["id"].as_str().unwrap().starts_with("call_"));

    // Two calls in one answer get indices 0 and 1 and distinct ids.
    s.answer(&format!("{CALL}\n{}", CALL.replace("Paris", "Oslo")));
    let (_, v) = post(&s, "/v1/chat/completions", ask(true));
    let calls = v["choices"][0]["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 2, "{v}");
    assert_ne!(calls[0]["id"], calls[1]["id"]);
    assert!(calls[1]["function"]["arguments"]
        .as_str()
        .unwrap()
        .contains("Oslo"));
    let chunks = stream(&s, ask(true));
    let idx: Vec<Value> = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["tool_calls"].as_array().cloned())
        .flatten()
        .map(|c| c["index"].clone())
        .collect();
    assert_eq!(idx, [json!(0), json!(1)]);

    // Offered no tools (or tool_choice "none"), the same text is plain content.
    s.answer(CALL);
    for body in [ask(false), {
        let mut b = ask(true);
        b["tool_choice"] = json!("none");
        b
    }] {
        let (st, v) = post(&s, "/v1/chat/completions", body);
        assert_eq!(st, 200, "{v}");
        assert_eq!(v["choices"][0]["message"]["content"], CALL);
        assert!(v["choices"][0]["message"].get("tool_calls").is_none());
        assert_eq!(v["choices"][0]["finish_reason"], "stop");
    }
    // A malformed call is content too.
    let bad = "<tool_call>{\"name\": get_weather}</tool_call>";
    s.answer(bad);
    let (_, v) = post(&s, "/v1/chat/completions", ask(true));
    assert_eq!(v["choices"][0]["message"]["content"], bad);
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
}

#[test]
fn reasoning_is_returned_apart() {
    let s = start(QWEN);
    s.answer("<think>\nTwo and two make four.\n</think>\n\nFour.");
    let (st, v) = post(&s, "/v1/chat/completions", ask(false));
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "\nTwo and two make four.\n");
    assert_eq!(m["content"], "\n\nFour.");
    let chunks = stream(&s, ask(false));
    let (mut reasoning, mut content) = (String::new(), String::new());
    for ch in &chunks {
        let d = &ch["choices"][0]["delta"];
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
    }
    assert_eq!(reasoning, "\nTwo and two make four.\n");
    assert_eq!(content, "\n\nFour.");
    assert!(
        chunks.len() > 4,
        "reasoning streams as it comes: {} chunks",
        chunks.len()
    );

    // Reasoning, then a call.
    s.answer(&format!("<think>Paris: ask the tool.</think>\n{CALL}"));
    let (_, v) = post(&s, "/v1/chat/completions", ask(true));
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "Paris: ask the tool.");
    assert_eq!(m["tool_calls"][0]["function"]["name"], "get_weather");
    assert_eq!(v["choices"][0]["finish_reason"], "tool_calls");

    // A template that opens the reasoning in the prompt (DeepSeek R1's way).
    let opened = QWEN.replace(
        "{{- '<|im_start|>assistant\\n' }}{%- endif %}",
        "{{- '<|im_start|>assistant\\n<think>\\n' }}{%- endif %}",
    );
    assert_ne!(opened, QWEN);
    let s = start(&opened);
    s.answer("Easy.\n</think>\nFour.");
    let (_, v) = post(&s, "/v1/chat/completions", ask(false));
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "Easy.\n", "{v}");
    assert_eq!(m["content"], "\nFour.");
}

#[test]
fn tool_fields_refused_by_name() {
    let s = start(QWEN);
    // A forced function that is not offered: named in the error.
    let mut b = ask(true);
    b["tool_choice"] = json!({"type": "function", "function": {"name": "get_stock"}});
    let (st, v) = post(&s, "/v1/chat/completions", b);
    assert_eq!(
        (st, v["error"]["param"].clone()),
        (400, json!("tool_choice")),
        "{v}"
    );
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("get_stock"),
        "{v}"
    );
    // A forced call without tools, a malformed choice, and a forced call that
    // response_format would contradict.
    for (choice, extra, param) in [
        (json!("required"), false, "tool_choice"),
        (json!({"type": "function"}), true, "tool_choice"),
        (json!("always"), true, "tool_choice"),
        (json!("required"), true, "response_format"),
    ] {
        let mut b = ask(extra);
        b["tool_choice"] = choice.clone();
        if param == "response_format" {
            b["response_format"] = json!({"type": "json_object"});
        }
        let (st, v) = post(&s, "/v1/chat/completions", b);
        assert_eq!(
            (st, v["error"]["param"].clone()),
            (400, json!(param)),
            "{choice}: {v}"
        );
    }
    let mut b = ask(false);
    b["tools"] = json!([{"type": "function", "function": {}}]);
    let (st, v) = post(&s, "/v1/chat/completions", b);
    assert_eq!((st, v["error"]["param"].clone()), (400, json!("tools[0]")));
    // A template that does not render tools: offering some is a 400, not ignored.
    let s = start(flint_loader::chat::GEMMA_TEMPLATE);
    let (st, v) = post(&s, "/v1/chat/completions", ask(true));
    assert_eq!(
        (st, v["error"]["param"].clone()),
        (400, json!("tools")),
        "{v}"
    );
    let mut b = ask(true);
    b["tools"] = json!([]);
    let (st, v) = post(&s, "/v1/chat/completions", b);
    assert_eq!(st, 200, "{v}");
}

/// Two tools whose arguments a schema pins down.
fn strict_tools() -> Value {
    json!([
        {"type": "function", "function": {"name": "get_weather",
            "parameters": {"type": "object", "properties": {
                "city": {"type": "string"}, "days": {"type": "integer"}},
                "required": ["city", "days"], "additionalProperties": false}}},
        {"type": "function", "function": {"name": "get_time",
            "parameters": {"type": "object", "properties": {"zone": {"type": "string"}},
                "required": ["zone"], "additionalProperties": false}}},
    ])
}

fn forced(choice: Value) -> Value {
    let mut b = ask(false);
    b["tools"] = strict_tools();
    b["tool_choice"] = choice;
    b["max_tokens"] = json!(200);
    b
}

/// The choice's calls as (name, arguments); asserts the answer is calls only.
fn forced_calls(v: &Value) -> Vec<(String, Value)> {
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    let content = c["message"]["content"].as_str().unwrap_or("");
    assert!(content.trim().is_empty(), "{v}");
    c["message"]["tool_calls"]
        .as_array()
        .unwrap_or_else(|| panic!("no tool_calls: {v}"))
        .iter()
        .map(|t| {
            let args = t["function"]["arguments"].as_str().unwrap();
            (
                t["function"]["name"].as_str().unwrap().to_string(),
                serde_json::from_str(args).unwrap_or_else(|e| panic!("{e}: {args}")),
            )
        })
        .collect()
}

/// Arguments valid under [`strict_tools`]' schema of `name`.
fn check_args(name: &str, args: &Value) {
    let o = args.as_object().unwrap_or_else(|| panic!("{args}"));
    match name {
        "get_weather" => {
            assert!(o["city"].is_string(), "{args}");
            assert!(o["days"].is_i64(), "{args}");
            assert_eq!(o.len(), 2, "{args}");
        }
        "get_time" => {
            assert!(o["zone"].is_string(), "{args}");
            assert_eq!(o.len(), 1, "{args}");
        }
        _ => panic!("{name} was not offered"),
    }
}

/// Whether the server's template writes reasoning: a thinking answer comes back as
/// `reasoning_content`.
fn plain_syntax_reasons(s: &Server) -> bool {
    s.answer("<think>x</think>y");
    let (_, v) = post(s, "/v1/chat/completions", ask(false));
    !v["choices"][0]["message"]["reasoning_content"].is_null()
}

/// `tool_choice` that forces a call: the sampler writes the call in the template's
/// syntax, with the named function (or any offered one for "required") and arguments
/// under its schema, whatever the model wanted to write.
#[test]
fn forced_tool_calls() {
    let s = start(QWEN);
    // The model wants to call get_weather with a string for the integer "days".
    let wanted = CALL.replace("\"Paris\"}", "\"Paris\", \"days\": \"three\"}");
    s.answer(&wanted);
    let (st, v) = post(&s, "/v1/chat/completions", {
        let mut b = forced(json!("auto"));
        b["tool_choice"] = json!("auto");
        b
    });
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        forced_calls(&v),
        [(
            "get_weather".into(),
            json!({"city": "Paris", "days": "three"})
        )],
        "unforced, the call is what the model wrote"
    );
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    let (st, v) = post(&s, "/v1/chat/completions", forced(named.clone()));
    assert_eq!(st, 200, "{v}");
    let calls = forced_calls(&v);
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0].0, "get_weather");
    check_args(&calls[0].0, &calls[0].1);
    assert_eq!(calls[0].1["city"], "Paris", "{v}");

    // Forced to the other function, or to any: from a model that wants the call, one
    // that thinks and then answers in words (the thinking stays reasoning), and one
    // that does not think and answers in words.
    let plain = start(&QWEN.replace(
        "message.content.split('</think>')[-1].lstrip('\\n')",
        "message.content",
    ));
    assert!(
        !plain_syntax_reasons(&plain),
        "the template knows no <think>"
    );
    let thinking = "<think>Paris.</think>\n\nIt is sunny.";
    for (server, answer) in [
        (&s, wanted.as_str()),
        (&s, thinking),
        (&plain, "It is sunny in Paris."),
    ] {
        server.answer(answer);
        for choice in [
            json!({"type": "function", "function": {"name": "get_time"}}),
            json!("required"),
        ] {
            let (st, v) = post(server, "/v1/chat/completions", forced(choice.clone()));
            assert_eq!(st, 200, "{v}");
            let calls = forced_calls(&v);
            assert!(!calls.is_empty(), "{v}");
            if choice != json!("required") {
                assert_eq!(calls.len(), 1, "{v}");
                assert_eq!(calls[0].0, "get_time", "{v}");
            }
            for (name, args) in &calls {
                check_args(name, args);
            }
            if answer == thinking {
                assert_eq!(v["choices"][0]["message"]["reasoning_content"], "Paris.");
            }
        }
    }

    // Streamed: the call in a delta, finish_reason tool_calls.
    plain.answer("It is sunny in Paris.");
    let chunks = stream(&plain, forced(named));
    let mut calls = Vec::new();
    let mut finish = Vec::new();
    for ch in &chunks {
        let c = &ch["choices"][0];
        assert!(
            c["delta"]["content"]
                .as_str()
                .unwrap_or("")
                .trim()
                .is_empty(),
            "{ch}"
        );
        calls.extend(
            c["delta"]["tool_calls"]
                .as_array()
                .cloned()
                .unwrap_or_default(),
        );
        if !c["finish_reason"].is_null() {
            finish.push(c["finish_reason"].clone());
        }
    }
    assert_eq!(finish, [json!("tool_calls")], "{chunks:?}");
    assert_eq!(calls.len(), 1, "{chunks:?}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    check_args("get_weather", &args);
}

/// The official `openai` client reads the calls and the reasoning.
#[test]
fn openai_client_reads_tool_calls_and_reasoning() {
    // The official openai client (installed by .ci/run from tools/requirements.txt).
    let have_openai = Command::new("python3")
        .args(["-c", "import openai"])
        .status()
        .is_ok_and(|st| st.success());
    if !have_openai {
        assert!(
            std::env::var_os("CI").is_none(),
            "the openai Python package must be installed in CI"
        );
        eprintln!("SKIPPED: the openai Python package is not installed here");
        return;
    }
    let s = start(QWEN);
    let script = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../tools/serve/openai_tools.py"
    );
    let run = |mode: &str, answer: &str| {
        s.answer(answer);
        let out = Command::new("python3")
            .arg(script)
            .arg(format!("{}/v1", s.base))
            .arg(mode)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "openai client ({mode}) failed:\n{}\n{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        eprintln!("{}", String::from_utf8_lossy(&out.stdout));
    };
    run("tools", CALL);
    run("reasoning", "<think>Two and two.</think>Four.");
}

fn with_format(format: Value) -> Value {
    let mut b = ask(false);
    b["response_format"] = format;
    b["max_tokens"] = json!(100);
    b
}

fn content(v: &Value) -> String {
    v["choices"][0]["message"]["content"]
        .as_str()
        .unwrap_or_else(|| panic!("{v}"))
        .to_string()
}

/// The model wants to write an answer that breaks the schema; the sampler bends it
/// into one that parses and fits, streamed or not, for each of `n` samples.
#[test]
fn response_format_is_enforced_while_sampling() {
    let s = start(QWEN);
    let person = json!({"type": "json_schema", "json_schema": {"name": "person", "strict": true,
        "schema": {"type": "object",
                   "properties": {"name": {"type": "string"}, "age": {"type": "integer"}},
                   "required": ["name", "age"], "additionalProperties": false}}});
    let wanted = r#"{"name": "Bob", "age": "old"} and then some"#;
    s.answer(wanted);
    // Unconstrained, the answer is what the model wants.
    let (_, v) = post(&s, "/v1/chat/completions", ask(false));
    assert_eq!(content(&v), wanted);
    let check = |text: &str| {
        let p: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
        assert_eq!(p["name"], "Bob", "{text}");
        assert!(p["age"].is_number(), "{text}");
        assert_eq!(p.as_object().unwrap().len(), 2, "{text}");
    };
    let mut body = with_format(person.clone());
    body["n"] = json!(2);
    let (st, v) = post(&s, "/v1/chat/completions", body);
    assert_eq!(st, 200, "{v}");
    for c in v["choices"].as_array().unwrap() {
        check(c["message"]["content"].as_str().unwrap());
        assert_eq!(c["finish_reason"], "stop", "{v}");
    }
    let chunks = stream(&s, with_format(person));
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["delta"]["content"].as_str())
        .collect();
    check(&text);

    // json_object: any object, and the answer ends when the object does.
    s.answer(r#"{"a": [1, 2]} and more"#);
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        with_format(json!({"type": "json_object"})),
    );
    assert_eq!(st, 200, "{v}");
    assert_eq!(content(&v), r#"{"a": [1, 2]}"#);
    // An enum and a bounded array.
    s.answer(r#"{"colors": ["red", "mauve", "blue", "green"]}"#);
    let schema = json!({"type": "object", "required": ["colors"], "additionalProperties": false,
        "properties": {"colors": {"type": "array", "maxItems": 2,
                                  "items": {"enum": ["red", "green", "blue"]}}}});
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        with_format(json!({"type": "json_schema", "json_schema": {"name": "c", "schema": schema}})),
    );
    assert_eq!(st, 200, "{v}");
    let p: Value = serde_json::from_str(&content(&v)).unwrap();
    let colors = p["colors"].as_array().unwrap();
    assert!(!colors.is_empty() && colors.len() <= 2, "{p}");
    assert_eq!(colors[0], "red");
    for c in colors {
        assert!(
            ["red", "green", "blue"].contains(&c.as_str().unwrap()),
            "{p}"
        );
    }
    // `text` asks for nothing.
    let (st, v) = post(
        &s,
        "/v1/chat/completions",
        with_format(json!({"type": "text"})),
    );
    assert_eq!((st, content(&v)), (200, s_answer(&s)));
}

/// `response_format` on `/v1/completions`: the same enforcement as in chat.
#[test]
fn completions_response_format_is_enforced() {
    let s = start(QWEN);
    let wanted = r#"{"name": "Bob", "age": "old"} and then some"#;
    s.answer(wanted);
    let body = |format: Value| {
        json!({"prompt": "Who?", "temperature": 0, "max_tokens": 100,
               "response_format": format})
    };
    let (st, v) = post(&s, "/v1/completions", body(json!({"type": "text"})));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["text"], wanted);
    let schema = json!({"type": "object", "required": ["name", "age"],
        "additionalProperties": false,
        "properties": {"name": {"type": "string"}, "age": {"type": "integer"}}});
    let (st, v) = post(
        &s,
        "/v1/completions",
        body(json!({"type": "json_schema", "json_schema": {"name": "p", "schema": schema}})),
    );
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    let p: Value = serde_json::from_str(text).unwrap_or_else(|e| panic!("{e}: {text}"));
    assert_eq!(p["name"], "Bob", "{text}");
    assert!(p["age"].is_i64(), "{text}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let (st, v) = post(&s, "/v1/completions", body(json!({"type": "json_object"})));
    assert_eq!(st, 200, "{v}");
    let text = v["choices"][0]["text"].as_str().unwrap();
    assert!(serde_json::from_str::<Value>(text).unwrap().is_object());
    let (st, v) = post(&s, "/v1/completions", body(json!({"type": "grammar"})));
    assert_eq!(
        (st, v["error"]["param"].clone()),
        (400, json!("response_format.type"))
    );
}

fn s_answer(s: &Server) -> String {
    String::from_utf8(s.script.lock().unwrap().clone()).unwrap()
}

#[test]
fn response_format_errors_name_the_field() {
    let s = start(QWEN);
    for (format, param) in [
        (json!({"type": "grammar"}), "response_format.type"),
        (
            json!({"type": "json_schema", "json_schema": 3}),
            "response_format.json_schema",
        ),
        (
            json!({"type": "json_schema", "json_schema": {"name": "x",
                   "schema": {"type": "object", "properties": {"a": {"type": "frob"}}}}}),
            "response_format",
        ),
    ] {
        let (st, v) = post(&s, "/v1/chat/completions", with_format(format.clone()));
        assert_eq!(st, 400, "{format}: {v}");
        assert_eq!(v["error"]["param"], param, "{format}: {v}");
    }
}

/// gpt-oss's chat template, as llama.cpp's sdist ships it.
fn harmony_template() -> String {
    let path = common::llamacpp_src().join("models/templates/openai-gpt-oss-120b.jinja");
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The reasoning, content and calls of a streamed answer, and its finish reasons;
/// asserts that no delta carries harmony's markers.
fn streamed_parts(chunks: &[Value]) -> (String, String, Vec<Value>, Vec<Value>) {
    let (mut reasoning, mut content, mut calls, mut finish) =
        (String::new(), String::new(), Vec::new(), Vec::new());
    for ch in chunks {
        let c = &ch["choices"][0];
        let d = &c["delta"];
        for part in [&d["reasoning_content"], &d["content"]] {
            assert!(!part.as_str().unwrap_or("").contains("<|"), "{ch}");
        }
        reasoning.push_str(d["reasoning_content"].as_str().unwrap_or(""));
        content.push_str(d["content"].as_str().unwrap_or(""));
        calls.extend(d["tool_calls"].as_array().cloned().unwrap_or_default());
        if !c["finish_reason"].is_null() {
            finish.push(c["finish_reason"].clone());
        }
    }
    (reasoning, content, calls, finish)
}

#[test]
fn harmony_channels_and_calls() {
    let s = start(&harmony_template());
    // The prompt: the tools in the developer message, an earlier call's reasoning
    // (`reasoning_content`) kept while its turn is open, the turn opened for the answer.
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "reasoning_content": "I should look it up.",
         "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ]);
    let prompt = prompt_with_weather_tool(&s, &history);
    assert!(prompt.contains("type get_weather = (_: {\n"), "{prompt}");
    assert!(
        prompt.contains(
            "<|start|>assistant<|channel|>analysis<|message|>I should look it up.<|end|>\
             <|start|>assistant to=functions.get_weather<|channel|>commentary json<|message|>\
             {\"city\": \"Paris\"}<|call|>"
        ),
        "{prompt}"
    );
    assert!(prompt.ends_with("<|start|>assistant"), "{prompt}");

    // Analysis and final: reasoning and content, streamed and not.
    s.answer(
        "<|channel|>analysis<|message|>Two and two.<|end|><|start|>assistant<|channel|>final\
         <|message|>Four.",
    );
    let (st, v) = post(&s, "/v1/chat/completions", ask(false));
    assert_eq!(st, 200, "{v}");
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "Two and two.", "{v}");
    assert_eq!(m["content"], "Four.", "{v}");
    assert_eq!(v["choices"][0]["finish_reason"], "stop");
    let chunks = stream(&s, ask(false));
    let (reasoning, said, calls, finish) = streamed_parts(&chunks);
    assert_eq!(
        (reasoning.as_str(), said.as_str()),
        ("Two and two.", "Four.")
    );
    assert!(calls.is_empty());
    assert_eq!(finish, [json!("stop")]);
    assert!(chunks.len() > 4, "{} chunks", chunks.len());

    // Reasoning, then a call on commentary.
    let call = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant\
                <|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>\
                {\"city\": \"Paris\"}";
    s.answer(call);
    let (_, v) = post(&s, "/v1/chat/completions", ask(true));
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert_eq!(c["message"]["content"], Value::Null, "{v}");
    assert_eq!(c["message"]["reasoning_content"], "Need the weather.");
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let (reasoning, said, calls, finish) = streamed_parts(&stream(&s, ask(true)));
    assert_eq!(
        (reasoning.as_str(), said.as_str()),
        ("Need the weather.", "")
    );
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(finish, [json!("tool_calls")]);
    // Offered no tools, the call is content, as written.
    let (_, v) = post(&s, "/v1/chat/completions", ask(false));
    let m = &v["choices"][0]["message"];
    assert_eq!(m["reasoning_content"], "Need the weather.");
    assert_eq!(
        m["content"].as_str(),
        call.split_once("<|end|>").map(|c| c.1),
        "{v}"
    );
    assert_eq!(v["choices"][0]["finish_reason"], "stop");

    // A forced call goes through the harmony grammar.
    s.answer(
        "<|channel|>commentary to=functions.get_time <|constrain|>json<|message|>\
         {\"zone\": \"UTC\"}",
    );
    let (st, v) = post(&s, "/v1/chat/completions", forced(json!("required")));
    assert_eq!(st, 200, "{v}");
    assert_eq!(
        forced_calls(&v),
        [("get_time".to_string(), json!({"zone": "UTC"}))]
    );

    // response_format: the value on the final channel, after analysis if wanted; a
    // model that breaks the schema is bent into it.
    let format = json!({"type": "json_schema", "json_schema": {"name": "n", "schema":
        {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"],
         "additionalProperties": false}}});
    s.answer(
        "<|channel|>analysis<|message|>Count.<|end|><|start|>assistant<|channel|>final\
         <|message|>{\"n\": \"four\"}",
    );
    let (st, v) = post(&s, "/v1/chat/completions", with_format(format.clone()));
    assert_eq!(st, 200, "{v}");
    assert_eq!(v["choices"][0]["message"]["reasoning_content"], "Count.");
    let answer: Value = serde_json::from_str(&content(&v)).unwrap_or_else(|e| panic!("{e}: {v}"));
    assert!(answer["n"].is_i64(), "{v}");
    // Without the grammar the same answer breaks the schema.
    let (_, v) = post(&s, "/v1/chat/completions", ask(false));
    assert_eq!(content(&v), "{\"n\": \"four\"}");
}

/// `reasoning_effort` and `chat_template_kwargs` reach the template: gpt-oss's writes
/// "Reasoning: {effort}" (default "medium") in its system message, and the stand-in's
/// tokens are the prompt's bytes, so the prompt's length tells which word it wrote.
#[test]
fn reasoning_effort_reaches_the_template() {
    let s = start(&harmony_template());
    s.answer("<|channel|>final<|message|>Four.");
    let prompt_len = |extra: Value| {
        let mut body = ask(false);
        for (k, v) in extra.as_object().unwrap() {
            body[k] = v.clone();
        }
        let (st, v) = post(&s, "/v1/chat/completions", body);
        assert_eq!(st, 200, "{v}");
        v["usage"]["prompt_tokens"].as_i64().unwrap()
    };
    let medium = prompt_len(json!({}));
    assert_eq!(prompt_len(json!({"reasoning_effort": "high"})), medium - 2);
    assert_eq!(prompt_len(json!({"reasoning_effort": "low"})), medium - 3);
    assert_eq!(
        prompt_len(json!({"chat_template_kwargs": {"reasoning_effort": "high"}})),
        medium - 2
    );
    // The field wins over the kwargs.
    assert_eq!(
        prompt_len(json!({"reasoning_effort": "low",
                          "chat_template_kwargs": {"reasoning_effort": "high"}})),
        medium - 3
    );
    let mut bad = ask(false);
    bad["reasoning_effort"] = json!("extreme");
    let (st, v) = post(&s, "/v1/chat/completions", bad);
    assert_eq!(st, 400, "{v}");
    assert_eq!(v["error"]["param"], "reasoning_effort", "{v}");
    let mut bad = ask(false);
    bad["chat_template_kwargs"] = json!("high");
    let (st, v) = post(&s, "/v1/chat/completions", bad);
    assert_eq!(st, 400, "{v}");
    // A variable the template never reads is refused by name, not ignored.
    let mut bad = ask(false);
    bad["chat_template_kwargs"] = json!({"enable_thinking": false});
    let (st, v) = post(&s, "/v1/chat/completions", bad);
    assert_eq!(st, 400, "{v}");
    assert_eq!(
        v["error"]["param"], "chat_template_kwargs.enable_thinking",
        "{v}"
    );
}

/// A chat template of llama.cpp's sdist (`models/templates/NAME.jinja`).
fn sdist_template(name: &str) -> String {
    let path = common::llamacpp_src().join(format!("models/templates/{name}.jinja"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The history of one call of the weather tool and its result.
fn call_history() -> Value {
    json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "call_1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "call_1", "content": "sunny, 21 C"},
    ])
}

/// An answer that reasons and calls the weather tool comes back as `reasoning` and
/// one call of get_weather for Paris, streamed and not; offered no tools, the call
/// stays in the content.
fn reasoned_call(s: &Server, answer: &str, reasoning: &str) {
    s.answer(answer);
    let (st, v) = post(s, "/v1/chat/completions", ask(true));
    assert_eq!(st, 200, "{v}");
    let c = &v["choices"][0];
    assert_eq!(c["finish_reason"], "tool_calls", "{v}");
    assert_eq!(c["message"]["reasoning_content"], reasoning, "{v}");
    assert!(
        c["message"]["content"]
            .as_str()
            .unwrap_or("")
            .trim()
            .is_empty(),
        "{v}"
    );
    let calls = c["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1, "{v}");
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    let args: Value =
        serde_json::from_str(calls[0]["function"]["arguments"].as_str().unwrap()).unwrap();
    assert_eq!(args, json!({"city": "Paris"}));
    let (r, said, calls, finish) = streamed_parts(&stream(s, ask(true)));
    assert_eq!(r, reasoning);
    assert!(said.trim().is_empty(), "{said}");
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(finish, [json!("tool_calls")]);
    let (_, v) = post(s, "/v1/chat/completions", ask(false));
    assert_eq!(v["choices"][0]["finish_reason"], "stop", "{v}");
    assert!(
        v["choices"][0]["message"]["content"]
            .as_str()
            .unwrap_or("")
            .contains("get_weather"),
        "{v}"
    );
}

/// Forced calls (named, and "required") come out as calls of the offered functions,
/// whatever the model wanted to write.
fn forced_in_syntax(s: &Server, wanted: &str) {
    s.answer(wanted);
    for choice in [
        json!({"type": "function", "function": {"name": "get_time"}}),
        json!("required"),
    ] {
        let (st, v) = post(s, "/v1/chat/completions", forced(choice.clone()));
        assert_eq!(st, 200, "{v}");
        let calls = forced_calls(&v);
        assert!(!calls.is_empty(), "{v}");
        if choice != json!("required") {
            assert_eq!(calls.len(), 1, "{v}");
            assert_eq!(calls[0].0, "get_time", "{v}");
        }
    }
}

/// Gemma 4's template (llama.cpp's sdist): the tools, calls and results in its own
/// syntax in the prompt, thinking on unless `chat_template_kwargs` switch it off, the
/// thought channel and `<|tool_call>` calls parsed back, forced calls.
#[test]
fn gemma4_template_through_the_server() {
    let s = start(&sdist_template("google-gemma-4-31B-it"));
    let prompt = prompt_with_weather_tool(&s, &call_history());
    assert!(
        prompt.starts_with("<|turn>system\n<|think|>\n<|tool>declaration:get_weather{"),
        "{prompt}"
    );
    assert!(
        prompt.ends_with(
            "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>}<tool_call|><|tool_response>\
             response:get_weather{value:<|\"|>sunny, 21 C<|\"|>}<tool_response|>"
        ),
        "{prompt}"
    );
    s.answer("<|channel>thought\nTwo and two.<channel|>Four.");
    let prompt_len = |thinking: bool| {
        let mut body = ask(false);
        body["chat_template_kwargs"] = json!({ "enable_thinking": thinking });
        let (st, v) = post(&s, "/v1/chat/completions", body);
        assert_eq!(st, 200, "{v}");
        assert_eq!(
            v["choices"][0]["message"]["reasoning_content"],
            "\nTwo and two."
        );
        assert_eq!(v["choices"][0]["message"]["content"], "Four.");
        v["usage"]["prompt_tokens"].as_i64().unwrap()
    };
    // Off: no `<|turn>system\n<|think|>\n<turn|>\n` (32 bytes), an empty thought
    // channel after the model turn (28).
    assert_eq!(prompt_len(false), prompt_len(true) - 4);
    reasoned_call(
        &s,
        "<|channel>thought\nNeed the weather.<channel|><|tool_call>call:get_weather{city:\
         <|\"|>Paris<|\"|>}<tool_call|>",
        "\nNeed the weather.",
    );
    forced_in_syntax(
        &s,
        "<|tool_call>call:get_weather{city:<|\"|>Paris<|\"|>,days:2}<tool_call|>",
    );
}

/// Qwen 3.5's template (llama.cpp's sdist): the prompt opens the reasoning, XML calls
/// parsed back with their arguments typed by the schema, forced calls.
#[test]
fn qwen35_template_through_the_server() {
    let s = start(&sdist_template("Qwen3.5-4B"));
    let prompt = prompt_with_weather_tool(&s, &call_history());
    assert!(
        prompt.contains(
            "<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n</parameter>\n\
             </function>\n</tool_call><|im_end|>\n<|im_start|>user\n<tool_response>\nsunny, 21 C\n\
             </tool_response><|im_end|>\n"
        ),
        "{prompt}"
    );
    assert!(
        prompt.ends_with("<|im_start|>assistant\n<think>\n"),
        "{prompt}"
    );
    reasoned_call(
        &s,
        "Need the weather.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\n\
         Paris\n</parameter>\n</function>\n</tool_call>",
        "Need the weather.\n",
    );
    forced_in_syntax(
        &s,
        "Hmm.\n</think>\n\n<tool_call>\n<function=get_weather>\n<parameter=city>\nParis\n\
         </parameter>\n<parameter=days>\n2\n</parameter>\n</function>\n</tool_call>",
    );
}
