#!/usr/bin/env python3
"""Load and soak tool for any OpenAI-compatible server (`flint serve`, llama-server, vLLM).

It drives the server with the official `openai` client from worker threads, one run per
concurrency level, every request streamed, and reports per level: requests ok / failed,
aggregate output tok/s, TTFT and TPOT percentiles (p50, p90, p99) and wall time.

    python3 tools/serve/load.py --base-url http://127.0.0.1:8080/v1 \
        --concurrency 1,4,16 --requests 64 --max-tokens 128 --prompt-tokens 256 \
        --json load.json

Measured on the client side: TTFT is the time from sending a request to its first
content chunk; TPOT is (last chunk - first chunk) / (output tokens - 1) for each request
with at least two tokens; output tokens are the server's `usage.completion_tokens`
(asked for with `stream_options.include_usage`), or the number of content chunks when
the server sends no usage. Output tok/s is all output tokens of a level over its wall
time.

`--soak SECONDS` runs a mixed load for that long instead (see `soak`): normal streams,
clients that disconnect mid-stream, prompts longer than the server's `max_model_len`
(which must fail with 400), at a concurrency that oversubscribes a small KV pool; then
it checks through `/metrics` that every KV block is free and nothing is left running,
that the server's resident memory (`--server-pid`) grew less than `--rss-growth`
between a warm point and the end, and that no request failed that was not meant to.
Exit status: 0 when every check passed, 1 on any violation (each one named), 2 on bad
usage.
"""
import argparse
import json
import math
import os
import random
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field

# The openai client builds its pydantic models lazily on first use by default, and that
# first build is not thread-safe: two worker threads parsing their first chunk at once can
# see a half-built class and fail with "BaseModel cannot be instantiated directly". Build
# them at import, before any worker thread starts.
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")

import openai  # noqa: E402: must follow the environment setting above
from openai import OpenAI  # noqa: E402

# Common English words: with a leading space each is one token for most BPE and
# SentencePiece vocabularies, so N words make a prompt of about N tokens.
WORDS = (
    "time year people way day man thing woman life child world school state family "
    "student group country problem hand part place case week company system program "
    "question work government number night point home water room mother area money "
    "story fact month lot right study book eye job word business issue side kind head "
    "house service friend father power hour game line end member law car city name "
    "team minute idea kid body information back parent face others level office door "
    "health person art war history party result change morning reason research girl "
    "guy moment air teacher force education"
).split()


def synthetic_text(rng: random.Random, n_words: int) -> str:
    """About `n_words` tokens of lowercase words, sentence-cased every dozen words."""
    out = []
    for i in range(n_words):
        w = rng.choice(WORDS)
        out.append(w.capitalize() if i % 12 == 0 else w)
        if i % 12 == 11:
            out[-1] += "."
    return " ".join(out)


def percentile(values, q):
    """The q-th percentile (0..100) by linear interpolation; None for no values."""
    if not values:
        return None
    v = sorted(values)
    k = (len(v) - 1) * q / 100.0
    lo, hi = math.floor(k), math.ceil(k)
    return v[lo] + (v[hi] - v[lo]) * (k - lo)


def pcts(values, scale=1000.0):
    """p50/p90/p99 of `values` (seconds) in milliseconds."""
    return {
        f"p{q}": (None if percentile(values, q) is None else round(percentile(values, q) * scale, 2))
        for q in (50, 90, 99)
    }


@dataclass
class Result:
    kind: str  # "normal", "disconnect", "overflow"
    ok: bool
    error: str = ""
    status: int = 0
    prompt_tokens: int = 0
    output_tokens: int = 0
    ttft: float = None
    tpot: float = None
    started: float = 0.0
    ended: float = 0.0


@dataclass
class Job:
    kind: str
    endpoint: str  # "chat" or "completions"
    system: str
    user: str
    max_tokens: int
    disconnect_after: int = 0  # content chunks read before closing (disconnect jobs)


