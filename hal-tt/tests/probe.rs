//! The `tt` backend without a usable adapter: every failure is `Unavailable` with its
//! reason, from the probe and from opening alike. All cases run in one test because they
//! set process-wide environment variables.

mod common;

use flint_hal::{DeviceOptions, HalErrorKind, Registry};

fn tt_entry() -> flint_hal::BackendEntry {
    let b = flint_hal_tt::backends();
    assert_eq!(b.len(), 1);
    assert_eq!(b[0].name, "tt");
    b[0].clone()
}

/// Probe and open through a registry both fail with `Unavailable`; returns the message.
fn unavailable_reason() -> String {
    let e = (tt_entry().probe)().expect_err("probe should fail");
    assert_eq!(e.kind, HalErrorKind::Unavailable, "{e}");
    let mut r = Registry::new();
    r.register(tt_entry());
    let e2 = r
        .open("tt", &DeviceOptions::default())
        .expect_err("open should fail");
    assert_eq!(e2, e, "open and probe give the same reason");
    let st = r.availability();
    assert_eq!(st.len(), 1);
    assert_eq!(st[0].status.as_ref().expect_err("unavailable"), &e);
    e.message
}

#[test]
fn probe_reports_each_reason() {
    let sim = common::sim_path();
    for v in [
        "FLINT_TT_RUNTIME",
        "FLINT_TT_SIM_ABI_VERSION",
        "FLINT_TT_SIM_FAIL_OPEN",
    ] {
        std::env::remove_var(v);
    }

    // Nothing configured and nothing on the search list.
    let m = unavailable_reason();
    assert!(
        m.contains("FLINT_TT_RUNTIME") && m.contains("libflint_tt.so"),
        "{m}"
    );

    // A path that does not exist.
    std::env::set_var("FLINT_TT_RUNTIME", "/nonexistent/dir/libflint_tt.so");
    let m = unavailable_reason();
    assert!(m.contains("/nonexistent/dir/libflint_tt.so"), "{m}");

    // A file that is not a library.
    let dir = std::env::temp_dir().join(format!("flint-tt-probe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let fake = dir.join("libflint_tt.so");
    std::fs::write(&fake, b"this is not an ELF file\n").expect("write");
    std::env::set_var("FLINT_TT_RUNTIME", &fake);
    let m = unavailable_reason();
    assert!(
        m.contains("cannot load") && m.contains(&*fake.to_string_lossy()),
        "{m}"
    );

    // A real shared library that is not an adapter (the C library): missing symbols.
    std::env::set_var("FLINT_TT_RUNTIME", "libc.so.6");
    let m = unavailable_reason();
    assert!(
        m.contains("missing symbols") && m.contains("flint_tt_abi_version"),
        "{m}"
    );
    assert!(
        m.contains("flint_tt_paged_attention"),
        "every missing name is listed: {m}"
    );

    // The simulated adapter reporting another ABI version.
    std::env::set_var("FLINT_TT_RUNTIME", &sim);
    std::env::set_var("FLINT_TT_SIM_ABI_VERSION", "7");
    let m = unavailable_reason();
    let ours = format!("version {}", flint_hal_tt::ABI_VERSION);
    assert!(m.contains("ABI version 7") && m.contains(&ours), "{m}");
    // An adapter built for ABI 1, whose weight descriptor lacks `source_type`, is refused
    // as well: reading the longer descriptor would be out of bounds for it.
    std::env::set_var("FLINT_TT_SIM_ABI_VERSION", "1");
    let m = unavailable_reason();
    assert!(m.contains("ABI version 1") && m.contains(&ours), "{m}");
    // And one built for ABI 2, whose `flint_tt_rope` takes the NeoX parameters as scalars
    // and which has no `flint_tt_add_bias`.
    std::env::set_var("FLINT_TT_SIM_ABI_VERSION", "2");
    let m = unavailable_reason();
    assert!(m.contains("ABI version 2") && m.contains(&ours), "{m}");
    assert!(m.contains("rebuild the adapter"), "{m}");
    // And one built for ABI 3: no `flint_tt_buffer_copy`, a `flint_tt_route_topk` that
    // takes its bias from host memory and shorter counters. Refused naming both versions.
    std::env::set_var("FLINT_TT_SIM_ABI_VERSION", "3");
    let m = unavailable_reason();
    assert!(
        m.contains("ABI version 3") && m.contains("needs version 6"),
        "{m}"
    );
    // And one built for ABI 4, whose get_rows, rope, write_kv and paged attention take
    // their index lists as host pointers: the same symbols with other signatures, so
    // only the version tells them apart.
    std::env::set_var("FLINT_TT_SIM_ABI_VERSION", "4");
    let m = unavailable_reason();
    assert!(
        m.contains("ABI version 4") && m.contains("needs version 6"),
        "{m}"
    );
    // And one built for ABI 5, whose route_topk writes host arrays and whose expert
    // matmul and scatter take host rows and weights: again the same symbols with other
    // signatures.
    std::env::set_var("FLINT_TT_SIM_ABI_VERSION", "5");
    let m = unavailable_reason();
    assert!(
        m.contains("ABI version 5") && m.contains("needs version 6"),
        "{m}"
    );
    assert!(m.contains("rebuild the adapter"), "{m}");
    assert_eq!(flint_hal_tt::ABI_VERSION, 6);
    assert_eq!(flint_tt_sim::ABI_VERSION, 6);
    std::env::remove_var("FLINT_TT_SIM_ABI_VERSION");

    // A device that fails to open.
    std::env::set_var("FLINT_TT_SIM_FAIL_OPEN", "1");
    let m = unavailable_reason();
    assert!(m.contains("failed to open"), "{m}");
    std::env::remove_var("FLINT_TT_SIM_FAIL_OPEN");

    // And with the adapter working, the backend is available and opens.
    (tt_entry().probe)().expect("probe with the simulated adapter");
    let mut r = Registry::new();
    r.register(tt_entry());
    let dev = r.open("tt", &DeviceOptions::default()).expect("open tt");
    assert_eq!(dev.name(), "tt");
    assert!(
        dev.description().contains("Blackhole P150"),
        "{}",
        dev.description()
    );

    std::env::remove_var("FLINT_TT_RUNTIME");
    let _ = std::fs::remove_dir_all(&dir);
}
