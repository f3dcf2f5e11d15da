//! `flint dump` against llama.cpp's Python reference: random blocks of every one of the
//! 25 types in `GgmlType::DEQUANTIZABLE`, written to a GGUF by the `gguf` package, are
//! dumped by `flint dump` and compared bit for bit with `gguf.quants.dequantize`.
//! Skipped with a message when python3 lacks `gguf`, except under `CI=true`.

use std::path::Path;
use std::process::Command;

use flint_core::GgmlType;

const SCRIPT: &str = r#"
import sys, os
import numpy as np
import gguf
from gguf import GGMLQuantizationType as Q
out = sys.argv[1]
names = sys.argv[2].split(",")
rng = np.random.default_rng(1234)
w = gguf.GGUFWriter(os.path.join(out, "all.gguf"), "test")
for name in names:
    qt = Q[name]
    block, tsize = gguf.GGML_QUANT_SIZES[qt]
    rows, blocks_per_row = 3, 2
    raw = rng.integers(0, 256, size=(rows, blocks_per_row * tsize), dtype=np.uint8)
    if name in ("F32", "F16", "BF16"):
        # Finite random floats: random bit patterns would make NaNs whose payloads
        # say nothing about dequantization.
        if name == "F32":
            raw = rng.standard_normal((rows, blocks_per_row)).astype(np.float32).view(np.uint8)
        elif name == "F16":
            raw = rng.standard_normal((rows, blocks_per_row)).astype(np.float16).view(np.uint8)
        else:
            f = rng.standard_normal((rows, blocks_per_row)).astype(np.float32)
            raw = (f.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
    w.add_tensor("t." + name, raw, raw_dtype=qt)
    deq = gguf.quants.dequantize(raw, qt).astype(np.float32)
    deq.tofile(os.path.join(out, name + ".f32"))
w.write_header_to_file()
w.write_kv_data_to_file()
w.write_tensors_to_file()
w.close()
"#;

fn python_has_gguf() -> bool {
    Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

#[test]
fn dump_matches_gguf_quants_dequantize_bit_for_bit() {
    if !python_has_gguf() {
        let ci = std::env::var("CI").map(|v| v == "true").unwrap_or(false);
        assert!(!ci, "CI=true but python3 cannot import gguf/numpy");
        eprintln!("SKIPPED: python3 cannot import the gguf package (pip install gguf)");
        return;
    }
    let dir = std::env::temp_dir().join(format!("flint-dump-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let names: Vec<&str> = GgmlType::DEQUANTIZABLE.iter().map(|t| t.name()).collect();
    let out = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(&dir)
        .arg(names.join(","))
        .output()
        .expect("python3");
    assert!(
        out.status.success(),
        "python failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let model = dir.join("all.gguf");
    let mut checked = 0;
    for name in &names {
        let got_path = dir.join(format!("{name}.dump"));
        let st = Command::new(env!("CARGO_BIN_EXE_flint"))
            .arg("dump")
            .arg(&model)
            .arg(format!("t.{name}"))
            .arg("--out")
            .arg(&got_path)
            .output()
            .expect("run flint");
        assert!(
            st.status.success(),
            "flint dump t.{name} failed: {}",
            String::from_utf8_lossy(&st.stderr)
        );
        let want = std::fs::read(dir.join(format!("{name}.f32"))).expect("expected");
        let got = std::fs::read(&got_path).expect("dump output");
        assert_eq!(got.len(), want.len(), "{name}: length");
        for (i, (g, w)) in got.chunks_exact(4).zip(want.chunks_exact(4)).enumerate() {
            assert_eq!(
                g,
                w,
                "{name}: element {i}: flint {} vs gguf {}",
                f32::from_le_bytes([g[0], g[1], g[2], g[3]]),
                f32::from_le_bytes([w[0], w[1], w[2], w[3]])
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 25);
    // stdout output equals the file output.
    let st = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args(["dump"])
        .arg(&model)
        .arg("t.Q4_K")
        .output()
        .expect("run flint");
    assert!(st.status.success());
    assert_eq!(
        st.stdout,
        std::fs::read(dir.join("Q4_K.f32")).expect("expected")
    );
    remove(&dir);
}

fn remove(dir: &Path) {
    std::fs::remove_dir_all(dir).ok();
}
