#!/usr/bin/env bash
# Speculative decoding on the tiny agent's held-out tool-use tasks, through
# moe-daemon and the official `openai` client, one sequence at a time, greedy.
#
#   bench/speculative/run.sh BUILD_DIR [MODEL_DIR] [--limit N] [--tiers high] [--modes off,lookup,mtp,auto]
#                            [--concurrency N] [--rounds R]
#
# One daemon serves MODEL_DIR (default models/tiny-agent/mxfp4) with
# `speculative: auto` (which loads the MTP layer); each mode runs the same tasks with the request field
# `speculative` set to it (tools/eval/eval.mjs --extra-body), one task after
# the other. Between modes /metrics is read: decode tokens/s is the
# inter-token latency histogram's count over its sum (every emitted token
# after a request's first, over the time from first to last), and the draft
# counters give the acceptance per kind. Prints per mode: accuracy (greedy:
# the same as off, since drafts never change a greedy token), decode tokens/s,
# its ratio to `off`, and each kind's drafts, proposed and accepted tokens.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: bench/speculative/run.sh BUILD_DIR [MODEL_DIR] [--limit N] [--tiers T] [--modes M,...]}
shift
MODEL=models/tiny-agent/mxfp4
if [[ $# -gt 0 && $1 != --* ]]; then MODEL=$1; shift; fi
LIMIT=60 TIERS=high MODES=off,lookup,mtp,auto CONCURRENCY=1 ROUNDS=1
while [[ $# -gt 0 ]]; do
  case $1 in
    --limit) LIMIT=$2; shift 2 ;;
    --tiers) TIERS=$2; shift 2 ;;
    --modes) MODES=$2; shift 2 ;;
    --concurrency) CONCURRENCY=$2; shift 2 ;;
    --rounds) ROUNDS=$2; shift 2 ;;
    *) echo "run.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
WORK=${TMPDIR:-/tmp}/moe-speculative-bench.$$
mkdir -p "$WORK"
/usr/bin/python3 tools/train/gen_data.py --split eval --seed 2 --count 300 --out "$WORK/eval.jsonl"
source tools/eval/daemon.sh
DAEMON_PID=
trap 'if [[ -n $DAEMON_PID ]]; then kill -TERM $DAEMON_PID 2>/dev/null || true; wait $DAEMON_PID 2>/dev/null || true; fi
      rm -rf "$WORK"' EXIT
start_daemon "$BUILD" "$MODEL" "$WORK/daemon.log" --speculative auto
port=$DAEMON_PORT
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p'), $(nproc) cores, load average $(cut -d' ' -f1 /proc/loadavg);" \
  "model $MODEL; $LIMIT tasks at tier $TIERS, $CONCURRENCY at a time; modes alternate, $ROUNDS round(s)"
printf '%-7s %9s %14s %8s %14s  %s\n' mode accuracy "decode tok/s" "vs off" "e2e tok/s" "drafts (kind: drafts, proposed, accepted)"
metrics() { curl -sf "http://127.0.0.1:$port/metrics"; }
IFS=, read -r -a MODE_LIST <<<"$MODES"
# Rounds alternate the modes, so that a change in the machine's load falls
# on every mode alike; each round prints its own rows.
for round in $(seq 1 "$ROUNDS"); do
for mode in "${MODE_LIST[@]}"; do
  metrics >"$WORK/before"
  node tools/eval/eval.mjs --base-url "http://127.0.0.1:$port/v1" --model tiny-agent --data "$WORK/eval.jsonl" \
    --limit "$LIMIT" --tiers "$TIERS" --json "$WORK/$mode.json" --extra-body "{\"speculative\":\"$mode\"}" \
    --concurrency "$CONCURRENCY" >"$WORK/$mode.log"
  metrics >"$WORK/after"
  /usr/bin/python3 bench/speculative/report.py "$mode" "$WORK/before" "$WORK/after" "$WORK/$mode.json" "$WORK/off.rate"
done
done
