#!/usr/bin/env python3
"""Two `flint serve` replicas behind `vllm-router` on 127.0.0.1: prefix-aware routing,
drain, a killed replica, the second signal (tools/serve/router_test.sh runs it; the
commands are those of docs/deploy.md, with free ports).

Phases, each a check that can fail:

1. kv_aware routing. Four 64-token prefixes are warmed directly on the replicas (two
   each), then 32 streamed completions through the router (8 per prefix, four clients
   at once, a distinct tail each) must all complete, each with its 64 prefix tokens
   served from the prefix cache (`usage.prompt_tokens_details.cached_tokens`), and each
   replica's `flint_requests_total` and `flint_prefix_cache_hits_total` must grow by
   exactly its 16 requests and their 16 * 64 tokens: every request went to the replica
   that holds its prefix, told by its KV events.
2. SIGTERM during load. While 24 streamed requests run through the router and one long
   stream runs directly on replica B, B gets SIGTERM: its `/health` and a new request
   must answer 503 with `Retry-After`, every request (the long one included, to its last
   token) must complete, the router must mark B unhealthy and send it nothing more, and
   B must exit by itself with status 0.
3. A replica killed mid-load. B is started again; while 32 streamed requests run, B gets
   SIGKILL. Every request must end (none hangs); every one that fails must have been in
   progress at the kill; every request A took must have run to its end (none aborted);
   the router must mark B unhealthy, and requests after that all complete.
4. The second signal. With a long stream in flight on replica A, SIGTERM makes A drain
   (503 on `/health`); a SIGINT then must make it exit at once (status 130).

Before them, the commands of docs/deploy.md's one-machine recipe must be the ones run
here (with the documentation's ports in place of the free ones this run picks).

Exit status 0 when every check passed, 1 otherwise (each failure named).
"""
import argparse
import json
import os
import random
import shlex
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("DEFER_PYDANTIC_BUILD", "false")
import load  # noqa: E402: after the path and environment settings above
import openai  # noqa: E402
from openai import OpenAI  # noqa: E402

MODEL = "flint"
BLOCK = 16
PREFIX = 4 * BLOCK


# Ports handed out so far: a port is free when asked for but taken only when its process
# binds it, so the kernel can hand the same one out twice in a row.
_GIVEN: set = set()


