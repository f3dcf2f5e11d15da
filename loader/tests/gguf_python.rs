//! Files our writer produces are read back by the `gguf` Python package (llama.cpp's
//! own reader): same keys, value types, value bytes, tensor types, shapes and data.
//! Skipped with a message when `python3 -c "import gguf"` fails, except under `CI=true`,
//! where that is a failure.

mod gguf_common;

use std::process::Command;

use flint_loader::gguf::{Array, GgufFile, Value};
use gguf_common::sample_writer;

const SCRIPT: &str = r#"
import json, sys
from gguf import GGUFReader
r = GGUFReader(sys.argv[1])
fields = {}
for name, f in r.fields.items():
    data = b"".join(f.parts[i].tobytes() for i in f.data)
    entry = {"types": [int(t) for t in f.types], "data": data.hex(), "offset": int(f.offset)}
    if f.types and f.types[0] == 8:
        entry["str"] = f.contents()
    fields[name] = entry
tensors = []
for t in r.tensors:
    tensors.append({"name": t.name, "type": int(t.tensor_type),
                    "shape": [int(d) for d in t.shape], "n_bytes": int(t.n_bytes),
                    "data_offset": int(t.data_offset), "data": t.data.tobytes().hex()})
print(json.dumps({"alignment": int(r.alignment), "data_offset": int(r.data_offset),
                  "fields": fields, "tensors": tensors}))
"#;

fn python_has_gguf() -> bool {
    Command::new("python3")
        .args(["-c", "import gguf"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false)
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// The bytes Python's reader lists as a field's data parts: scalars little-endian,
/// strings without their length, arrays element by element (nested arrays flattened).
fn data_bytes(v: &Value) -> Vec<u8> {
    match v {
        Value::U8(x) => vec![*x],
        Value::I8(x) => vec![*x as u8],
        Value::U16(x) => x.to_le_bytes().to_vec(),
        Value::I16(x) => x.to_le_bytes().to_vec(),
        Value::U32(x) => x.to_le_bytes().to_vec(),
        Value::I32(x) => x.to_le_bytes().to_vec(),
        Value::F32(x) => x.to_le_bytes().to_vec(),
        Value::Bool(x) => vec![*x as u8],
        Value::String(s) => s.as_bytes().to_vec(),
        Value::U64(x) => x.to_le_bytes().to_vec(),
        Value::I64(x) => x.to_le_bytes().to_vec(),
        Value::F64(x) => x.to_le_bytes().to_vec(),
        Value::Array(a) => {
            let mut out = Vec::new();
            flatten(a, &mut out);
            out
        }
    }
}

fn flatten(a: &Array, out: &mut Vec<u8>) {
    if let Array::Array(inner) = a {
        for x in inner {
            flatten(x, out);
        }
        return;
    }
    for i in 0..a.len() {
        if let Some(v) = a.get(i) {
            out.extend(data_bytes(&v));
        }
    }
}

/// Python's `types` list: the value type, then (for a non-empty array) the types of
/// its first element, recursively.
fn types(v: &Value) -> Vec<u64> {
    let mut t = vec![v.value_type().id() as u64];
    if let Value::Array(a) = v {
        if let Some(first) = a.get(0) {
            t.extend(types(&first));
        }
    }
    t
}

#[test]
fn python_gguf_reads_what_we_write() {
    if !python_has_gguf() {
        let ci = std::env::var("CI").map(|v| v == "true").unwrap_or(false);
        assert!(
            !ci,
            "CI=true but python3 cannot import gguf (pip install gguf)"
        );
        eprintln!("SKIPPED: python3 cannot import the gguf package (pip install gguf)");
        return;
    }
    let mut w = sample_writer(11);
    // A key after the nested array: if Python misread the nesting, this one would shift.
    w.add("z.after", "end").expect("key");
    w.set_alignment(64).expect("alignment");
    let dir = std::env::temp_dir().join(format!("flint-gguf-py-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("tmp dir");
    let path = dir.join("w.gguf");
    w.write_file(&path).expect("write");
    let ours = GgufFile::open(&path).expect("our reader");

    let out = Command::new("python3")
        .args(["-c", SCRIPT])
        .arg(&path)
        .output()
        .expect("run python3");
    assert!(
        out.status.success(),
        "python GGUFReader failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let py: serde_json::Value = serde_json::from_slice(&out.stdout).expect("python json");
    assert_eq!(py["alignment"], 64);
    assert_eq!(py["data_offset"].as_u64(), Some(ours.data_start() as u64));

    let fields = py["fields"].as_object().expect("fields");
    // Python adds GGUF.version, GGUF.tensor_count and GGUF.kv_count.
    assert_eq!(fields.len(), ours.metadata().len() + 3);
    for (key, v) in ours.metadata() {
        let f = &fields[key];
        assert!(f.is_object(), "python lacks key {key}");
        assert_eq!(
            f["data"].as_str(),
            Some(hex(&data_bytes(v)).as_str()),
            "{key}"
        );
        let py_types: Vec<u64> = f["types"]
            .as_array()
            .expect("types")
            .iter()
            .filter_map(|t| t.as_u64())
            .collect();
        assert_eq!(py_types, types(v), "{key}");
        if let Value::String(s) = v {
            assert_eq!(f["str"].as_str(), Some(s.as_str()), "{key}");
        }
    }

    let tensors = py["tensors"].as_array().expect("tensors");
    assert_eq!(tensors.len(), ours.tensors().len());
    for (pt, t) in tensors.iter().zip(ours.tensors()) {
        assert_eq!(pt["name"].as_str(), Some(t.name.as_str()));
        assert_eq!(pt["type"].as_u64(), Some(t.ty.id() as u64), "{}", t.name);
        let shape: Vec<usize> = pt["shape"]
            .as_array()
            .expect("shape")
            .iter()
            .filter_map(|d| d.as_u64().map(|d| d as usize))
            .collect();
        assert_eq!(shape, t.dims, "{}", t.name);
        assert_eq!(pt["n_bytes"].as_u64(), Some(t.n_bytes as u64), "{}", t.name);
        assert_eq!(
            pt["data_offset"].as_u64(),
            Some(t.start as u64),
            "{}",
            t.name
        );
        assert_eq!(
            pt["data"].as_str(),
            Some(hex(ours.tensor_data(t)).as_str()),
            "{}",
            t.name
        );
    }
    std::fs::remove_dir_all(&dir).ok();
}
