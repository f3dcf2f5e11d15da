//! Compiles the WGSL compute shaders in `shaders/` to SPIR-V with naga (pure Rust: no
//! external shader compiler is needed to build Flint).
//!
//! - `shaders/*.wgsl` other than the weight templates and the prelude: one shader each,
//!   and for one that uses f64 a second, `<name>_f32`, with f32 in its place (for
//!   devices without shaderFloat64).
//! - The weight templates (`matmul.wgsl`, `matmul_rows.wgsl`, `get_rows.wgsl`) are joined with
//!   `prelude.wgsl` and each `blocks/<type>.wgsl` into `<template>_<type>`;
//!   `matmul_exact.wgsl` with each `exact/<type>.wgsl` (the types it computes in the cpu
//!   device's order). The matmul templates also get `matmul_params.wgsl`, their push
//!   constants. A joined shader that uses f64 gets an `_f32` variant as well.
//! - A line `// #include PATH` in any of them is replaced by that file of `shaders/`
//!   (`lib/`: functions several shaders share; an `exact/` file includes its type's
//!   `blocks/` file for the integer decoder `ints32`).
//!
//! The SPIR-V lands in `OUT_DIR`; `shaders.rs` there lists every shader by name
//! (`include!`d by `src/shaders.rs`). A shader that does not parse or validate fails the
//! build with naga's message, naming the file.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};

/// (template, folder of the per-type files joined with it, whether it takes the matmul
/// push constants).
const TEMPLATES: [(&str, &str, bool); 4] = [
    ("matmul", "blocks", true),
    ("matmul_rows", "blocks", true),
    ("get_rows", "blocks", false),
    ("matmul_exact", "exact", true),
];

fn compile(name: &str, src: &str, out_dir: &Path) -> PathBuf {
    let module = match naga::front::wgsl::parse_str(src) {
        Ok(m) => m,
        Err(e) => panic!("shader {name}: {}", e.emit_to_string(src)),
    };
    let info = naga::valid::Validator::new(
        naga::valid::ValidationFlags::all(),
        naga::valid::Capabilities::all(),
    )
    .validate(&module)
    .unwrap_or_else(|e| panic!("shader {name}: {}", e.emit_to_string(src)));
    let options = naga::back::spv::Options {
        lang_version: (1, 3),
        ..Default::default()
    };
    let words = naga::back::spv::write_vec(&module, &info, &options, None)
        .unwrap_or_else(|e| panic!("shader {name}: SPIR-V output: {e}"));
    let bytes: Vec<u8> = words.iter().flat_map(|w| w.to_le_bytes()).collect();
    let path = out_dir.join(format!("{name}.spv"));
    std::fs::write(&path, bytes).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    path
}

fn read(p: &Path) -> String {
    println!("cargo:rerun-if-changed={}", p.display());
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// `src` with each line `// #include PATH` replaced by that file of `shaders/`
/// (WGSL has no includes; shared functions live once in `shaders/lib/`).
fn includes(src: &str, shaders: &Path) -> String {
    src.lines()
        .map(|l| match l.trim().strip_prefix("// #include ") {
            Some(f) => read(&shaders.join(f.trim())),
            None => format!("{l}\n"),
        })
        .collect()
}

fn wgsl_files(dir: &Path) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dir)
        .unwrap_or_else(|e| panic!("{}: {e}", dir.display()))
        .map(|e| e.expect("dir entry").path())
        .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
        .collect();
    v.sort();
    v
}

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").expect("CARGO_MANIFEST_DIR"));
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let shaders = root.join("shaders");
    println!("cargo:rerun-if-changed={}", shaders.display());
    for dir in ["blocks", "exact", "lib"] {
        println!("cargo:rerun-if-changed={}", shaders.join(dir).display());
    }
    let prelude = read(&shaders.join("prelude.wgsl"));
    let params = read(&shaders.join("matmul_params.wgsl"));

    let mut list = String::from("/// Every compiled shader: (name, SPIR-V bytes).\npub const SHADERS: &[(&str, &[u8])] = &[\n");
    let mut add = |name: &str, path: &Path| {
        writeln!(
            list,
            "    ({name:?}, include_bytes!({:?})),",
            path.display().to_string()
        )
        .expect("write to a String");
    };

    for p in wgsl_files(&shaders) {
        let stem = p
            .file_stem()
            .and_then(|s| s.to_str())
            .expect("utf-8 name")
            .to_string();
        if stem == "prelude"
            || stem == "matmul_params"
            || TEMPLATES.iter().any(|(t, _, _)| *t == stem)
        {
            continue;
        }
        let src = includes(&read(&p), &shaders);
        let path = compile(&stem, &src, &out_dir);
        add(&stem, &path);
        // A shader that sums in f64 (as ggml's CPU code does) also gets an f32 variant,
        // `<name>_f32`, for devices without shaderFloat64.
        if src.contains("f64") {
            let name = format!("{stem}_f32");
            let path = compile(&name, &src.replace("f64", "f32"), &out_dir);
            add(&name, &path);
        }
    }
    for (t, dir, with_params) in TEMPLATES {
        let template = read(&shaders.join(format!("{t}.wgsl")));
        let params = if with_params { params.as_str() } else { "" };
        for b in wgsl_files(&shaders.join(dir)) {
            let ty = b
                .file_stem()
                .and_then(|s| s.to_str())
                .expect("utf-8 name")
                .to_string();
            let src = includes(
                &format!("{prelude}\n{params}\n{}\n{template}", read(&b)),
                &shaders,
            );
            let name = format!("{t}_{ty}");
            let path = compile(&name, &src, &out_dir);
            add(&name, &path);
            if src.contains("f64") {
                let name = format!("{name}_f32");
                let path = compile(&name, &src.replace("f64", "f32"), &out_dir);
                add(&name, &path);
            }
        }
    }
    list.push_str("];\n");
    let gen = out_dir.join("shaders.rs");
    std::fs::write(&gen, list).unwrap_or_else(|e| panic!("{}: {e}", gen.display()));
}
