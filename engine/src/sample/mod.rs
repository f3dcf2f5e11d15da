//! Token sampling: greedy, temperature, top-k, top-p, min-p, repetition / presence /
//! frequency penalties, seeded and reproducible; constrained decoding (a grammar masks
//! the tokens it does not allow, [`constrain`]); and the stop conditions (EOS/EOG ids,
//! stop strings).
//!
//! The order of the steps follows llama.cpp's default sampler chain, so that the same
//! settings mean the same thing in both engines: penalties, then top-k, top-p and min-p
//! (on the probabilities of the *unscaled* logits), then temperature, then the draw.
//! With `temperature <= 0` the result is the argmax after the penalties (greedy).
//!
//! The random numbers come from a small PRNG owned here (xoshiro256** seeded through
//! SplitMix64), so a seed gives the same tokens on every platform and every version of
//! our dependencies.

use std::collections::HashMap;

pub mod constrain;

pub use constrain::{Constraint, ConstraintError, GrammarVocab};

/// Sampling settings of one request.
#[derive(Clone, Debug, PartialEq)]
pub struct SamplerConfig {
    /// Softmax temperature; `<= 0` means greedy.
    pub temperature: f32,
    /// Keep only the `top_k` most likely tokens (0 = off).
    pub top_k: usize,
    /// Keep the smallest set of tokens whose probability reaches `top_p` (>= 1 = off).
    pub top_p: f32,
    /// Drop tokens whose probability is below `min_p` times the top probability (0 = off).
    pub min_p: f32,
    /// Repetition penalty (1 = off): a recent token's positive logit is divided by it,
    /// a negative one multiplied (llama.cpp's convention).
    pub repetition_penalty: f32,
    /// Subtracted once from the logit of every token seen in the window (0 = off).
    pub presence_penalty: f32,
    /// Subtracted per occurrence from the logit of every token seen in the window (0 = off).
    pub frequency_penalty: f32,
    /// How many of the most recent tokens the penalties look at (0 = all).
    pub penalty_last_n: usize,
    /// Seed of the random draw.
    pub seed: u64,
    /// Added to the logits of these tokens before anything else (OpenAI's `logit_bias`).
    pub logit_bias: Vec<(u32, f32)>,
    /// When set, [`Sampler::sample_with_logprobs`] reports the log-probability of the
    /// drawn token and of this many most likely tokens.
    pub logprobs: Option<usize>,
    /// A grammar the output must follow: the tokens it does not allow are never drawn
    /// (applied after the penalties, before the filters).
    pub constraint: Option<Constraint>,
}

impl Default for SamplerConfig {
    fn default() -> Self {
        Self::greedy()
    }
}

impl SamplerConfig {
    /// Greedy decoding with no penalties.
    pub fn greedy() -> Self {
        Self {
            temperature: 0.0,
            top_k: 0,
            top_p: 1.0,
            min_p: 0.0,
            repetition_penalty: 1.0,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            penalty_last_n: 64,
            seed: 0,
            logit_bias: Vec::new(),
            logprobs: None,
            constraint: None,
        }
    }

    /// True when the draw is the argmax.
    pub fn is_greedy(&self) -> bool {
        self.temperature <= 0.0
    }

    /// True when no penalty changes the logits.
    pub fn penalties_off(&self) -> bool {
        self.repetition_penalty == 1.0
            && self.presence_penalty == 0.0
            && self.frequency_penalty == 0.0
    }
}

/// A small, fast, reproducible PRNG: xoshiro256** seeded with SplitMix64.
#[derive(Clone, Debug)]
pub struct Rng {
    s: [u64; 4],
}

