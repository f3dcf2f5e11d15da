//! Single ops of the real Gemma 3 270M model against llama.cpp's own outputs for them
//! (rows cut from a full tensor dump by `tools/golden/extract_op_fixtures.py`): the
//! `flint_core` statements of llama.cpp's x86 arithmetic reproduce them bit for bit.
//!
//! - Q5_0 and Q8_0 matmuls in tinyBLAS's order, Q6_K in the tiled kernel's, Q4_K in the
//!   repacked kernels' (rows of a group of four: gemm; the `n % 4` tail: gemv), for rows
//!   0, 101, 175 and 176 of the 177-token golden batch;
//! - NeoX RoPE (glibc's `sinf`/`cosf`, GCC's fused multiply-adds) at positions 1, 101,
//!   150 and 176 (above 120 glibc reduces the angle through its 4/pi table), on a local
//!   layer (base 10^4) and a global one (base 10^6).
//!
//! These pin down what `docs/parity.md` describes, op by op; the device kernels can be
//! checked against the same `flint_core` functions.

use std::path::PathBuf;

use flint_core::dot::ggml_x86::BatchRow;
use flint_engine::model::{load_model, Ffn, Model, TensorRef};

/// Positions of the fixture rows in the golden batch, and its length.
const ROWS: [usize; 4] = [0, 101, 175, 176];
const ROPE_ROWS: [u32; 4] = [1, 101, 150, 176];
const BATCH: usize = 177;

fn fixture(name: &str) -> (Vec<f32>, Vec<f32>) {
    let dir = PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/tests/data/gemma_ops"));
    let read = |suffix: &str| -> Vec<f32> {
        let p = dir.join(format!("{name}.{suffix}.bin"));
        let b = std::fs::read(&p).unwrap_or_else(|e| panic!("cannot read {}: {e}", p.display()));
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    };
    (read("in"), read("out"))
}

fn model() -> Model {
    let path = flint_loader::fetch::default_model_path()
        .expect("the default model (gemma-3-270m-q4_k_m.gguf) is needed");
    load_model(&path).expect("the default model loads")
}

/// Asserts that `w`'s matmul over the fixture rows is llama.cpp's, bit for bit.
fn check_matmul(name: &str, w: &TensorRef) {
    let (x, want) = fixture(name);
    let (k, n) = (w.dims[0], w.dims[1]);
    assert_eq!(x.len(), ROWS.len() * k, "{name}: fixture input size");
    assert_eq!(want.len(), ROWS.len() * n, "{name}: fixture output size");
    let mut exact = 0;
    for (i, &r) in ROWS.iter().enumerate() {
        let at = BatchRow::at(BATCH, r);
        let mut got = vec![0f32; n];
        flint_core::dot::matvec_f32_ggml_x86(w.ty, w.bytes(), &x[i * k..(i + 1) * k], &mut got, at)
            .expect("matmul");
        for (o, (g, e)) in got.iter().zip(&want[i * n..(i + 1) * n]).enumerate() {
            assert_eq!(
                g.to_bits(),
                e.to_bits(),
                "{name} ({:?}): row {r}, output {o}: ours {g}, llama.cpp {e}",
                w.ty
            );
        }
        exact += n;
    }
    eprintln!("{name} ({:?}): {exact} outputs bit-identical", w.ty);
}

#[test]
fn gemma_matmuls_match_llama_cpp_bit_for_bit() {
    let m = model();
    let dense = |il: usize| match &m.layers[il].ffn {
        Ffn::Dense(mlp) => mlp,
        Ffn::Moe(_) => panic!("Gemma 3 layers are dense"),
    };
    check_matmul("q5_0_attn_q_0", &m.layers[0].wq);
    check_matmul("q8_0_attn_v_0", &m.layers[0].wv);
    check_matmul("q6_k_ffn_down_0", &dense(0).down);
    check_matmul("q4_k_attn_output_0", &m.layers[0].wo);
    check_matmul("q4_k_ffn_down_2", &dense(2).down);
}

#[test]
fn gemma_rope_matches_llama_cpp_bit_for_bit() {
    let m = model();
    let s = &m.spec;
    for (name, il) in [("rope_q_0", 0usize), ("rope_q_5", 5)] {
        let (x, want) = fixture(name);
        let row = s.n_heads * s.head_dim_k;
        let base = s.layers[il].rope_base;
        for (i, &pos) in ROPE_ROWS.iter().enumerate() {
            let mut got = x[i * row..(i + 1) * row].to_vec();
            flint_core::math::rope_neox_heads(&mut got, s.head_dim_k, pos, s.rope.n_rot, base);
            for (j, (g, e)) in got.iter().zip(&want[i * row..(i + 1) * row]).enumerate() {
                assert_eq!(
                    g.to_bits(),
                    e.to_bits(),
                    "{name} (base {base}): position {pos}, value {j}: ours {g}, llama.cpp {e}"
                );
            }
        }
        eprintln!(
            "{name}: base {base}, {} positions bit-identical",
            ROPE_ROWS.len()
        );
    }
}
