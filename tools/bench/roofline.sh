#!/usr/bin/env bash
# Decode at c=1 against the read-bandwidth roofline, for any model Flint runs (the
# `flint synth --preset bench` checkpoint in particular, which llama.cpp cannot load).
#
#   tools/bench/roofline.sh MODEL [ROUNDS]
#
# Measures, interleaved: the plain read loop (tools/bench/readbw.c, FLINT_BENCH_THREADS
# threads, default 2) and `flint bench --json` (FLINT_THREADS the same), ROUNDS times
# (default 3). Prints the weight bytes one decoded token reads (bench_report.py
# weights: dense tensors, k of E experts, one embedding row), the median bandwidth, the
# roofline (bandwidth / bytes per token), the median decode tok/s and its fraction of the
# roofline, and the c=4 vs c=1 aggregate ratio. Needs a release `flint` (FLINT_BIN, else
# target/release/flint) and python3 with `gguf`.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
model="${1:?usage: roofline.sh MODEL [ROUNDS]}"
rounds="${2:-3}"
threads="${FLINT_BENCH_THREADS:-2}"
flint_bin="${FLINT_BIN:-${CARGO_TARGET_DIR:-$repo/target}/release/flint}"
cache="${XDG_CACHE_HOME:-$HOME/.cache}/flint"
[[ -f "$model" ]] || { echo "roofline.sh: no model at $model" >&2; exit 1; }
[[ -x "$flint_bin" ]] || {
    echo "roofline.sh: no Flint binary at $flint_bin (cargo build --release -p flint-engine --bin flint)" >&2
    exit 1
}
mkdir -p "$cache"
readbw="$cache/readbw"
if [[ ! -x "$readbw" || "$here/readbw.c" -nt "$readbw" ]]; then
    cc -O3 -march=native -pthread -std=c11 "$here/readbw.c" -o "$readbw" 2>/dev/null ||
        cc -O3 -pthread -std=c11 "$here/readbw.c" -o "$readbw"
fi
out="$(mktemp -d)"
trap 'rm -rf "$out"' EXIT
python3 "$here/bench_report.py" weights "$model" >"$out/weights.json"
for r in $(seq 1 "$rounds"); do
    "$readbw" 2147483648 "$threads" 3 >"$out/bw.$r.json"
    FLINT_THREADS="$threads" "$flint_bin" bench --json -m "$model" 2>/dev/null | grep '^{' >"$out/flint.$r.json"
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
w = json.load(open(f"{out}/weights.json"))
bws = [json.load(open(f"{out}/bw.{r}.json"))["median_gb_s"] for r in range(1, rounds + 1)]
fl = [json.load(open(f"{out}/flint.{r}.json")) for r in range(1, rounds + 1)]
dec = [f["decode"]["tok_s"] for f in fl]
agg = [f["aggregate"]["decode_tok_s"] for f in fl]
pre = [f["prefill"]["tok_s"] for f in fl]
bw = statistics.median(bws)
per_tok = w["bytes_per_token"]
roof = bw * 1e9 / per_tok
d = statistics.median(dec)
print(f"model            {w['model']}")
print(f"weights/token    {per_tok / 1e6:.1f} MB (experts: {w['experts_used']} of each tower)")
print(f"read bandwidth   {bw:.1f} GB/s median of {rounds} (runs: {', '.join(f'{x:.1f}' for x in bws)})")
print(f"roofline         {roof:.1f} tok/s")
print(f"decode c=1       {d:.1f} tok/s median (runs: {', '.join(f'{x:.1f}' for x in dec)}) = {100 * d / roof:.0f}% of the roofline")
a = statistics.median(agg)
print(f"decode c=4       {a:.1f} tok/s median (runs: {', '.join(f'{x:.1f}' for x in agg)}) = {a / d:.2f}x c=1")
print(f"prefill 512      {statistics.median(pre):.1f} tok/s median")
PY
