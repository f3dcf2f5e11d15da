//! A simple generation loop for one sequence on the device forward (`flint run`, the
//! gates): prefill the prompt in chunks, then sample token by token.

use std::time::{Duration, Instant};

use crate::forward::Session;
use crate::model::ModelError;
use crate::sample::{FinishReason, Sampler, StopConditions};

/// Prompt tokens per prefill step (bounds the activation memory of one step).
pub const PREFILL_CHUNK: usize = 512;

/// Timings of a generation.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GenerateStats {
    /// Prompt tokens fed.
    pub prompt_tokens: usize,
    /// Time spent on the prompt (up to the first sampled token's logits).
    pub prompt_time: Duration,
    /// Tokens generated.
    pub generated: usize,
    /// Time spent generating after the prompt.
    pub gen_time: Duration,
}

impl GenerateStats {
    /// Prompt tokens per second.
    pub fn prompt_tok_s(&self) -> f64 {
        self.prompt_tokens as f64 / self.prompt_time.as_secs_f64().max(1e-9)
    }

    /// Generated tokens per second (the first token's sampling counts as generation;
    /// its logits came from the prompt step).
    pub fn gen_tok_s(&self) -> f64 {
        self.generated as f64 / self.gen_time.as_secs_f64().max(1e-9)
    }
}

/// The result of [`generate`].
#[derive(Clone, Debug, PartialEq)]
pub struct Generation {
    /// The generated token ids (an end-of-generation token is not included).
    pub tokens: Vec<u32>,
    /// Why it stopped.
    pub finish: FinishReason,
    /// Timings.
    pub stats: GenerateStats,
}

/// What the caller's token callback wants next.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Flow {
    /// Keep generating.
    Continue,
    /// Stop now (e.g. a stop string appeared in the text).
    Stop,
}

/// Feeds `prompt` to an empty `session` and samples up to `max_new` tokens. Each new
/// token is handed to `on_token` (to stream its text) before the next step;
/// end-of-generation ids in `stop` end the loop without being handed over.
pub fn generate(
    session: &mut Session<'_>,
    prompt: &[u32],
    max_new: usize,
    sampler: &mut Sampler,
    stop: &StopConditions,
    on_token: &mut dyn FnMut(u32) -> Flow,
) -> Result<Generation, ModelError> {
    if prompt.is_empty() {
        return Err(ModelError::new("the prompt has no tokens"));
    }
    let mut stats = GenerateStats {
        prompt_tokens: prompt.len(),
        ..GenerateStats::default()
    };
    let t0 = Instant::now();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(PREFILL_CHUNK) {
        logits = session.feed(chunk, false)?;
    }
    stats.prompt_time = t0.elapsed();
    let t1 = Instant::now();
    let mut history: Vec<u32> = prompt.to_vec();
    let mut tokens = Vec::new();
    let mut finish = FinishReason::Length;
    while tokens.len() < max_new {
        let id = sampler.sample(&logits, &history);
        if stop.is_eog(id) {
            finish = FinishReason::Eos;
            break;
        }
        tokens.push(id);
        history.push(id);
        if on_token(id) == Flow::Stop {
            finish = FinishReason::Stop;
            break;
        }
        if tokens.len() == max_new {
            break;
        }
        logits = session.feed(&[id], false)?;
    }
    stats.generated = tokens.len();
    stats.gen_time = t1.elapsed();
    Ok(Generation {
        tokens,
        finish,
        stats,
    })
}
