//! Op-by-op parity of Flint's Gemma 3 arithmetic with llama.cpp, against full tensor dumps
//! written by `tools/golden/dump_ops.sh` (llama.cpp's own graph, one batch over the
//! teacher-forced golden paragraph).
//!
//! Each op is fed llama.cpp's own inputs and its output is compared with llama.cpp's, so
//! a difference points at that op alone, not at something upstream. Ignored by default:
//! it needs the dump (about 700 MB) in `FLINT_GGML_DUMP`:
//!
//! ```text
//! tools/golden/dump_ops.sh /tmp/gemma-dump
//! FLINT_GGML_DUMP=/tmp/gemma-dump cargo test -p flint-engine --test gemma_parity -- --ignored --nocapture
//! ```

use std::collections::HashMap;
use std::path::PathBuf;

use flint_engine::model::{load_model, Ffn, Model, TensorRef};
use flint_engine::reference;

struct Dump {
    dir: PathBuf,
    /// name -> (op, dims) in graph order.
    order: Vec<(String, String, Vec<usize>)>,
    index: HashMap<String, usize>,
}

impl Dump {
    fn open() -> Option<Self> {
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

    fn get(&self, name: &str) -> Vec<f32> {
        assert!(self.index.contains_key(name), "{name} is not in the dump");
        let b = std::fs::read(self.dir.join(format!("{name}.bin"))).expect(name);
        b.chunks_exact(4)
            .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    /// The name of the first tensor after `name` in graph order whose op is `op`.
    fn next_op(&self, name: &str, op: &str) -> String {
        let i = self.index[name];
        self.order[i + 1..]
            .iter()
            .find(|e| e.1 == op)
            .map(|e| e.0.clone())
            .expect("op after")
    }
}

/// Compares row by row (`row` values per position); prints max |diff|, how many rows are
/// bit-identical and the first row that is not.
fn cmp(name: &str, ours: &[f32], theirs: &[f32], row: usize) -> usize {
    assert_eq!(ours.len(), theirs.len(), "{name}: lengths");
    let mut max = 0.0f32;
    let mut max_rel = 0.0f32;
    let mut same = 0;
    let mut first = None;
    for (p, (a, b)) in ours.chunks(row).zip(theirs.chunks(row)).enumerate() {
        let mut eq = true;
        for (x, y) in a.iter().zip(b) {
            if x.to_bits() != y.to_bits() {
                eq = false;
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
        "{name:>22}: {same:>3}/{n} rows bit-identical, first differing {:>4}, max |d| {max:.3e} (rel {max_rel:.2e})",
        first.map(|p| p as i64).unwrap_or(-1)
    );
    n - same
}

fn matvec_rows(w: &TensorRef, x: &[f32], n_in: usize) -> Vec<f32> {
    let n = x.len() / n_in;
    let generic = std::env::var("GENERIC").is_ok();
    let mut out = Vec::new();
    for (p, r) in x.chunks(n_in).enumerate() {
        if generic {
            out.extend(reference::matvec(w, r).expect("matvec"));
            continue;
        }
        let path = if p < n - n % 4 {
            flint_core::dot::ggml_x86::Q4kPath::Gemm
        } else {
            flint_core::dot::ggml_x86::Q4kPath::Gemv
        };
        let mut o = vec![0.0; w.dims[1]];
        flint_core::dot::matvec_f32_ggml_x86(w.ty, w.bytes(), r, &mut o, path).expect("matvec");
        out.extend(o);
    }
    out
}

fn norm_rows(x: &[f32], w: &[f32], eps: f32) -> Vec<f32> {
    x.chunks(w.len())
        .flat_map(|r| reference::rms_norm(r, Some(w), eps))
        .collect()
}

fn model() -> Model {
    let path = flint_loader::fetch::default_model_path().expect("default model");
    load_model(&path).expect("loads")
}

#[test]
#[ignore = "needs a llama.cpp tensor dump in FLINT_GGML_DUMP (tools/golden/dump_ops.sh)"]
fn gemma_ops_against_llama_cpp() {
    let Some(d) = Dump::open() else {
        eprintln!("FLINT_GGML_DUMP is not set");
        return;
    };
    let m = model();
    let s = &m.spec;
    let (dk, dv, h) = (s.head_dim_k, s.head_dim_v, s.n_heads);
    let only: Option<usize> = std::env::var("LAYER").ok().and_then(|v| v.parse().ok());
    let n_tok = d.order[d.index["inp_scaled"]].2[1];
    for (il, layer) in m.layers.iter().enumerate() {
        if only.is_some_and(|l| l != il) {
            continue;
        }
        eprintln!("--- layer {il}");
        let x_in = if il == 0 {
            d.get("inp_scaled")
        } else {
            d.get(&format!("l_out-{}", il - 1))
        };
        let an = d.get(&format!("attn_norm-{il}"));
        cmp(
            "attn_norm",
            &norm_rows(&x_in, &layer.attn_norm, s.eps),
            &an,
            s.d,
        );
        let q = d.get(&format!("Qcur-{il}"));
        let k = d.get(&format!("Kcur-{il}"));
        let v = d.get(&format!("Vcur-{il}"));
        cmp(
            &format!("Qcur ({:?})", layer.wq.ty),
            &matvec_rows(&layer.wq, &an, s.d),
            &q,
            h * dk,
        );
        cmp(
            &format!("Kcur ({:?})", layer.wk.ty),
            &matvec_rows(&layer.wk, &an, s.d),
            &k,
            dk,
        );
        cmp(
            &format!("Vcur ({:?})", layer.wv.ty),
            &matvec_rows(&layer.wv, &an, s.d),
            &v,
            dv,
        );
        let qn = d.get(&format!("Qcur_normed-{il}"));
        let kn = d.get(&format!("Kcur_normed-{il}"));
        cmp(
            "Qcur_normed",
            &norm_rows(&q, layer.q_norm.as_deref().expect("q_norm"), s.eps),
            &qn,
            h * dk,
        );
        cmp(
            "Kcur_normed",
            &norm_rows(&k, layer.k_norm.as_deref().expect("k_norm"), s.eps),
            &kn,
            dk,
        );
        let qr = d.get(&format!("Qcur-{il}#2"));
        let kr = d.get(&format!("Kcur-{il}#2"));
        let base = s.layers[il].rope_base;
        let rope = |x: &[f32], row: usize| -> Vec<f32> {
            let mut y = x.to_vec();
            for (p, r) in y.chunks_mut(row).enumerate() {
                for hd in r.chunks_mut(dk) {
                    reference::rope_neox(hd, p as u32, s.n_rot, base);
                }
            }
            y
        };
        cmp("Q rope", &rope(&qn, h * dk), &qr, h * dk);
        cmp("K rope", &rope(&kn, dk), &kr, dk);
        let qs_name = d.next_op(&format!("Qcur-{il}#2"), "SCALE");
        let qs = d.get(&qs_name);
        let ours_qs: Vec<f32> = qr.iter().map(|x| x * s.attn_scale).collect();
        cmp("Q scaled", &ours_qs, &qs, h * dk);
        // Attention from llama.cpp's scaled q, its rotated k and its v, cache in f16.
        let f16 = |x: &f32| half::f16::from_f32(*x).to_f32();
        let k16: Vec<f32> = kr.iter().map(f16).collect();
        let v16: Vec<f32> = v.iter().map(f16).collect();
        let kq_name = d.next_op(&qs_name, "FLASH_ATTN_EXT");
        let kqv = d.get(&kq_name);
        let keys: Vec<&[f32]> = k16.chunks(dk).collect();
        let vals: Vec<&[f32]> = v16.chunks(dv).collect();
        let mut ours = Vec::new();
        for p in 0..n_tok {
            for hq in 0..h {
                ours.extend(reference::attend_head(
                    &qs[(p * h + hq) * dk..(p * h + hq + 1) * dk],
                    &keys,
                    &vals,
                    p,
                    1.0,
                    None,
                    s.layer_window(il),
                ));
            }
        }
        cmp("attention", &ours, &kqv, h * dv);
        let wo_name = d.next_op(&format!("kqv_out-{il}"), "MUL_MAT");
        let attn = d.get(&wo_name);
        cmp(
            &format!("wo ({:?})", layer.wo.ty),
            &matvec_rows(&layer.wo, &kqv, h * dv),
            &attn,
            s.d,
        );
        let apn = d.get(&format!("attn_post_norm-{il}"));
        cmp(
            "attn_post_norm",
            &norm_rows(&attn, layer.post_attn_norm.as_deref().expect("post"), s.eps),
            &apn,
            s.d,
        );
        let sa = d.get(&format!("sa_out-{il}"));
        let ours_sa: Vec<f32> = x_in.iter().zip(&apn).map(|(a, b)| a + b).collect();
        cmp("sa_out", &ours_sa, &sa, s.d);
        let fnm = d.get(&format!("ffn_norm-{il}"));
        cmp("ffn_norm", &norm_rows(&sa, &layer.ffn_norm, s.eps), &fnm, s.d);
        let Ffn::Dense(mlp) = &layer.ffn else {
            panic!("Gemma layers are dense")
        };
        let g = d.get(&format!("ffn_gate-{il}"));
        let u = d.get(&format!("ffn_up-{il}"));
        let ff = mlp.gate.dims[1];
        cmp(
            &format!("ffn_gate ({:?})", mlp.gate.ty),
            &matvec_rows(&mlp.gate, &fnm, s.d),
            &g,
            ff,
        );
        cmp(
            &format!("ffn_up ({:?})", mlp.up.ty),
            &matvec_rows(&mlp.up, &fnm, s.d),
            &u,
            ff,
        );
        let gg = d.get(&format!("ffn_geglu-{il}"));
        let ours_gg: Vec<f32> = g
            .iter()
            .zip(&u)
            .map(|(&a, &b)| flint_core::math::gelu_tanh_ggml_f16(a) * b)
            .collect();
        cmp("ffn_geglu", &ours_gg, &gg, ff);
        let fo = d.get(&format!("ffn_out-{il}"));
        cmp(
            &format!("ffn_down ({:?})", mlp.down.ty),
            &matvec_rows(&mlp.down, &gg, ff),
            &fo,
            s.d,
        );
        let fpn = d.get(&format!("ffn_post_norm-{il}"));
        cmp(
            "ffn_post_norm",
            &norm_rows(&fo, layer.post_ffn_norm.as_deref().expect("post"), s.eps),
            &fpn,
            s.d,
        );
        let lo = d.get(&format!("l_out-{il}"));
        let ours_lo: Vec<f32> = sa.iter().zip(&fpn).map(|(a, b)| a + b).collect();
        cmp("l_out", &ours_lo, &lo, s.d);
    }
    if only.is_none() {
        let x = d.get(&format!("l_out-{}", m.layers.len() - 1));
        cmp(
            "result_norm",
            &norm_rows(&x, &m.output_norm, s.eps),
            &d.get("result_norm"),
            s.d,
        );
    }
}

#[test]
#[ignore = "needs a llama.cpp tensor dump in FLINT_GGML_DUMP (tools/golden/dump_ops.sh)"]
fn gelu_variants() {
    let Some(d) = Dump::open() else { return };
    const S: f32 = 0.797_884_6;
    const A: f32 = 0.044715;
    let variants: [(&str, fn(f32) -> f32); 3] = [
        ("plain libm", flint_core::math::gelu_tanh),
        ("plain f64tanh", |x| 0.5 * x * (1.0 + ((S * x * (1.0 + A * x * x)) as f64).tanh() as f32)),
        ("fma f64tanh", |x| 0.5 * x * (1.0 + ((S * x * (A * x).mul_add(x, 1.0)) as f64).tanh() as f32)),
    ];
    for il in 0..18 {
        let g = d.get(&format!("ffn_gate-{il}"));
        let u = d.get(&format!("ffn_up-{il}"));
        let gg = d.get(&format!("ffn_geglu-{il}"));
        let mut line = format!("layer {il}:");
        for (name, f) in &variants {
            let bad = g.iter().zip(&u).zip(&gg).filter(|((&x, &b), &y)| {
                let v = if x <= -10.0 { 0.0 } else if x >= 10.0 { x * b } else {
                    let xh = half::f16::from_f32(x).to_f32();
                    half::f16::from_f32(f(xh)).to_f32() * b
                };
                v.to_bits() != y.to_bits()
            }).count();
            line += &format!(" {name}={bad}");
        }
        eprintln!("{line}");
    }
}

#[test]
#[ignore = "needs a llama.cpp tensor dump in FLINT_GGML_DUMP (tools/golden/dump_ops.sh)"]
fn rope_variants() {
    let Some(d) = Dump::open() else { return };
    let m = model();
    let s = &m.spec;
    for il in [0usize, 5] {
        let qn = d.get(&format!("Qcur_normed-{il}"));
        let qr = d.get(&format!("Qcur-{il}#2"));
        let base = s.layers[il].rope_base;
        let half = s.n_rot / 2;
        let ts = (base as f64).powf(-2.0 / s.n_rot as f64) as f32;
        let ts2 = ts;
        eprintln!("layer {il} base {base} ts {ts:e} libm {ts2:e}");
        let mut bad = [0usize; 4];
        for (p, (a, b)) in qn.chunks(s.d.max(1024)).zip(qr.chunks(1024)).enumerate() {
            for (ha, hb) in a.chunks(256).zip(b.chunks(256)) {
                let mut theta = p as f32;
                for i in 0..half {
                    let (c, sn) = ((theta as f64).cos() as f32, (theta as f64).sin() as f32);
                    let (x0, x1) = (ha[i], ha[i + half]);
                    let v = [
                        (x0.mul_add(c, -(x1 * sn)), x0.mul_add(sn, x1 * c)),
                        ((-x1).mul_add(sn, x0 * c), x1.mul_add(c, x0 * sn)),
                        (x0 * c - x1 * sn, x0 * sn + x1 * c),
                        (x0.mul_add(c, -(x1 * sn)), x1.mul_add(c, x0 * sn)),
                    ];
                    for (k, (y0, y1)) in v.iter().enumerate() {
                        if y0.to_bits() != hb[i].to_bits() || y1.to_bits() != hb[i + half].to_bits() {
                            bad[k] += 1;
                        }
                    }
                    theta *= ts2;
                }
            }
        }
        eprintln!("  mismatching pairs per variant: {bad:?}");
    }
}

#[test]
#[ignore = "needs a llama.cpp tensor dump in FLINT_GGML_DUMP (tools/golden/dump_ops.sh)"]
fn q6k_probe() {
    let Some(d) = Dump::open() else { return };
    let m = model();
    let Ffn::Dense(mlp) = &m.layers[0].ffn else { panic!() };
    let w = &mlp.down;
    let gg = d.get("ffn_geglu-0");
    let fo = d.get("ffn_out-0");
    let ff = w.dims[0];
    let mut stats = [0usize; 3];
    for p in 0..4 {
        let x = &gg[p * ff..(p + 1) * ff];
        let mut ours = vec![0.0; 640];
        let mut gen = vec![0.0; 640];
        flint_core::dot::matvec_f32_ggml_x86(w.ty, w.bytes(), x, &mut ours, flint_core::dot::ggml_x86::Q4kPath::Gemm).unwrap();
        flint_core::dot::matvec_f32(w.ty, w.bytes(), x, &mut gen).unwrap();

        for r in 0..640 {
            let want = fo[p * 640 + r];
            stats[0] += (ours[r] == want) as usize;
            stats[1] += (gen[r] == want) as usize;
            stats[2] += 1;
            if p == 0 && r < 5 {
                eprintln!("row {r}: llama {want:e} avx2-emul {:e} generic {:e}", ours[r], gen[r]);
            }
        }
    }
    eprintln!("exact: avx2-emul {} generic {} of {}", stats[0], stats[1], stats[2]);
}