def free_port() -> int:
    """A free TCP port on 127.0.0.1 that no earlier call of this run returned."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _GIVEN:
            _GIVEN.add(port)
            return port


def shell(cmd) -> str:
    return " ".join(c if c and all(ch.isalnum() or ch in "-_./:=@," for ch in c) else repr(c)
                    for c in cmd)


class Failures:
    def __init__(self):
        self.items = []

    def check(self, cond: bool, what: str) -> bool:
        print(("  ok: " if cond else "  FAIL: ") + what, flush=True)
        if not cond:
            self.items.append(what)
        return cond


class Replica:
    """One `flint serve` process (started again by `start`)."""

    def __init__(self, name, flint, model, logdir, port=None, events=None):
        self.name, self.flint, self.model = name, flint, model
        self.port, self.events = port or free_port(), events or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.endpoint = f"tcp://127.0.0.1:{self.events}"
        self.log = os.path.join(logdir, f"replica-{name}.log")
        self.proc = None

    def cmd(self):
        return [self.flint, "serve", "-m", self.model, "--host", "127.0.0.1",
                "--port", str(self.port), "--kv-events", self.endpoint,
                "--served-model-name", MODEL]

    def start(self):
        env = dict(os.environ, FLINT_THREADS=os.environ.get("FLINT_THREADS", "1"))
        print(f"$ FLINT_THREADS={env['FLINT_THREADS']} {shell(self.cmd())} &", flush=True)
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(self.cmd(), stdout=f, stderr=f, env=env)

    def wait_ready(self, timeout=120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"replica {self.name} exited ({self.proc.returncode}); "
                                   f"see {self.log}")
            try:
                with urllib.request.urlopen(self.url + "/health", timeout=2) as r:
                    if r.status == 200:
                        return
            except (urllib.error.URLError, OSError):
                pass
            time.sleep(0.2)
        raise RuntimeError(f"replica {self.name} not healthy within {timeout} s")

    def metrics(self) -> dict:
        return load.read_metrics(self.url, "")

    def signal(self, sig):
        if self.proc and self.proc.poll() is None:
            self.proc.send_signal(sig)

    def wait_exit(self, timeout):
        try:
            return self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


class Router:
    def __init__(self, replicas, logdir, port=None, prom=None):
        self.port, self.prom = port or free_port(), prom or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.replicas = replicas
        self.log = os.path.join(logdir, "router.log")
        self.proc = None

    def cmd(self):
        c = ["vllm-router", "--host", "127.0.0.1", "--port", str(self.port),
             "--worker-urls", *[r.url for r in self.replicas],
             "--policy", "kv_aware"]
        for r in self.replicas:
            c += ["--kv-event-source", f"{r.url}={r.endpoint}"]
        c += ["--kv-event-block-size", str(BLOCK), "--kv-event-model", MODEL,
              "--health-check-interval-secs", "1", "--health-failure-threshold", "2",
              "--health-success-threshold", "1", "--cb-timeout-duration-secs", "5",
              "--worker-startup-timeout-secs", "120", "--worker-startup-check-interval", "1",
              "--prometheus-port", str(self.prom)]
        return c

    def start(self):
        print(f"$ {shell(self.cmd())} &", flush=True)
        with open(self.log, "ab") as f:
            self.proc = subprocess.Popen(self.cmd(), stdout=f, stderr=f)

    def workers(self):
        """The router's view: worker url -> healthy."""
        with urllib.request.urlopen(self.url + "/workers", timeout=5) as r:
            doc = json.loads(r.read())
        out = {}
        for w in doc.get("workers", []):
            out[w.get("url")] = bool(w.get("is_healthy"))
        return out

    def wait_ready(self, timeout=120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"vllm-router exited ({self.proc.returncode}); see {self.log}")
            try:
                w = self.workers()
                if len(w) == len(self.replicas) and all(w.values()):
                    return
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.3)
        raise RuntimeError(f"vllm-router not ready within {timeout} s")

    def wait_health(self, url, healthy, timeout):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                if self.workers().get(url) == healthy:
                    return True
            except (urllib.error.URLError, OSError, ValueError):
                pass
            time.sleep(0.2)
        return False

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def stream(base, prompt, max_tokens, timeout=120.0, on_first=None):
    """One streamed completion; returns a dict: ok, error, finish, tokens, cached,
    started, ended."""
    res = {"ok": False, "error": "", "finish": None, "tokens": 0, "cached": None,
           "started": time.monotonic(), "ended": None}
    client = OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=timeout)
    try:
        s = client.completions.create(
            model=MODEL, prompt=prompt, max_tokens=max_tokens, temperature=0, stream=True,
            stream_options={"include_usage": True}, extra_body={"ignore_eos": True})
        chunks = 0
        for chunk in s:
            if getattr(chunk, "usage", None) is not None:
                res["tokens"] = chunk.usage.completion_tokens
                details = getattr(chunk.usage, "prompt_tokens_details", None)
                res["cached"] = getattr(details, "cached_tokens", None) if details else None
            for c in chunk.choices or []:
                if c.text is not None:
                    chunks += 1
                    if chunks == 1 and on_first:
                        on_first()
                if c.finish_reason:
                    res["finish"] = c.finish_reason
        res["ok"] = res["finish"] is not None and res["tokens"] == max_tokens
        if not res["ok"]:
            res["error"] = f"finish {res['finish']}, {res['tokens']} of {max_tokens} tokens"
    except openai.APIStatusError as e:
        res["error"] = f"HTTP {e.status_code}: {e}"
    except Exception as e:  # noqa: BLE001: any other failure is a failed request
        res["error"] = f"{type(e).__name__}: {e}"
    res["ended"] = time.monotonic()
    return res


def post_raw(url, body, timeout=30.0):
    """POST JSON; returns (status, headers, parsed body or text)."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, dict(r.headers), json.loads(r.read())
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers), e.read().decode("utf-8", "replace")
    except (urllib.error.URLError, OSError) as e:
        return None, {}, str(e)


def retry_after(headers):
    """The Retry-After header, whatever its case (None when absent)."""
    return next((v for k, v in headers.items() if k.lower() == "retry-after"), None)


def get_raw(url, timeout=5.0):
    """GET; returns (status, headers), or (None, {}) when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, dict(r.headers)
    except urllib.error.HTTPError as e:
        return e.code, dict(e.headers)
    except (urllib.error.URLError, OSError):
        return None, {}