impl Rng {
    /// Seeds the generator; every seed (0 included) gives a valid, distinct state.
    pub fn new(seed: u64) -> Self {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9E37_79B9_7F4A_7C15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
            x ^ (x >> 31)
        };
        Self {
            s: [next(), next(), next(), next()],
        }
    }

    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        let result = self.s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = self.s[1] << 17;
        self.s[2] ^= self.s[0];
        self.s[3] ^= self.s[1];
        self.s[1] ^= self.s[2];
        self.s[0] ^= self.s[3];
        self.s[2] ^= t;
        self.s[3] = self.s[3].rotate_left(45);
        result
    }

    /// A uniform float in `[0, 1)` with 53 random bits.
    pub fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// A standard normal sample (Box-Muller); used by the synthetic checkpoints.
    pub fn normal(&mut self) -> f32 {
        let u1 = self.next_f64().max(f64::MIN_POSITIVE);
        let u2 = self.next_f64();
        ((-2.0 * u1.ln()).sqrt() * (2.0 * std::f64::consts::PI * u2).cos()) as f32
    }
}

/// A sampler: settings plus its random state.
#[derive(Clone, Debug)]
pub struct Sampler {
    cfg: SamplerConfig,
    rng: Rng,
}

impl Sampler {
    /// A sampler seeded from `cfg.seed`.
    pub fn new(cfg: SamplerConfig) -> Self {
        let rng = Rng::new(cfg.seed);
        Self { cfg, rng }
    }

    /// The settings.
    pub fn config(&self) -> &SamplerConfig {
        &self.cfg
    }

    /// Picks the next token from `logits` (one per vocabulary entry), given the tokens
    /// of the sequence so far (`history`, prompt included) for the penalties.
    ///
    /// Panics on empty `logits` (a caller bug).
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        let t = self.draw(logits, history);
        if let Some(c) = self.cfg.constraint.as_mut() {
            c.commit(t);
        }
        t
    }

    fn draw(&mut self, logits: &[f32], history: &[u32]) -> u32 {
        assert!(!logits.is_empty(), "sample: empty logits");
        if self.cfg.is_greedy()
            && self.cfg.constraint.is_none()
            && self.cfg.logit_bias.is_empty()
            && (self.cfg.penalties_off() || history.is_empty())
        {
            // Nothing changes the logits: no copy of a (262k-entry) row per token.
            return argmax(logits) as u32;
        }
        let mut l = logits.to_vec();
        for &(t, b) in &self.cfg.logit_bias {
            if let Some(x) = l.get_mut(t as usize) {
                *x += b;
            }
        }
        apply_penalties(&self.cfg, &mut l, history);
        if let Some(c) = self.cfg.constraint.as_mut() {
            c.mask(&mut l);
        }
        if self.cfg.is_greedy() {
            return argmax(&l) as u32;
        }
        let mut cand = filter_candidates(&self.cfg, &l);
        // Temperature last: it reshapes the distribution over the survivors.
        let t = self.cfg.temperature;
        let m = cand.iter().map(|c| c.1).fold(f32::NEG_INFINITY, f32::max);
        let mut total = 0.0f64;
        for c in cand.iter_mut() {
            let p = (((c.1 - m) / t) as f64).exp();
            c.1 = p as f32;
            total += p;
        }
        let r = self.rng.next_f64() * total;
        let mut acc = 0.0f64;
        for c in &cand {
            acc += c.1 as f64;
            if r < acc {
                return c.0;
            }
        }
        // Rounding left `r` just above the sum: the last survivor.
        cand.last().map(|c| c.0).unwrap_or(0)
    }
}

/// The log-probabilities of one drawn token: its own and the most likely tokens'.
#[derive(Clone, Debug, PartialEq)]
pub struct TokenLogprobs {
    /// The drawn token.
    pub token: u32,
    /// Its log-probability.
    pub logprob: f32,
    /// The most likely tokens with their log-probabilities, most likely first (ties:
    /// lower id first).
    pub top: Vec<(u32, f32)>,
}

