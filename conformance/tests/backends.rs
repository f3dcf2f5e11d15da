//! The suite on every backend this build registers: one test per backend.

use flint_conformance::{registry, run_suite, SuiteOptions};
use flint_hal::DeviceOptions;

/// Runs the whole suite on `name`. `required` backends must be available; the others
/// are skipped (with their reason printed) when this machine cannot run them.
fn certify(name: &str, required: bool) {
    let reg = registry();
    if reg.get(name).is_none() {
        assert!(!required, "{name} is not registered in this build");
        eprintln!("{name}: not registered in this build; nothing to run");
        return;
    }
    let dev = match reg.open(name, &DeviceOptions::default()) {
        Ok(d) => d,
        Err(e) => {
            assert!(!required, "{name} does not open: {e}");
            eprintln!("{name}: unavailable here ({e}); not run");
            return;
        }
    };
    let r = run_suite(dev.as_ref(), &SuiteOptions::default());
    println!("{}", r.table());
    println!("{}: {} in {:.2} s", name, r.counts().line(), r.seconds);
    assert_eq!(
        r.counts().failed,
        0,
        "{name} fails conformance:\n{}",
        r.failure_details()
    );
    assert!(r.counts().passed > 0, "{name} passed nothing");
}

#[test]
fn cpu() {
    certify("cpu", true);
}

#[test]
fn tt() {
    certify("tt", false);
}

/// A backend registered without a test here would never be certified by `cargo test`.
#[test]
fn every_registered_backend_has_a_test() {
    for name in registry().names() {
        assert!(
            ["cpu", "tt"].contains(&name),
            "backend {name} has no test in conformance/tests/backends.rs"
        );
    }
}
