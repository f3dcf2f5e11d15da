//! What the tt engine tests share: finding the simulated adapter.

use std::path::PathBuf;

/// The simulated adapter, or `None` (after saying so) outside CI when it is not built.
pub fn sim_library() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("FLINT_TT_RUNTIME").filter(|v| !v.is_empty()) {
        let p = PathBuf::from(p);
        assert!(
            p.exists(),
            "FLINT_TT_RUNTIME={} does not exist",
            p.display()
        );
        return Some(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    for dir in exe.ancestors().skip(1).take(3) {
        for cand in [
            dir.join("libflint_tt_sim.so"),
            dir.join("deps/libflint_tt_sim.so"),
        ] {
            if cand.exists() {
                return Some(cand);
            }
        }
    }
    let msg = format!(
        "the simulated Tenstorrent adapter (libflint_tt_sim.so) is not built near {}; \
         run `cargo build -p flint-tt-sim` or set FLINT_TT_RUNTIME",
        exe.display()
    );
    assert!(std::env::var_os("CI").is_none(), "{msg}");
    eprintln!("\n!!! SKIPPED: {msg}\n");
    None
}
