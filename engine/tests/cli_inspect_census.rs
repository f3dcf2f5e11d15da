//! `flint inspect MODEL --device tt`: the staging census of both arms, through the
//! simulated Tenstorrent adapter, under a DRAM budget too small for the bf16 arm.

use std::path::PathBuf;
use std::process::Command;

use serde_json::Value;

/// The simulated adapter cargo built for this test (a dev-dependency of the engine).
fn sim_library() -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    for dir in exe.ancestors().skip(1).take(3) {
        for cand in [
            dir.join("libflint_tt_sim.so"),
            dir.join("deps/libflint_tt_sim.so"),
        ] {
            if cand.exists() {
                return cand;
            }
        }
    }
    panic!("libflint_tt_sim.so not found near {}", exe.display());
}

#[test]
fn census_shows_experts_resident_when_kept_and_streamed_when_expanded() {
    let dir = std::env::temp_dir().join(format!("flint-census-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let model = dir.join("tiny.gguf");
    let st = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["synth", "--preset", "tiny", "--out"])
        .arg(&model)
        .status()
        .unwrap();
    assert!(st.success());
    let out = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["inspect", "--json", "--device", "tt"])
        .arg(&model)
        .env("FLINT_TT_RUNTIME", sim_library())
        // Enough for every kept block, too little for the bf16 expansion of the experts.
        .env("FLINT_TT_SIM_DRAM_BYTES", "8000000")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let arms = v["staging"].as_array().unwrap();
    let arm = |k: &str| arms.iter().find(|a| a["arm"] == k).unwrap().clone();
    let kept = arm("keep_quant");
    let expanded = arm("expanded");
    let expert_streamed = |a: &Value| {
        a["weights"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|w| w["name"].as_str().unwrap().contains("_exps"))
            .map(|w| w["streamed_bytes"].as_u64().unwrap())
            .sum::<u64>()
    };
    assert_eq!(kept["streamed_bytes"], 0, "keep-quant: everything resident");
    assert!(kept["expert_tier_bytes"].as_u64().unwrap() > 0);
    assert!(expert_streamed(&expanded) > 0, "bf16 arm: experts stream");
    assert_eq!(expert_streamed(&kept), 0);
    // The same tensors, in both arms.
    assert_eq!(
        kept["weights"].as_array().unwrap().len(),
        expanded["weights"].as_array().unwrap().len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
