#!/usr/bin/env python3
"""Time to first token of a growing tool-calling conversation, turn by turn,
through the sessions API (POST /v1/sessions/{id}/chat/completions, only the
new messages) beside the same kind of conversation through the stateless
endpoint (the client re-sends the whole history every turn).

Each turn adds about --turn-tokens tokens (tool results; the chat format's
tokens are UTF-8 bytes), and the model answers with one forced tool call.
The two conversations have system prompts of equal length that differ in
their first byte, so neither is served from the other's cache. The daemon
is started here, on the model given or one generated with moe-model-gen.

Usage: bench/session_ttft.py BUILD_DIR [--preset small] [--turns 20] [--rounds 2]

With --history N (e.g. --preset long --history 131072 --rounds 1): time to
first token of a session's turn N+1 after a history of about N tokens, with
the history's cache (a) in memory, (b) on disk only (the daemon restarted
over the same prefix_disk_dir and session store, so the prefix cache's tier
on disk is all that holds it), and (c) recomputed (restarted with the prefix
cache off), and the ratios. A round builds the history (its first turn,
itself a prefill of N tokens from nothing), then takes one short turn per
case; which of (b) and (c) runs first alternates between rounds.
"""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import time

TOOLS = [{"type": "function", "function": {
    "name": "read_file", "description": "Reads a file",
    "parameters": {"type": "object", "properties": {"path": {"type": "string"}}, "required": ["path"]}}}]


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def request(port, method, path, body=None):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    conn.request(method, path, json.dumps(body) if body is not None else None, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    data = resp.read()
    conn.close()
    return resp.status, json.loads(data) if data else None


def stream(port, path, body):
    """POSTs a streamed turn; returns (seconds to the first generated delta, assistant message, usage)."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    payload = json.dumps(body)
    start = time.perf_counter()
    conn.request("POST", path, payload, {"Content-Type": "application/json"})
    resp = conn.getresponse()
    if resp.status != 200:
        raise RuntimeError(f"{path}: {resp.status} {resp.read()[:300]!r}")
    first = None
    content, reasoning, calls, usage = "", "", {}, None
    while True:
        line = resp.readline()
        if not line:
            break
        if not line.startswith(b"data: "):
            continue
        data = line[6:].strip()
        if data == b"[DONE]":
            break
        chunk = json.loads(data)
        if "error" in chunk:
            raise RuntimeError(f"{path}: {chunk['error']}")
        if chunk.get("usage"):
            usage = chunk["usage"]
        for c in chunk.get("choices", []):
            d = c.get("delta", {})
            got = d.get("reasoning_content") or d.get("tool_calls") or (d.get("content") and "role" not in d)
            if got and first is None:
                first = time.perf_counter() - start
            reasoning += d.get("reasoning_content") or ""
            content += d.get("content") or ""
            for t in d.get("tool_calls") or []:
                call = calls.setdefault(t["index"], {"id": "", "name": "", "arguments": ""})
                call["id"] = t.get("id", call["id"])
                call["name"] = t["function"].get("name", call["name"])
                call["arguments"] += t["function"].get("arguments", "")
    conn.close()
    message = {"role": "assistant", "content": content or None, "reasoning_content": reasoning or None}
    if calls:
        message["tool_calls"] = [{"id": c["id"], "type": "function",
                                  "function": {"name": c["name"], "arguments": c["arguments"]}}
                                 for _, c in sorted(calls.items())]
    return first, message, usage


def new_messages(turn, last, turn_tokens):
    """The turn's new messages: results for the last answer's calls, or a user message."""
    filler = "".join(f"line {i} of file {turn}: some text that a tool returned.\n" for i in range(turn_tokens // 40 + 1))
    calls = last.get("tool_calls") if last else None
    if calls:
        share = turn_tokens // len(calls)
        return [{"role": "tool", "tool_call_id": c["id"], "content": filler[:share]} for c in calls]
    return [{"role": "user", "content": filler[:turn_tokens]}]


def run_round(port, turns, turn_tokens, marks, rnd, args_probes=5):
    turn_body = {"tool_choice": "required", "parallel_tool_calls": False, "max_tokens": 96,
                 "reasoning_effort": "low", "temperature": 0, "seed": rnd,
                 "stream": True, "stream_options": {"include_usage": True}}
    # Distinct per round and per path (same length), so that no prompt is
    # served from another conversation's cache.
    system = f"{rnd:04d} You are an agent that reads files to answer questions. " * 4
    status, created = request(port, "POST", "/v1/sessions", {"system": "A" + system, "tools": TOOLS})
    assert status == 200, created
    sid = created["id"]
    history = [{"role": "system", "content": "B" + system}]
    out = {"session": {}, "stateless": {}}
    last_s = last_h = None
    for turn in range(1, turns + 1):
        msgs = new_messages(turn, last_s, turn_tokens)
        history += new_messages(turn, last_h, turn_tokens)
        # Which path goes first alternates, so neither always meets a machine
        # the other just warmed (or a neighbour just loaded).
        def session():
            return stream(port, f"/v1/sessions/{sid}/chat/completions", dict(turn_body, messages=msgs))

        def stateless():
            return stream(port, "/v1/chat/completions", dict(turn_body, messages=history, tools=TOOLS))

        if (turn + rnd) % 2:
            t_s, last_s, u_s = session()
            t_h, last_h, u_h = stateless()
        else:
            t_h, last_h, u_h = stateless()
            t_s, last_s, u_s = session()
        history.append(last_h)
        if turn in marks:
            out["session"][turn] = (t_s, u_s)
            out["stateless"][turn] = (t_h, u_h)
            print(f"round {rnd} turn {turn}: session {t_s:.3f} s, stateless {t_h:.3f} s "
                  f"(prompt {u_s['prompt_tokens']}, cached {u_s['prompt_tokens_details']['cached_tokens']} / "
                  f"{u_h['prompt_tokens_details']['cached_tokens']})", flush=True)
    # Probes: short turns (a few new tokens, one generated) on the grown
    # history, where the prefill is small and what the session path adds
    # (reading the store, rendering, the commit before [DONE]) shows.
    probe = dict(turn_body, tool_choice="auto", max_tokens=1)
    out["probe"] = {"session": [], "stateless": []}
    for k in range(args_probes):
        def short(last):
            calls = last.get("tool_calls") if last else None
            if calls:
                return [{"role": "tool", "tool_call_id": c["id"], "content": "ok"} for c in calls]
            return [{"role": "user", "content": f"ok {k}"}]
        msgs = short(last_s)
        history += short(last_h)
        t_h, last_h, _ = stream(port, "/v1/chat/completions", dict(probe, messages=history, tools=TOOLS))
        history.append(last_h)
        t_s, last_s, _ = stream(port, f"/v1/sessions/{sid}/chat/completions", dict(probe, messages=msgs))
        out["probe"]["session"].append(t_s)
        out["probe"]["stateless"].append(t_h)
    request(port, "DELETE", f"/v1/sessions/{sid}")
    return out


def start_daemon(args, model, work, tag, extra):
    port = free_port()
    log = open(os.path.join(work, f"daemon-{tag}.log"), "w")
    daemon = subprocess.Popen([os.path.join(args.build, "daemon", "moe-daemon"), "--model", model, "--port", str(port),
                               "--served-model-name", "bench", "--threads", str(args.threads)] + extra,
                              stdout=log, stderr=log)
    for _ in range(3000):
        if daemon.poll() is not None:
            raise RuntimeError(f"moe-daemon exited ({daemon.returncode}); see {log.name}")
        try:
            if request(port, "GET", "/readyz")[0] == 200:
                break
        except OSError:
            pass
        time.sleep(0.1)
    return daemon, port


def stop_daemon(daemon):
    daemon.terminate()  # SIGTERM: the prefix cache's entries are written to prefix_disk_dir on the way out
    daemon.wait(timeout=900)


def metric(port, name):
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.request("GET", "/metrics")
    text = conn.getresponse().read().decode()
    conn.close()
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name) and (line[len(name)] in " {"):
            total += float(line.rsplit(" ", 1)[1])
    return total


def warm_up(port):
    """A short request first: the process's first forward pass pays for warming up."""
    stream(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 2,
                                          "stream": True})


