//! Chat template rendering: the built-in Gemma template, HF-style templates with Python
//! string methods, `raise_exception`, and the selection rules.

use flint_loader::chat::{ChatError, ChatMessage, ChatTemplate};

fn msgs(list: &[(&str, &str)]) -> Vec<ChatMessage> {
    list.iter().map(|(r, c)| ChatMessage::new(*r, *c)).collect()
}

#[test]
fn gemma_builtin_renders_turns() {
    let t = ChatTemplate::gemma("<bos>", "<eos>");
    assert!(t.is_builtin());
    let out = t
        .render(
            &msgs(&[
                ("system", "Be brief."),
                ("user", " Hi there "),
                ("assistant", "Hello!"),
                ("user", "Bye"),
            ]),
            true,
        )
        .expect("render");
    assert_eq!(
        out,
        "<bos><start_of_turn>user\nBe brief.\n\nHi there<end_of_turn>\n\
         <start_of_turn>model\nHello!<end_of_turn>\n\
         <start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n"
    );
    let no_prompt = t.render(&msgs(&[("user", "x")]), false).expect("render");
    assert_eq!(no_prompt, "<bos><start_of_turn>user\nx<end_of_turn>\n");
}

#[test]
fn gemma_builtin_rejects_bad_alternation() {
    let t = ChatTemplate::gemma("<bos>", "<eos>");
    let e = t
        .render(&msgs(&[("user", "a"), ("user", "b")]), true)
        .expect_err("must alternate");
    assert!(matches!(e, ChatError::Render(_)));
    assert!(e.to_string().contains("alternate"), "{e}");
}

#[test]
fn chatml_style_template_with_python_methods() {
    let src = "{% for m in messages %}{% if m.role == 'system' and not m.content.strip() %}{% continue %}{% endif %}\
<|im_start|>{{ m.role }}\n{{ m.content.strip() }}<|im_end|>\n{% endfor %}\
{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}{{ messages | length | tojson }}";
    let t = ChatTemplate::new(src, "", "<|im_end|>").expect("compile");
    let out = t
        .render(&msgs(&[("system", "  "), ("user", "  hello  ")]), true)
        .expect("render");
    assert_eq!(
        out,
        "<|im_start|>user\nhello<|im_end|>\n<|im_start|>assistant\n2"
    );
    let starts = ChatTemplate::new(
        "{% if messages[0].content.startswith('Q:') %}yes{% else %}no{% endif %}{{ eos_token }}",
        "<s>",
        "</s>",
    )
    .expect("compile");
    assert_eq!(
        starts
            .render(&msgs(&[("user", "Q: x")]), false)
            .expect("render"),
        "yes</s>"
    );
}

#[test]
fn selection_and_errors() {
    let g = ChatTemplate::select(None, "gemma3", "<bos>", "<eos>").expect("gemma fallback");
    assert!(g.is_builtin());
    let own =
        ChatTemplate::select(Some("{{ bos_token }}x"), "gemma3", "<bos>", "<eos>").expect("own");
    assert!(!own.is_builtin());
    assert_eq!(own.render(&[], false).expect("render"), "<bos>x");
    let e = ChatTemplate::select(None, "llama", "<s>", "</s>").expect_err("no template");
    assert!(
        e.to_string().contains("tokenizer.chat_template") && e.to_string().contains("llama"),
        "{e}"
    );
    let e = ChatTemplate::new("{% for %}", "", "").expect_err("syntax");
    assert!(matches!(e, ChatError::Compile(_)), "{e}");
    let e = ChatTemplate::new("{{ raise_exception('nope') }}", "", "")
        .expect("compile")
        .render(&[], false)
        .expect_err("raise");
    assert!(e.to_string().contains("nope"), "{e}");
}
