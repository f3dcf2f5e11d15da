//! The `flint-conformance` binary as `shared/spec/CLI.md` describes it.

use std::process::{Command, Output};

fn run(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_flint-conformance"))
        .args(args)
        .env_remove("FLINT_DEVICE")
        .output()
        .expect("run flint-conformance")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

#[test]
fn last_line_counts_and_exit_zero_when_nothing_failed() {
    let o = run(&["--device", "cpu", "--filter", "route_topk"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert_eq!(last, "5 passed, 0 failed, 0 skipped", "{out}");
    assert!(out.contains("route_topk"), "{out}");
}

#[test]
fn default_device_is_cpu() {
    let o = run(&["--filter", "scale"]);
    assert_eq!(o.status.code(), Some(0));
    assert!(stdout(&o).contains("device cpu"), "{}", stdout(&o));
}

#[test]
fn unknown_device_exits_1_listing_the_known_ones() {
    let o = run(&["--device", "nonsense"]);
    assert_eq!(o.status.code(), Some(1));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nonsense") && err.contains("cpu"), "{err}");
}

#[test]
fn bad_usage_exits_2() {
    assert_eq!(run(&["--bogus"]).status.code(), Some(2));
    assert_eq!(run(&["--seed", "many"]).status.code(), Some(2));
    // A filter that selects nothing is a typo, not a clean run.
    assert_eq!(run(&["--filter", "matmull"]).status.code(), Some(2));
}

#[test]
fn all_runs_cpu_and_lists_or_runs_the_others() {
    let o = run(&["--device", "all", "--filter", "add"]);
    let out = stdout(&o);
    assert_eq!(o.status.code(), Some(0), "{out}");
    assert!(out.contains("device cpu"), "{out}");
    // ref runs in every build.
    assert!(out.contains("device ref"), "{out}");
    // tt is either run or listed as unavailable with its reason, never failed.
    assert!(out.contains("device tt"), "{out}");
    let last = out.lines().last().unwrap_or_default();
    assert!(last.ends_with("0 failed, 0 skipped"), "{out}");
}

#[test]
fn json_is_one_object_with_the_counts() {
    let o = run(&["--json", "--filter", "rms_norm", "--seed", "0x2a"]);
    assert_eq!(o.status.code(), Some(0));
    let v: serde_json::Value =
        serde_json::from_str(stdout(&o).trim()).expect("stdout is one JSON object");
    assert_eq!(v["failed"], 0);
    assert_eq!(v["passed"], 3);
    assert_eq!(v["seed"], 42);
    let cases = &v["devices"][0]["cases"];
    assert_eq!(cases.as_array().map(Vec::len), Some(3));
    assert!(cases[0]["seed"].is_u64() && cases[0]["result"] == "pass");
}