def run_all(jobs, concurrency):
    """Runs callables `jobs` on `concurrency` threads; returns their results in order."""
    results = [None] * len(jobs)
    lock = threading.Lock()
    nxt = [0]

    def worker():
        while True:
            with lock:
                i = nxt[0]
                nxt[0] += 1
            if i >= len(jobs):
                return
            results[i] = jobs[i]()

    threads = [threading.Thread(target=worker) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return results


LONG = 1000  # tokens of a long request (prompt of 8: within the tiny model's 1024)


def long_requests(replica, rng, n):
    """Sends `n` long requests (not streamed: the client stays cheap) directly to
    `replica` and waits until it admitted them all; returns (threads, results, admitted)."""
    before = replica.metrics().get("flint_requests_total", 0)
    results = [dict() for _ in range(n)]
    threads = []
    for i in range(n):
        body = {"model": MODEL, "prompt": rand_tokens(rng, 8), "max_tokens": LONG,
                "temperature": 0, "ignore_eos": True}

        def job(i=i, body=body):
            status, _, doc = post_raw(replica.url + "/v1/completions", body, timeout=120)
            tokens = doc.get("usage", {}).get("completion_tokens") if status == 200 else None
            results[i].update(status=status, tokens=tokens)

        t = threading.Thread(target=job)
        t.start()
        threads.append(t)
    deadline = time.monotonic() + 60
    admitted = False
    while time.monotonic() < deadline:
        if replica.metrics().get("flint_requests_total", 0) - before >= n:
            admitted = True
            break
        time.sleep(0.02)
    return threads, results, admitted


def rand_tokens(rng, n):
    return [rng.randrange(10, 250) for _ in range(n)]


def delta(after, before, name):
    return after.get(name, 0.0) - before.get(name, 0.0)


def phase_routing(f, router, a, b, rng):
    print("\n== 1. kv_aware: repeated prefixes go to the replica that holds them", flush=True)
    prefixes = [rand_tokens(rng, PREFIX) for _ in range(4)]
    holders = [a, b, a, b]
    for p, h in zip(prefixes, holders):
        status, _, body = post_raw(h.url + "/v1/completions",
                                   {"model": MODEL, "prompt": p + rand_tokens(rng, 8),
                                    "max_tokens": 4, "temperature": 0})
        if not f.check(status == 200, f"warming a prefix directly on replica {h.name}"):
            return
    # The router learns of the blocks from the events; give them a moment to arrive.
    time.sleep(1.0)
    before = {r.name: r.metrics() for r in (a, b)}
    jobs_by_prefix = [[(lambda p=p: stream(router.url, p + rand_tokens(rng, 8), 4))
                       for _ in range(8)] for p in prefixes]
    # One client per prefix, each sending its 8 requests one after another.
    per_prefix = run_all([lambda js=js: [j() for j in js] for js in jobs_by_prefix], 4)
    results = [r for rs in per_prefix for r in rs]
    after = {r.name: r.metrics() for r in (a, b)}
    ok = [r for r in results if r["ok"]]
    f.check(len(ok) == 32, f"32 streamed requests through the router complete ({len(ok)} did)")
    for r in results:
        if not r["ok"]:
            print(f"    failed: {r['error']}")
    hits = [r["cached"] for r in results]
    f.check(all(h == PREFIX for h in hits),
            f"every request found its {PREFIX} prefix tokens cached (cached_tokens: "
            f"{sorted(set(map(str, hits)))})")
    for r in (a, b):
        n = delta(after[r.name], before[r.name], "flint_requests_total")
        hit = delta(after[r.name], before[r.name], "flint_prefix_cache_hits_total")
        f.check(n == 16 and hit == 16 * PREFIX,
                f"replica {r.name} served the 16 requests of its prefixes, all hits "
                f"(requests +{n:.0f}, prefix-cache hit tokens +{hit:.0f})")


def phase_drain(f, router, a, b, rng):
    print("\n== 2. SIGTERM during load: nothing in flight is lost", flush=True)
    # Long requests directly on B keep its drain going for a few seconds; then the load
    # through the router.
    long_threads, long_res, admitted = long_requests(b, rng, 24)
    f.check(admitted, f"24 long requests ({LONG} tokens) on B admitted")
    load_res = []
    prompts = [rand_tokens(rng, 40) for _ in range(24)]
    loader = threading.Thread(target=lambda: load_res.extend(
        run_all([lambda p=p: stream(router.url, p, 24) for p in prompts], 6)))
    loader.start()
    time.sleep(0.3)
    b.signal(signal.SIGTERM)
    time.sleep(0.3)
    status, headers = get_raw(b.url + "/health")
    f.check(status == 503 and retry_after(headers) is not None,
            f"draining B: /health answers {status} with Retry-After {retry_after(headers)}")
    status, headers, _ = post_raw(b.url + "/v1/completions",
                                  {"model": MODEL, "prompt": [11, 12], "max_tokens": 1})
    f.check(status == 503 and retry_after(headers) is not None,
            f"draining B: a new request answers {status} with Retry-After "
            f"{retry_after(headers)}")
    loader.join()
    ok = [r for r in load_res if r["ok"]]
    f.check(len(ok) == len(prompts),
            f"every request through the router completed ({len(ok)} of {len(prompts)})")
    for r in load_res:
        if not r["ok"]:
            print(f"    failed: {r['error']}")
    f.check(router.wait_health(b.url, False, 10), "the router marks B unhealthy")
    if b.proc.poll() is None:
        m0 = b.metrics()
        after = run_all([lambda: stream(router.url, rand_tokens(rng, 20), 4)
                         for _ in range(8)], 4)
        alive = b.proc.poll() is None
        m1 = b.metrics() if alive else m0
        f.check(all(r["ok"] for r in after) and delta(m1, m0, "flint_requests_total") == 0,
                "requests after that all complete, none on B "
                f"({sum(r['ok'] for r in after)} of 8 ok; B still draining: {alive})")
    for t in long_threads:
        t.join()
    f.check(all(r.get("tokens") == LONG for r in long_res),
            f"the long requests on B finished all their tokens "
            f"({sorted(set(str(r.get('tokens')) for r in long_res))} of {LONG}; HTTP "
            f"{sorted(set(str(r.get('status')) for r in long_res))})")
    code = b.wait_exit(30)
    f.check(code == 0, f"B exited by itself after the drain (status {code})")


def phase_kill(f, router, a, b, rng):
    print("\n== 3. a replica killed mid-load", flush=True)
    b.start()
    b.wait_ready()
    # The router's health checker takes B back; B taking requests below is the check.
    t = time.monotonic()
    back = router.wait_health(b.url, True, 30)
    print(f"  the router's /workers says B is {'healthy' if back else 'not yet healthy'} "
          f"after {time.monotonic() - t:.1f} s", flush=True)
    base = b.metrics().get("flint_requests_total", 0)
    a0 = a.metrics()
    results = []
    prompts = [rand_tokens(rng, 40) for _ in range(32)]
    loader = threading.Thread(target=lambda: results.extend(
        run_all([lambda p=p: stream(router.url, p, 200) for p in prompts], 8)))
    loader.start()
    # Until B has taken a few requests of this load.
    deadline = time.monotonic() + 30
    snap = {}
    while time.monotonic() < deadline:
        snap = b.metrics()
        if snap.get("flint_requests_total", 0) - base >= 3:
            break
        time.sleep(0.02)
    t_snap = time.monotonic()
    on_b = snap.get("flint_requests_total", 0) - base
    f.check(on_b >= 3, f"B took requests of this load before the kill ({on_b:.0f})")
    b.proc.kill()
    t_kill = time.monotonic()
    b.proc.wait()
    loader.join()
    failed = [r for r in results if not r["ok"]]
    in_progress = [r for r in results if r["started"] <= t_kill <= r["ended"]]
    longest = max((r["ended"] - r["started"] for r in results), default=0.0)
    f.check(len(results) == len(prompts) and longest < 30,
            f"every request ended (none hung: the longest took {longest:.1f} s)")
    a1 = a.metrics()
    a_taken = delta(a1, a0, "flint_requests_total")
    a_done = delta(a1, a0, "flint_requests_finished_total")
    a_cut = delta(a1, a0, "flint_requests_aborted_total")
    f.check(a_cut == 0 and a_done == a_taken,
            f"every request on A ran to its end (A took {a_taken:.0f}, finished "
            f"{a_done:.0f}, aborted {a_cut:.0f})")
    f.check(all(r["started"] <= t_kill <= r["ended"] for r in failed),
            f"{len(results) - len(failed)} of {len(results)} completed; each of the "
            f"{len(failed)} that failed was in progress at the kill ({len(in_progress)} "
            f"were; B had taken {on_b:.0f} of this load {t_kill - t_snap:.2f} s before)")
    for r in failed:
        print(f"    failed (clean): {r['error'][:160]}")
    for r in results:
        if r["ended"] - r["started"] > 5:
            print(f"    slow: {r['ended'] - r['started']:.1f} s, started "
                  f"{r['started'] - t_kill:+.1f} s from the kill, "
                  f"{'ok' if r['ok'] else r['error'][:120]}")
    f.check(router.wait_health(b.url, False, 10), "the router marks the killed B unhealthy")
    after = run_all([lambda: stream(router.url, rand_tokens(rng, 20), 4) for _ in range(8)], 4)
    f.check(all(r["ok"] for r in after),
            f"requests after that all complete ({sum(r['ok'] for r in after)} of 8)")


def phase_second_signal(f, a, rng):
    print("\n== 4. a second signal exits at once", flush=True)
    threads, _, admitted = long_requests(a, rng, 24)
    f.check(admitted, f"24 long requests ({LONG} tokens) on A admitted")
    a.signal(signal.SIGTERM)
    time.sleep(0.3)
    status, _ = get_raw(a.url + "/health")
    f.check(status == 503 and a.proc.poll() is None,
            f"after SIGTERM A drains (/health {status}) and is still running")
    t0 = time.monotonic()
    a.signal(signal.SIGINT)
    code = a.wait_exit(5)
    f.check(code == 130, f"SIGINT: A exited in {time.monotonic() - t0:.2f} s with status {code} "
            "(the long requests cut)")
    for t in threads:
        t.join()


DOC = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "docs", "deploy.md")


