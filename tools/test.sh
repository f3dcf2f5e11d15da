#!/usr/bin/env bash
# The whole test suite. `.ci/run` calls this after its install, format and lint steps.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