def drop_from_page_cache(folder):
    """Writes the tier's files out and drops them from the page cache, so that
    the restarted daemon reads them from the disk (a cold restart)."""
    total = 0
    for root, _, names in os.walk(folder):
        for n in names:
            fd = os.open(os.path.join(root, n), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                total += os.fstat(fd).st_size
            finally:
                os.close(fd)
    return total


def timed_turn(port, sid, text, max_tokens=4):
    """One session turn; seconds to the first generated delta (or to the end of
    the stream when the model's first tokens print nothing), and its usage."""
    body = {"messages": [{"role": "user", "content": text}], "max_tokens": max_tokens, "temperature": 0,
            "reasoning_effort": "low", "stream": True, "stream_options": {"include_usage": True}}
    start = time.perf_counter()
    first, _, usage = stream(port, f"/v1/sessions/{sid}/chat/completions", body)
    return (first if first is not None else time.perf_counter() - start), usage


def history_round(args, model, work, history, rnd):
    """One round at one history length: returns {case: (seconds, usage)}."""
    tag = f"h{history}-r{rnd}"
    disk = os.path.join(work, f"disk-{tag}")
    state = os.path.join(work, f"state-{tag}")
    subprocess.run(["rm", "-rf", disk, state], check=True)
    common = ["--max-context", str(history + 8192), "--cache-tokens", str(history + 16384), "--state-dir", state,
              "--prefix-cache-bytes", str(1 << 36), "--thinking-budgets.low", "4"]
    cached = common + ["--prefix-disk-dir", disk, "--prefix-disk-bytes", str(1 << 38)]
    out = {}
    daemon, port = start_daemon(args, model, work, tag + "-memory", cached)
    try:
        warm_up(port)
        status, created = request(port, "POST", "/v1/sessions", {"system": f"{rnd:04d} You read long logs."})
        assert status == 200, created
        sid = created["id"]
        line = "".join(f"line {i}: a record the tool returned, kept in the history.\n" for i in range(history // 50 + 2))
        out["history"] = timed_turn(port, sid, line[:history - 64])
        print(f"h {history} round {rnd}: history turn {out['history'][0]:.2f} s "
              f"(prompt {out['history'][1]['prompt_tokens']})", flush=True)
        out["memory"] = timed_turn(port, sid, "next 1")
    finally:
        stop_daemon(daemon)
    cases = ["disk", "recompute"] if rnd % 2 == 0 else ["recompute", "disk"]
    for k, case in enumerate(cases):
        extra = cached if case == "disk" else common + ["--no-prefix-cache"]
        if case == "disk":
            out["disk_files_bytes"] = drop_from_page_cache(disk)
        daemon, port = start_daemon(args, model, work, f"{tag}-{case}", extra)
        try:
            warm_up(port)
            out[case] = timed_turn(port, sid, f"next {k + 2}")
            if case == "disk":
                out["disk_hit_tokens"] = metric(port, "moe_prefix_disk_hit_tokens_total")
        finally:
            stop_daemon(daemon)
    for case in ("memory", "disk", "recompute"):
        t, u = out[case]
        print(f"h {history} round {rnd}: {case} {t:.3f} s (prompt {u['prompt_tokens']}, "
              f"cached {u['prompt_tokens_details']['cached_tokens']})", flush=True)
    print(f"h {history} round {rnd}: tokens read back from disk {out['disk_hit_tokens']:.0f} (the tier held "
          f"{out['disk_files_bytes'] / 2**20:.1f} MiB, dropped from the page cache before the restart)", flush=True)
    return out


def history_main(args, model, work):
    sizes = [int(x) for x in args.history.split(",")]
    results = {h: [history_round(args, model, work, h, r) for r in range(args.rounds)] for h in sizes}
    print(f"model {os.path.basename(model)}, a session turn (a few new tokens) after a history of H tokens, "
          f"{args.rounds} round(s), best of the rounds (s); restore/recompute is disk over recompute")
    print(f"{'H':>8} {'history':>9} {'memory':>8} {'disk':>8} {'recompute':>10} {'mem/rec':>8} {'disk/rec':>9} "
          f"{'rec/disk':>9}")
    for h, rounds in results.items():
        best = {c: min(r[c][0] for r in rounds) for c in ("history", "memory", "disk", "recompute")}
        print(f"{h:>8} {best['history']:>9.2f} {best['memory']:>8.3f} {best['disk']:>8.3f} {best['recompute']:>10.2f} "
              f"{best['memory'] / best['recompute']:>8.4f} {best['disk'] / best['recompute']:>9.4f} "
              f"{best['recompute'] / best['disk']:>8.1f}x")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("build")
    ap.add_argument("--preset", default="small")
    ap.add_argument("--model", help="a model directory (default: generate --preset)")
    ap.add_argument("--turns", type=int, default=20)
    ap.add_argument("--turn-tokens", type=int, default=800)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--history", help="history lengths in tokens, comma-separated (the long-history mode)")
    args = ap.parse_args()
    work = os.path.join(args.build, "bench-session")
    os.makedirs(work, exist_ok=True)
    model = args.model or os.path.join(work, args.preset)
    if not os.path.exists(os.path.join(model, "manifest.json")):
        subprocess.run([os.path.join(args.build, "engine", "moe-model-gen"), "--preset", args.preset, "--seed", "1",
                        "--out", model], check=True, stdout=subprocess.DEVNULL)
    if args.history:
        return history_main(args, model, work)
    daemon, port = start_daemon(args, model, work, "turns",
                                ["--max-context", "32768", "--cache-tokens", "131072", "--state-dir",
                                 os.path.join(work, "state"), "--thinking-budgets.low", "4",
                                 "--constrained-max-string-bytes", "24"])
    try:
        # One request first: the process's first forward pass pays for warming up.
        stream(port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "warm up"}], "max_tokens": 4,
                                              "stream": True})
        marks = {1, 10, 20} & set(range(1, args.turns + 1)) or {args.turns}
        results = [run_round(port, args.turns, args.turn_tokens, marks, r) for r in range(args.rounds)]
    finally:
        daemon.terminate()
        daemon.wait()
    print(f"model {os.path.basename(model)}, {args.turns} turns of ~{args.turn_tokens} tokens, {args.rounds} rounds, "
          "median time to first token (s); prompt / cached tokens of the last round")
    print(f"{'turn':>5} {'session':>9} {'stateless':>10} {'ratio':>7} {'prompt':>8} {'cached s':>9} {'cached h':>9}")
    for turn in sorted(marks):
        s = statistics.median(r["session"][turn][0] for r in results)
        h = statistics.median(r["stateless"][turn][0] for r in results)
        us, uh = results[-1]["session"][turn][1], results[-1]["stateless"][turn][1]
        print(f"{turn:>5} {s:>9.3f} {h:>10.3f} {s / h:>7.2f} {us['prompt_tokens']:>8} "
              f"{us['prompt_tokens_details']['cached_tokens']:>9} {uh['prompt_tokens_details']['cached_tokens']:>9}")
    ps = statistics.median(t for r in results for t in r["probe"]["session"])
    ph = statistics.median(t for r in results for t in r["probe"]["stateless"])
    print(f"short turns after turn {args.turns} (a few new tokens, max_tokens 1), median of "
          f"{sum(len(r['probe']['session']) for r in results)}: session {ps:.3f} s, stateless {ph:.3f} s, "
          f"ratio {ps / ph:.2f}")


if __name__ == "__main__":
    sys.exit(main())
