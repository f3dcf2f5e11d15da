//! Sampler behaviour: greedy, each filter, penalties, reproducibility, stop conditions.

use flint_engine::sample::{
    apply_penalties, filter_candidates, Sampler, SamplerConfig, StopConditions, StopScan,
};

fn cfg() -> SamplerConfig {
    SamplerConfig {
        temperature: 1.0,
        top_k: 0,
        top_p: 1.0,
        min_p: 0.0,
        ..SamplerConfig::greedy()
    }
}

#[test]
fn greedy_is_argmax_first_on_ties() {
    let mut s = Sampler::new(SamplerConfig::greedy());
    assert_eq!(s.sample(&[0.1, 3.0, -1.0, 3.0], &[]), 1);
}

#[test]
fn top_k_keeps_k_best() {
    let c = SamplerConfig { top_k: 2, ..cfg() };
    let got = filter_candidates(&c, &[0.0, 5.0, 1.0, 4.0]);
    assert_eq!(got.iter().map(|x| x.0).collect::<Vec<_>>(), vec![1, 3]);
}

#[test]
fn top_p_keeps_smallest_nucleus() {
    // probabilities ~ [0.665, 0.245, 0.090]
    let l = [2.0f32, 1.0, 0.0];
    let c = SamplerConfig {
        top_p: 0.6,
        ..cfg()
    };
    assert_eq!(filter_candidates(&c, &l).len(), 1);
    let c = SamplerConfig {
        top_p: 0.8,
        ..cfg()
    };
    assert_eq!(filter_candidates(&c, &l).len(), 2);
    let c = SamplerConfig {
        top_p: 0.95,
        ..cfg()
    };
    assert_eq!(filter_candidates(&c, &l).len(), 3);
}

#[test]
fn min_p_drops_unlikely() {
    // p1/p0 = e^-1 = 0.37, p2/p0 = e^-3 = 0.05
    let l = [3.0f32, 2.0, 0.0];
    let c = SamplerConfig {
        min_p: 0.1,
        ..cfg()
    };
    assert_eq!(filter_candidates(&c, &l).len(), 2);
    let c = SamplerConfig {
        min_p: 0.5,
        ..cfg()
    };
    assert_eq!(filter_candidates(&c, &l).len(), 1);
}

#[test]
fn penalties_follow_llama_cpp() {
    let c = SamplerConfig {
        repetition_penalty: 2.0,
        presence_penalty: 0.5,
        frequency_penalty: 0.25,
        penalty_last_n: 0,
        ..cfg()
    };
    let mut l = vec![4.0f32, -4.0, 1.0];
    apply_penalties(&c, &mut l, &[0, 0, 1]);
    assert!((l[0] - (2.0 - 0.5 - 0.5)).abs() < 1e-6, "{}", l[0]);
    assert!((l[1] - (-8.0 - 0.5 - 0.25)).abs() < 1e-6, "{}", l[1]);
    assert_eq!(l[2], 1.0);
    // last_n limits the window
    let c = SamplerConfig {
        penalty_last_n: 1,
        ..c
    };
    let mut l = vec![4.0f32, -4.0, 1.0];
    apply_penalties(&c, &mut l, &[0, 0, 1]);
    assert_eq!(l[0], 4.0);
}

#[test]
fn seeded_sampling_is_reproducible_and_follows_probabilities() {
    let logits = [1.0f32, 0.0, 2.0, -1.0];
    let c = SamplerConfig { seed: 42, ..cfg() };
    let a: Vec<u32> = {
        let mut s = Sampler::new(c.clone());
        (0..200).map(|_| s.sample(&logits, &[])).collect()
    };
    let b: Vec<u32> = {
        let mut s = Sampler::new(c.clone());
        (0..200).map(|_| s.sample(&logits, &[])).collect()
    };
    assert_eq!(a, b);
    let other: Vec<u32> = {
        let mut s = Sampler::new(SamplerConfig {
            seed: 43,
            ..c.clone()
        });
        (0..200).map(|_| s.sample(&logits, &[])).collect()
    };
    assert_ne!(a, other);
    // frequencies roughly follow softmax: p(2) = 0.644
    let mut s = Sampler::new(c);
    let n = 20000;
    let hits = (0..n).filter(|_| s.sample(&logits, &[]) == 2).count();
    let f = hits as f64 / n as f64;
    assert!((f - 0.6439).abs() < 0.02, "frequency {f}");
}

#[test]
fn low_temperature_concentrates() {
    let logits = [1.0f32, 0.0, 2.0, -1.0];
    let mut s = Sampler::new(SamplerConfig {
        temperature: 0.05,
        seed: 3,
        ..cfg()
    });
    assert!((0..100).all(|_| s.sample(&logits, &[]) == 2));
}

#[test]
fn stop_strings_cut_and_hold_back() {
    let sc = StopConditions {
        eog_ids: vec![1, 106],
        stop_strings: vec!["\n\n".into(), "END".into()],
    };
    assert!(sc.is_eog(106));
    assert!(!sc.is_eog(2));
    assert_eq!(sc.scan("hello END there"), StopScan::Stop(6));
    assert_eq!(sc.scan("hello EN"), StopScan::Safe(6));
    assert_eq!(sc.scan("hello\n"), StopScan::Safe(5));
    assert_eq!(sc.scan("hello"), StopScan::Safe(5));
}
