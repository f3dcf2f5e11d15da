//! The scheduler: one token budget per step, running requests first, chunked prefill,
//! preemption by recomputation.
//!
//! Every request carries its tokens (prompt, then generated) and how many of them have
//! been computed into the KV cache. A step gives each request up to
//! `tokens - computed` new tokens to compute, within one budget
//! (`max_num_batched_tokens`) shared by the whole batch:
//!
//! 1. Running requests, oldest first. A decode needs 1 token; a prefill that did not fit
//!    in earlier steps continues with the next chunk.
//! 2. Waiting requests, in arrival order, while the budget, `max_num_seqs` and the KV
//!    pools allow. A long prompt is split into chunks (chunked prefill).
//!
//! **Preemption rule.** When a running request needs KV blocks and the pools are empty,
//! the *newest* running request is preempted: all its blocks go back to the pools, its
//! computed count drops to 0, and it goes to the front of the waiting queue. Its tokens
//! (prompt and everything generated so far) are kept, so when it is scheduled again it
//! recomputes them and continues exactly where it stopped. If the request that needs the
//! blocks is itself the newest, it is the one preempted.
//!
//! **Prefix caching.** A waiting request is admitted after the longest prefix of its
//! tokens the KV cache manager has cached ([`KvCacheManager::find_cached_prefix`]): it
//! takes those blocks and its prefill starts after them. A preempted request is looked
//! up again when it is re-admitted, so it finds its own blocks if they were not evicted
//! meanwhile. After each step, the blocks the step filled are offered to the cache.

use std::collections::{HashMap, VecDeque};

use crate::kv::{KvCacheManager, RequestId};

/// Limits of the scheduler.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SchedulerConfig {
    /// Most requests running (holding KV blocks) at once.
    pub max_num_seqs: usize,
    /// Token budget of one step, over all requests.
    pub max_num_batched_tokens: usize,
    /// Longest sequence (prompt + generated) a request may reach.
    pub max_model_len: usize,
}

/// Why a request was refused at admission.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AdmissionError {
    /// The prompt alone is longer than the model allows.
    PromptTooLong {
        /// Tokens in the prompt.
        prompt_tokens: usize,
        /// The limit.
        max_model_len: usize,
    },
    /// The prompt is empty.
    EmptyPrompt,
    /// The id is already in use.
    DuplicateId(RequestId),
    /// The prompt's KV alone would not fit in the pools even with nothing else running.
    TooLargeForCache {
        /// Tokens in the prompt.
        prompt_tokens: usize,
    },
}

impl std::fmt::Display for AdmissionError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AdmissionError::PromptTooLong {
                prompt_tokens,
                max_model_len,
            } => write!(
                f,
                "the prompt has {prompt_tokens} tokens but the model allows at most \
                 {max_model_len} (max_model_len)"
            ),
            AdmissionError::EmptyPrompt => f.write_str("the prompt has no tokens"),
            AdmissionError::DuplicateId(id) => write!(f, "request id {id} is already in use"),
            AdmissionError::TooLargeForCache { prompt_tokens } => write!(
                f,
                "the prompt has {prompt_tokens} tokens, more than the whole KV cache can hold; \
                 raise --kv-memory"
            ),
        }
    }
}

impl std::error::Error for AdmissionError {}

/// Where a request is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RequestStatus {
    /// Queued, holding no blocks.
    Waiting,
    /// Holding blocks and being computed.
    Running,
}

/// A request as the scheduler sees it.
#[derive(Clone, Debug)]
pub struct SeqState {
    /// Its id.
    pub id: RequestId,
    /// Prompt tokens followed by generated tokens.
    pub tokens: Vec<u32>,
    /// How many of `tokens` are the prompt.
    pub num_prompt: usize,
    /// How many of `tokens` are in the KV cache.
    pub num_computed: usize,
    /// How many of `tokens` were found in the prefix cache at its last admission.
    pub num_cached: usize,
    /// Where it is.
    pub status: RequestStatus,
    /// Times it was preempted.
    pub preemptions: usize,
}

