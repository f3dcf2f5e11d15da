#!/usr/bin/env python3
"""Helpers of tools/bench/compare.sh (issue 10).

  bench_report.py weights MODEL.gguf
      weight bytes one decoded token reads, as JSON (needs the `gguf` package).
  bench_report.py table RESULTS_DIR
      reads the raw outputs compare.sh left in RESULTS_DIR, prints the comparison table
      and writes RESULTS_DIR/summary.json.
"""

import json
import math
import os
import re
import statistics
import sys


def die(msg):
    print(f"bench_report.py: error: {msg}", file=sys.stderr)
    sys.exit(1)


def weights(model):
    """Bytes of weights one decode step reads.

    Every tensor is read once per token, except the token embedding, of which only the
    one row of the current token is read, and expert towers, of which a token reads the
    k (`expert_used_count`) of E experts it is routed to. When the output projection is tied to the token
    embedding (no `output.weight`), that whole matrix is read once more for the logits.
    """
    try:
        import gguf
    except ImportError:
        die("the python package `gguf` is missing (pip install gguf)")
    try:
        reader = gguf.GGUFReader(model)
    except (OSError, ValueError) as e:
        die(f"cannot read {model} as GGUF: {e}")
    total = 0
    embd = None
    has_output = False
    # Mixture of experts: a token reads k of the E matrices of each expert tower.
    arch = None
    k_used = None
    for field in reader.fields.values():
        if field.name == "general.architecture":
            arch = bytes(field.parts[field.data[0]]).decode()
    for field in reader.fields.values():
        if arch and field.name == f"{arch}.expert_used_count":
            k_used = int(field.parts[field.data[0]][0])
    expert_bytes_all = 0
    for t in reader.tensors:
        if "_exps" in t.name and k_used:
            n_exp = int(t.shape[-1])
            expert_bytes_all += int(t.n_bytes)
            total += int(t.n_bytes) * k_used // n_exp
            continue
        total += int(t.n_bytes)
        if t.name == "token_embd.weight":
            embd = t
        elif t.name == "output.weight":
            has_output = True
    if embd is None:
        die(f"{model} has no token_embd.weight")
    embd_bytes = int(embd.n_bytes)
    # GGUF shape is [n_embd, n_vocab]: the last dimension counts rows.
    n_rows = int(embd.shape[-1])
    row_bytes = embd_bytes // n_rows
    per_token = total - embd_bytes + row_bytes + (0 if has_output else embd_bytes)
    return {
        "model": model,
        "file_bytes": os.path.getsize(model),
        "tensor_bytes": total,
        "token_embd_bytes": embd_bytes,
        "token_embd_type": embd.tensor_type.name,
        "token_embd_row_bytes": row_bytes,
        "tied_output": not has_output,
        "experts_used": k_used,
        "expert_tower_bytes": expert_bytes_all,
        "bytes_per_token": per_token,
    }


def median(xs):
    return statistics.median(xs) if xs else None


def load_json(path):
    try:
        with open(path) as f:
            return json.load(f)
    except FileNotFoundError:
        return None
    except json.JSONDecodeError as e:
        print(f"bench_report.py: warning: {path} is not valid JSON ({e})", file=sys.stderr)
        return None


def round_files(results_dir, prefix, suffix):
    """`prefix.json` (one round) or `prefix.N.json` (round N), sorted."""
    return sorted(
        os.path.join(results_dir, f)
        for f in os.listdir(results_dir)
        if f.startswith(prefix) and f.endswith(suffix)
        and (f == prefix + suffix or re.fullmatch(r"\.\d+", f[len(prefix):-len(suffix)]))
    )