impl Sampler {
    /// [`sample`](Self::sample), and when [`SamplerConfig::logprobs`] is set the
    /// log-probabilities of the draw ([`logprobs`]).
    pub fn sample_with_logprobs(
        &mut self,
        logits: &[f32],
        history: &[u32],
    ) -> (u32, Option<TokenLogprobs>) {
        let token = self.sample(logits, history);
        let lp = self.cfg.logprobs.map(|n| logprobs(logits, token, n));
        (token, lp)
    }
}

/// The log-probability of `token` and of the `top` most likely tokens under the
/// log-softmax of the raw `logits`: the model's distribution before logit bias,
/// penalties, filtering and temperature (vLLM's default, `raw_logprobs`). Non-finite
/// logits count as probability 0 (log-probability minus infinity).
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> TokenLogprobs {
    let m = logits
        .iter()
        .copied()
        .filter(|x| x.is_finite())
        .fold(f32::NEG_INFINITY, f32::max);
    let sum: f64 = logits
        .iter()
        .filter(|x| x.is_finite())
        .map(|&x| ((x - m) as f64).exp())
        .sum();
    let lse = m as f64 + sum.ln();
    let lp = |x: f32| {
        if x.is_finite() {
            (x as f64 - lse) as f32
        } else {
            f32::NEG_INFINITY
        }
    };
    // The `top` largest, kept sorted (most likely first, lower id first on ties).
    let mut best: Vec<(u32, f32)> = Vec::with_capacity(top + 1);
    if top > 0 {
        for (i, &x) in logits.iter().enumerate() {
            if !x.is_finite() {
                continue;
            }
            if best.len() == top && best.last().is_some_and(|b| x <= b.1) {
                continue;
            }
            let at = best.partition_point(|b| b.1 >= x);
            best.insert(at, (i as u32, x));
            best.truncate(top);
        }
    }
    TokenLogprobs {
        token,
        logprob: logits
            .get(token as usize)
            .map_or(f32::NEG_INFINITY, |&x| lp(x)),
        top: best.into_iter().map(|(i, x)| (i, lp(x))).collect(),
    }
}

/// Index of the largest value (the first on ties). NaNs never win, and a NaN first value
/// wins throughout (index 0), as a plain `x > best` scan from the first value would have
/// it.
pub fn argmax(v: &[f32]) -> usize {
    /// Lanes of the maximum pass: two AVX-512 registers' worth, so that the compiler
    /// keeps independent max chains (a 262k-entry Gemma 3 row: ~0.2 ms as one scalar
    /// compare-and-branch chain per token).
    const LANES: usize = 32;
    let Some(&first) = v.first() else {
        return 0;
    };
    if first.is_nan() {
        return 0;
    }
    // The maximum over the non-NaN values: `if x > m { x } else { m }` ignores a NaN `x`
    // (the comparison is false), which is what the scan did.
    let mut lanes = [first; LANES];
    let chunks = v.chunks_exact(LANES);
    let tail = chunks.remainder();
    for c in chunks {
        for (m, &x) in lanes.iter_mut().zip(c) {
            *m = if x > *m { x } else { *m };
        }
    }
    let mut best = lanes.iter().fold(first, |m, &x| if x > m { x } else { m });
    for &x in tail {
        best = if x > best { x } else { best };
    }
    // The first index holding it.
    v.chunks(LANES)
        .enumerate()
        .find_map(|(c, chunk)| {
            chunk
                .contains(&best)
                .then(|| c * LANES + chunk.iter().position(|&x| x == best).unwrap_or(0))
        })
        .unwrap_or(0)
}

/// Applies the repetition, presence and frequency penalties in place.
pub fn apply_penalties(cfg: &SamplerConfig, logits: &mut [f32], history: &[u32]) {
    if cfg.penalties_off() || history.is_empty() {
        return;
    }
    let start = if cfg.penalty_last_n == 0 {
        0
    } else {
        history.len().saturating_sub(cfg.penalty_last_n)
    };
    let mut counts: HashMap<u32, u32> = HashMap::new();
    for &t in &history[start..] {
        *counts.entry(t).or_insert(0) += 1;
    }
    for (&t, &n) in &counts {
        let Some(l) = logits.get_mut(t as usize) else {
            continue;
        };
        if cfg.repetition_penalty != 1.0 {
            if *l > 0.0 {
                *l /= cfg.repetition_penalty;
            } else {
                *l *= cfg.repetition_penalty;
            }
        }
        *l -= n as f32 * cfg.frequency_penalty + cfg.presence_penalty;
    }
}

