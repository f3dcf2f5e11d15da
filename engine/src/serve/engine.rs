//! Glue between a loaded model and the paged engine: building an [`LLMEngine`] with its
//! KV cache and scheduler, and the tokenizer / chat-template side the server needs.

use std::sync::{Arc, OnceLock};

use flint_loader::chat::ChatTemplate;
use flint_loader::tokenizer::Tokenizer;

use crate::kv::{KvSizing, PagedModel, DEFAULT_BLOCK_SIZE};
use crate::model::LoadedModel;
use crate::model::ModelError;
use crate::sample::GrammarVocab;
use crate::sched::{Detokenizer, LLMEngine};
use crate::sched::{Scheduler, SchedulerConfig};
use crate::serve::tools::{self, ChatSyntax};
use crate::serve::TemplateVars;
use crate::serve::{ChatMessage, ChatPrompt, TextSide};

/// Default KV cache budget when `--kv-memory` is not given.
pub const DEFAULT_KV_MEMORY: u64 = 1 << 30;

/// Engine settings.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct EngineSettings {
    /// Most requests running at once.
    pub max_num_seqs: usize,
    /// Token budget of one step.
    pub max_num_batched_tokens: usize,
    /// Longest sequence; `None` = the model's context length.
    pub max_model_len: Option<usize>,
    /// KV cache bytes.
    pub kv_memory: u64,
    /// Tokens per KV block.
    pub block_size: usize,
    /// Whether requests reuse the cached KV blocks of a common prefix.
    pub prefix_caching: bool,
    /// Whether the KV pool's memory is faulted in when the engine is built
    /// ([`PagedModel::make_kv_resident`]) rather than by the first steps to reach each
    /// block: `flint serve` and `flint bench` do; the default (tests, one-shot tools) does not.
    pub resident_kv: bool,
}

impl Default for EngineSettings {
    fn default() -> Self {
        Self {
            max_num_seqs: 16,
            max_num_batched_tokens: 512,
            max_model_len: None,
            kv_memory: DEFAULT_KV_MEMORY,
            block_size: DEFAULT_BLOCK_SIZE,
            prefix_caching: true,
            resident_kv: false,
        }
    }
}

/// Turns tokens into bytes with the model's tokenizer. Control tokens render as
/// nothing, except the markers of reasoning and tool calls ([`tools::MARKERS`]), which
/// the output parser reads.
#[derive(Debug, Clone)]
pub struct TokenizerDetok {
    tokenizer: Arc<Tokenizer>,
    markers: Vec<u32>,
}

impl TokenizerDetok {
    /// The detokenizer of `tokenizer`.
    pub fn new(tokenizer: Arc<Tokenizer>) -> Self {
        let markers = tools::MARKERS
            .iter()
            .filter_map(|m| tokenizer.token_id(m))
            .collect();
        Self { tokenizer, markers }
    }
}

impl Detokenizer for TokenizerDetok {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        let special = self.markers.contains(&id);
        self.tokenizer.token_to_piece(id, special).into_owned()
    }
}

/// The engine over a loaded model, and the `max_model_len` it enforces.
pub fn build_engine(
    loaded: LoadedModel,
    settings: &EngineSettings,
) -> Result<(LLMEngine<PagedModel>, Arc<Tokenizer>, usize), ModelError> {
    let context = loaded.device_model.spec().context_length;
    let max_model_len = settings.max_model_len.unwrap_or(context).min(context);
    let tokenizer = Arc::new(loaded.tokenizer);
    let (mut paged, mut kv) = PagedModel::new(
        loaded.device_model,
        &KvSizing {
            memory_bytes: settings.kv_memory,
            block_size: settings.block_size,
            max_num_seqs: settings.max_num_seqs,
            max_num_batched_tokens: settings.max_num_batched_tokens,
        },
    )?;
    if settings.resident_kv {
        paged.make_kv_resident();
    }
    kv.set_prefix_caching(settings.prefix_caching);
    // A sequence can never grow past what the full-attention pool holds.
    let pool_tokens = (0..kv.num_groups())
        .filter(|&g| {
            kv.group_specs()
                .nth(g)
                .is_some_and(|s| s.kind == crate::kv::GroupKind::Full)
        })
        .map(|g| kv.num_blocks(g) * kv.block_size())
        .min()
        .unwrap_or(usize::MAX);
    let max_model_len = max_model_len.min(pool_tokens);
    let scheduler = Scheduler::new(
        SchedulerConfig {
            max_num_seqs: settings.max_num_seqs,
            max_num_batched_tokens: settings.max_num_batched_tokens,
            max_model_len,
        },
        kv,
    );
    let engine = LLMEngine::new(
        paged,
        scheduler,
        Some(Box::new(TokenizerDetok::new(tokenizer.clone()))),
    );
    Ok((engine, tokenizer, max_model_len))
}

