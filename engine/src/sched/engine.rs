//! `LLMEngine`: requests in, tokens and text out, one batched step at a time.
//!
//! The engine owns the [`Scheduler`] (and through it the KV cache manager), a model
//! that computes one batched step ([`StepModel`]), and per request its sampler, stop
//! conditions and incremental detokenizer. Callers `add_request`, then call `step`
//! until `has_unfinished` is false, reading the [`RequestOutput`]s each step returns;
//! `abort` drops a request and returns its KV blocks at once.

use std::collections::HashMap;

use crate::kv::RequestId;
use crate::model::ModelError;
use crate::sample::{
    FinishReason, Sampler, SamplerConfig, StopConditions, StopScan, TokenLogprobs,
};
use crate::sched::{AdmissionError, Scheduler, SchedulerOutput};

/// One request's share of a batched step, as the model sees it.
#[derive(Clone, Copy, Debug)]
pub struct StepSeq<'a> {
    /// The request.
    pub id: RequestId,
    /// Tokens to compute, at positions `start ..`.
    pub tokens: &'a [u32],
    /// Position of `tokens[0]`.
    pub start: usize,
    /// Whether the logits of the last token are wanted.
    pub sample: bool,
}

/// A model that computes one batched step over the paged KV cache.
pub trait StepModel {
    /// Vocabulary size (length of one row of logits).
    fn vocab_size(&self) -> usize;

    /// Computes every token of `seqs` in one batch, reading and writing KV through the
    /// block tables that `kv` holds for each request (one per group), and returns the
    /// logits of the last token of each sequence with `sample` set, concatenated in
    /// batch order (`[n_sample, vocab]`).
    fn step(
        &mut self,
        seqs: &[StepSeq<'_>],
        kv: &crate::kv::KvCacheManager,
    ) -> Result<Vec<f32>, ModelError>;

    /// The device the model computes on, for [`LLMEngine::in_session`]; `None` (the
    /// default) for a model without one.
    fn device(&self) -> Option<flint_hal::DeviceRef> {
        None
    }
}

/// Turns token ids into text incrementally.
pub trait Detokenizer: Send {
    /// The text bytes of one token (byte tokens give their byte; specials may give none).
    fn token_bytes(&self, id: u32) -> Vec<u8>;
}

/// Sampling and stopping parameters of one request.
#[derive(Clone, Debug)]
pub struct RequestParams {
    /// Sampler settings (temperature, top-k/p, min-p, penalties, seed).
    pub sampler: SamplerConfig,
    /// Most tokens to generate.
    pub max_tokens: usize,
    /// EOG ids and stop strings.
    pub stop: StopConditions,
}

/// What one step produced for one request.
#[derive(Clone, Debug, PartialEq)]
pub struct RequestOutput {
    /// The request.
    pub id: RequestId,
    /// The token generated this step, if any.
    pub token: Option<u32>,
    /// Text that became final this step (never a split UTF-8 character, never the start
    /// of a possible stop string).
    pub text: String,
    /// Set when the request finished this step.
    pub finished: Option<FinishReason>,
    /// Tokens in its prompt.
    pub prompt_tokens: usize,
    /// Of those, tokens found in the prefix cache at its last admission.
    pub cached_tokens: usize,
    /// Tokens generated so far.
    pub completion_tokens: usize,
    /// The log-probabilities of `token`, when its sampler was asked for them
    /// ([`SamplerConfig::logprobs`]).
    pub logprobs: Option<TokenLogprobs>,
}

/// What the last step computed (for benchmarks and metrics).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct StepStats {
    /// Tokens in the batch.
    pub num_tokens: usize,
    /// Requests in the batch.
    pub num_seqs: usize,
    /// True when the batch held any prompt token.
    pub has_prefill: bool,
    /// Tokens sampled.
    pub sampled: usize,
}

