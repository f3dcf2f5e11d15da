#!/usr/bin/env bash
# Flint against ik_llama.cpp (the fastest public CPU fork of llama.cpp) on one GGUF file,
# in alternating rounds, 2 threads by default; prints every round's figures and the
# medians, and for each metric Flint over ik_llama.cpp's better variant (with or without
# run-time repacking, `-rtr 1`).
#
# usage: tools/bench/ik_compare.sh [MODEL] [ROUNDS]
#   MODEL   GGUF file (default: the default model in the Flint cache)
#   ROUNDS  alternating rounds (default 3)
# env:
#   FLINT_IK_BIN         ik_llama.cpp's bin folder, holding llama-bench and
#                        llama-batched-bench (default ~/.cache/flint/ik_llama.cpp/src/build/bin;
#                        how to build it: docs/benchmarks.md, "ik_llama.cpp")
#   FLINT_BIN            the flint binary (default target/release/flint)
#   FLINT_BENCH_THREADS  threads for both and the read loop (default 2)
#
# Each round: the read loop (tools/bench/readbw.c, 2 GiB), ik's llama-bench (pp512,
# tg128, 3 repetitions) without and with -rtr 1, ik's llama-batched-bench (npp 128,
# ntg 32, B = 1 and 4: S_TG at B = 4 is the c = 4 figure), then `flint bench --json`;
# one more read loop after the last round. Raw outputs stay in the folder printed last.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
cache=${XDG_CACHE_HOME:-$HOME/.cache}/flint
model=${1:-$cache/gemma-3-270m-q4_k_m.gguf}
rounds=${2:-3}
ik=${FLINT_IK_BIN:-$cache/ik_llama.cpp/src/build/bin}
flint=${FLINT_BIN:-$root/target/release/flint}
t=${FLINT_BENCH_THREADS:-2}
die() { echo "ik_compare.sh: $*" >&2; exit 1; }
[[ -f "$model" ]] || die "no model file $model"
model=$(realpath "$model")
for b in "$ik/llama-bench" "$ik/llama-batched-bench"; do
    [[ -x "$b" ]] || die "no $b (build ik_llama.cpp: docs/benchmarks.md, \"ik_llama.cpp\")"
done
[[ -x "$flint" ]] || die "no flint binary at $flint (cargo build --release --bin flint)"
out=$(mktemp -d)
readbw="$out/readbw"
cc -O3 -march=native -pthread -std=c11 "$here/readbw.c" -o "$readbw" 2>/dev/null ||
    cc -O3 -pthread -std=c11 "$here/readbw.c" -o "$readbw" || die "could not compile readbw.c"
for r in $(seq 1 "$rounds"); do
    echo "ik_compare.sh: round $r/$rounds" >&2
    "$readbw" 2147483648 "$t" 7 >"$out/rb.$r.json"
    # In the raw folder: ik's tools write a llama.log into the working directory.
    (
        cd "$out"
        "$ik/llama-bench" -m "$model" -t "$t" -p 512 -n 128 -r 3 -o json >"ik.$r.json" 2>"ik.$r.log"
        "$ik/llama-bench" -m "$model" -t "$t" -p 512 -n 128 -r 3 -rtr 1 -o json >"ikr.$r.json" 2>"ikr.$r.log"
        "$ik/llama-batched-bench" -m "$model" -t "$t" -c 640 -npp 128 -ntg 32 -npl 1,4 >"ikb.$r.txt" 2>&1
    )
    FLINT_THREADS=$t "$flint" bench -m "$model" --json 2>"$out/flint.$r.log" | tail -n1 >"$out/flint.$r.json"
done
"$readbw" 2147483648 "$t" 7 >"$out/rb.end.json"
python3 - "$out" "$rounds" <<'PY'
import glob, json, statistics as st, sys
d, rounds = sys.argv[1], int(sys.argv[2])
R = range(1, rounds + 1)
def bench(f):
    v = json.load(open(f))
    pp = [x["avg_ts"] for x in v if x["n_prompt"] > 0 and x["n_gen"] == 0]
    tg = [x["avg_ts"] for x in v if x["n_gen"] > 0 and x["n_prompt"] == 0]
    return pp[0], tg[0]
def batched(f):
    for line in open(f):
        c = [x.strip() for x in line.split("|")]
        if len(c) > 8 and c[3] == "4":
            return float(c[8])
    sys.exit(f"ik_compare.sh: no B = 4 row in {f}")
ik = [bench(f"{d}/ik.{r}.json") for r in R]
ikr = [bench(f"{d}/ikr.{r}.json") for r in R]
ikb = [batched(f"{d}/ikb.{r}.txt") for r in R]
fl = [json.load(open(f"{d}/flint.{r}.json")) for r in R]
rb = [json.load(open(f))["median_gb_s"] for f in sorted(glob.glob(f"{d}/rb.*.json"))]
m = st.median
r1 = lambda xs: [round(x, 1) for x in xs]
print("read loop GB/s      ", r1(rb))
print("ik      pp512 / tg128", r1([x[0] for x in ik]), r1([x[1] for x in ik]))
print("ik -rtr pp512 / tg128", r1([x[0] for x in ikr]), r1([x[1] for x in ikr]))
print("ik      S_TG B=4     ", r1(ikb))
print("flint prefill / decode / c=4", r1([x["prefill"]["tok_s"] for x in fl]),
      r1([x["decode"]["tok_s"] for x in fl]), r1([x["aggregate"]["decode_tok_s"] for x in fl]))
pairs = [
    ("prefill 512", m([x["prefill"]["tok_s"] for x in fl]), max(m([x[0] for x in ik]), m([x[0] for x in ikr]))),
    ("decode c=1", m([x["decode"]["tok_s"] for x in fl]), max(m([x[1] for x in ik]), m([x[1] for x in ikr]))),
    ("aggregate c=4", m([x["aggregate"]["decode_tok_s"] for x in fl]), m(ikb)),
]
print(f"{'metric':<16}{'Flint':>9}{'ik best':>9}{'ratio':>8}")
for name, f, i in pairs:
    print(f"{name:<16}{f:>9.1f}{i:>9.1f}{f / i:>8.2f}")
PY
echo "ik_compare.sh: raw outputs in $out" >&2