/// The `(id, logit)` pairs that survive top-k, top-p and min-p, sorted by descending
/// logit (ties: lower id first). Top-p and min-p use the softmax of the unscaled logits.
pub fn filter_candidates(cfg: &SamplerConfig, logits: &[f32]) -> Vec<(u32, f32)> {
    let mut cand: Vec<(u32, f32)> = logits
        .iter()
        .enumerate()
        .filter(|(_, l)| l.is_finite())
        .map(|(i, &l)| (i as u32, l))
        .collect();
    if cand.is_empty() {
        return vec![(argmax(logits) as u32, 0.0)];
    }
    cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
    if cfg.top_k > 0 && cfg.top_k < cand.len() {
        cand.truncate(cfg.top_k);
    }
    let m = cand[0].1;
    let probs: Vec<f64> = cand.iter().map(|c| ((c.1 - m) as f64).exp()).collect();
    let total: f64 = probs.iter().sum();
    if cfg.top_p < 1.0 {
        let mut acc = 0.0;
        let mut keep = cand.len();
        for (i, p) in probs.iter().enumerate() {
            acc += p / total;
            if acc >= cfg.top_p as f64 {
                keep = i + 1;
                break;
            }
        }
        cand.truncate(keep.max(1));
    }
    if cfg.min_p > 0.0 {
        // probs[0] is the top probability (unnormalised, = 1 after the shift by m).
        let floor = cfg.min_p as f64 * probs[0];
        let keep = probs
            .iter()
            .take(cand.len())
            .take_while(|&&p| p >= floor)
            .count();
        cand.truncate(keep.max(1));
    }
    cand
}

/// Why generation stopped.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FinishReason {
    /// An end-of-sequence / end-of-generation token.
    Eos,
    /// A stop string appeared in the text.
    Stop,
    /// The token limit was reached.
    Length,
}

/// What a stop-string scan found in the text generated so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StopScan {
    /// A stop string starts at this byte: the output ends there.
    Stop(usize),
    /// No stop string; the first this many bytes are safe to emit (the rest could still
    /// become the start of a stop string).
    Safe(usize),
}

/// Stop conditions of a request: end-of-generation token ids and stop strings.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StopConditions {
    /// Token ids that end generation (EOS and the other EOG tokens).
    pub eog_ids: Vec<u32>,
    /// Strings that end generation; the output is cut before the first one.
    pub stop_strings: Vec<String>,
}

impl StopConditions {
    /// True when `id` ends generation.
    pub fn is_eog(&self, id: u32) -> bool {
        self.eog_ids.contains(&id)
    }

