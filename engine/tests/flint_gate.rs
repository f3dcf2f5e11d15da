//! The Flint gate: on the `tiny` checkpoint, the device forward (cpu) against the
//! reference forward over 3 prompts x 64 greedy tokens: identical chains, or a first
//! divergence where the reference's own top-2 margin is below 0.25 nats.

mod flint_common;
use flint_common::*;

#[test]
fn device_forward_matches_reference_on_tiny() {
    let model = tiny();
    let dm = on_cpu(&model);
    let vocab = model.spec.vocab;
    // Prompts longer than the window (8), so sliding layers drop keys.
    let prompts = [
        prompt(1, 12, vocab),
        prompt(2, 20, vocab),
        prompt(3, 9, vocab),
    ];
    let mut identical = 0;
    for (i, p) in prompts.iter().enumerate() {
        let (r, margins) = reference_chain(&model, p, 64);
        let d = device_chain(&dm, p, 64);
        match check_chain(&format!("prompt {i}"), &r, &margins, &d, 0.25) {
            None => identical += 1,
            Some(step) => eprintln!(
                "prompt {i}: first divergence at step {step}, margin {}",
                margins[step]
            ),
        }
        let min_margin = margins.iter().copied().fold(f32::INFINITY, f32::min);
        eprintln!(
            "prompt {i}: {} tokens, smallest reference margin {min_margin:.3}",
            r.len()
        );
    }
    eprintln!("{identical}/3 chains identical");
}

#[test]
fn teacher_forced_logits_agree_closely() {
    let model = tiny();
    let toks = prompt(9, 24, model.spec.vocab);
    let r = reference_logits(&model, &toks);
    let d = device_logits(&model, &toks);
    let diff = max_abs_diff(&r, &d);
    let std = logit_std(&r);
    let per_pos: Vec<String> = r
        .iter()
        .zip(&d)
        .map(|(a, b)| {
            format!(
                "{:.3}",
                max_abs_diff(std::slice::from_ref(a), std::slice::from_ref(b))
            )
        })
        .collect();
    eprintln!("per position: {}", per_pos.join(" "));
    let mean = mean_abs_diff(&r, &d);
    eprintln!("max |ref - device| = {diff:.4}, mean {mean:.5} (logit std {std:.3})");
    assert!(
        mean < 0.02 * std,
        "device logits depart from the reference by {mean} on average (std {std})"
    );
}
