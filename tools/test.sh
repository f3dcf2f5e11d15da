#!/usr/bin/env bash
# The whole test suite. `.ci/run` calls this after its install, format and lint steps.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo test --workspace
# The step-by-step A/B timer is behind a feature that no normal build turns on.
cargo test -p flint-hal --features ab-test --lib
