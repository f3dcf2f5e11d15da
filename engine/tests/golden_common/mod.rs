//! llama.cpp's greedy chains for the default model, from
//! `shared/golden/gemma3-270m/greedy.jsonl` (see `shared/golden/README.md`).
#![allow(dead_code)]

use serde_json::Value;

/// One greedy chain: the prompt (text and ids), the tokens llama.cpp chose and, per
/// step, its top-2 margin in nats.
pub struct GreedyChain {
    pub prompt_text: String,
    pub prompt: Vec<u32>,
    pub ids: Vec<u32>,
    pub margins: Vec<f64>,
}

/// Every chain of the file, in order.
pub fn greedy_chains() -> Vec<GreedyChain> {
    let p = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../shared/golden/gemma3-270m/greedy.jsonl"
    );
    let text = std::fs::read_to_string(p).unwrap_or_else(|e| panic!("cannot read {p}: {e}"));
    let ids = |v: &Value| -> Vec<u32> {
        v.as_array()
            .expect("array of ids")
            .iter()
            .map(|x| u32::try_from(x.as_u64().expect("id")).expect("id fits u32"))
            .collect()
    };
    text.lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let v: Value = serde_json::from_str(l).expect("golden line is JSON");
            let steps = v["steps"].as_array().expect("steps");
            GreedyChain {
                prompt_text: v["prompt"].as_str().unwrap_or("?").to_string(),
                prompt: ids(&v["prompt_ids"]),
                ids: steps
                    .iter()
                    .map(|s| u32::try_from(s["id"].as_u64().expect("id")).expect("id fits u32"))
                    .collect(),
                margins: steps
                    .iter()
                    .map(|s| s["margin"].as_f64().expect("margin"))
                    .collect(),
            }
        })
        .collect()
}
