//! Op-by-op parity of Flint's gpt-oss arithmetic (the reference forward's building
//! blocks) with llama.cpp, against full tensor dumps written by `tools/golden/dump_ops.sh`
//! on the gpt-oss-tiny goldens' files: attention norm, Q/K/V matmuls and their biases,
//! YaRN RoPE, attention with sinks and a window over the f16 cache, `attn_output` and
//! its bias, the post-attention norm, the F32 router and its bias, the softmax-weight
//! routing, the expert towers (`MUL_MAT_ID`) with their biases (`ADD_ID`), the clamped
//! SwiGLU, the weighting and sum over the chosen experts, the output norm and matrix.
//!
//! Each op is fed llama.cpp's own inputs and its output is compared with llama.cpp's,
//! so a difference points at that op alone. Ignored by default: it needs a dump in
//! `FLINT_GGML_DUMP` and the file it was made from in `FLINT_MODEL`:
//!
//! ```text
//! FLINT_MODEL=$PWD/engine/tests/data/families/gpt-oss-tiny/model-q8_0.gguf \
//!   IDS_JSON=engine/tests/data/families/gpt-oss-tiny/ids.json N_IDS=256 \
//!   tools/golden/dump_ops.sh /tmp/gptoss-dump
//! FLINT_GGML_DUMP=/tmp/gptoss-dump FLINT_MODEL=$PWD/engine/tests/data/families/gpt-oss-tiny/model-q8_0.gguf \
//!   cargo test --release -p flint-engine --test gptoss_parity -- --ignored --nocapture
//! ```
//!
//! On both quantized files every op is bit-identical for all 256 rows (docs/parity.md).

mod ggml_dump;

use std::path::PathBuf;

use flint_core::dot::ggml_x86::BatchRow;
use flint_engine::forward::reference;
use flint_engine::model::{layer_rope, load_model, Ffn, TensorRef};
use ggml_dump::{cmp, norm_rows, Dump};

fn rows(w: &TensorRef, off: usize, n_out: usize, x: &[f32], at: BatchRow) -> Vec<f32> {
    let mut o = vec![0.0; n_out];
    reference::matvec_rows_in(w, off, x, &mut o, at).expect("matvec");
    o
}

fn mm(w: &TensorRef, x: &[f32]) -> Vec<f32> {
    let n_in = w.dims[0];
    let n = x.len() / n_in;
    x.chunks(n_in)
        .enumerate()
        .flat_map(|(p, r)| rows(w, 0, w.dims[1], r, BatchRow::at(n, p)))
        .collect()
}

fn add_rows(x: &[f32], b: &[f32]) -> Vec<f32> {
    x.chunks(b.len())
        .flat_map(|r| r.iter().zip(b).map(|(a, b)| a + b).collect::<Vec<_>>())
        .collect()
}

