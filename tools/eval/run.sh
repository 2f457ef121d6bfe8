#!/usr/bin/env bash
# The held-out tool-use evaluation of a model directory through moe-daemon.
#
#   tools/eval/run.sh BUILD_DIR MODEL_DIR [eval.mjs options: --limit N --tiers low,medium,high
#                     --min-accuracy P --json FILE]
#
# Generates the held-out set (eval split, seed 2, 300 tasks: phrasings, numbers,
# unit pairs and table keys the training split never produces), serves
# MODEL_DIR on a free loopback port and runs tools/eval/eval.mjs against it.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: tools/eval/run.sh BUILD_DIR MODEL_DIR [options]}
MODEL=${2:?usage: tools/eval/run.sh BUILD_DIR MODEL_DIR [options]}
shift 2
WORK=${TMPDIR:-/tmp}/tiny-agent-eval.$$
mkdir -p "$WORK"
DATA=$WORK/eval.jsonl
/usr/bin/python3 tools/train/gen_data.py --split eval --seed 2 --count 300 --out "$DATA"

PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
"$BUILD/daemon/moe-daemon" --model "$MODEL" --served-model-name tiny-agent --port "$PORT" \
  --max-context 4096 --default-max-tokens 192 >"$WORK/daemon.log" 2>&1 &
DAEMON_PID=$!
stop_daemon() {
  kill -TERM "$DAEMON_PID" 2>/dev/null || true
  wait "$DAEMON_PID" 2>/dev/null || true
  rm -rf "$WORK"
}
trap stop_daemon EXIT
for _ in $(seq 1 300); do
  curl -sf "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1 && break
  kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$WORK/daemon.log" >&2; exit 1; }
  sleep 0.2
done
node tools/eval/eval.mjs --base-url "http://127.0.0.1:$PORT/v1" --model tiny-agent --data "$DATA" "$@"
