#!/usr/bin/env bash
# bench/daemon: the daemon's HTTP throughput against the cpprestsdk ceiling,
# and time to first token on a 2,000-token prompt, cold vs cached prefix.
# Usage: bench/daemon/run.sh [BUILD_DIR] [SECONDS]   (BUILD_DIR holds daemon/moe-daemon and engine/moe-model-gen)
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
seconds="${2:-10}"
work="$build/bench-daemon"
mkdir -p "$work"
[[ -x $work/http_ceiling ]] || g++ -std=c++2b -O2 "$root/bench/daemon/http_ceiling.cpp" -o "$work/http_ceiling" -lcpprest -lssl -lcrypto -lpthread
[[ -f $work/tiny/manifest.json ]] || "$build/engine/moe-model-gen" --preset tiny --seed 1 --out "$work/tiny" >/dev/null
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait' EXIT

p1=$(port); "$work/http_ceiling" "$p1" 2>/dev/null & pids+=($!)
p2=$(port); "$build/daemon/moe-daemon" --model "$work/tiny" --served-model-name tiny --port "$p2" \
  --max-context 8192 --max-running 64 >"$work/daemon.log" 2>&1 & pids+=($!)
for _ in $(seq 1 200); do curl -sf "http://127.0.0.1:$p2/readyz" >/dev/null && break; sleep 0.1; done

lua="$root/bench/daemon/post.lua"
if command -v wrk >/dev/null; then
  # wrk (C, keep-alive) so the client is not the bottleneck; Node's fetch tops out far lower.
  for target in "HTTP ceiling (trivial cpprestsdk endpoint)|$p1" "moe-daemon, max_tokens 1|$p2"; do
    echo "${target%%|*}, 32 connections, ${seconds}s:"
    wrk -t2 -c32 -d"${seconds}s" --latency -s "$lua" "http://127.0.0.1:${target##*|}/v1/chat/completions" |
      grep -E "Requests/sec|^ +50%|^ +99%|Non-2xx|Socket errors"
  done
else
  echo "HTTP ceiling (trivial cpprestsdk endpoint), 32 clients (node; install wrk for a faster client):"
  node "$root/bench/daemon/load.mjs" rps "http://127.0.0.1:$p1" 32 "$seconds"
  echo "moe-daemon, max_tokens 1, 32 clients:"
  node "$root/bench/daemon/load.mjs" rps "http://127.0.0.1:$p2" 32 "$seconds"
fi
echo "moe-daemon, TTFT on a 2,000-token prompt (cold), then turn 2 of that conversation (prefix cached):"
node "$root/bench/daemon/load.mjs" ttft "http://127.0.0.1:$p2" 2000
