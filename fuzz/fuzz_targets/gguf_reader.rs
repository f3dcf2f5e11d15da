//! Fuzz target: any byte string given to the GGUF reader must yield `Ok` or `Err`, never
//! a panic, an out-of-memory abort or a hang. What the reader accepts must survive a
//! write/read round trip through our writer unchanged (byte-identical re-encoding).
//!
//! Run (nightly): `cargo +nightly fuzz run gguf_reader` from `fuzz/` (see docs/gguf.md).

#![no_main]

use flint_loader::gguf::{GgufFile, GgufWriter, Value};
use libfuzzer_sys::fuzz_target;

/// Re-encodes a parsed file with our writer, or `None` where the writer is stricter
/// than the reader (an alignment key stored as another integer type than u32).
fn rewrite(f: &GgufFile) -> Option<Vec<u8>> {
    let mut w = GgufWriter::new();
    for (k, v) in f.metadata() {
        if k == "general.alignment" && !matches!(v, Value::U32(_)) {
            return None;
        }
        w.add(k, v.clone())
            .expect("keys of a parsed file are unique and valid");
    }
    for t in f.tensors() {
        w.add_tensor(&t.name, t.ty, &t.dims, f.tensor_data(t).to_vec())
            .expect("tensors of a parsed file are valid");
    }
    Some(w.to_bytes())
}

fuzz_target!(|data: &[u8]| {
    let Ok(f) = GgufFile::from_bytes(data.to_vec()) else {
        return;
    };
    for t in f.tensors() {
        assert_eq!(f.tensor_data(t).len(), t.n_bytes);
        assert!(t.dims.len() <= 4);
    }
    for (k, v) in f.metadata() {
        let _ = v.summary(8).to_string();
        let _ = f.get_u32(k);
        let _ = f.get_f32_array(k);
    }
    if let Some(b1) = rewrite(&f) {
        let f2 = GgufFile::from_bytes(b1.clone()).expect("our own output parses");
        let b2 = rewrite(&f2).expect("rewritable");
        assert_eq!(b1, b2, "write/read/write is not stable");
    }
});
