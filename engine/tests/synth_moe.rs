//! `flint synth --arch qwen3moe|glm4moe|mimo2|gpt-oss`: every small preset against the tensors
//! llama.cpp's `load_arch_tensors` creates for the file's own keys (required and
//! optional, the NextN block's included), against the description the loader reads from
//! it (the features the preset promises), the bench presets' shapes, the same bytes
//! whatever the thread count, and the `gguf` Python package reading every file.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;

use flint_core::math::Gating;
use flint_core::GgmlType;
use flint_engine::synth::dense::VocabSource;
use flint_engine::synth::moe::{moe_file, synth_moe, MoeFamily, MoeRecipe};
use flint_loader::config::{Arch, FfnDesc, ModelDesc};
use flint_loader::gguf::GgufFile;

fn small_presets() -> Vec<(MoeFamily, &'static str)> {
    MoeFamily::ALL
        .into_iter()
        .flat_map(|f| {
            f.presets()
                .iter()
                .filter(|p| !matches!(**p, "bench" | "full"))
                .map(move |p| (f, *p))
        })
        .collect()
}

fn build(family: MoeFamily, preset: &str, seed: u64) -> GgufFile {
    let r = MoeRecipe::of(family, preset).unwrap();
    let (w, params) = synth_moe(&r, seed, VocabSource::Builtin, &|_, _| {}).unwrap();
    let f = GgufFile::from_bytes(w.to_bytes()).unwrap();
    let total: usize = f
        .tensors()
        .iter()
        .map(|t| t.dims.iter().product::<usize>())
        .sum();
    assert_eq!(params, total, "{} {preset}", family.arch());
    f
}

fn u(f: &GgufFile, k: &str) -> usize {
    let arch = f.architecture().unwrap();
    f.get_usize(&format!("{arch}.{k}")).unwrap()
}

fn per_block(f: &GgufFile, k: &str, n: usize) -> Vec<usize> {
    let arch = f.architecture().unwrap();
    let key = format!("{arch}.{k}");
    match f.get_u32_array(&key) {
        Ok(v) => v.iter().map(|&x| x as usize).collect(),
        Err(_) => vec![f.get_usize(&key).unwrap(); n],
    }
}