def llama_bench(paths):
    """pp512 and tg128 from `llama-bench -o json` of every round: median over all samples."""
    entries = []
    for path in paths:
        data = load_json(path)
        if isinstance(data, list):
            entries.extend(data)
    merged = {}
    for entry in entries:
        n_prompt, n_gen = entry.get("n_prompt"), entry.get("n_gen")
        key = None
        if n_prompt and not n_gen:
            key = f"pp{n_prompt}"
        elif n_gen and not n_prompt:
            key = f"tg{n_gen}"
        if key:
            d = merged.setdefault(
                key,
                {
                    "samples_tok_s": [],
                    "n_threads": entry.get("n_threads"),
                    "cpu_info": entry.get("cpu_info"),
                    "build_commit": entry.get("build_commit"),
                },
            )
            d["samples_tok_s"].extend(entry.get("samples_ts") or [])
    for d in merged.values():
        d["median_tok_s"] = median(d["samples_tok_s"])
    return merged


def flint_rounds(paths):
    """Every round's `flint bench --json` object, and a merged one holding per-figure medians."""
    objs = [o for o in (load_json(p) for p in paths) if isinstance(o, dict)]
    if not objs:
        return [], None
    merged = json.loads(json.dumps(objs[0]))
    for section in ("prefill", "decode", "aggregate"):
        for k in ("tok_s", "tpot_ms", "output_tok_s", "decode_tok_s", "wall_s"):
            vals = [_get(o, (section, k)) for o in objs]
            vals = [v for v in vals if v is not None]
            if vals and isinstance(merged.get(section), dict):
                merged[section][k] = median(vals)
    return objs, merged


ROW = re.compile(
    r"^\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*(\d+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|"
    r"\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|\s*([\d.]+)\s*\|"
)


def batched_bench(results_dir):
    """S_TG (and S_PP) per batch size over every batched-bench run; medians across runs."""
    per_b = {}
    runs = sorted(
        f for f in os.listdir(results_dir) if f.startswith("batched-bench.") and f.endswith(".txt")
    )
    for name in runs:
        with open(os.path.join(results_dir, name), errors="replace") as f:
            for line in f:
                m = ROW.match(line.strip())
                if not m:
                    continue
                b = int(m.group(3))
                d = per_b.setdefault(b, {"s_tg": [], "s_pp": []})
                d["s_tg"].append(float(m.group(8)))
                d["s_pp"].append(float(m.group(6)))
    return {
        str(b): {
            "s_tg_median": median(v["s_tg"]),
            "s_tg_runs": v["s_tg"],
            "s_pp_median": median(v["s_pp"]),
        }
        for b, v in sorted(per_b.items())
    }


def fmt(x, nd=1):
    return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else f"{x:.{nd}f}"


def ratio(a, b):
    if a is None or b is None or b == 0:
        return None
    return a / b


