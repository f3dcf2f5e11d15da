//! Glue between a loaded model and the paged engine: building an [`LLMEngine`] with its
//! KV cache and scheduler, and the tokenizer / chat-template side the server needs.

use std::sync::Arc;

use flint_loader::chat::{ChatMessage as LoaderChatMessage, ChatTemplate};
use flint_loader::tokenizer::Tokenizer;

use crate::kv::{KvSizing, PagedModel, DEFAULT_BLOCK_SIZE};
use crate::model::LoadedModel;
use crate::model::ModelError;
use crate::sched::{Detokenizer, LLMEngine};
use crate::sched::{Scheduler, SchedulerConfig};
use crate::serve::{ChatMessage, TextSide};

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
        }
    }
}

/// Turns tokens into bytes with the model's tokenizer (control tokens render as nothing).
#[derive(Debug, Clone)]
pub struct TokenizerDetok(pub Arc<Tokenizer>);

impl Detokenizer for TokenizerDetok {
    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.0.token_to_piece(id, false).into_owned()
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
    let (paged, mut kv) = PagedModel::new(
        loaded.device_model,
        &KvSizing {
            memory_bytes: settings.kv_memory,
            block_size: settings.block_size,
            max_num_seqs: settings.max_num_seqs,
            max_num_batched_tokens: settings.max_num_batched_tokens,
        },
    )?;
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
        Some(Box::new(TokenizerDetok(tokenizer.clone()))),
    );
    Ok((engine, tokenizer, max_model_len))
}

/// The server's text side: the tokenizer and the chat template of a model.
#[derive(Debug)]
pub struct ModelText {
    tokenizer: Arc<Tokenizer>,
    template: Option<ChatTemplate>,
    template_error: Option<String>,
}

impl ModelText {
    /// The text side; a model without a usable chat template can still serve
    /// completions, and chat requests get the template error.
    pub fn new(tokenizer: Arc<Tokenizer>, template: Result<ChatTemplate, String>) -> Self {
        match template {
            Ok(t) => Self {
                tokenizer,
                template: Some(t),
                template_error: None,
            },
            Err(e) => Self {
                tokenizer,
                template: None,
                template_error: Some(e),
            },
        }
    }
}

impl TextSide for ModelText {
    fn encode_prompt(&self, text: &str) -> Result<Vec<u32>, String> {
        Ok(self.tokenizer.tokenize(text, true, false))
    }

    fn encode_chat(&self, messages: &[ChatMessage]) -> Result<Vec<u32>, String> {
        let Some(t) = &self.template else {
            return Err(self
                .template_error
                .clone()
                .unwrap_or_else(|| "the model has no chat template".into()));
        };
        let msgs: Vec<LoaderChatMessage> = messages
            .iter()
            .map(|m| LoaderChatMessage::new(m.role.clone(), m.content.clone()))
            .collect();
        let text = t.render(&msgs, true).map_err(|e| e.to_string())?;
        // The template writes BOS itself; its special-token text must become tokens.
        Ok(self.tokenizer.tokenize(&text, false, true))
    }

    fn eog_ids(&self) -> Vec<u32> {
        self.tokenizer.eog_ids().collect()
    }

    fn token_bytes(&self, id: u32) -> Vec<u8> {
        self.tokenizer.token_to_piece(id, true).into_owned()
    }
}