/// What llama.cpp's `load_arch_tensors` of the file's architecture creates (with
/// `load_mtp` off: the NextN block's tensors all optional): required and optional
/// name -> shape. Written from `src/models/{qwen3moe,glm4-moe,mimo2,openai-moe}.cpp`.
type Shapes = BTreeMap<String, Vec<usize>>;
fn llama_cpp_tensors(f: &GgufFile) -> (Shapes, Shapes) {
    let arch = f.architecture().unwrap().to_string();
    let (d, n_all, h) = (
        u(f, "embedding_length"),
        u(f, "block_count"),
        u(f, "attention.head_count"),
    );
    let nextn = f
        .opt_usize(&format!("{arch}.nextn_predict_layers"))
        .unwrap()
        .unwrap_or(0);
    let n_layer = n_all - nextn;
    let hkv = per_block(f, "attention.head_count_kv", n_all);
    let (dk, dv) = (u(f, "attention.key_length"), u(f, "attention.value_length"));
    let (e, fe, ff) = (
        u(f, "expert_count"),
        u(f, "expert_feed_forward_length"),
        u(f, "feed_forward_length"),
    );
    let vocab = f.get_str_array("tokenizer.ggml.tokens").unwrap().len();
    let (mut req, mut opt) = (Shapes::new(), Shapes::new());
    req.insert("token_embd.weight".into(), vec![d, vocab]);
    req.insert("output_norm.weight".into(), vec![d]);
    if arch == "mimo2" || arch == "gpt-oss" {
        req.insert("output.weight".into(), vec![d, vocab]);
    } else {
        opt.insert("output.weight".into(), vec![d, vocab]);
    }
    for il in 0..n_all {
        let p = |s: &str| format!("blk.{il}.{s}");
        let trunk = il < n_layer;
        let mut r: Vec<(String, Vec<usize>)> = Vec::new();
        let mut o: Vec<(String, Vec<usize>)> = Vec::new();
        let (q, k, v) = (h * dk, hkv[il] * dk, hkv[il] * dv);
        r.push((p("attn_norm.weight"), vec![d]));
        r.push((p("attn_q.weight"), vec![d, q]));
        r.push((p("attn_k.weight"), vec![d, k]));
        r.push((p("attn_v.weight"), vec![d, v]));
        o.push((p("attn_qkv.weight"), vec![d, q + k + v]));
        for (n, s) in [("attn_q.bias", q), ("attn_k.bias", k), ("attn_v.bias", v)] {
            o.push((p(n), vec![s]));
        }
        r.push((p("attn_output.weight"), vec![h * dv, d]));
        let moe_layer;
        match arch.as_str() {
            "qwen3moe" => {
                r.push((p("attn_q_norm.weight"), vec![dk]));
                r.push((p("attn_k_norm.weight"), vec![dk]));
                r.push((p("ffn_norm.weight"), vec![d]));
                moe_layer = true;
            }
            "glm4moe" => {
                o.push((p("attn_q_norm.weight"), vec![dk]));
                o.push((p("attn_k_norm.weight"), vec![dk]));
                r.push((p("post_attention_norm.weight"), vec![d]));
                moe_layer = il >= u(f, "leading_dense_block_count");
                if moe_layer {
                    r.push((p("exp_probs_b.bias"), vec![e]));
                    let fs = fe * u(f, "expert_shared_count");
                    r.push((p("ffn_gate_shexp.weight"), vec![d, fs]));
                    r.push((p("ffn_up_shexp.weight"), vec![d, fs]));
                    r.push((p("ffn_down_shexp.weight"), vec![fs, d]));
                }
            }
            "gpt-oss" => {
                r.push((p("post_attention_norm.weight"), vec![d]));
                r.push((p("attn_sinks.weight"), vec![h]));
                r.push((p("attn_output.bias"), vec![d]));
                r.push((p("ffn_gate_inp.bias"), vec![e]));
                r.push((p("ffn_gate_exps.bias"), vec![fe, e]));
                r.push((p("ffn_up_exps.bias"), vec![fe, e]));
                r.push((p("ffn_down_exps.bias"), vec![d, e]));
                moe_layer = true;
            }
            _ => {
                o.push((p("attn_sinks.weight"), vec![h]));
                r.push((p("ffn_norm.weight"), vec![d]));
                // Both branches optional; the graph picks by ffn_gate_inp.
                for (n, s) in [
                    ("ffn_gate.weight", vec![d, ff]),
                    ("ffn_up.weight", vec![d, ff]),
                    ("ffn_down.weight", vec![ff, d]),
                    ("ffn_gate_inp.weight", vec![d, e]),
                    ("ffn_gate_exps.weight", vec![d, fe, e]),
                    ("ffn_up_exps.weight", vec![d, fe, e]),
                    ("ffn_down_exps.weight", vec![fe, d, e]),
                    ("exp_probs_b.bias", vec![e]),
                ] {
                    o.push((p(n), s));
                }
                moe_layer = false;
            }
        }
        if arch != "mimo2" {
            if moe_layer {
                r.push((p("ffn_gate_inp.weight"), vec![d, e]));
                r.push((p("ffn_gate_exps.weight"), vec![d, fe, e]));
                r.push((p("ffn_up_exps.weight"), vec![d, fe, e]));
                r.push((p("ffn_down_exps.weight"), vec![fe, d, e]));
            } else {
                r.push((p("ffn_gate.weight"), vec![d, ff]));
                r.push((p("ffn_up.weight"), vec![d, ff]));
                r.push((p("ffn_down.weight"), vec![ff, d]));
            }
        }
        if !trunk {
            for (n, s) in [
                ("nextn.eh_proj.weight", vec![2 * d, d]),
                ("nextn.enorm.weight", vec![d]),
                ("nextn.hnorm.weight", vec![d]),
                ("nextn.embed_tokens.weight", vec![d, vocab]),
                ("nextn.shared_head_head.weight", vec![d, vocab]),
                ("nextn.shared_head_norm.weight", vec![d]),
            ] {
                o.push((p(n), s));
            }
            if arch == "mimo2" {
                o.push((p("layer_output_norm.weight"), vec![d]));
            }
            // TENSOR_SKIP: everything of the block optional.
            o.append(&mut r);
        }
        req.extend(r);
        opt.extend(o);
    }
    (req, opt)
}