impl SeqState {
    /// Tokens generated so far.
    pub fn output(&self) -> &[u32] {
        &self.tokens[self.num_prompt..]
    }
}

/// One request's share of a step.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ScheduledSeq {
    /// The request.
    pub id: RequestId,
    /// Position of the first token to compute.
    pub start: usize,
    /// The tokens to compute, at positions `start .. start + tokens.len()`.
    pub tokens: Vec<u32>,
    /// True when this chunk reaches the last known token, so the step samples the next.
    pub sample: bool,
}

/// What one step computes.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SchedulerOutput {
    /// The requests of this step, in batch order.
    pub seqs: Vec<ScheduledSeq>,
    /// Requests preempted while scheduling this step.
    pub preempted: Vec<RequestId>,
    /// Requests that can never run: even alone, their next chunk needs more KV blocks
    /// than the pools hold. They stay known to the scheduler until `remove`d, so the
    /// caller can finish them (with what they generated) instead of waiting forever.
    pub capacity_exceeded: Vec<RequestId>,
}

impl SchedulerOutput {
    /// Tokens in the batch.
    pub fn num_tokens(&self) -> usize {
        self.seqs.iter().map(|s| s.tokens.len()).sum()
    }

    /// True when the batch holds any prompt token (a step that is not pure decode).
    pub fn has_prefill(&self) -> bool {
        self.seqs.iter().any(|s| s.tokens.len() > 1 || !s.sample)
    }
}

/// The scheduler and the KV cache manager it allocates from.
#[derive(Debug)]
pub struct Scheduler {
    cfg: SchedulerConfig,
    kv: KvCacheManager,
    requests: HashMap<RequestId, SeqState>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    /// Preemptions since the start.
    preemptions: u64,
}

impl Scheduler {
    /// A scheduler over `kv`.
    pub fn new(cfg: SchedulerConfig, kv: KvCacheManager) -> Self {
        Self {
            cfg,
            kv,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            preemptions: 0,
        }
    }

    /// Preemptions since the start (every request, every time).
    pub fn num_preemptions(&self) -> u64 {
        self.preemptions
    }

    /// Its limits.
    pub fn config(&self) -> &SchedulerConfig {
        &self.cfg
    }

    /// The KV cache manager (block tables and slot mappings for the forward).
    pub fn kv(&self) -> &KvCacheManager {
        &self.kv
    }

    /// The KV cache manager, for changes outside a step (the server's warm-up resets its
    /// prefix cache).
    pub fn kv_mut(&mut self) -> &mut KvCacheManager {
        &mut self.kv
    }

    /// A request's state.
    pub fn get(&self, id: RequestId) -> Option<&SeqState> {
        self.requests.get(&id)
    }

    /// Requests waiting.
    pub fn num_waiting(&self) -> usize {
        self.waiting.len()
    }

    /// Requests running.
    pub fn num_running(&self) -> usize {
        self.running.len()
    }

