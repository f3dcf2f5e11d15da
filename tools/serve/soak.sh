#!/usr/bin/env bash
# The soak test: starts `flint serve` on 127.0.0.1 (a free port) with a small KV pool,
# runs `tools/serve/load.py --soak SECONDS` against it (normal streams, clients that
# disconnect mid-stream, prompts longer than max_model_len, more requests than the pool
# holds at once), and stops the server. Before the soak, a short run of load.py's load
# mode (two concurrency levels) must report every request ok. Exits non-zero when
# load.py reports a violation, when the server dies, or when it is not ready in time;
# the server never outlives it.
#
# Usage: tools/serve/soak.sh [SECONDS] [load.py flags...]      (default 60 s)
#
# Environment:
#   FLINT_BIN         the flint binary [default: $CARGO_TARGET_DIR/debug/flint, else target/debug/flint]
#   FLINT_MODEL       the model [default: the default model]
#   FLINT_SOAK_KV     --kv-memory of the server in bytes [default 24000000]
#   FLINT_SOAK_SEQS   --max-num-seqs [default 8]
#   FLINT_SOAK_JSON   write load.py's report here
set -euo pipefail
cd "$(dirname "$0")/../.."

seconds="${1:-60}"
shift || true
target="${CARGO_TARGET_DIR:-$PWD/target}"
flint="${FLINT_BIN:-$target/debug/flint}"
kv="${FLINT_SOAK_KV:-24000000}"
seqs="${FLINT_SOAK_SEQS:-8}"

die() {
    echo "soak.sh: error: $*" >&2
    exit 1
}
[[ -x "$flint" ]] || die "$flint is not built (cargo build -p flint-engine --bin flint)"

log="$(mktemp "${TMPDIR:-/tmp}/flint-soak.XXXXXX")"
pid=""
stop_server() {
    if [[ -n "$pid" ]] && kill -0 "$pid" 2>/dev/null; then
        kill -TERM "$pid" 2>/dev/null || true
        # Bounded: SIGTERM, then SIGKILL after 15 s.
        for _ in $(seq 1 75); do
            kill -0 "$pid" 2>/dev/null || break
            sleep 0.2
        done
        kill -KILL "$pid" 2>/dev/null || true
        wait "$pid" 2>/dev/null || true
    fi
    pid=""
}
server_log() {
    echo "---- flint serve stderr (last 40 lines) ----" >&2
    tail -n 40 "$log" >&2 || true
    echo "----" >&2
}
trap 'stop_server; rm -f "$log"' EXIT
trap 'exit 130' INT TERM

"$flint" serve --host 127.0.0.1 --port 0 --kv-memory "$kv" --max-num-seqs "$seqs" \
    --served-model-name soak 2>"$log" &
pid=$!

# Ready: the listening line on stderr (the load may include fetching the default model,
# hence up to 10 minutes), then /health answers.
base=""
for _ in $(seq 1 3000); do
    kill -0 "$pid" 2>/dev/null || { server_log; die "flint serve exited before listening"; }
    line="$(grep -m1 -o 'on http://[^ ]*' "$log" || true)"
    if [[ -n "$line" ]]; then
        base="${line#on }"
        break
    fi
    sleep 0.2
done
[[ -n "$base" ]] || { server_log; die "flint serve did not listen within 600 s"; }
healthy=""
for _ in $(seq 1 50); do
    if python3 -c 'import sys, urllib.request; urllib.request.urlopen(sys.argv[1] + "/health", timeout=2).read()' \
        "$base" 2>/dev/null; then
        healthy=1
        break
    fi
    kill -0 "$pid" 2>/dev/null || { server_log; die "flint serve exited before /health answered"; }
    sleep 0.2
done
[[ -n "$healthy" ]] || { server_log; die "$base/health did not answer within 10 s"; }
echo "soak.sh: flint serve (pid $pid) on $base, --kv-memory $kv --max-num-seqs $seqs; soaking ${seconds} s"

# The load mode first, briefly (two levels, a shared prefix): it must report every
# request ok.
python3 tools/serve/load.py --base-url "$base/v1" --concurrency 1,2 --requests 2 \
    --prompt-tokens 32 --system-tokens 32 --max-tokens 4 --timeout 120 ||
    { server_log; die "the load mode failed (above)"; }

json_args=()
[[ -n "${FLINT_SOAK_JSON:-}" ]] && json_args=(--json "$FLINT_SOAK_JSON")
rc=0
python3 tools/serve/load.py --base-url "$base/v1" --soak "$seconds" --server-pid "$pid" \
    --expect-preemption --grace 120 --prompt-tokens 96 --max-tokens 24 ${json_args[@]+"${json_args[@]}"} "$@" || rc=$?
if ! kill -0 "$pid" 2>/dev/null; then
    server_log
    die "flint serve died during the soak"
fi
if [[ $rc -ne 0 ]]; then
    server_log
    die "the soak found violations (above)"
fi
echo "soak.sh: passed"
