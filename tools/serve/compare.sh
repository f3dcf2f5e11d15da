#!/usr/bin/env bash
# flint serve against llama.cpp's llama-server: the same model file, the same cores, the
# same client (tools/serve/load.py, the official openai client), alternating rounds.
#
#   tools/serve/compare.sh [MODEL.gguf] [ROUNDS] [LEVELS]
#
# MODEL defaults to Flint's default model (Gemma 3 270M Q4_K_M, fetched on first use),
# ROUNDS to 2, LEVELS to 1,4,16. Needs a release build of flint (`cargo build --release`)
# and llama-server (tools/bench/build_llamacpp.sh). llama-server runs with 16 slots,
# continuous batching and --jinja; both servers get $THREADS threads (default: nproc).
# Each round writes load.py's JSON report per server to $OUT (default
# target/serve-compare); the summary prints per level the medians over rounds of output
# tok/s and p50 TTFT, and Flint's ratios.
set -euo pipefail
cd "$(dirname "$0")/../.."

model="${1:-}"
rounds="${2:-2}"
levels="${3:-1,4,16}"
threads="${THREADS:-$(nproc)}"
out="${OUT:-target/serve-compare}"
requests="${REQUESTS:-32}"
flint="${FLINT_BIN:-target/release/flint}"
llama_bin="${LLAMA_BIN:-$HOME/.cache/flint/llama.cpp-11434/build/bin}"
mkdir -p "$out"

if [[ -z "$model" ]]; then
    "$flint" tokenize "warm-up" >/dev/null
    model="$(ls "${XDG_CACHE_HOME:-$HOME/.cache}"/flint/gemma-3-270m-q4_k_m.gguf)"
fi
[[ -x "$flint" ]] || { echo "no flint binary at $flint (cargo build --release)" >&2; exit 2; }
[[ -x "$llama_bin/llama-server" ]] || { echo "no llama-server in $llama_bin (tools/bench/build_llamacpp.sh)" >&2; exit 2; }

wait_health() {
    local url="$1"
    for _ in $(seq 1 600); do
        if curl -sf "$url/health" >/dev/null 2>&1; then return 0; fi
        sleep 0.2
    done
    echo "server at $url did not become healthy" >&2
    return 1
}

run_one() {
    local who="$1" round="$2" pid
    case "$who" in
    flint)
        FLINT_THREADS="$threads" "$flint" serve -m "$model" --port 18080 --max-num-seqs 16 \
            >"$out/flint-serve.log" 2>&1 &
        pid=$!
        ;;
    llama)
        "$llama_bin/llama-server" -m "$model" --port 18080 -np 16 -cb --jinja -t "$threads" \
            -c 16384 >"$out/llama-server.log" 2>&1 &
        pid=$!
        ;;
    esac
    wait_health http://127.0.0.1:18080
    python3 -B tools/serve/load.py --base-url http://127.0.0.1:18080/v1 \
        --concurrency "$levels" --requests "$requests" --max-tokens 64 --ignore-eos \
        --json "$out/$who-$round.json" | sed "s/^/[$who round $round] /"
    kill "$pid"
    wait "$pid" 2>/dev/null || true
}

for r in $(seq 1 "$rounds"); do
    if (( r % 2 == 1 )); then order="flint llama"; else order="llama flint"; fi
    for who in $order; do run_one "$who" "$r"; done
done

python3 - "$out" "$rounds" <<'EOF'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def levels(who):
    per = {}
    for r in range(1, rounds + 1):
        rep = json.load(open(f"{out}/{who}-{r}.json"))
        for lv in rep["levels"]:
            per.setdefault(lv["concurrency"], []).append(lv)
    return per
f, l = levels("flint"), levels("llama")
print(f"{'clients':>7} {'flint tok/s':>12} {'llama tok/s':>12} {'ratio':>6} {'flint TTFT p50':>15} {'llama TTFT p50':>15} {'ratio':>6}")
for c in sorted(f):
    ft = statistics.median(x["output_tok_s"] for x in f[c])
    lt = statistics.median(x["output_tok_s"] for x in l[c])
    fq = statistics.median(x["ttft_ms"]["p50"] for x in f[c])
    lq = statistics.median(x["ttft_ms"]["p50"] for x in l[c])
    print(f"{c:>7} {ft:>12.1f} {lt:>12.1f} {ft/lt:>6.2f} {fq:>13.0f}ms {lq:>13.0f}ms {fq/lq:>6.2f}")
EOF