/// The server's text side: the tokenizer and the chat template of a model.
#[derive(Debug)]
pub struct ModelText {
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    template_error: Option<String>,
    syntax: ChatSyntax,
    grammar: OnceLock<Result<Arc<GrammarVocab>, String>>,
}

impl ModelText {
    /// The text side; a model without a usable chat template can still serve
    /// completions, and chat requests get the template error.
    pub fn new(tokenizer: Arc<Tokenizer>, template: Result<ChatTemplate, String>) -> Self {
        match template {
            Ok(t) => Self {
                tokenizer,
                syntax: ChatSyntax::detect(t.source()),
                template: Some(t),
                template_error: None,
                grammar: OnceLock::new(),
            },
            Err(e) => Self {
                tokenizer,
                template: None,
                template_error: Some(e),
                syntax: ChatSyntax::default(),
                grammar: OnceLock::new(),
            },
        }
    }
}

/// Renders `messages` (and the offered `tools`) with `template`, ready for generation:
/// the prompt text, and whether it leaves the model inside its reasoning.
pub fn render_chat(
    template: &ChatTemplate,
    messages: &[ChatMessage],
    tools: Option<&[serde_json::Value]>,
    vars: &TemplateVars,
) -> Result<(String, bool), String> {
    let msgs: Vec<serde_json::Value> = messages.iter().map(ChatMessage::to_template).collect();
    let text = template
        .render_json_with(&msgs, tools, true, vars)
        .map_err(|e| e.to_string())?;
    let opens = ChatSyntax::detect(template.source())
        .reasoning
        .is_some_and(|th| tools::prompt_opens_reasoning(&text, th));
    Ok((text, opens))
}

impl TextSide for ModelText {
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(self.tokenizer.tokenize(text, true, false))
    }

    fn encode_chat(
        &self,
        messages: &[ChatMessage],
        tools: Option<&[serde_json::Value]>,
        vars: &TemplateVars,
    ) -> Result<ChatPrompt, String> {
        let Some(t) = &self.template else {
            return Err(self
                .template_error
                .clone()
                .unwrap_or_else(|| "the model has no chat template".into()));
        };
        let (text, opens_reasoning) = render_chat(t, messages, tools, vars)?;
        // The template writes BOS itself; its special-token text must become tokens.
        Ok(ChatPrompt {
            tokens: self.tokenizer.tokenize(&text, false, true),
            opens_reasoning,
        })
    }

    fn chat_syntax(&self) -> ChatSyntax {
        self.syntax
    }

    fn template_reads(&self, name: &str) -> bool {
        self.template
            .as_ref()
            .is_some_and(|t| t.source().contains(name))
    }

    fn grammar_vocab(&self) -> Result<Arc<GrammarVocab>, String> {
        self.grammar
            .get_or_init(|| {
                // What each token adds to generated text, as the engine's detokenizer
                // writes it: control tokens add nothing, except the markers of
                // reasoning and tool calls, which a forced call's grammar writes.
                let detok = TokenizerDetok::new(Arc::clone(&self.tokenizer));
                let tokens: Vec<Option<Vec<u8>>> = (0..self.tokenizer.n_vocab())
                    .map(|id| {
                        let b = detok.token_bytes(id as u32);
                        (!b.is_empty()).then_some(b)
                    })
                    .collect();
                let eog: Vec<u32> = self.tokenizer.eog_ids().collect();
                GrammarVocab::new(&tokens, &eog)
                    .map(Arc::new)
                    .map_err(|e| e.to_string())
            })
            .clone()
    }

    fn eog_ids(&self) -> Vec<u32> {
        self.tokenizer.eog_ids().collect()
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer.token_to_piece(id, true).into_owned()
    }
}
