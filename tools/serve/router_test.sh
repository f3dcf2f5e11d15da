#!/usr/bin/env bash
# Two `flint serve` replicas behind `vllm-router` on 127.0.0.1 (tools/serve/router_test.py:
# kv_aware routing by the replicas' KV events, a drain under load, a replica killed
# mid-load, the second signal). The commands are those of docs/deploy.md, on free ports,
# over a synthetic model (`flint synth --arch flint --preset tiny`: no download). Exits
# non-zero when a check fails; no process outlives it.
#
# Usage: tools/serve/router_test.sh
#
# Environment:
#   FLINT_BIN       the flint binary [default: $CARGO_TARGET_DIR/debug/flint, else target/debug/flint]
#   FLINT_THREADS   CPU threads per replica [default 1]
set -euo pipefail
cd "$(dirname "$0")/../.."

target="${CARGO_TARGET_DIR:-$PWD/target}"
flint="${FLINT_BIN:-$target/debug/flint}"
die() {
    echo "router_test.sh: error: $*" >&2
    exit 1
}
[[ -x "$flint" ]] || die "$flint is not built (cargo build -p flint-engine --bin flint)"
command -v vllm-router >/dev/null ||
    die "vllm-router is not installed (python3 -m pip install -r tools/requirements.txt)"

tmp="$(mktemp -d "${TMPDIR:-/tmp}/flint-router.XXXXXX")"
trap 'rm -rf "$tmp"' EXIT
trap 'exit 130' INT TERM
"$flint" synth --arch flint --preset tiny --out "$tmp/tiny.gguf" 2>/dev/null
echo "router_test.sh: vllm-router $(python3 -m pip show vllm-router 2>/dev/null | sed -n 's/^Version: //p'), model $tmp/tiny.gguf"

rc=0
python3 tools/serve/router_test.py --flint "$flint" --model "$tmp/tiny.gguf" --logdir "$tmp" || rc=$?
if [[ $rc -ne 0 ]]; then
    for log in "$tmp"/*.log; do
        echo "---- $(basename "$log") (last 30 lines) ----" >&2
        tail -n 30 "$log" >&2 || true
    done
    die "checks failed (above)"
fi