def table(results_dir):
    meta = load_json(os.path.join(results_dir, "meta.json")) or {}
    lb = llama_bench(round_files(results_dir, "llama-bench", ".json"))
    bb = batched_bench(results_dir)
    bw = load_json(os.path.join(results_dir, "readbw.json"))
    wt = load_json(os.path.join(results_dir, "weights.json"))
    fl_rounds, fl = flint_rounds(round_files(results_dir, "flint-bench", ".json"))

    flint_ok = isinstance(fl, dict)
    g = (lambda *ks: _get(fl, ks)) if flint_ok else (lambda *ks: None)
    f_dec, f_pre, f_agg = g("decode", "tok_s"), g("prefill", "tok_s"), g("aggregate", "decode_tok_s")
    l_dec = (lb.get("tg128") or {}).get("median_tok_s")
    l_pre = (lb.get("pp512") or {}).get("median_tok_s")
    l_agg = (bb.get("4") or {}).get("s_tg_median")

    # The read loop of every round and the last one: the median of their medians.
    bw_runs = [load_json(f) for f in round_files(results_dir, "readbw", ".json")]
    bw_runs = [b for b in bw_runs if isinstance(b, dict) and b.get("median_gb_s")]
    if bw_runs and not isinstance(bw, dict):
        bw = bw_runs[-1]
    bw_each = [b["median_gb_s"] for b in bw_runs]
    bw_gbs = statistics.median(bw_each) if bw_each else None
    per_tok = wt.get("bytes_per_token") if isinstance(wt, dict) else None
    roofline = bw_gbs * 1e9 / per_tok if bw_gbs and per_tok else None

    print()
    print(f"machine : {meta.get('cpu', '?')}  (threads used: {meta.get('threads', '?')})")
    print(f"model   : {meta.get('model', '?')}")
    print(f"load avg: before {meta.get('load_before', '?')}  after {meta.get('load_after', '?')}")
    print()
    print(f"{'metric':<34} {'Flint':>10} {'llama.cpp':>10} {'ratio':>7}  target")
    rows = [
        ("decode c=1 tok/s (vs tg128)", f_dec, l_dec),
        ("prefill 512 tok/s (vs pp512)", f_pre, l_pre),
        ("aggregate decode c=4 (vs S_TG B=4)", f_agg, l_agg),
    ]
    for label, f, l in rows:
        r = ratio(f, l)
        ok = "" if r is None else ("ok" if r >= 1.5 else "below")
        print(f"{label:<34} {fmt(f):>10} {fmt(l):>10} {fmt(r, 2):>7}  >=1.5 {ok}")
    for b in ("1", "8"):
        if b in bb:
            print(f"{'  llama.cpp S_TG B=' + b:<34} {'':>10} {fmt(bb[b]['s_tg_median']):>10}")
    print()
    if per_tok:
        print(
            f"weights per decoded token: {per_tok / 1e6:.1f} MB ({per_tok / 2**20:.1f} MiB)"
            f" of {wt['tensor_bytes'] / 1e6:.1f} MB tensors; "
            f"{'tied output' if wt['tied_output'] else 'token embedding (one row read)'} "
            f"{wt['token_embd_bytes'] / 1e6:.1f} MB ({wt['token_embd_type']})"
        )
    if bw_gbs:
        print(
            f"read bandwidth ({bw['threads']} threads, {bw['bytes'] / 2**30:.1f} GiB): "
            f"median {bw_gbs:.1f} GB/s over {len(bw_each)} runs "
            f"({', '.join(f'{x:.1f}' for x in bw_each)}), "
            f"best {max(b['best_gb_s'] for b in bw_runs):.1f} GB/s"
        )
    if roofline:
        print(f"decode roofline: {roofline:.1f} tok/s", end="")
        if f_dec:
            print(f"; Flint decode at {100 * f_dec / roofline:.0f}% of it", end="")
        if l_dec:
            print(f"; llama.cpp tg128 at {100 * l_dec / roofline:.0f}%", end="")
        print()
    if flint_ok and fl.get("threads") != meta.get("threads"):
        print()
        print(
            f"WARNING: flint reported {fl.get('threads')} threads, llama.cpp ran with "
            f"{meta.get('threads')}: the ratios are not like for like"
        )
    if not flint_ok:
        why = meta.get("flint_status", "no flint-bench.json")
        print()
        print(f"FLINT FIGURES MISSING: {why}")

    summary = {
        "meta": meta,
        "llama_bench": lb,
        "batched_bench": bb,
        "readbw": bw,
        "readbw_runs_gb_s": bw_each,
        "readbw_median_gb_s": bw_gbs,
        "weights": wt,
        "flint": fl if flint_ok else None,
        "flint_rounds": fl_rounds,
        "ratios": {
            "decode_c1": ratio(f_dec, l_dec),
            "prefill_512": ratio(f_pre, l_pre),
            "aggregate_c4": ratio(f_agg, l_agg),
        },
        "roofline_tok_s": roofline,
    }
    with open(os.path.join(results_dir, "summary.json"), "w") as f:
        json.dump(summary, f, indent=2)
        f.write("\n")


def _get(d, keys):
    for k in keys:
        if not isinstance(d, dict) or k not in d:
            return None
        d = d[k]
    return d if isinstance(d, (int, float)) else None


def main(argv):
    if len(argv) == 3 and argv[1] == "weights":
        print(json.dumps(weights(argv[2])))
    elif len(argv) == 3 and argv[1] == "table":
        table(argv[2])
    else:
        die("usage: bench_report.py weights MODEL.gguf | table RESULTS_DIR")


if __name__ == "__main__":
    main(sys.argv)
