#!/usr/bin/env bash
# Builds one of the C++ oracle harnesses in this folder against llama.cpp's static
# libraries and runs it with the remaining arguments:
#   tools/golden/llamacpp_run.sh llamacpp_logits MODEL.gguf logits IDS OUT.json [options]
#   tools/golden/llamacpp_run.sh llamacpp_logits MODEL.gguf greedy PROMPTS.txt OUT.jsonl [options]
#   tools/golden/llamacpp_run.sh llamacpp_tokenize VOCAB.gguf IN.jsonl OUT.jsonl [options]
#   tools/golden/llamacpp_run.sh llamacpp_chat TEMPLATE.jinja IN.jsonl OUT.jsonl [options]
#   tools/golden/llamacpp_run.sh llamacpp_pretokenize REGEXES.json IN.jsonl OUT.jsonl
# Usage and formats: the head of each .cpp file. llama.cpp itself comes from
# tools/bench/build_llamacpp.sh (called here; a no-op once built). The harness binary is
# cached next to that build, in build/flint/NAME, and rebuilt when its source is newer.
# THREADS is not read here: each harness takes --threads where it computes.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
die() {
    echo "llamacpp_run.sh: error: $*" >&2
    exit 1
}
name="${1:-}"
[[ -n "$name" && -f "$here/$name.cpp" ]] ||
    die "usage: llamacpp_run.sh llamacpp_logits|llamacpp_tokenize ARGS... (no $here/$name.cpp)"
shift

bindir="$("$here/../bench/build_llamacpp.sh" | tail -n1)"
build="$(dirname "$bindir")"
src="$("$here/../llamacpp_sdist.sh" | tail -n1)"
exe="$build/flint/$name"
# llamacpp_chat also needs llama.cpp's common library (its Jinja engine and chat code).
extra=()
if [[ "$name" == llamacpp_chat ]]; then
    extra=(-I"$src/common" "$build/common/libllama-common.a" "$build/common/libllama-common-base.a"
        "$build/vendor/cpp-httplib/libcpp-httplib.a")
fi
# llamacpp_pretokenize calls unicode_regex_split, declared in llama.cpp's src/unicode.h.
if [[ "$name" == llamacpp_pretokenize ]]; then
    extra=(-I"$src/src")
fi
if [[ ! -x "$exe" || "$here/$name.cpp" -nt "$exe" || "$build/src/libllama.a" -nt "$exe" ]]; then
    mkdir -p "$build/flint"
    echo "llamacpp_run.sh: compiling $exe" >&2
    nice g++ -O2 -std=c++17 -I"$src/include" -I"$src/ggml/include" -I"$src/vendor" \
        "$here/$name.cpp" -o "$exe.part" "${extra[@]}" "$build/src/libllama.a" "$build/ggml/src/libggml.a" \
        "$build/ggml/src/libggml-cpu.a" "$build/ggml/src/libggml-base.a" \
        -fopenmp -lpthread -ldl -lm || die "compiling $name.cpp failed"
    mv "$exe.part" "$exe"
fi
exec "$exe" "$@"