#[test]
#[ignore = "needs a llama.cpp tensor dump in FLINT_GGML_DUMP and its model in FLINT_MODEL"]
fn gpt_oss_ops_against_llama_cpp() {
    let Some(d) = Dump::open() else {
        eprintln!("FLINT_GGML_DUMP is not set");
        return;
    };
    let m = load_model(&PathBuf::from(
        std::env::var_os("FLINT_MODEL").expect("FLINT_MODEL"),
    ))
    .expect("loads");
    let s = &m.spec;
    let h = s.n_heads;
    let n_tok = d.dims("embd")[1];
    for (il, layer) in m.layers.iter().enumerate() {
        eprintln!("--- layer {il}");
        let ld = &s.layers[il];
        let (hkv, dk, dv) = (ld.n_kv_heads, ld.head_dim_k, ld.head_dim_v);
        let x_in = if il == 0 {
            d.get("embd")
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
        let mut biased = Vec::new();
        for (nm, w, b, width) in [
            ("Qcur", &layer.wq, &layer.bq, h * dk),
            ("Kcur", &layer.wk, &layer.bk, hkv * dk),
            ("Vcur", &layer.wv, &layer.bv, hkv * dv),
        ] {
            let t = d.get(&format!("{nm}-{il}"));
            cmp(&format!("{nm} ({:?})", w.ty), &mm(w, &an), &t, width);
            let tb = d.get(&format!("{nm}-{il}#1"));
            cmp(
                &format!("{nm} + bias"),
                &add_rows(&t, b.as_deref().expect("bias")),
                &tb,
                width,
            );
            biased.push(tb);
        }
        let rope = layer_rope(s, il, m.rope_freqs.as_deref());
        let rot = |x: &[f32], width: usize| -> Vec<f32> {
            let mut y = x.to_vec();
            for (p, r) in y.chunks_mut(width).enumerate() {
                for hd in r.chunks_mut(dk) {
                    flint_core::math::rope(hd, p as u32, &rope);
                }
            }
            y
        };
        let qr = d.get(&format!("Qcur-{il}#3"));
        let kr = d.get(&format!("Kcur-{il}#3"));
        cmp("Q rope", &rot(&biased[0], h * dk), &qr, h * dk);
        cmp("K rope", &rot(&biased[1], hkv * dk), &kr, hkv * dk);
        let f16 = |x: &f32| half::f16::from_f32(*x).to_f32();
        let k16: Vec<f32> = kr.iter().map(f16).collect();
        let v16: Vec<f32> = biased[2].iter().map(f16).collect();
        let fa = d.next_op(&format!("Qcur-{il}#3"), "FLASH_ATTN_EXT");
        let kqv = d.get(&fa);
        let mut ours = Vec::new();
        let group = h / hkv;
        for p in 0..n_tok {
            for hq in 0..h {
                let g = hq / group;
                let keys: Vec<&[f32]> = k16
                    .chunks(hkv * dk)
                    .map(|r| &r[g * dk..(g + 1) * dk])
                    .collect();
                let vals: Vec<&[f32]> = v16
                    .chunks(hkv * dv)
                    .map(|r| &r[g * dv..(g + 1) * dv])
                    .collect();
                let q = &qr[(p * h + hq) * dk..(p * h + hq + 1) * dk];
                ours.extend(reference::attend_head(
                    flint_core::math::GgmlCpuBuild::Avx512,
                    q,
                    &keys,
                    &vals,
                    p,
                    s.attn_scale,
                    layer.sinks.as_ref().map(|x| x[hq]),
                    s.layer_window(il),
                ));
            }
        }
        cmp("attention", &ours, &kqv, h * dv);
        let wo_name = d.next_op(&format!("kqv_out-{il}"), "MUL_MAT");
        let wo = d.get(&wo_name);
        cmp(
            &format!("wo ({:?})", layer.wo.ty),
            &mm(&layer.wo, &kqv),
            &wo,
            s.d,
        );
        let ao = d.get(&d.next_op(&wo_name, "ADD"));
        cmp(
            "wo + bias",
            &add_rows(&wo, layer.bo.as_deref().expect("bo")),
            &ao,
            s.d,
        );
        let fi = d.get(&format!("ffn_inp-{il}"));
        let ours_fi: Vec<f32> = ao.iter().zip(&x_in).map(|(a, b)| a + b).collect();
        cmp("ffn_inp", &ours_fi, &fi, s.d);
        let pn = d.get(&format!("attn_post_norm-{il}"));
        cmp(
            "attn_post_norm",
            &norm_rows(&fi, &layer.ffn_norm, s.rms_eps),
            &pn,
            s.d,
        );
        let Ffn::Moe(moe) = &layer.ffn else {
            panic!("gpt-oss layers are MoE")
        };
        let ms = s.moe.expect("moe");
        let e = ms.experts;
        let lg = d.get(&format!("ffn_moe_logits-{il}"));
        cmp(
            &format!("router ({:?})", moe.router.ty),
            &mm(&moe.router, &pn),
            &lg,
            e,
        );
        let pr = d.get(&format!("ffn_moe_probs-{il}"));
        cmp(
            "router + bias",
            &add_rows(&lg, moe.router_bias.as_deref().expect("rb")),
            &pr,
            e,
        );
        let k = ms.used;
        let wsm = d.get(&format!("ffn_moe_weights_softmax-{il}"));
        let mut chosen = Vec::new();
        let mut ours_w = Vec::new();
        for row in pr.chunks(e) {
            let c = reference::route(
                flint_core::math::GgmlCpuBuild::Avx512,
                row,
                moe.bias.as_deref(),
                k,
                ms.gating,
                ms.normalize,
                ms.scale,
            )
            .expect("route");
            ours_w.extend(c.iter().map(|x| x.1));
            chosen.push(c);
        }
        cmp("routing weights", &ours_w, &wsm, k);
        let w = moe.experts.gate.dims[1];
        let gate = d.get(&format!("ffn_moe_gate-{il}"));
        let up = d.get(&format!("ffn_moe_up-{il}"));
        let gb = d.get(&format!("ffn_moe_gate_biased-{il}"));
        let ub = d.get(&format!("ffn_moe_up_biased-{il}"));
        let sw = d.get(&format!("ffn_moe_swiglu_oai-{il}"));
        let dn = d.get(&format!("ffn_moe_down-{il}"));
        let db = d.get(&format!("ffn_moe_down_biased-{il}"));
        let wt = d.get(&format!("ffn_moe_weighted-{il}"));
        let eb = moe.expert_biases.as_ref().expect("expert biases");
        let at = BatchRow::expert(n_tok);
        let (mut og, mut ou, mut ogb, mut oub, mut osw, mut odn, mut odb, mut owt) = (
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
            vec![],
        );
        for (p, c) in chosen.iter().enumerate() {
            let x = &pn[p * s.d..(p + 1) * s.d];
            for (j, &(ex, wgt)) in c.iter().enumerate() {
                let slot = (p * k + j) * w;
                og.extend(rows(&moe.experts.gate, ex * w, w, x, at));
                ou.extend(rows(&moe.experts.up, ex * w, w, x, at));
                ogb.extend(add_rows(
                    &gate[slot..slot + w],
                    &eb.gate[ex * w..(ex + 1) * w],
                ));
                oub.extend(add_rows(&up[slot..slot + w], &eb.up[ex * w..(ex + 1) * w]));
                osw.extend(
                    gb[slot..slot + w]
                        .iter()
                        .zip(&ub[slot..slot + w])
                        .map(|(&g, &u)| flint_core::math::swiglu_oai(g, u)),
                );
                let dslot = (p * k + j) * s.d;
                odn.extend(rows(
                    &moe.experts.down,
                    ex * s.d,
                    s.d,
                    &sw[slot..slot + w],
                    at,
                ));
                odb.extend(add_rows(
                    &dn[dslot..dslot + s.d],
                    &eb.down[ex * s.d..(ex + 1) * s.d],
                ));
                owt.extend(db[dslot..dslot + s.d].iter().map(|&y| y * wgt));
            }
        }
        cmp(
            &format!("expert gate ({:?})", moe.experts.gate.ty),
            &og,
            &gate,
            w,
        );
        cmp("expert gate + bias", &ogb, &gb, w);
        cmp(&format!("expert up ({:?})", moe.experts.up.ty), &ou, &up, w);
        cmp("expert up + bias", &oub, &ub, w);
        cmp("swiglu_oai", &osw, &sw, w);
        cmp(
            &format!("expert down ({:?})", moe.experts.down.ty),
            &odn,
            &dn,
            s.d,
        );
        cmp("expert down + bias", &odb, &db, s.d);
        cmp("weighted", &owt, &wt, s.d);
        let mo = d.get(&format!("ffn_moe_out-{il}"));
        let mut ours_mo = Vec::new();
        for p in 0..n_tok {
            let mut acc = wt[p * k * s.d..(p * k + 1) * s.d].to_vec();
            for j in 1..k {
                let o = (p * k + j) * s.d;
                for (a, b) in acc.iter_mut().zip(&wt[o..o + s.d]) {
                    *a += b;
                }
            }
            ours_mo.extend(acc);
        }
        cmp("ffn_moe_out", &ours_mo, &mo, s.d);
        let lo = d.get(&format!("l_out-{il}"));
        let ours_lo: Vec<f32> = mo.iter().zip(&fi).map(|(a, b)| a + b).collect();
        cmp("l_out", &ours_lo, &lo, s.d);
    }
    let x = d.get(&format!("l_out-{}", m.layers.len() - 1));
    let rn = d.get("result_norm");
    cmp(
        "result_norm",
        &norm_rows(&x, &m.output_norm, s.rms_eps),
        &rn,
        s.d,
    );
    let ro = d.get("result_output");
    cmp(
        &format!("output ({:?})", m.output.ty),
        &mm(&m.output, &rn),
        &ro,
        s.vocab,
    );
}
