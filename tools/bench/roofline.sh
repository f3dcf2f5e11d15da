#!/usr/bin/env bash
# Decode at c=1 against the read-bandwidth roofline, for any model Flint runs (the
# `flint synth --preset bench` checkpoint in particular, which llama.cpp cannot load).
#
#   tools/bench/roofline.sh MODEL [ROUNDS]
#
# Measures, interleaved: the read loop (tools/bench/readbw.c, FLINT_BENCH_THREADS
# threads, default 2) and `flint bench --json` (FLINT_THREADS the same), ROUNDS times
# (default 3). Prints the weight bytes one decoded token reads (bench_report.py
# weights: dense tensors, k of E experts, one embedding row), the median bandwidth, the
# roofline (bandwidth / bytes per token), the median decode tok/s and its fraction of the
# roofline, and the c=4 vs c=1 aggregate ratio; then each round against the loop measured
# just before and after it (this host's memory switches between a slow and a fast state
# every few seconds: a round that straddled a switch is marked). Needs a release `flint`
# (FLINT_BIN, else target/release/flint) and python3 with `gguf`.
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
    # The read loop just before and just after the bench: this host's memory switches
    # between a slow and a fast state every few seconds, and a round whose two readings
    # disagree straddled a switch.
    "$readbw" 2147483648 "$threads" 3 >"$out/bw.$r.json"
    FLINT_THREADS="$threads" "$flint_bin" bench --json -m "$model" 2>/dev/null | grep '^{' >"$out/flint.$r.json"
    "$readbw" 2147483648 "$threads" 3 >"$out/bw_after.$r.json"
done
python3 - "$out" "$rounds" <<'PY'
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
w = json.load(open(f"{out}/weights.json"))
rs = range(1, rounds + 1)
before = [json.load(open(f"{out}/bw.{r}.json"))["median_gb_s"] for r in rs]
after = [json.load(open(f"{out}/bw_after.{r}.json"))["median_gb_s"] for r in rs]
fl = [json.load(open(f"{out}/flint.{r}.json")) for r in rs]
dec = [f["decode"]["tok_s"] for f in fl]
agg = [f["aggregate"]["decode_tok_s"] for f in fl]
pre = [f["prefill"]["tok_s"] for f in fl]
per_tok = w["bytes_per_token"]
bws = before + after
bw = statistics.median(bws)
roof = bw * 1e9 / per_tok
d = statistics.median(dec)
print(f"model            {w['model']}")
print(f"weights/token    {per_tok / 1e6:.1f} MB (experts: {w['experts_used']} of each tower)")
print(f"read bandwidth   {bw:.1f} GB/s median of {2 * rounds} (before / after each round below)")
print(f"roofline         {roof:.1f} tok/s")
print(f"decode c=1       {d:.1f} tok/s median = {100 * d / roof:.0f}% of the roofline")
a = statistics.median(agg)
print(f"decode c=4       {a:.1f} tok/s median = {a / d:.2f}x c=1")
print(f"prefill 512      {statistics.median(pre):.1f} tok/s median")
# Per round, against the bandwidth measured around it; "steady" when the two readings
# agree within 10%, so that the round most likely ran in one memory state.
print("round  loop before / after  decode c=1  of its roofline  c=4 / c=1")
steady = []
for i, r in enumerate(rs):
    b, e = before[i], after[i]
    mid = (b + e) / 2
    frac = dec[i] * per_tok / (mid * 1e9)
    ok = abs(b - e) <= 0.1 * max(b, e)
    if ok:
        steady.append((mid, frac))
    print(f"{r:5d}  {b:6.1f} / {e:5.1f} GB/s  {dec[i]:7.1f} tok/s  {100 * frac:5.0f}%{'' if ok else ' (state changed)':16s}  {agg[i] / dec[i]:.2f}x")
if steady:
    steady.sort()
    print("steady rounds, slowest loop first: " + ", ".join(f"{100 * f:.0f}% at {m:.1f} GB/s" for m, f in steady))
PY