def doc_commands(path=DOC):
    """The commands of docs/deploy.md's one-machine recipe: each line of its first `sh`
    block (continuations joined) as a list of words, without a trailing `&`."""
    text = open(path, encoding="utf-8").read()
    start = text.index("## One machine")
    block = text[text.index("```sh\n", start) + 6:]
    block = block[: block.index("```")]
    out = []
    for line in block.replace("\\\n", " ").splitlines():
        words = shlex.split(line)
        if words and words[-1] == "&":
            words.pop()
        if words:
            out.append(words)
    return out


def check_doc_commands(f):
    """docs/deploy.md's commands are the test's, with the documentation's ports and names
    in place of the free ports this run picks."""
    a = Replica("A", "flint", "model.gguf", "", port=8001, events=5557)
    b = Replica("B", "flint", "model.gguf", "", port=8002, events=5558)
    router = Router([a, b], "", port=8000, prom=29000)
    want = [["FLINT_THREADS=1", *a.cmd()], ["FLINT_THREADS=1", *b.cmd()], router.cmd()]
    got = [c for c in doc_commands() if c[0] != "python3"]
    f.check(got == want, "docs/deploy.md's one-machine commands are the ones run here")
    if got != want:
        for g, w in zip(got + [[]] * 3, want):
            if g != w:
                print(f"    docs: {shlex.join(g)}\n    test: {shlex.join(w)}")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--flint", required=True, help="the flint binary")
    ap.add_argument("--model", required=True, help="the GGUF both replicas serve")
    ap.add_argument("--logdir", required=True, help="where the processes' logs go")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    f = Failures()
    a = Replica("A", args.flint, args.model, args.logdir)
    b = Replica("B", args.flint, args.model, args.logdir)
    router = Router([a, b], args.logdir)
    t0 = time.monotonic()
    check_doc_commands(f)
    try:
        a.start()
        b.start()
        a.wait_ready()
        b.wait_ready()
        router.start()
        router.wait_ready()
        print(f"replicas A {a.url} (events {a.endpoint}), B {b.url} (events {b.endpoint}); "
              f"router {router.url}", flush=True)
        for phase in (lambda: phase_routing(f, router, a, b, rng),
                      lambda: phase_drain(f, router, a, b, rng),
                      lambda: phase_kill(f, router, a, b, rng),
                      lambda: phase_second_signal(f, a, rng)):
            t = time.monotonic()
            phase()
            print(f"  ({time.monotonic() - t:.1f} s)", flush=True)
    except RuntimeError as e:
        f.check(False, str(e))
    finally:
        router.stop()
        a.stop()
        b.stop()
    print(f"\n{time.monotonic() - t0:.1f} s", flush=True)
    if f.items:
        print(f"router_test: {len(f.items)} check(s) failed:")
        for i in f.items:
            print(f"  - {i}")
        return 1
    print("router_test: passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
