//! The suite on every backend this build registers: one test per backend (and per
//! staging arm of tt).

use std::path::PathBuf;
use std::sync::Arc;

use flint_conformance::{registry, run_suite, Counts, SuiteOptions};
use flint_hal::{DeviceOptions, DeviceRef};

/// Runs the whole suite on `dev` and fails on any failed case; the counts.
fn certify(dev: DeviceRef, what: &str) -> Counts {
    let r = run_suite(dev.as_ref(), &SuiteOptions::default());
    println!("{}", r.table());
    println!("{what}: {} in {:.2} s", r.counts().line(), r.seconds);
    assert_eq!(
        r.counts().failed,
        0,
        "{what} fails conformance:\n{}",
        r.failure_details()
    );
    assert!(r.counts().passed > 0, "{what} passed nothing");
    r.counts()
}

#[test]
fn cpu() {
    let dev = registry()
        .open("cpu", &DeviceOptions::default())
        .expect("the cpu backend is registered and opens in every build");
    certify(dev, "cpu");
}

/// The reference backend: the `flint-core` scalar kernels behind the interface. Every op
/// and every encoding core computes is claimed, so nothing may be skipped.
#[test]
fn reference() {
    let dev = registry()
        .open("ref", &DeviceOptions::default())
        .expect("the ref backend is registered and opens in every build");
    let counts = certify(dev, "ref");
    assert_eq!(
        counts.skipped, 0,
        "ref skips cases although flint-core has the scalar math for all of them"
    );
}

/// The cpu backend at every SIMD level this machine has, not only the one it picks:
/// each level is its own set of kernels.
#[test]
fn cpu_every_simd_level() {
    use flint_hal_cpu::{CpuDevice, SimdLevel};
    for level in SimdLevel::ALL {
        match CpuDevice::with_level(&DeviceOptions::default(), level) {
            Ok(d) => {
                certify(Arc::new(d), &format!("cpu ({level:?})"));
            }
            Err(e) => eprintln!("cpu {level:?}: not on this machine ({e}); not run"),
        }
    }
}

/// The simulated Tenstorrent adapter that the `flint-tt-sim` dev-dependency builds next
/// to this test executable.
fn tt_sim() -> Option<PathBuf> {
    let exe = std::env::current_exe().ok()?;
    exe.ancestors()
        .skip(1)
        .take(3)
        .map(|d| d.join("libflint_tt_sim.so"))
        .find(|p| p.is_file())
}

/// tt as the registry opens it (`FLINT_TT_RUNTIME` or its search list), else through
/// the simulated adapter of this build; `None` (with the reason printed) when neither
/// is there.
fn open_tt(keep_quant: bool) -> Option<DeviceRef> {
    let opts = DeviceOptions {
        threads: None,
        keep_quant,
    };
    let reg = registry();
    if reg.get("tt").is_none() {
        eprintln!("tt: not registered in this build; nothing to run");
        return None;
    }
    match reg.open("tt", &opts) {
        Ok(d) => Some(d),
        Err(e) => match tt_sim() {
            Some(p) => {
                let d = flint_hal_tt::TtDevice::open_path(&p, &opts).unwrap_or_else(|e| {
                    panic!("the simulated adapter {} fails to open: {e}", p.display())
                });
                Some(Arc::new(d))
            }
            None => {
                eprintln!("tt: unavailable here ({e}) and no simulated adapter built; not run");
                None
            }
        },
    }
}

#[test]
fn tt_keep_quant() {
    if let Some(d) = open_tt(true) {
        certify(d, "tt (keep-quant)");
    }
}

#[test]
fn tt_expanded() {
    if let Some(d) = open_tt(false) {
        certify(d, "tt (FLINT_KEEP_QUANT=0)");
    }
}

/// The Vulkan backend on whatever Vulkan device the machine has (lavapipe in CI). Without
/// one it says so loudly and is not run, except in CI (`CI` set), where `.ci/run`
/// installs lavapipe and a missing device fails the test.
#[test]
fn vk() {
    match flint_hal_vk::VkDevice::open(&DeviceOptions::default()) {
        Ok(d) => {
            let what = format!("vk ({})", flint_hal::Device::description(&d));
            certify(Arc::new(d), &what);
        }
        Err(e) if std::env::var_os("CI").is_some() => {
            panic!("CI: the vk device must open (.ci/run installs lavapipe): {e}")
        }
        Err(e) => eprintln!("!!! vk: unavailable here ({e}); not run"),
    }
}

/// A backend registered without a test here would never be certified by `cargo test`.
#[test]
fn every_registered_backend_has_a_test() {
    for name in registry().names() {
        assert!(
            ["cpu", "ref", "tt", "vk"].contains(&name),
            "backend {name} has no test in conformance/tests/backends.rs"
        );
    }
}
