#!/usr/bin/env python3
"""bench/daemon/gpt_oss.py: moe-daemon serving a tiny random gpt-oss
checkpoint (tools/reference/gpt_oss.py write, the real o200k_harmony
tokenizer), timed through the HTTP API:

  single     one request, unconstrained: completion tokens per second
  parallel   N requests at once: completion tokens per second, all together
             (the engine decodes them in one batched forward per step)
  constrained  a tool_choice-named call with a free-string schema: every
             token masked by the JSON grammar over the 200k-token vocabulary

Usage: bench/daemon/gpt_oss.py [BUILD_DIR] [--layers 4] [--tokens 48] [--parallel 4] [--model DIR]
--model serves an existing checkpoint instead (e.g. the gpt-oss-20b-shaped
one of bench/gpt_oss/README.md). The tokens are noise (random weights); only
the times mean something.
"""
import argparse
import json
import os
import socket
import subprocess
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def post(port, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}/v1/chat/completions", data=json.dumps(body).encode(),
                                 headers={"content-type": "application/json"})
    with urllib.request.urlopen(req, timeout=600) as r:
        return json.loads(r.read())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build", nargs="?", default=os.path.join(ROOT, "build"))
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=48, help="max_tokens (at most ~60: see plain())")
    ap.add_argument("--parallel", type=int, default=4)
    ap.add_argument("--model", help="serve this gpt-oss checkpoint instead of writing a tiny one")
    a = ap.parse_args()
    work = os.path.join(a.build, "bench-gptoss")  # the checkpoint (~100 MB) and the daemon log
    os.makedirs(work, exist_ok=True)
    model = a.model or os.path.join(work, "model")
    if not a.model:
        subprocess.run(["/usr/bin/python3", os.path.join(ROOT, "tools/reference/gpt_oss.py"), "write", "--out", model,
                        "--layers", str(a.layers)], check=True)
    port = free_port()
    log = open(os.path.join(work, "daemon.log"), "w")
    daemon = subprocess.Popen([os.path.join(a.build, "daemon/moe-daemon"), "--model", model, "--port", str(port),
                               "--max-context", "4096", "--constrained-max-string-bytes", "4096"],
                              stdout=log, stderr=subprocess.STDOUT)
    try:
        for _ in range(3000):  # a 13 GB checkpoint loads in up to a minute
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=1)
                break
            except Exception:
                time.sleep(0.1)
        # Plain chat: the random model's text stays inside one long message
        # header (harmony's parser allows 64 header tokens), so up to ~60
        # tokens run unconstrained to max_tokens.
        def plain(seed):
            return post(port, {"messages": [{"role": "user", "content": "hi"}], "max_tokens": a.tokens, "seed": seed})

        # A call the server opens: every token masked by the JSON grammar over the vocabulary.
        def call(seed):
            schema = {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}
            tools = [{"type": "function", "function": {"name": "f", "parameters": schema}}]
            return post(port, {"messages": [{"role": "user", "content": "hi"}], "tools": tools,
                               "tool_choice": {"type": "function", "function": {"name": "f"}},
                               "max_tokens": a.tokens, "seed": seed})

        def timed(label, fn, seed):
            t = time.time()
            r = fn(seed)
            dt = time.time() - t
            n = r["usage"]["completion_tokens"]
            print(f"{label:12s}{n} tokens in {dt:.2f} s: {n / dt:.1f} tokens/s (prompt {r['usage']['prompt_tokens']})")

        plain(0)  # warm-up
        timed("single", plain, 1)
        timed("constrained", call, 2)
        results = []
        t = time.time()
        threads = [threading.Thread(target=lambda i=i: results.append(plain(10 + i))) for i in range(a.parallel)]
        for th in threads:
            th.start()
        for th in threads:
            th.join()
        dt = time.time() - t
        n = sum(r["usage"]["completion_tokens"] for r in results)
        print(f"parallel    {a.parallel} requests, {n} tokens in {dt:.2f} s: {n / dt:.1f} tokens/s together")
    finally:
        daemon.terminate()
        daemon.wait()
        log.close()


if __name__ == "__main__":
    main()
