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
//!
//! `LAYER=n` limits the run to one layer; `GENERIC=1` computes the matmuls in ggml's
//! generic-C order instead of llama.cpp's x86 one, to see what that order changes.

mod ggml_dump;

use flint_engine::forward::reference;
use flint_engine::model::{load_model, Ffn, Model, TensorRef};
use ggml_dump::{cmp, norm_rows, Dump};

fn matvec_rows(w: &TensorRef, x: &[f32], n_in: usize) -> Vec<f32> {
    let n = x.len() / n_in;
    let generic = std::env::var("GENERIC").is_ok();
    let mut out = Vec::new();
    for (p, r) in x.chunks(n_in).enumerate() {
        if generic {
            out.extend(reference::matvec(w, r).expect("matvec"));
            continue;
        }
        let at = flint_core::dot::ggml_x86::BatchRow::at(n, p);
        let mut o = vec![0.0; w.dims[1]];
        flint_core::dot::matvec_f32_ggml_x86(w.ty, w.bytes(), r, &mut o, at).expect("matvec");
        out.extend(o);
    }
    out
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
    let n_tok = d.dims("inp_scaled")[1];
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
            &norm_rows(&x_in, &layer.attn_norm, s.rms_eps),
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
            &norm_rows(&q, layer.q_norm.as_deref().expect("q_norm"), s.rms_eps),
            &qn,
            h * dk,
        );
        cmp(
            "Kcur_normed",
            &norm_rows(&k, layer.k_norm.as_deref().expect("k_norm"), s.rms_eps),
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
                    reference::rope_neox(hd, p as u32, s.rope.n_rot, base);
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
                let q = &qs[(p * h + hq) * dk..(p * h + hq + 1) * dk];
                if n_tok >= flint_core::math::GGML_FA_TILE_Q {
                    ours.extend(reference::attend_head(
                        flint_core::math::GgmlCpuBuild::Avx512,
                        q,
                        &keys,
                        &vals,
                        p,
                        1.0,
                        None,
                        s.layer_window(il),
                    ));
                } else {
                    let mut o = vec![0.0; dv];
                    flint_core::math::attend_ggml_one_chunk(
                        flint_core::math::GgmlCpuBuild::Avx512,
                        q,
                        &keys[..=p],
                        &vals[..=p],
                        1.0,
                        None,
                        &mut o,
                    );
                    ours.extend(o);
                }
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
            &norm_rows(
                &attn,
                layer.post_attn_norm.as_deref().expect("post"),
                s.rms_eps,
            ),
            &apn,
            s.d,
        );
        let sa = d.get(&format!("sa_out-{il}"));
        let ours_sa: Vec<f32> = x_in.iter().zip(&apn).map(|(a, b)| a + b).collect();
        cmp("sa_out", &ours_sa, &sa, s.d);
        let fnm = d.get(&format!("ffn_norm-{il}"));
        cmp(
            "ffn_norm",
            &norm_rows(&sa, &layer.ffn_norm, s.rms_eps),
            &fnm,
            s.d,
        );
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
            &norm_rows(
                &fo,
                layer.post_ffn_norm.as_deref().expect("post"),
                s.rms_eps,
            ),
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
            &norm_rows(&x, &m.output_norm, s.rms_eps),
            &d.get("result_norm"),
            s.d,
        );
    }
}

/// The reference forward over the dump's tokens (`ids.txt`) against the dump's logits
/// (`logits.bin`): all rows, or the last only with `LAST_ONLY=1` (a generation prefill).
#[test]
#[ignore = "needs a llama.cpp tensor dump in FLINT_GGML_DUMP (tools/golden/dump_ops.sh)"]
fn reference_logits_against_dump() {
    let Some(d) = Dump::open() else { return };
    let m = model();
    let ids: Vec<u32> = std::fs::read_to_string(d.dir().join("ids.txt"))
        .expect("ids.txt")
        .split_whitespace()
        .map(|t| t.parse().expect("id"))
        .collect();
    let b = std::fs::read(d.dir().join("logits.bin")).expect("logits.bin");
    let want: Vec<f32> = b
        .chunks_exact(4)
        .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect();
    let last_only = std::env::var("LAST_ONLY").is_ok();
    let mut r = flint_engine::forward::reference::Reference::new(&m);
    if last_only {
        r.set_prompt_batch(ids.len());
    } else {
        r.set_batch_len(ids.len());
    }
    let v = m.spec.vocab;
    for (p, &t) in ids.iter().enumerate() {
        let got = r.forward(t).expect("forward");
        let row = if last_only {
            if p + 1 < ids.len() {
                continue;
            }
            &want[..v]
        } else {
            &want[p * v..(p + 1) * v]
        };
        cmp(&format!("logits pos {p}"), &got, row, v);
    }
}

/// The last layer after attention on the single output row of a generation prefill
/// (`LAST_ONLY=1` dumps), each op from llama.cpp's inputs.
#[test]
#[ignore = "needs a LAST_ONLY llama.cpp tensor dump in FLINT_GGML_DUMP"]
fn last_layer_single_row() {
    use flint_core::dot::ggml_x86::BatchRow;
    let Some(d) = Dump::open() else { return };
    let m = model();
    let s = &m.spec;
    let il = m.layers.len() - 1;
    let layer = &m.layers[il];
    let Ffn::Dense(mlp) = &layer.ffn else {
        panic!("dense")
    };
    let mv = |w: &TensorRef, x: &[f32]| {
        let mut o = vec![0.0; w.dims[1]];
        flint_core::dot::matvec_f32_ggml_x86(w.ty, w.bytes(), x, &mut o, BatchRow::SINGLE)
            .expect("mv");
        o
    };
    let wo_all = d.get(&d.next_op(&format!("kqv_out-{il}"), "MUL_MAT"));
    let n = wo_all.len() / s.d;
    let wo_last = &wo_all[(n - 1) * s.d..];
    let apn = d.get(&format!("attn_post_norm-{il}"));
    cmp(
        "attn_post_norm",
        &norm_rows(
            wo_last,
            layer.post_attn_norm.as_deref().expect("p"),
            s.rms_eps,
        ),
        &apn,
        s.d,
    );
    let fnm = d.get(&format!("ffn_norm-{il}"));
    let sa = d.get(&format!("sa_out-{il}"));
    cmp(
        "ffn_norm",
        &norm_rows(&sa, &layer.ffn_norm, s.rms_eps),
        &fnm,
        s.d,
    );
    let g = d.get(&format!("ffn_gate-{il}"));
    let u = d.get(&format!("ffn_up-{il}"));
    cmp("gate", &mv(&mlp.gate, &fnm), &g, g.len());
    cmp("up", &mv(&mlp.up, &fnm), &u, u.len());
    let gg = d.get(&format!("ffn_geglu-{il}"));
    let fo = d.get(&format!("ffn_out-{il}"));
    cmp(
        &format!("down {:?}", mlp.down.ty),
        &mv(&mlp.down, &gg),
        &fo,
        fo.len(),
    );
    let rn = d.get("result_norm");
    cmp(
        "result_norm",
        &norm_rows(&d.get(&format!("l_out-{il}")), &m.output_norm, s.rms_eps),
        &rn,
        s.d,
    );
    let ro = d.get("result_output");
    cmp("output", &mv(&m.output, &rn), &ro, ro.len());
}