def make_client(args) -> OpenAI:
    return OpenAI(
        base_url=args.base_url,
        api_key=args.api_key,
        max_retries=0,
        timeout=args.timeout,
    )


def run_job(client: OpenAI, model: str, job: Job, args) -> Result:
    """Sends one streamed request and measures it. Overflow jobs are ok only when the
    server refuses them with 400; disconnect jobs close the stream after a few chunks."""
    res = Result(kind=job.kind, ok=False, started=time.monotonic())
    try:
        extra = {"stream_options": {"include_usage": True}}
        if args.ignore_eos:
            extra["extra_body"] = {"ignore_eos": True}
        if job.endpoint == "chat":
            msgs = []
            if job.system:
                msgs.append({"role": "system", "content": job.system})
            msgs.append({"role": "user", "content": job.user})
            stream = client.chat.completions.create(
                model=model, messages=msgs, max_tokens=job.max_tokens,
                temperature=args.temperature, stream=True, **extra)
        else:
            prompt = (job.system + "\n\n" + job.user) if job.system else job.user
            stream = client.completions.create(
                model=model, prompt=prompt, max_tokens=job.max_tokens,
                temperature=args.temperature, stream=True, **extra)
        first = last = None
        chunks = 0
        usage = None
        finish = None
        for chunk in stream:
            if getattr(chunk, "usage", None) is not None:
                usage = chunk.usage
            for c in chunk.choices or []:
                text = c.delta.content if job.endpoint == "chat" else c.text
                if text:
                    now = time.monotonic()
                    if first is None:
                        first = now
                    last = now
                    chunks += 1
                if c.finish_reason:
                    finish = c.finish_reason
            if job.kind == "disconnect" and chunks >= job.disconnect_after:
                stream.close()
                break
        res.ended = time.monotonic()
        if job.kind == "overflow":
            res.error = "a prompt longer than max_model_len was accepted"
            return res
        n = usage.completion_tokens if usage is not None else chunks
        res.prompt_tokens = usage.prompt_tokens if usage is not None else 0
        res.output_tokens = n
        if first is not None:
            res.ttft = first - res.started
            if n > 1 and last > first:
                res.tpot = (last - first) / (n - 1)
        if job.kind == "normal":
            if first is None:
                res.error = "the stream carried no text"
                return res
            if finish is None:
                res.error = "the stream ended without a finish_reason"
                return res
        elif job.kind == "disconnect" and first is None:
            res.error = "the stream carried no text before the disconnect"
            return res
        res.ok = True
    except openai.APIStatusError as e:
        res.ended = time.monotonic()
        res.status = e.status_code
        msg = str(e)
        if job.kind == "overflow":
            res.ok = e.status_code == 400 and "max_model_len" in msg
            if not res.ok:
                res.error = f"overflow refused with {e.status_code}, not 400 naming max_model_len: {msg}"
        else:
            res.error = f"HTTP {e.status_code}: {msg}"
    except Exception as e:  # noqa: BLE001: every other failure is a failed request
        res.ended = time.monotonic()
        res.error = f"{type(e).__name__}: {e}"
    return res