#[test]
fn every_small_preset_is_what_llama_cpp_loads() {
    for (family, preset) in small_presets() {
        let what = format!("{} {preset}", family.arch());
        let f = build(family, preset, 1);
        let (req, opt) = llama_cpp_tensors(&f);
        let have: BTreeMap<String, Vec<usize>> = f
            .tensors()
            .iter()
            .map(|t| (t.name.clone(), t.dims.clone()))
            .collect();
        for (name, shape) in &req {
            assert_eq!(have.get(name), Some(shape), "{what}: required {name}");
        }
        for (name, shape) in &have {
            let want = req.get(name).or_else(|| opt.get(name));
            assert_eq!(
                want,
                Some(shape),
                "{what}: {name} is not one llama.cpp creates"
            );
        }
        // mimo2's fused attn_qkv coexists with no split projection (the NextN block).
        let names: BTreeSet<&str> = have.keys().map(String::as_str).collect();
        for n in &names {
            if let Some(b) = n.strip_suffix("attn_qkv.weight") {
                assert!(
                    !names.contains(format!("{b}attn_q.weight").as_str()),
                    "{what}"
                );
            }
        }
        assert!(
            f.tensors().iter().all(|t| t.ty == GgmlType::F32),
            "{what}: tiny presets are f32"
        );
    }
}

#[test]
fn the_loader_reads_the_features_each_preset_promises() {
    let desc = |fam, p| ModelDesc::from_gguf(&build(fam, p, 1)).expect("description");
    // qwen3moe: softmax over 8, top-4, renormalised, QK norm, no shared expert.
    let c = desc(MoeFamily::Qwen3Moe, "tiny");
    assert_eq!(c.arch, Arch::Qwen3Moe);
    let m = c.moe.unwrap();
    assert_eq!((m.experts, m.used, m.expert_width), (8, 4, 256));
    assert_eq!(
        (m.gating, m.normalize, m.shared_count),
        (Gating::Softmax, true, 0)
    );
    assert!(c.layers.iter().all(|l| l.qk_norm && !l.biases.q));
    assert_eq!(
        (c.head_dim_k, c.rope.n_rot, c.tied_output),
        (128, 128, false)
    );
    let c = desc(MoeFamily::Qwen3Moe, "tiny-bias");
    assert!(c
        .layers
        .iter()
        .all(|l| l.biases.q && l.biases.k && l.biases.v));
    // glm4moe: sigmoid + bias + scale + shared + leading dense + partial rope + biases.
    for p in ["tiny", "tiny-nextn"] {
        let c = desc(MoeFamily::Glm4Moe, p);
        let m = c.moe.unwrap();
        assert_eq!(
            (m.gating, m.normalize, m.scale),
            (Gating::Sigmoid, true, 2.5)
        );
        assert_eq!(
            (m.shared_count, m.shared_width, m.leading_dense),
            (1, 256, 1)
        );
        assert_eq!((c.head_dim_k, c.rope.n_rot), (64, 32));
        assert_eq!(c.ffn_norm_tensor, "post_attention_norm");
        assert_eq!(c.layers.len(), 3);
        assert_eq!(c.layers[0].ffn, FfnDesc::Dense { width: 512 });
        assert!(c.layers[1..].iter().all(|l| l.ffn
            == FfnDesc::Moe {
                selection_bias: true,
                shared_expert: true,
                parallel_dense: None,
            }));
        assert!(c
            .layers
            .iter()
            .all(|l| l.biases.q && l.biases.k && l.biases.v));
        let skipped: Vec<usize> = if p == "tiny" { vec![] } else { vec![3] };
        assert_eq!(c.skipped_layers, skipped);
    }
    // mimo2: hybrid pattern, sinks on sliding layers only, swa base, per-layer KV heads,
    // dv != dk, partial rope, value scale, sigmoid + bias, leading dense.
    for p in ["tiny", "tiny-nextn"] {
        let c = desc(MoeFamily::Mimo2, p);
        let sl: Vec<bool> = c.layers.iter().map(|l| l.sliding).collect();
        assert_eq!(sl, vec![false, true, true, false]);
        assert!(c.layers.iter().all(|l| l.sinks == l.sliding));
        assert!(c
            .layers
            .iter()
            .all(|l| l.rope_base == if l.sliding { 1e4 } else { 5e6 }));
        let kv: Vec<usize> = c.layers.iter().map(|l| l.n_kv_heads).collect();
        assert_eq!(kv, vec![1, 2, 2, 1]);
        assert_eq!((c.head_dim_k, c.head_dim_v, c.rope.n_rot), (96, 64, 32));
        assert_eq!((c.window, c.value_scale), (Some(64), 0.707));
        let m = c.moe.unwrap();
        assert_eq!(
            (m.gating, m.normalize, m.leading_dense),
            (Gating::Sigmoid, true, 1)
        );
        assert!(c.layers[1..].iter().all(|l| l.ffn
            == FfnDesc::Moe {
                selection_bias: true,
                shared_expert: false,
                parallel_dense: None,
            }));
        let skipped: Vec<usize> = if p == "tiny" { vec![] } else { vec![4] };
        assert_eq!(c.skipped_layers, skipped);
    }
    // gpt-oss: alternating windows starting with a sliding layer, sinks and q/k/v/o
    // biases everywhere, YaRN on every layer, softmax over the chosen experts, router and
    // expert biases, the clamped SwiGLU.
    let c = desc(MoeFamily::GptOss, "tiny");
    let sl: Vec<bool> = c.layers.iter().map(|l| l.sliding).collect();
    assert_eq!(sl, vec![true, false, true, false]);
    assert!(c.layers.iter().all(|l| l.sinks
        && l.biases.q
        && l.biases.k
        && l.biases.v
        && l.biases.o
        && l.rope_freq_scale == 1.0 / 32.0));
    assert_eq!(c.rope.yarn.map(|y| y.n_ctx_orig), Some(4096));
    assert_eq!(c.activation, flint_loader::config::Activation::SwigluOai);
    let m = c.moe.unwrap();
    assert_eq!(
        (m.gating, m.normalize, m.used, m.experts),
        (Gating::SoftmaxWeight, false, 4, 8)
    );
    assert!(m.router_bias && m.expert_biases);
}

