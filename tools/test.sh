#!/usr/bin/env bash
# The whole test suite. `.ci/run` calls this after its install, format and lint steps.
set -euo pipefail
cd "$(dirname "$0")/.."
# llama.cpp's source (fetched and unpacked once, never built here): the tokenizer and
# chat-template tests read its vocabulary GGUFs, test vectors and templates.
if [[ -z "${FLINT_LLAMACPP_SRC:-}" ]]; then
    FLINT_LLAMACPP_SRC="$(tools/llamacpp_sdist.sh | tail -n1)"
    export FLINT_LLAMACPP_SRC
fi
cargo test --workspace
# The step-by-step A/B timer is behind a feature that no normal build turns on.
cargo test -p flint-hal --features ab-test --lib
# The load tool's arithmetic and parsing (tools/serve/load.py; the soak itself is a step
# of .ci/run).
python3 -B -m unittest tools/serve/test_load.py