/// An error of the engine.
#[derive(Debug, thiserror::Error)]
pub enum EngineError {
    /// The request was refused at admission.
    #[error("request refused: {0}")]
    Admission(#[from] AdmissionError),
    /// The model failed while computing a step.
    #[error("forward failed: {0}")]
    Model(#[from] ModelError),
}

#[derive(Debug)]
struct Live {
    params: RequestParams,
    sampler: Sampler,
    /// Bytes decoded so far (all of them), and how many were emitted as text.
    bytes: Vec<u8>,
    emitted: usize,
    /// Text of `bytes[..valid]` (the longest valid UTF-8 prefix).
    text: String,
    prompt_tokens: usize,
}

/// The engine: scheduler, model, samplers.
pub struct LLMEngine<M: StepModel> {
    model: M,
    scheduler: Scheduler,
    detok: Option<Box<dyn Detokenizer>>,
    live: HashMap<RequestId, Live>,
    next_id: RequestId,
    last: StepStats,
}

impl<M: StepModel> std::fmt::Debug for LLMEngine<M> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LLMEngine")
            .field("scheduler", &self.scheduler)
            .field("live", &self.live.len())
            .finish_non_exhaustive()
    }
}

impl<M: StepModel> LLMEngine<M> {
    /// An engine over `model` and `scheduler`; `detok` turns tokens into text (without
    /// one, outputs carry tokens only).
    pub fn new(model: M, scheduler: Scheduler, detok: Option<Box<dyn Detokenizer>>) -> Self {
        Self {
            model,
            scheduler,
            detok,
            live: HashMap::new(),
            next_id: 0,
            last: StepStats::default(),
        }
    }

    /// The scheduler (for metrics: queue depth, KV blocks in use).
    pub fn scheduler(&self) -> &Scheduler {
        &self.scheduler
    }

    /// The scheduler, for changes outside a step.
    pub fn scheduler_mut(&mut self) -> &mut Scheduler {
        &mut self.scheduler
    }

    /// The model.
    pub fn model(&self) -> &M {
        &self.model
    }

    /// Runs `f` on this engine inside its device's session
    /// ([`Device::run_session`](flint_hal::Device::run_session)), so that the steps `f`
    /// takes start and end without a hand-off between threads. `f` should return when
    /// there is nothing left to compute, not wait for new requests inside.
    pub fn in_session<R: Send>(&mut self, f: impl FnOnce(&mut Self) -> R + Send) -> R
    where
        Self: Send,
    {
        let Some(dev) = self.model.device() else {
            return f(self);
        };
        let mut f = Some(f);
        let mut out = None;
        dev.run_session(&mut || {
            if let Some(f) = f.take() {
                out = Some(f(self));
            }
        });
        match (out, f) {
            (Some(r), _) => r,
            // A device that did not run the body: run it here.
            (None, Some(f)) => f(self),
            (None, None) => unreachable!("the session body ran without a result"),
        }
    }

    /// What the last call of [`step`](Self::step) computed.
    pub fn last_step(&self) -> StepStats {
        self.last
    }

    /// Queues a tokenized prompt; returns its id. A prompt longer than the model allows
    /// is refused at once, naming both numbers.
    pub fn add_request(
        &mut self,
        prompt: Vec<u32>,
        params: RequestParams,
    ) -> Result<RequestId, EngineError> {
        let id = self.next_id;
        let prompt_tokens = prompt.len();
        self.scheduler.add(id, prompt)?;
        self.next_id += 1;
        self.live.insert(
            id,
            Live {
                sampler: Sampler::new(params.sampler.clone()),
                params,
                bytes: Vec::new(),
                emitted: 0,
                text: String::new(),
                prompt_tokens,
            },
        );
        Ok(id)
    }

    /// Drops a request wherever it is; its KV blocks go back to the pools at once.
    /// Returns false for an unknown (or already finished) id.
    pub fn abort(&mut self, id: RequestId) -> bool {
        let known = self.live.remove(&id).is_some();
        self.scheduler.remove(id);
        known
    }

    /// True while any request is queued or running.
    pub fn has_unfinished(&self) -> bool {
        !self.live.is_empty()
    }

    /// Requests queued or running.
    pub fn num_unfinished(&self) -> usize {
        self.live.len()
    }