    /// Scans the whole generated `text` for the stop strings.
    pub fn scan(&self, text: &str) -> StopScan {
        let first = self
            .stop_strings
            .iter()
            .filter(|s| !s.is_empty())
            .filter_map(|s| text.find(s.as_str()))
            .min();
        if let Some(at) = first {
            return StopScan::Stop(at);
        }
        // Hold back the longest suffix that is a proper prefix of some stop string.
        let mut hold = 0;
        for s in self.stop_strings.iter().filter(|s| !s.is_empty()) {
            for n in (1..s.len()).rev() {
                if n <= text.len() && s.is_char_boundary(n) && text.ends_with(&s[..n]) {
                    hold = hold.max(n);
                    break;
                }
            }
        }
        StopScan::Safe(text.len() - hold)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The scan `argmax` must agree with: the first strictly greater value wins.
    fn argmax_scan(v: &[f32]) -> usize {
        let (mut best, mut best_v) = (0, v.first().copied().unwrap_or(f32::NAN));
        for (i, &x) in v.iter().enumerate() {
            if x > best_v {
                (best, best_v) = (i, x);
            }
        }
        best
    }

    #[test]
    fn argmax_matches_the_scan_on_ties_nans_zeros_and_infinities() {
        let mut rng = Rng::new(11);
        let specials = [
            f32::NAN,
            -0.0,
            0.0,
            f32::INFINITY,
            f32::NEG_INFINITY,
            1.5,
            -1.5,
        ];
        for len in [0usize, 1, 2, 31, 32, 33, 64, 95, 1000] {
            for _ in 0..200 {
                // Few distinct values, so that ties are common; specials now and then.
                let v: Vec<f32> = (0..len)
                    .map(|_| {
                        let r = rng.next_u64();
                        if r.is_multiple_of(5) {
                            specials[(r / 5) as usize % specials.len()]
                        } else {
                            (r % 7) as f32 - 3.0
                        }
                    })
                    .collect();
                assert_eq!(argmax(&v), argmax_scan(&v), "{v:?}");
            }
        }
        // The maximum only in the tail, only in a lane, only at the start.
        let mut v = vec![0.0f32; 70];
        v[69] = 1.0;
        assert_eq!(argmax(&v), 69);
        v[40] = 1.0;
        assert_eq!(argmax(&v), 40);
        v[0] = 2.0;
        assert_eq!(argmax(&v), 0);
        assert_eq!(argmax(&[-0.0, 0.0]), 0);
        assert_eq!(argmax(&[f32::NAN, 5.0]), 0);
        assert_eq!(argmax(&[1.0, f32::NAN, 5.0]), 2);
    }

    #[test]
    fn logprobs_are_the_log_softmax_of_the_raw_logits() {
        let logits = [1.0f32, 3.0, 3.0, -2.0, f32::NEG_INFINITY];
        let z: f64 = logits.iter().map(|&x| (x as f64).exp()).sum();
        let lp = logprobs(&logits, 0, 3);
        assert!((lp.logprob as f64 - (1.0 - z.ln())).abs() < 1e-6, "{lp:?}");
        let ids: Vec<u32> = lp.top.iter().map(|t| t.0).collect();
        assert_eq!(ids, [1, 2, 0]);
        assert!((lp.top[0].1 as f64 - (3.0 - z.ln())).abs() < 1e-6);
        assert_eq!(logprobs(&logits, 4, 0).logprob, f32::NEG_INFINITY);
        assert!(logprobs(&logits, 4, 0).top.is_empty());
    }

    #[test]
    fn logit_bias_moves_the_draw_but_not_the_logprobs() {
        let logits = [5.0f32, 0.0, 0.0];
        let mut s = Sampler::new(SamplerConfig {
            logit_bias: vec![(2, 100.0)],
            logprobs: Some(1),
            ..SamplerConfig::greedy()
        });
        let (t, lp) = s.sample_with_logprobs(&logits, &[]);
        assert_eq!(t, 2);
        let lp = lp.unwrap();
        assert_eq!(lp.token, 2);
        assert_eq!(lp.top[0].0, 0, "the top log-probability is the raw model's");
    }

    #[test]
    fn rng_is_reproducible_and_uniformish() {
        let mut a = Rng::new(7);
        let mut b = Rng::new(7);
        let mut c = Rng::new(8);
        let va: Vec<u64> = (0..8).map(|_| a.next_u64()).collect();
        let vb: Vec<u64> = (0..8).map(|_| b.next_u64()).collect();
        let vc: Vec<u64> = (0..8).map(|_| c.next_u64()).collect();
        assert_eq!(va, vb);
        assert_ne!(va, vc);
        let mut r = Rng::new(1);
        let mean: f64 = (0..10000).map(|_| r.next_f64()).sum::<f64>() / 10000.0;
        assert!((mean - 0.5).abs() < 0.02, "mean {mean}");
    }
}
