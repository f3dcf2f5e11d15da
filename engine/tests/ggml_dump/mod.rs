//! The tensor dumps of llama.cpp's graph that `tools/golden/dump_ops.sh` writes
//! (`index.tsv` and one `NAME.bin` of f32 per tensor), read by the op-by-op parity tests
//! (`gemma_parity.rs`, `gptoss_parity.rs`), and the one comparison they print.
#![allow(dead_code)]

use std::collections::HashMap;
use std::path::PathBuf;

/// A dump: the tensors in graph order, by name.
pub struct Dump {
    dir: PathBuf,
    /// name -> (op, dims) in graph order.
    order: Vec<(String, String, Vec<usize>)>,
    index: HashMap<String, usize>,
}

impl Dump {
    /// The dump in `FLINT_GGML_DUMP`, `None` when that is unset.
    pub fn open() -> Option<Self> {
        let dir = PathBuf::from(std::env::var_os("FLINT_GGML_DUMP")?);
        let text = std::fs::read_to_string(dir.join("index.tsv")).expect("index.tsv");
        let mut order = Vec::new();
        let mut index = HashMap::new();
        for line in text.lines() {
            let f: Vec<&str> = line.split('\t').collect();
            if f.len() > 7 {
                continue; // not dumped (non-contiguous view)
            }
            let dims = f[3..7].iter().map(|s| s.parse().expect("dim")).collect();
            index.insert(f[0].to_string(), order.len());
            order.push((f[0].to_string(), f[1].to_string(), dims));
        }
        Some(Self { dir, order, index })
    }

    /// The values of tensor `name`.
    pub fn get(&self, name: &str) -> Vec<f32> {
        assert!(self.index.contains_key(name), "{name} is not in the dump");
        let b = std::fs::read(self.dir.join(format!("{name}.bin"))).expect(name);
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// The dump's folder (beside the tensors: `ids.txt`, the ids it was made from).
    pub fn dir(&self) -> &std::path::Path {
        &self.dir
    }

    /// The dimensions of tensor `name` (ggml's `ne`, innermost first).
    pub fn dims(&self, name: &str) -> &[usize] {
        &self.order[self.index[name]].2
    }

    /// The name of the first tensor after `name` in graph order whose op is `op`.
    pub fn next_op(&self, name: &str, op: &str) -> String {
        let i = self.index[name];
        self.order[i + 1..]
            .iter()
            .find(|e| e.1 == op)
            .map(|e| e.0.clone())
            .expect("op after")
    }
}

/// Compares row by row (`row` values per position); prints max |diff|, how many rows and
/// values differ and the first row that does; returns the rows that differ.
pub fn cmp(name: &str, ours: &[f32], theirs: &[f32], row: usize) -> usize {
    assert_eq!(ours.len(), theirs.len(), "{name}: lengths");
    let (mut max, mut max_rel, mut same, mut first, mut nd) = (0.0f32, 0.0f32, 0, None, 0usize);
    for (p, (a, b)) in ours.chunks(row).zip(theirs.chunks(row)).enumerate() {
        let mut eq = true;
        for (x, y) in a.iter().zip(b) {
            if x.to_bits() != y.to_bits() {
                eq = false;
                nd += 1;
                max = max.max((x - y).abs());
                max_rel = max_rel.max((x - y).abs() / y.abs().max(1e-30));
            }
        }
        if eq {
            same += 1;
        } else if first.is_none() {
            first = Some(p);
        }
    }
    let n = ours.len() / row;
    eprintln!(
        "{name:>28}: {same:>4}/{n} rows bit-identical ({nd} values differ), first differing {:>4}, max |d| {max:.3e} (rel {max_rel:.2e})",
        first.map(|p| p as i64).unwrap_or(-1)
    );
    n - same
}

/// RMS norm of each row of `x` (as many values as `w`) times `w`.
pub fn norm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks(w.len())
        .flat_map(|r| flint_engine::forward::reference::rms_norm(r, Some(w), eps))
        .collect()
}