    /// Runs one step: schedules, computes the batch, samples, detokenizes, finishes.
    /// Returns one output per request that produced a token this step.
    pub fn step(&mut self) -> Result<Vec<RequestOutput>, EngineError> {
        let plan: SchedulerOutput = self.scheduler.schedule();
        self.last = StepStats {
            num_tokens: plan.num_tokens(),
            num_seqs: plan.seqs.len(),
            has_prefill: plan.has_prefill(),
            sampled: plan.seqs.iter().filter(|q| q.sample).count(),
        };
        let mut outputs = Vec::new();
        for &id in &plan.capacity_exceeded {
            // Its sequence no longer fits in the whole KV cache: finish it as a length
            // limit, flushing the text it has.
            let completion_tokens = self.scheduler.get(id).map_or(0, |s| s.output().len());
            let cached_tokens = self.scheduler.get(id).map_or(0, |s| s.num_cached);
            if let Some(l) = self.live.remove(&id) {
                outputs.push(RequestOutput {
                    id,
                    token: None,
                    text: l.text.get(l.emitted..).unwrap_or("").to_string(),
                    finished: Some(FinishReason::Length),
                    prompt_tokens: l.prompt_tokens,
                    cached_tokens,
                    completion_tokens,
                    logprobs: None,
                });
            }
            self.scheduler.remove(id);
        }
        if plan.seqs.is_empty() {
            return Ok(outputs);
        }
        let seqs: Vec<StepSeq<'_>> = plan
            .seqs
            .iter()
            .map(|q| StepSeq {
                id: q.id,
                tokens: &q.tokens,
                start: q.start,
                sample: q.sample,
            })
            .collect();
        let logits = self.model.step(&seqs, self.scheduler.kv())?;
        let vocab = self.model.vocab_size();
        let n_sample = plan.seqs.iter().filter(|q| q.sample).count();
        if logits.len() != n_sample * vocab {
            return Err(EngineError::Model(ModelError::new(format!(
                "model returned {} logits for {n_sample} rows of {vocab}",
                logits.len()
            ))));
        }
        let mut sampled = Vec::with_capacity(n_sample);
        let mut sampled_logprobs: HashMap<RequestId, TokenLogprobs> = HashMap::new();
        for (row, q) in plan.seqs.iter().filter(|q| q.sample).enumerate() {
            let history = self
                .scheduler
                .get(q.id)
                .map(|s| s.output().to_vec())
                .unwrap_or_default();
            let t = match self.live.get_mut(&q.id) {
                Some(l) => {
                    let (t, lp) = l
                        .sampler
                        .sample_with_logprobs(&logits[row * vocab..(row + 1) * vocab], &history);
                    if let Some(lp) = lp {
                        sampled_logprobs.insert(q.id, lp);
                    }
                    t
                }
                None => 0,
            };
            sampled.push(t);
        }
        let grew = self.scheduler.update(&plan, &sampled);
        let max_model_len = self.scheduler.config().max_model_len;
        for id in grew {
            let Some(state) = self.scheduler.get(id) else {
                continue;
            };
            let token = state.tokens.last().copied();
            let n_out = state.output().len();
            let cached_tokens = state.num_cached;
            let total = state.tokens.len();
            let Some(l) = self.live.get_mut(&id) else {
                continue;
            };
            let mut finished = None;
            let is_eog = token.is_some_and(|t| l.params.stop.is_eog(t));
            if let (Some(t), Some(d), false) = (token, self.detok.as_ref(), is_eog) {
                l.bytes.extend(d.token_bytes(t));
                // Keep the longest valid UTF-8 prefix as text.
                let valid = match std::str::from_utf8(&l.bytes) {
                    Ok(_) => l.bytes.len(),
                    Err(e) => e.valid_up_to(),
                };
                if valid > l.text.len() {
                    l.text = String::from_utf8_lossy(&l.bytes[..valid]).into_owned();
                }
            }
            let mut end = match l.params.stop.scan(&l.text) {
                StopScan::Stop(at) => {
                    finished = Some(FinishReason::Stop);
                    at
                }
                StopScan::Safe(n) => n,
            };
            if finished.is_none() && is_eog {
                finished = Some(FinishReason::Eos);
            }
            if finished.is_none() && (n_out >= l.params.max_tokens || total >= max_model_len) {
                finished = Some(FinishReason::Length);
            }
            if finished.is_some() && !matches!(finished, Some(FinishReason::Stop)) {
                // Flush everything that is valid text, held-back stop prefixes included.
                end = l.text.len();
            }
            let text = l.text.get(l.emitted..end).unwrap_or("").to_string();
            l.emitted = l.emitted.max(end);
            outputs.push(RequestOutput {
                id,
                token,
                text,
                finished,
                prompt_tokens: l.prompt_tokens,
                cached_tokens,
                completion_tokens: n_out,
                logprobs: sampled_logprobs.remove(&id),
            });
            if finished.is_some() {
                self.live.remove(&id);
                self.scheduler.remove(id);
            }
        }
        Ok(outputs)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::{groups_from_pattern, KvCacheManager};
    use crate::sched::SchedulerConfig;

    /// A model whose next token is `(last token + 1) % vocab`, checking that every
    /// position it is asked to compute has a block in every group.
    struct Counter {
        vocab: usize,
    }

    impl StepModel for Counter {
        fn vocab_size(&self) -> usize {
            self.vocab
        }
        fn step(
            &mut self,
            seqs: &[StepSeq<'_>],
            kv: &KvCacheManager,
        ) -> Result<Vec<f32>, ModelError> {
            let mut out = Vec::new();
            for s in seqs {
                let pos: Vec<u32> = (s.start..s.start + s.tokens.len())
                    .map(|p| p as u32)
                    .collect();
                for g in 0..kv.num_groups() {
                    let _ = kv.slot_mapping(s.id, g, &pos);
                }
                if s.sample {
                    let last = *s.tokens.last().ok_or(ModelError::new("empty"))? as usize;
                    let mut row = vec![0.0; self.vocab];
                    row[(last + 1) % self.vocab] = 10.0;
                    out.extend(row);
                }
            }
            Ok(out)
        }
    }

    struct Letters;
    impl Detokenizer for Letters {
        fn token_bytes(&self, id: u32) -> Vec<u8> {
            vec![b'a' + (id % 26) as u8]
        }
    }

    fn engine(blocks: usize) -> LLMEngine<Counter> {
        let kv = KvCacheManager::new(
            groups_from_pattern(&[false, true], Some(8)),
            4,
            &[blocks, blocks],
        );
        let s = Scheduler::new(
            SchedulerConfig {
                max_num_seqs: 8,
                max_num_batched_tokens: 16,
                max_model_len: 128,
            },
            kv,
        );
        LLMEngine::new(Counter { vocab: 26 }, s, Some(Box::new(Letters)))
    }

    fn params(max_tokens: usize, stop: &[&str]) -> RequestParams {
        RequestParams {
            sampler: SamplerConfig::greedy(),
            max_tokens,
            stop: StopConditions {
                eog_ids: vec![25],
                stop_strings: stop.iter().map(|s| s.to_string()).collect(),
            },
        }
    }

    fn run(e: &mut LLMEngine<Counter>) -> HashMap<RequestId, (String, Option<FinishReason>)> {
        let mut texts: HashMap<RequestId, (String, Option<FinishReason>)> = HashMap::new();
        while e.has_unfinished() {
            for o in e.step().unwrap() {
                let t = texts.entry(o.id).or_default();
                t.0.push_str(&o.text);
                t.1 = o.finished;
            }
        }
        texts
    }

    #[test]
    fn generates_stops_and_returns_blocks() {
        let mut e = engine(64);
        let a = e.add_request(vec![0, 1, 2], params(5, &[])).unwrap();
        let b = e.add_request(vec![10], params(20, &["op"])).unwrap();
        let c = e.add_request(vec![20], params(20, &[])).unwrap();
        let out = run(&mut e);
        assert_eq!(out[&a], ("defgh".to_string(), Some(FinishReason::Length)));
        // l m n o p: the stop string "op" cuts before "o".
        assert_eq!(out[&b], ("lmn".to_string(), Some(FinishReason::Stop)));
        // v w x y then z (id 25) is EOG and is not printed.
        assert_eq!(out[&c], ("vwxy".to_string(), Some(FinishReason::Eos)));
        assert!(e.scheduler().kv().all_free());
    }

    #[test]
    fn abort_returns_blocks_at_once() {
        let mut e = engine(64);
        let a = e.add_request(vec![1; 20], params(50, &[])).unwrap();
        e.step().unwrap();
        assert!(!e.scheduler().kv().all_free());
        assert!(e.abort(a));
        assert!(e.scheduler().kv().all_free());
        assert!(!e.has_unfinished());
    }

    #[test]
    fn too_long_prompt_is_refused() {
        let mut e = engine(64);
        let err = e.add_request(vec![1; 129], params(5, &[])).unwrap_err();
        assert!(err.to_string().contains("129") && err.to_string().contains("128"));
    }
}