#[test]
fn bench_presets_have_real_per_layer_shapes_in_a_quantizable_mix() {
    let q = MoeRecipe::of(MoeFamily::Qwen3Moe, "bench").unwrap();
    assert_eq!((q.d, q.experts, q.expert_ff, q.used), (2048, 128, 768, 8));
    let g = MoeRecipe::of(MoeFamily::GptOss, "bench").unwrap();
    assert_eq!((g.d, g.experts, g.expert_ff, g.used), (2880, 32, 2880, 4));
    for family in MoeFamily::ALL {
        let r = MoeRecipe::of(family, "bench").unwrap();
        let layout = r.layout(32_000);
        // gpt-oss: llama-quantize's MXFP4_MOE mix (MXFP4 towers, Q8_0 matrices);
        // the others a Q4_K_M-like mix.
        let mix: &[GgmlType] = if family == MoeFamily::GptOss {
            &[GgmlType::MXFP4, GgmlType::Q8_0]
        } else {
            &[GgmlType::Q4_K, GgmlType::Q6_K]
        };
        for want in mix {
            assert!(
                layout.iter().any(|(_, t, _)| t == want),
                "{family:?}: no {want}"
            );
        }
        if family == MoeFamily::GptOss {
            for (name, ty, dims) in &layout {
                if dims.len() == 3 {
                    assert_eq!(*ty, GgmlType::MXFP4, "{name}");
                } else if dims.len() == 2 && !name.contains("bias") && !name.contains("gate_inp") {
                    assert_eq!(*ty, GgmlType::Q8_0, "{name}");
                }
            }
        }
        for (name, ty, dims) in &layout {
            // Every encoding fits its rows.
            assert!(ty.row_bytes(dims[0]).is_some(), "{family:?} {name} {ty}");
            if dims.len() == 1 {
                assert_eq!(*ty, GgmlType::F32, "{family:?} {name}");
            }
        }
        // A few real layers: 1.5 to 8 billion parameters.
        let p = r.param_count(32_000);
        assert!(p > 1_500_000_000 && p < 8_000_000_000, "{family:?}: {p}");
    }
}