def run_level(args, model, concurrency, jobs_for, stop_at=None, n_requests=None, join_by=None):
    """Runs workers until `n_requests` jobs are done or `stop_at` (monotonic) passes.
    Waits for the requests in flight until `join_by` (monotonic; None: until they end);
    returns the results, the wall time and how many requests were still in flight."""
    results = []
    lock = threading.Lock()
    counter = [0]

    def worker(wid):
        client = make_client(args)
        while True:
            with lock:
                i = counter[0]
                if n_requests is not None and i >= n_requests:
                    return
                if stop_at is not None and time.monotonic() >= stop_at:
                    return
                counter[0] += 1
            r = run_job(client, model, jobs_for(i), args)
            with lock:
                results.append(r)

    t0 = time.monotonic()
    threads = [threading.Thread(target=worker, args=(w,), daemon=True) for w in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(None if join_by is None else max(0.0, join_by - time.monotonic()))
    stuck = sum(t.is_alive() for t in threads)
    with lock:
        done = list(results)
    return done, time.monotonic() - t0, stuck


def summarize(results, wall, concurrency):
    measured = [r for r in results if r.kind == "normal" and r.ok]
    out_tokens = sum(r.output_tokens for r in results if r.ok and r.kind != "overflow")
    prompt = [r.prompt_tokens for r in measured if r.prompt_tokens]
    return {
        "concurrency": concurrency,
        "requests_ok": sum(r.ok for r in results),
        "requests_failed": sum(not r.ok for r in results),
        "output_tokens": out_tokens,
        "output_tok_s": round(out_tokens / wall, 2) if wall > 0 else None,
        "mean_prompt_tokens": round(sum(prompt) / len(prompt), 1) if prompt else None,
        "ttft_ms": pcts([r.ttft for r in measured if r.ttft is not None]),
        "tpot_ms": pcts([r.tpot for r in measured if r.tpot is not None]),
        "wall_s": round(wall, 2),
    }


def fmt_p(p):
    return "/".join("-" if p[k] is None else f"{p[k]:.1f}" for k in ("p50", "p90", "p99"))


def print_level(s):
    print(
        f"c={s['concurrency']:<3} ok {s['requests_ok']:<4} failed {s['requests_failed']:<3} "
        f"out {s['output_tok_s']} tok/s | TTFT p50/p90/p99 {fmt_p(s['ttft_ms'])} ms | "
        f"TPOT p50/p90/p99 {fmt_p(s['tpot_ms'])} ms | wall {s['wall_s']} s",
        flush=True,
    )


def server_root(base_url: str) -> str:
    b = base_url.rstrip("/")
    return b[: -len("/v1")] if b.endswith("/v1") else b


def http_get(url: str, api_key: str, timeout=10.0) -> str:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"})
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.read().decode("utf-8", "replace")


def read_metrics(root: str, api_key: str) -> dict:
    """The unlabelled samples of `/metrics` as name -> float."""
    out = {}
    for line in http_get(root + "/metrics", api_key).splitlines():
        if not line or line.startswith("#") or "{" in line:
            continue
        parts = line.split()
        if len(parts) == 2:
            try:
                out[parts[0]] = float(parts[1])
            except ValueError:
                pass
    return out


def rss_kib(pid: int):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return None


def model_info(client: OpenAI, args):
    """The model name to send and the server's max_model_len (flint reports it in
    /v1/models; for other servers give --max-model-len)."""
    models = client.models.list().data
    if not models:
        raise SystemExit("load.py: the server lists no model")
    m = models[0]
    name = args.model or m.id
    mml = args.max_model_len or (getattr(m, "model_extra", None) or {}).get("max_model_len")
    return name, mml


def load_mode(args, client, model):
    rng = random.Random(args.seed)
    system = synthetic_text(rng, args.system_tokens) if args.system_tokens else ""
    levels = []
    for c in args.concurrency:
        def jobs_for(i, c=c):
            r = random.Random(args.seed * 1_000_003 + c * 10_007 + i)
            return Job("normal", args.endpoint, system, synthetic_text(r, args.prompt_tokens),
                       args.max_tokens)
        n = args.requests if args.duration is None else None
        stop_at = time.monotonic() + args.duration if args.duration is not None else None
        join_by = stop_at + args.grace if stop_at is not None else None
        results, wall, stuck = run_level(args, model, c, jobs_for, stop_at=stop_at,
                                         n_requests=n, join_by=join_by)
        s = summarize(results, wall, c)
        if stuck:
            s["requests_failed"] += stuck
            s["errors"] = [f"{stuck} requests unanswered {args.grace:g} s after the level's end"]
        errors = sorted({r.error for r in results if not r.ok})
        if errors:
            s["errors"] = s.get("errors", []) + errors[:10]
        print_level(s)
        for e in errors[:5]:
            print(f"  error: {e}", file=sys.stderr)
        levels.append(s)
    report = {
        "base_url": args.base_url, "model": model, "endpoint": args.endpoint,
        "prompt_tokens": args.prompt_tokens, "system_tokens": args.system_tokens,
        "max_tokens": args.max_tokens, "levels": levels,
    }
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
    return 0 if all(s["requests_failed"] == 0 for s in levels) else 1


def soak_mode(args, client, model, max_model_len):
    """The soak: a seeded mix of jobs for `args.soak` seconds, then the checks."""
    if not max_model_len:
        raise SystemExit("load.py: --soak needs the server's max_model_len (flint reports it "
                         "in /v1/models; give --max-model-len for other servers)")
    root = server_root(args.base_url)
    violations = []
    rng = random.Random(args.seed)
    system = synthetic_text(rng, args.system_tokens) if args.system_tokens else ""
    # Prompts long enough that the running requests outgrow a small KV pool (the
    # scheduler must preempt), yet within max_model_len.
    long_words = max(16, min(args.prompt_tokens * 2, max_model_len // 2))
    overflow_words = max_model_len + max_model_len // 2 + 64

    # Every 10 jobs: 1 overflow, 2 disconnects, 2 long prompts, 5 normal prompts, in an
    # order that puts each kind among the first jobs, so even a short soak sends them all.
    cycle = ("normal", "disconnect", "long", "overflow", "normal", "long", "disconnect",
             "normal", "normal", "normal")

    def jobs_for(i):
        r = random.Random(args.seed * 1_000_003 + i)
        kind = cycle[i % len(cycle)]
        endpoint = "chat" if r.random() < 0.75 else "completions"
        if kind == "overflow":
            return Job("overflow", endpoint, "", synthetic_text(r, overflow_words), 8)
        if kind == "disconnect":
            return Job("disconnect", endpoint, system, synthetic_text(r, args.prompt_tokens),
                       args.max_tokens, disconnect_after=r.randint(1, 4))
        n = long_words if kind == "long" else args.prompt_tokens
        return Job("normal", endpoint, system, synthetic_text(r, n), args.max_tokens)

    # A monitor samples the metrics (peak KV use, peak running) and, once warm, the RSS.
    peak = {"kv_in_use": 0.0, "running": 0.0, "waiting": 0.0}
    rss = {"warm": None, "warm_at": None}
    done = threading.Event()
    t_start = time.monotonic()
    # The warm point: 20% into the soak (at least 5 s) once the KV pool has been at least
    # 90% in use (the pool's pages are then mostly touched, so what grows after it is
    # not the cache filling up), and at half the soak in any case. The baseline is the
    # highest resident memory sampled from the warm point to half the soak (the
    # allocator's arenas and the worker threads' scratch reach their plateau at
    # different moments); growth is the end against that plateau, so what the second
    # half adds is what counts.
    warm_after = max(5.0, args.soak * 0.2)
    warm_latest = max(warm_after, args.soak * 0.5)

    def monitor():
        while not done.wait(0.5):
            try:
                m = read_metrics(root, args.api_key)
            except Exception:  # noqa: BLE001: a busy server may answer late; try again
                continue
            peak["kv_in_use"] = max(peak["kv_in_use"], m.get("flint_kv_blocks_in_use", 0))
            peak["running"] = max(peak["running"], m.get("flint_running_requests", 0))
            peak["waiting"] = max(peak["waiting"], m.get("flint_queue_depth", 0))
            elapsed = time.monotonic() - t_start
            pool_filled = peak["kv_in_use"] >= 0.9 * m.get("flint_kv_blocks_total", 0)
            if args.server_pid and rss["warm"] is None and elapsed >= warm_after \
                    and (pool_filled or elapsed >= warm_latest):
                rss["warm"] = rss_kib(args.server_pid)
                rss["warm_at"] = round(time.monotonic() - t_start, 1)
            elif args.server_pid and rss["warm"] is not None and elapsed <= warm_latest:
                try:
                    now = rss_kib(args.server_pid)
                except OSError:
                    continue
                if now is not None and now > rss["warm"]:
                    rss["warm"] = now
                    rss["warm_at"] = round(time.monotonic() - t_start, 1)

    mon = threading.Thread(target=monitor, daemon=True)
    mon.start()
    stop_at = time.monotonic() + args.soak
    results, wall, stuck = run_level(args, model, args.soak_concurrency, jobs_for,
                                     stop_at=stop_at, join_by=stop_at + args.grace)
    done.set()
    mon.join()
    if stuck:
        violations.append(f"{stuck} requests were still unanswered {args.grace:g} s after the "
                          "soak's end (is the server stuck?)")

    by_kind = {k: [r for r in results if r.kind == k] for k in ("normal", "disconnect", "overflow")}
    s = summarize(results, wall, args.soak_concurrency)
    print_level(s)
    for k, rs in by_kind.items():
        print(f"  {k}: {len(rs)} sent, {sum(r.ok for r in rs)} as expected", flush=True)
    for r in results:
        if not r.ok:
            violations.append(f"a {r.kind} request failed: {r.error}")
    for k in ("normal", "disconnect", "overflow"):
        if not by_kind[k]:
            violations.append(f"the soak sent no {k} request (run it longer)")

    # Every block free and nothing left running: aborts take effect at the engine's next
    # step, so the gauges get a few seconds to settle.
    end = {}
    deadline = time.monotonic() + args.settle
    while True:
        try:
            end = read_metrics(root, args.api_key)
        except Exception as e:  # noqa: BLE001
            violations.append(f"/metrics unreadable after the soak: {e}")
            break
        idle = (end.get("flint_kv_blocks_in_use", -1) == 0
                and end.get("flint_running_requests", -1) == 0
                and end.get("flint_queue_depth", -1) == 0)
        if idle or time.monotonic() >= deadline:
            break
        time.sleep(0.25)
    if end:
        for name in ("flint_kv_blocks_in_use", "flint_running_requests", "flint_queue_depth"):
            if name not in end:
                violations.append(f"/metrics has no {name}")
            elif end[name] != 0:
                violations.append(f"{name} is {end[name]:g} after the soak, {args.settle:g} s "
                                  "after the last request (expected 0)")
        total = end.get("flint_kv_blocks_total")
        print(f"  KV blocks: peak {peak['kv_in_use']:g} of {total:g} in use, "
              f"{end.get('flint_kv_blocks_in_use', float('nan')):g} at the end; "
              f"peak running {peak['running']:g}, peak waiting {peak['waiting']:g}; "
              f"aborted {end.get('flint_requests_aborted_total', float('nan')):g}, "
              f"refused {end.get('flint_requests_refused_total', float('nan')):g}", flush=True)

    # Preemptions are counted by the server (flint_preemptions_total).
    preempted = None
    if end and "flint_preemptions_total" in end:
        preempted = end["flint_preemptions_total"] > 0
        print(f"  preemption: {end['flint_preemptions_total']:g} preemptions", flush=True)
    if args.expect_preemption and not preempted:
        violations.append("no preemption was seen (raise --soak-concurrency or shrink the "
                          "server's --kv-memory)" if preempted is False else
                          "/metrics has no flint_preemptions_total")

    rss_report = None
    if args.server_pid:
        try:
            final = rss_kib(args.server_pid)
        except OSError as e:
            final = None
            violations.append(f"cannot read the server's memory (pid {args.server_pid}): {e}")
        warm = rss["warm"]
        if warm is None:
            violations.append(f"the soak ended before the warm point ({warm_after:g} s); "
                              "run it longer to check resident memory")
        elif final is not None:
            growth = (final - warm) / warm
            rss_report = {"warm_kib": warm, "warm_at_s": rss["warm_at"], "end_kib": final,
                          "growth": round(growth, 4)}
            print(f"  resident memory: {warm / 1024:.1f} MiB at {rss['warm_at']} s (the most "
                  f"from the warm point to {warm_latest:g} s), "
                  f"{final / 1024:.1f} MiB at the end ({growth * 100:+.2f}%)", flush=True)
            if growth >= args.rss_growth:
                violations.append(f"resident memory grew {growth * 100:.2f}% (limit "
                                  f"{args.rss_growth * 100:g}%): {warm} KiB -> {final} KiB")
    else:
        print("  resident memory: not checked (give --server-pid)", flush=True)

    if args.json:
        with open(args.json, "w") as f:
            json.dump({"soak_s": args.soak, "summary": s, "peak": peak, "rss": rss_report,
                       "preemption_seen": preempted,
                       "end_metrics": end, "violations": violations,
                       "sent": {k: len(v) for k, v in by_kind.items()}}, f, indent=2)
    # Distinct messages, each with how often it happened.
    counts = {}
    for v in violations:
        counts[v] = counts.get(v, 0) + 1
    for v, n in counts.items():
        print(f"load.py: soak violation{'' if n == 1 else f' (x{n})'}: {v}", file=sys.stderr)
    if violations:
        return 1
    print("soak: every check passed", flush=True)
    return 0


def parse_levels(text):
    try:
        levels = [int(x) for x in text.split(",") if x.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}")
    if not levels or any(c < 1 for c in levels):
        raise argparse.ArgumentTypeError(f"concurrency levels must be >= 1: {text!r}")
    return levels


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080/v1")
    p.add_argument("--api-key", default="unused")
    p.add_argument("--model", help="model name to send [default: the first of /v1/models]")
    p.add_argument("--concurrency", type=parse_levels, default=[1],
                   help="comma-separated levels, one run each (e.g. 1,4,16)")
    g = p.add_mutually_exclusive_group()
    g.add_argument("--requests", type=int, default=None, help="requests per level [default 32]")
    g.add_argument("--duration", type=float, default=None, help="seconds per level")
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--prompt-tokens", type=int, default=128,
                   help="about this many prompt tokens per request (synthetic words)")
    p.add_argument("--system-tokens", type=int, default=0,
                   help="a shared prefix of about K tokens on every request (the prefix cache)")
    p.add_argument("--endpoint", choices=("chat", "completions"), default="chat")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true",
                   help="send ignore_eos (llama-server, vLLM) so every request runs to max_tokens")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--timeout", type=float, default=300.0, help="seconds per request")
    p.add_argument("--json", help="write the report to this file")
    p.add_argument("--soak", type=float, metavar="SECONDS",
                   help="run the soak mix for this long, then check the server (see above)")
    p.add_argument("--soak-concurrency", type=int, default=12)
    p.add_argument("--max-model-len", type=int, help="the server's max_model_len [default: /v1/models]")
    p.add_argument("--expect-preemption", action="store_true",
                   help="soak: a violation unless /metrics shows that requests were preempted")
    p.add_argument("--server-pid", type=int, help="the server's pid: its VmRSS is checked")
    p.add_argument("--rss-growth", type=float, default=0.05,
                   help="largest allowed growth of resident memory during the soak (fraction)")
    p.add_argument("--grace", type=float, default=60.0,
                   help="with --duration or --soak: seconds the requests in flight at the end "
                        "get to finish before they count as failed")
    p.add_argument("--settle", type=float, default=10.0,
                   help="seconds the KV and queue gauges get to reach 0 after the soak")
    args = p.parse_args(argv)
    if args.requests is None and args.duration is None:
        args.requests = 32
    if (args.requests is not None and args.requests < 1) or args.max_tokens < 1 \
            or args.prompt_tokens < 1 or args.soak_concurrency < 1 \
            or (args.soak is not None and args.soak <= 0):
        p.error("--requests, --max-tokens, --prompt-tokens, --soak-concurrency and --soak "
                "must be positive")

    client = make_client(args)
    try:
        model, max_model_len = model_info(client, args)
    except openai.APIConnectionError as e:
        print(f"load.py: cannot reach {args.base_url}: {e}", file=sys.stderr)
        return 1
    if args.soak is not None:
        return soak_mode(args, client, model, max_model_len)
    return load_mode(args, client, model)


if __name__ == "__main__":
    sys.exit(main())
