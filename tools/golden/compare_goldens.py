#!/usr/bin/env python3
"""Compare two golden files of the same kind and print how far apart they are.

  compare_goldens.py A.json B.json      teacher-forced logits (logits-top20.json format,
                                        with or without start/stride/pos)
  compare_goldens.py A.jsonl B.jsonl    greedy chains (greedy.jsonl format)

Logits: the ids must be equal; for every position both hold, prints the largest absolute
difference of lse and of the logits of the ids both top lists share, how often the top-1
ids agree, and how often the top lists hold the same ids in the same order. Greedy: the
chains must have the same prompts; prints the number of steps whose ids agree, and the
largest logit / lse / margin difference over the agreeing steps. Exit status 1 when
`--tol X` is given and a difference exceeds X or an id differs.
"""

import argparse
import json
import sys


def positions(d):
    if "pos" in (d["positions"][0] if d["positions"] else {}):
        return {p["pos"]: p for p in d["positions"]}
    return dict(enumerate(d["positions"]))


def compare_logits(a, b):
    if a["ids"] != b["ids"]:
        sys.exit("the ids differ")
    pa, pb = positions(a), positions(b)
    common = sorted(set(pa) & set(pb))
    if not common:
        sys.exit("no position in common")
    d_lse = d_logit = 0.0
    top1 = same_order = 0
    for i in common:
        x, y = pa[i], pb[i]
        d_lse = max(d_lse, abs(x["lse"] - y["lse"]))
        ly = dict((t[0], t[1]) for t in y["top"])
        for t, v in x["top"]:
            if t in ly:
                d_logit = max(d_logit, abs(v - ly[t]))
        top1 += x["top"][0][0] == y["top"][0][0]
        same_order += [t[0] for t in x["top"]] == [t[0] for t in y["top"]]
    n = len(common)
    print(f"positions {n}: max |d lse| {d_lse:.6g}, max |d logit| {d_logit:.6g}, "
          f"top-1 agree {top1}/{n}, same top list {same_order}/{n}")
    return max(d_lse, d_logit), top1 == n and same_order == n


def compare_greedy(a, b):
    if len(a) != len(b):
        sys.exit(f"{len(a)} chains against {len(b)}")
    d = 0.0
    steps = agree = 0
    for x, y in zip(a, b):
        if x["prompt_ids"] != y["prompt_ids"]:
            sys.exit("the prompts differ")
        for s, t in zip(x["steps"], y["steps"]):
            steps += 1
            if s["id"] != t["id"]:
                break
            agree += 1
            d = max(d, abs(s["lse"] - t["lse"]), abs(s["margin"] - t["margin"]))
            lt = dict((k[0], k[1]) for k in t["top"])
            for k, v in s["top"]:
                if k in lt:
                    d = max(d, abs(v - lt[k]))
        if len(x["steps"]) != len(y["steps"]):
            print(f"chain {x['prompt_ids'][:8]}...: {len(x['steps'])} steps against {len(y['steps'])}")
    print(f"greedy: {agree}/{steps} steps agree, max |d| of logits, lse, margin {d:.6g}")
    return d, agree == steps


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--tol", type=float)
    args = ap.parse_args()
    if args.a.endswith(".jsonl"):
        load = lambda p: [json.loads(line) for line in open(p) if line.strip()]
        diff, ids_ok = compare_greedy(load(args.a), load(args.b))
    else:
        diff, ids_ok = compare_logits(json.load(open(args.a)), json.load(open(args.b)))
    if args.tol is not None and (diff > args.tol or not ids_ok):
        sys.exit(1)


if __name__ == "__main__":
    main()