/// The qwen3moe `full` preset is Qwen3-30B-A3B shape for shape, with its parameter count
/// (30,532,122,624, the released model's) and about 18 GB at the Q4_K_M-like mix; the
/// built-in vocabulary reaches Qwen3's 151,936 tokens. The file itself is not written.
#[test]
fn qwen3moe_full_preset_is_qwen3_30b_a3b() {
    let r = MoeRecipe::of(MoeFamily::Qwen3Moe, "full").unwrap();
    assert!(MoeFamily::Qwen3Moe.presets().contains(&"full"));
    let (d, v) = (2048, 151_936);
    assert_eq!(r.builtin_vocab, v);
    assert_eq!(
        (
            r.n_layers,
            r.d,
            r.n_heads,
            r.n_kv_heads,
            r.head_dim_k,
            r.head_dim_v
        ),
        (48, d, 32, 4, 128, 128)
    );
    assert_eq!((r.experts, r.expert_ff, r.used), (128, 768, 8));
    assert_eq!((r.context_length, r.ff), (40_960, 6144));
    let layout = r.layout(v);
    let dims = |name: &str| {
        layout
            .iter()
            .find(|(n, _, _)| n == name)
            .map(|(_, _, d)| d.clone())
            .unwrap_or_else(|| panic!("no {name}"))
    };
    assert_eq!(dims("token_embd.weight"), [d, v]);
    assert_eq!(dims("output.weight"), [d, v]);
    for il in [0, 47] {
        let p = |s: &str| dims(&format!("blk.{il}.{s}"));
        assert_eq!(p("attn_q.weight"), [d, 32 * 128]);
        assert_eq!(p("attn_k.weight"), [d, 4 * 128]);
        assert_eq!(p("attn_v.weight"), [d, 4 * 128]);
        assert_eq!(p("attn_output.weight"), [32 * 128, d]);
        assert_eq!(p("attn_q_norm.weight"), [128]);
        assert_eq!(p("ffn_gate_inp.weight"), [d, 128]);
        assert_eq!(p("ffn_gate_exps.weight"), [d, 768, 128]);
        assert_eq!(p("ffn_up_exps.weight"), [d, 768, 128]);
        assert_eq!(p("ffn_down_exps.weight"), [768, d, 128]);
    }
    assert!(!layout.iter().any(|(n, _, _)| n.starts_with("blk.48.")));
    let per_layer = 2 * d * 4096 + 2 * d * 512 + 2 * 128 + 2 * d + d * 128 + 3 * d * 768 * 128;
    let params = 48 * per_layer + 2 * v * d + d;
    assert_eq!(params, 30_532_122_624);
    assert_eq!(r.param_count(v), params);
    let bytes: usize = layout
        .iter()
        .map(|(_, ty, dims)| {
            ty.row_bytes(dims[0]).expect("whole blocks") * dims[1..].iter().product::<usize>()
        })
        .sum();
    assert!(
        (17_000_000_000..20_000_000_000).contains(&bytes),
        "{bytes} bytes"
    );
    assert_eq!(flint_engine::synth::build_vocab(v, 0).tokens.len(), v);
}

#[test]
fn seeds_differ_and_the_same_seed_gives_the_same_bytes() {
    let bytes = |seed| {
        let r = MoeRecipe::of(MoeFamily::Mimo2, "tiny-nextn").unwrap();
        synth_moe(&r, seed, VocabSource::Builtin, &|_, _| {})
            .unwrap()
            .0
            .to_bytes()
    };
    assert_eq!(bytes(5), bytes(5));
    assert_ne!(bytes(5), bytes(6));
}