    /// True when no request is left.
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty()
    }

    /// Queues a request. A prompt longer than `max_model_len` is refused at once.
    pub fn add(&mut self, id: RequestId, prompt: Vec<u32>) -> Result<(), AdmissionError> {
        if prompt.is_empty() {
            return Err(AdmissionError::EmptyPrompt);
        }
        if prompt.len() > self.cfg.max_model_len {
            return Err(AdmissionError::PromptTooLong {
                prompt_tokens: prompt.len(),
                max_model_len: self.cfg.max_model_len,
            });
        }
        if self.requests.contains_key(&id) {
            return Err(AdmissionError::DuplicateId(id));
        }
        // The prompt (and the first generated token) must fit in an otherwise empty
        // cache, or it could never run: the worst chunk is the last, with its window.
        let chunk = prompt.len().min(self.cfg.max_num_batched_tokens).max(1);
        if !self
            .kv
            .fits_when_empty(prompt.len() - chunk, prompt.len() + 1)
        {
            return Err(AdmissionError::TooLargeForCache {
                prompt_tokens: prompt.len(),
            });
        }
        let num_prompt = prompt.len();
        self.requests.insert(
            id,
            SeqState {
                id,
                tokens: prompt,
                num_prompt,
                num_computed: 0,
                num_cached: 0,
                status: RequestStatus::Waiting,
                preemptions: 0,
            },
        );
        self.waiting.push_back(id);
        Ok(())
    }

    /// Removes a request wherever it is and returns its blocks. Returns its final state.
    pub fn remove(&mut self, id: RequestId) -> Option<SeqState> {
        self.waiting.retain(|&r| r != id);
        self.running.retain(|&r| r != id);
        self.kv.free(id);
        self.requests.remove(&id)
    }

    fn preempt(&mut self, id: RequestId) {
        self.preemptions += 1;
        self.running.retain(|&r| r != id);
        self.kv.free(id);
        if let Some(s) = self.requests.get_mut(&id) {
            s.num_computed = 0;
            s.status = RequestStatus::Waiting;
            s.preemptions += 1;
        }
        self.waiting.push_front(id);
    }

    /// Plans the next step.
    pub fn schedule(&mut self) -> SchedulerOutput {
        let mut out = SchedulerOutput::default();
        let mut budget = self.cfg.max_num_batched_tokens;

        // 1. Running requests, oldest first.
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let Some(s) = self.requests.get(&id) else {
                i += 1;
                continue;
            };
            let (start, total) = (s.num_computed, s.tokens.len());
            let n = (total - start).min(budget);
            if n == 0 {
                i += 1;
                continue;
            }
            let mut scheduled = true;
            while !self.kv.can_allocate(id, start, start + n) {
                // Preempt the newest running request; possibly this one.
                let Some(&victim) = self.running.last() else {
                    scheduled = false;
                    break;
                };
                self.preempt(victim);
                out.preempted.push(victim);
                // A preempted request that was already scheduled this step is dropped
                // from the batch.
                out.seqs.retain(|q| q.id != victim);
                if victim == id {
                    scheduled = false;
                    break;
                }
            }
            if !scheduled {
                break;
            }
            // Checked just above.
            if self.kv.allocate(id, start, start + n).is_err() {
                break;
            }
            let tokens = self
                .requests
                .get(&id)
                .map(|s| s.tokens[start..start + n].to_vec())
                .unwrap_or_default();
            out.seqs.push(ScheduledSeq {
                id,
                start,
                tokens,
                sample: start + n == total,
            });
            budget -= n;
            i += 1;
        }

        // 2. Waiting requests, unless this step had to preempt.
        if out.preempted.is_empty() {
            while budget > 0 && self.running.len() < self.cfg.max_num_seqs {
                let Some(&id) = self.waiting.front() else {
                    break;
                };
                let Some(s) = self.requests.get(&id) else {
                    self.waiting.pop_front();
                    continue;
                };
                // A waiting request holds no blocks: it starts after its cached prefix.
                let prefix = self.kv.find_cached_prefix(&s.tokens);
                let (start, total) = (prefix.num_tokens, s.tokens.len());
                let n = (total - start).min(budget);
                if !self.kv.fits_when_empty(start, start + n) {
                    self.waiting.pop_front();
                    out.capacity_exceeded.push(id);
                    continue;
                }
                if self
                    .kv
                    .allocate_with_prefix(id, &prefix, start + n)
                    .is_err()
                {
                    break;
                }
                out.seqs.push(ScheduledSeq {
                    id,
                    start,
                    tokens: s.tokens[start..start + n].to_vec(),
                    sample: start + n == total,
                });
                budget -= n;
                self.waiting.pop_front();
                self.running.push(id);
                if let Some(s) = self.requests.get_mut(&id) {
                    s.status = RequestStatus::Running;
                    s.num_computed = start;
                    s.num_cached = start;
                }
            }
        }
        out
    }

    /// Records a step's results: every scheduled chunk is now computed, and `sampled`
    /// holds the new token of each request whose chunk had `sample` set (in batch order
    /// of those requests). Returns the requests that got a new token.
    ///
    /// # Panics
    /// When `sampled` does not have one token per sampling request (caller bug).
    pub fn update(&mut self, step: &SchedulerOutput, sampled: &[u32]) -> Vec<RequestId> {
        let sampling: Vec<&ScheduledSeq> = step.seqs.iter().filter(|s| s.sample).collect();
        assert_eq!(
            sampling.len(),
            sampled.len(),
            "one sampled token per request"
        );
        let mut next = sampled.iter();
        let mut grew = Vec::new();
        for q in &step.seqs {
            let Some(s) = self.requests.get_mut(&q.id) else {
                continue;
            };
            s.num_computed = q.start + q.tokens.len();
            if q.sample {
                if let Some(&t) = next.next() {
                    s.tokens.push(t);
                    grew.push(q.id);
                }
            }
            let next_pos = s.num_computed;
            self.kv.cache_computed(q.id, &s.tokens, next_pos);
            self.kv.free_out_of_window(q.id, next_pos);
        }
        grew
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::kv::groups_from_pattern;

    fn sched(blocks: usize, budget: usize, max_seqs: usize) -> Scheduler {
        let kv = KvCacheManager::new(
            groups_from_pattern(&[false, true], Some(8)),
            4,
            &[blocks, blocks],
        );
        Scheduler::new(
            SchedulerConfig {
                max_num_seqs: max_seqs,
                max_num_batched_tokens: budget,
                max_model_len: 64,
            },
            kv,
        )
    }

    /// Runs a fake model that always samples `id + 100` until each request has `n_out`.
    fn drive(s: &mut Scheduler, n_out: usize) -> HashMap<RequestId, Vec<u32>> {
        let mut done = HashMap::new();
        for _ in 0..10_000 {
            if s.is_idle() {
                break;
            }
            let step = s.schedule();
            assert!(step.num_tokens() <= s.config().max_num_batched_tokens);
            let sampled: Vec<u32> = step
                .seqs
                .iter()
                .filter(|q| q.sample)
                .map(|q| q.id as u32 + 100)
                .collect();
            for id in s.update(&step, &sampled) {
                if s.get(id).is_some_and(|r| r.output().len() >= n_out) {
                    let r = s.remove(id).unwrap();
                    done.insert(id, r.output().to_vec());
                }
            }
        }
        done
    }

    #[test]
    fn prompt_longer_than_max_model_len_is_refused_naming_both_numbers() {
        let mut s = sched(64, 16, 4);
        let e = s.add(1, vec![1; 65]).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("65") && msg.contains("64"), "{msg}");
        assert_eq!(s.add(2, vec![]), Err(AdmissionError::EmptyPrompt));
    }

    #[test]
    fn chunked_prefill_respects_the_budget() {
        let mut s = sched(64, 8, 4);
        s.add(1, (0..20).collect()).unwrap();
        let a = s.schedule();
        assert_eq!(a.seqs[0].tokens.len(), 8);
        assert!(!a.seqs[0].sample);
        s.update(&a, &[]);
        let b = s.schedule();
        assert_eq!((b.seqs[0].start, b.seqs[0].tokens.len()), (8, 8));
        s.update(&b, &[]);
        let c = s.schedule();
        assert_eq!((c.seqs[0].start, c.seqs[0].tokens.len()), (16, 4));
        assert!(c.seqs[0].sample);
    }

    #[test]
    fn running_first_then_waiting() {
        let mut s = sched(64, 10, 4);
        s.add(1, vec![1; 4]).unwrap();
        let a = s.schedule();
        s.update(&a, &[7]);
        s.add(2, vec![2; 20]).unwrap();
        let b = s.schedule();
        assert_eq!(b.seqs[0].id, 1);
        assert_eq!(b.seqs[0].tokens, vec![7]);
        assert_eq!(b.seqs[1].id, 2);
        assert_eq!(
            b.seqs[1].tokens.len(),
            9,
            "the rest of the budget goes to the prefill"
        );
    }

    #[test]
    fn max_num_seqs_is_respected() {
        let mut s = sched(64, 100, 2);
        for id in 0..5 {
            s.add(id, vec![1; 3]).unwrap();
        }
        let a = s.schedule();
        assert_eq!(a.seqs.len(), 2);
        assert_eq!(s.num_running(), 2);
    }

    #[test]
    fn preemption_finishes_everything_and_returns_every_block() {
        // 12 blocks per group, 4 tokens each: far too small for 16 requests of 9 + 12.
        let mut s = sched(12, 32, 16);
        for id in 0..16 {
            s.add(id, vec![id as u32; 9]).unwrap();
        }
        let done = drive(&mut s, 12);
        assert_eq!(done.len(), 16);
        for (id, out) in &done {
            assert_eq!(out, &vec![*id as u32 + 100; 12]);
        }
        assert!(s.kv().all_free());
    }

    #[test]
    fn a_request_that_outgrows_the_whole_cache_is_reported_not_stuck() {
        // 2 blocks of 4 in the full group: 8 tokens at most.
        let mut s = sched(2, 64, 4);
        s.add(1, vec![1; 6]).unwrap();
        let mut reported = false;
        for _ in 0..10 {
            let step = s.schedule();
            if step.capacity_exceeded.contains(&1) {
                reported = true;
                break;
            }
            let sampled: Vec<u32> = step.seqs.iter().filter(|q| q.sample).map(|_| 5).collect();
            s.update(&step, &sampled);
        }
        assert!(reported, "the request must be reported, not left waiting");
        let r = s.remove(1).unwrap();
        assert!(r.tokens.len() >= 8);
        assert!(s.kv().all_free());
    }

    #[test]
    fn newest_running_request_is_the_one_preempted() {
        // Full group: 6 blocks of 4. Two requests of 8 tokens take 2 blocks each; when
        // both grow past 8, one more block each is needed, then more.
        let mut s = sched(6, 64, 4);
        s.add(1, vec![1; 8]).unwrap();
        s.add(2, vec![2; 8]).unwrap();
        let mut preempted = Vec::new();
        for _ in 0..12 {
            let step = s.schedule();
            preempted.extend(step.preempted.iter().copied());
            let sampled: Vec<u32> = step.seqs.iter().filter(|q| q.sample).map(|_| 5).collect();
            s.update(&step, &sampled);
            if !preempted.is_empty() {
                break;
            }
        }
        assert_eq!(preempted.first(), Some(&2), "request 2 arrived last");
        assert_eq!(s.get(2).unwrap().status, RequestStatus::Waiting);
        assert_eq!(s.get(2).unwrap().num_computed, 0);
        assert!(!s.get(2).unwrap().output().is_empty(), "its output is kept");
    }

    #[test]
    fn a_common_prefix_is_computed_once() {
        let mut s = sched(64, 64, 4);
        let first: Vec<u32> = (0..20).collect();
        s.add(1, first.clone()).unwrap();
        drive(&mut s, 2);
        assert!(s.kv().all_free());
        let mut second = first.clone();
        second.push(99);
        s.add(2, second).unwrap();
        let step = s.schedule();
        // Five cached blocks of 4 in both groups: only the last token is computed.
        assert_eq!(
            (step.seqs[0].start, step.seqs[0].tokens.clone()),
            (20, vec![99])
        );
        assert_eq!(s.get(2).unwrap().num_cached, 20);
        s.update(&step, &[7]);
        // The same prompt again leaves its last token to compute.
        s.add(3, first).unwrap();
        let step = s.schedule();
        let third = step.seqs.iter().find(|q| q.id == 3).unwrap();
        assert_eq!(
            (third.start, third.tokens.clone()),
            (16, vec![16, 17, 18, 19])
        );
    }
}
