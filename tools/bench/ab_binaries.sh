#!/usr/bin/env bash
# Two `flint` binaries on one model, run after run in alternating order (A B, B A, ...),
# and the paired B/A ratio of each pair: for a change too large for `flint_hal::ab_test`
# (one binary per side) on a host whose memory bandwidth moves between minutes.
#
#   tools/bench/ab_binaries.sh A_BIN B_BIN [ROUNDS] [-- extra flint bench args]
#
# Env: FLINT_MODEL (default: flint's default model), FLINT_THREADS (default 2).
# Prints each run's JSON line to stderr, then per metric (prefill, decode c=1, c=4
# aggregate decode) the medians of each side and the median of the paired ratios.
set -euo pipefail
a=${1:?A binary}; b=${2:?B binary}; rounds=${3:-10}
shift $(( $# >= 3 ? 3 : $# ))
[[ "${1:-}" == "--" ]] && shift
export FLINT_THREADS=${FLINT_THREADS:-2}
model=()
[[ -n "${FLINT_MODEL:-}" ]] && model=(-m "$FLINT_MODEL")
out=$(mktemp)
trap 'rm -f "$out"' EXIT
for r in $(seq 1 "$rounds"); do
    if (( r % 2 )); then order=(A B); else order=(B A); fi
    for side in "${order[@]}"; do
        bin=$a; [[ $side == B ]] && bin=$b
        line=$("$bin" bench "${model[@]}" --json "$@" 2>/dev/null | tail -n1)
        echo "$side $line" | tee -a "$out" >&2
    done
done
python3 - "$out" <<'PY'
import json, statistics as st, sys
rows = [l.split(" ", 1) for l in open(sys.argv[1]) if l.strip()]
rows = [(s, json.loads(j)) for s, j in rows]
metrics = {
    "prefill 512": lambda d: d["prefill"]["tok_s"],
    "decode c=1": lambda d: d["decode"]["tok_s"],
    "c=4 aggregate decode": lambda d: d["aggregate"]["decode_tok_s"],
}
for name, f in metrics.items():
    a = [f(d) for s, d in rows if s == "A"]
    b = [f(d) for s, d in rows if s == "B"]
    pairs = []
    for (s1, d1), (s2, d2) in zip(rows[0::2], rows[1::2]):
        x, y = (d1, d2) if s1 == "B" else (d2, d1)
        pairs.append(f(x) / f(y))
    print(f"{name:22s} A {st.median(a):8.1f}  B {st.median(b):8.1f}  tok/s;  "
          f"B/A paired median {st.median(pairs):.3f} "
          f"(range {min(pairs):.3f}-{max(pairs):.3f}, {len(pairs)} pairs)")
PY
