#!/usr/bin/env bash
# bench/daemon/ledger.sh: what the durable usage ledger costs. Two moe-daemon
# processes on the tiny preset, one with the ledger in memory (no file, no
# fsync: "off") and one with it on disk (WAL, synchronous=FULL: "on"), are
# driven in alternating rounds by wrk (32 connections, max_tokens 1, ~50-token
# prompts), after a warm-up round, in rounds that alternate which goes first;
# requests/s of each and the on/off ratio are printed. Then the
# "on" daemon runs once more under strace to count fsync/fdatasync calls per
# request (strace slows it; that pass is not timed).
# Usage: bench/daemon/ledger.sh [BUILD_DIR] [SECONDS_PER_ROUND] [ROUNDS]
#   BUILD_DIR holds daemon/moe-daemon and engine/moe-model-gen.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="${1:-$root/build}"
seconds="${2:-5}"
rounds="${3:-3}"
work="$build/bench-ledger"
mkdir -p "$work"
[[ -f $work/tiny/manifest.json ]] || "$build/engine/moe-model-gen" --preset tiny --seed 1 --out "$work/tiny" >/dev/null
command -v wrk >/dev/null || { echo "wrk is needed (apt-get install wrk)"; exit 1; }
port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
pids=()
trap 'for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done; wait 2>/dev/null' EXIT
start() {  # start NAME PORT EXTRA...
  local name=$1 p=$2; shift 2
  "$build/daemon/moe-daemon" --model "$work/tiny" --served-model-name tiny --port "$p" --max-context 4096 \
    --max-running 64 "$@" >"$work/$name.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$p/readyz" >/dev/null && return; sleep 0.1; done
  echo "$name did not start; see $work/$name.log"; exit 1
}
rm -f "$work"/usage.sqlite3*
off=$(port); start off "$off"
on=$(port); start on "$on" --ledger-path "$work/usage.sqlite3"
lua="$root/bench/daemon/ledger_post.lua"
rps() { wrk -t2 -c32 -d"${seconds}s" -s "$lua" "http://127.0.0.1:$1/v1/chat/completions" | awk '/Requests\/sec/ {print $2}'; }
curl -s "http://127.0.0.1:$on/v1/chat/completions" -d '{"messages":[{"role":"user","content":"request 1: summarise the usage of each tenant"}],"max_tokens":1}' |
  python3 -c 'import json,sys; u=json.load(sys.stdin)["usage"]; print("prompt tokens per request:", u["prompt_tokens"])'
rps "$off" >/dev/null; rps "$on" >/dev/null  # warm-up round, not counted
ratios=()
for r in $(seq 1 "$rounds"); do
  # Alternate which goes first, so that drift in the machine's load favours neither.
  if (( r % 2 )); then a=$(rps "$off"); b=$(rps "$on"); else b=$(rps "$on"); a=$(rps "$off"); fi
  ratio=$(python3 -c "print(f'{$b/$a:.3f}')")
  ratios+=("$ratio")
  echo "round $r: ledger off $a req/s, ledger on $b req/s, on/off $ratio"
done
python3 -c 'import statistics,sys; print(f"median on/off: {statistics.median(map(float, sys.argv[1:])):.3f}")' "${ratios[@]}"
curl -s "http://127.0.0.1:$on/metrics" | awk '/^moe_usage_ledger_commits_total/ {c=$2} /^moe_usage_ledger_charges_total/ {r=$2}
  END {printf "ledger commits %d for %d requests = %.3f per request (each one WAL fsync)\n", c, r, c/(r>0?r:1)}' 
kill -TERM "${pids[@]}"; wait 2>/dev/null || true; pids=()

if command -v strace >/dev/null; then
  rm -f "$work"/usage.sqlite3*
  p=$(port)
  strace -f -qq -c -e trace=fsync,fdatasync -o "$work/strace.txt" \
    "$build/daemon/moe-daemon" --model "$work/tiny" --served-model-name tiny --port "$p" --max-context 4096 \
    --ledger-path "$work/usage.sqlite3" >"$work/strace-daemon.log" 2>&1 &
  pids+=($!)
  for _ in $(seq 1 300); do curl -sf "http://127.0.0.1:$p/readyz" >/dev/null && break; sleep 0.1; done
  wrk -t2 -c32 -d"${seconds}s" -s "$lua" "http://127.0.0.1:$p/v1/chat/completions" >/dev/null
  n=$(curl -s "http://127.0.0.1:$p/v1/usage" | python3 -c 'import json,sys; print(sum(r["requests"] for r in json.load(sys.stdin)["data"] if r["period"]=="month"))')
  # SIGTERM to the daemon itself: strace would only detach from it.
  for child in $(ps -o pid= --ppid "${pids[0]}"); do kill -TERM "$child"; done
  wait 2>/dev/null || true; pids=()
  calls=$(awk '$NF=="fsync"||$NF=="fdatasync" {s+=$4} END {print s+0}' "$work/strace.txt")
  python3 -c "print(f'fsync+fdatasync: {$calls} for $n requests = {$calls/max($n,1):.3f} per request (under strace)')"
fi
