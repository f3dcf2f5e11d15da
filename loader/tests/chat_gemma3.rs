//! The Gemma 3 270M file has no `tokenizer.chat_template`: the built-in Gemma template is
//! selected, and its rendering tokenizes (with special parsing) into the turn tokens.

use flint_loader::chat::{ChatMessage, ChatTemplate};
use flint_loader::gguf::GgufFile;
use flint_loader::tokenizer::Tokenizer;

#[test]
fn gemma3_file_uses_builtin_template() {
    let path = flint_loader::fetch::default_model_path().expect("default model");
    let f = GgufFile::open(&path).expect("open");
    assert!(!f.contains_key("tokenizer.chat_template"));
    let tok = Tokenizer::from_gguf(&f).expect("tokenizer");
    let t = ChatTemplate::from_gguf(&f, &tok).expect("template");
    assert!(t.is_builtin());
    let prompt = t
        .render(&[ChatMessage::new("user", "Hello world")], true)
        .expect("render");
    assert_eq!(
        prompt,
        "<bos><start_of_turn>user\nHello world<end_of_turn>\n<start_of_turn>model\n"
    );
    let ids = tok.tokenize(&prompt, false, true);
    let model = tok.tokenize("model", false, false);
    let user = tok.tokenize("user", false, false);
    let mut want = vec![2, 105];
    want.extend(&user);
    want.extend([107, 9259, 1902, 106, 107, 105]);
    want.extend(&model);
    want.push(107);
    assert_eq!(ids, want);
}