/// `SynthFile::write`, which `flint synth` uses, streams the bytes the in-memory writer
/// makes.
#[test]
fn the_streamed_file_is_the_in_memory_one() {
    let dir = std::env::temp_dir().join(format!("flint-synth-stream-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for (family, preset) in [
        (MoeFamily::Qwen3Moe, "tiny"),
        (MoeFamily::Mimo2, "tiny-nextn"),
    ] {
        let r = MoeRecipe::of(family, preset).unwrap();
        let (w, params) = synth_moe(&r, 4, VocabSource::Builtin, &|_, _| {}).unwrap();
        let path = dir.join(format!("{}-{preset}.gguf", family.arch()));
        let file = moe_file(&r, 4, VocabSource::Builtin).unwrap();
        let last = std::sync::Mutex::new((0, 0));
        let streamed = file
            .write(&path, &|done, total| *last.lock().unwrap() = (done, total))
            .unwrap();
        assert_eq!(streamed, params);
        let (done, total) = *last.lock().unwrap();
        assert_eq!((done, total), (file.tensor_bytes(), file.tensor_bytes()));
        assert!(std::fs::read(&path).unwrap() == w.to_bytes(), "{preset}");
    }
    let _ = std::fs::remove_dir_all(&dir);
}

fn synth_cli(dir: &Path, arch: &str, preset: &str, threads: &str) -> PathBuf {
    let out = dir.join(format!("{arch}-{preset}-{threads}.gguf"));
    let st = Command::new(env!("CARGO_BIN_EXE_flint"))
        .args([
            "synth", "--arch", arch, "--preset", preset, "--seed", "3", "--out",
        ])
        .arg(&out)
        .env("RAYON_NUM_THREADS", threads)
        .env("FLINT_THREADS", threads)
        .output()
        .unwrap();
    assert!(
        st.status.success(),
        "{}",
        String::from_utf8_lossy(&st.stderr)
    );
    out
}

#[test]
fn cli_bytes_do_not_depend_on_threads_and_gguf_py_reads_them() {
    let dir = std::env::temp_dir().join(format!("flint-synth-moe-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let mut files = Vec::new();
    for (family, preset) in small_presets() {
        let a = synth_cli(&dir, family.arch(), preset, "1");
        let b = synth_cli(&dir, family.arch(), preset, "2");
        assert_eq!(
            std::fs::read(&a).unwrap(),
            std::fs::read(&b).unwrap(),
            "{} {preset}",
            family.arch()
        );
        files.push(a);
    }
    // `flint inspect` states the new description facts.
    let inspect = |arch: &str, preset: &str| {
        let p = dir.join(format!("{arch}-{preset}-1.gguf"));
        let o = Command::new(env!("CARGO_BIN_EXE_flint"))
            .arg("inspect")
            .arg(&p)
            .output()
            .unwrap();
        assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    let m = inspect("mimo2", "tiny-nextn");
    for want in [
        "runs: yes (mimo2 model",
        "KV heads per layer [1, 2, 2, 1], output scaled by 0.707",
        "head sizes 96/64",
        "skipped: NextN/MTP blocks 4",
    ] {
        assert!(m.contains(want), "{want} not in {m}");
    }
    let g = inspect("glm4moe", "tiny-nextn");
    for want in [
        "the FFN norm is post_attention_norm",
        "skipped: NextN/MTP blocks 3",
    ] {
        assert!(g.contains(want), "{want} not in {g}");
    }
    let has_gguf = Command::new("python3")
        .args(["-c", "import gguf, numpy"])
        .output()
        .map(|o| o.status.success())
        .unwrap_or(false);
    if !has_gguf {
        eprintln!("skipping the gguf-py check: python3 with gguf and numpy not found");
        let _ = std::fs::remove_dir_all(&dir);
        return;
    }
    const PY: &str = r#"
import sys, gguf
for p in sys.argv[1:]:
    r = gguf.GGUFReader(p)
    arch = bytes(r.fields["general.architecture"].parts[-1]).decode()
    n = int(r.fields[f"{arch}.block_count"].parts[-1][0])
    names = {t.name for t in r.tensors}
    assert "token_embd.weight" in names and "output.weight" in names, p
    assert all(f"blk.{i}.attn_norm.weight" in names for i in range(n)), p
    for t in r.tensors:
        assert t.data.size == int(t.n_elements), (p, t.name)
    print(p, arch, n, len(r.tensors))
"#;
    let out = Command::new("python3")
        .arg("-c")
        .arg(PY)
        .args(&files)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        String::from_utf8_lossy(&out.stdout).lines().count(),
        files.len()
    );
    let _ = std::fs::remove_dir_all(&dir);
}
