#!/usr/bin/env bash
# The held-out tool-use evaluation of one or more model directories through
# moe-daemon, side by side.
#
#   tools/eval/run.sh BUILD_DIR MODEL_DIR[,MODEL_DIR...] [eval.mjs options: --limit N
#                     --tiers low,medium,high --min-accuracy P --max-gap P --json FILE]
#
# e.g. tools/eval/run.sh build models/tiny-agent/bf16,models/tiny-agent/mxfp4
#      EVAL_SET=vision tools/eval/run.sh build models/tiny-vision-agent/bf16,models/tiny-vision-agent/mxfp4
# Generates the held-out set (eval split, seed 2, 300 tasks: phrasings, numbers,
# unit names and pairs and table keys the training split never produces; with
# EVAL_SET=vision the image tasks of tools/train/gen_images.py: images,
# phrasings, numbers and background shades the training split never draws),
# serves each MODEL_DIR with its own moe-daemon on a free loopback port (the
# variant is named by the directory's last component) and runs
# tools/eval/eval.mjs against them, one after the other.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: tools/eval/run.sh BUILD_DIR MODEL_DIR[,MODEL_DIR...] [options]}
MODELS=${2:?usage: tools/eval/run.sh BUILD_DIR MODEL_DIR[,MODEL_DIR...] [options]}
shift 2
WORK=${TMPDIR:-/tmp}/tiny-agent-eval.$$
mkdir -p "$WORK"
DATA=$WORK/eval.jsonl
case ${EVAL_SET:-text} in
  text) /usr/bin/python3 tools/train/gen_data.py --split eval --seed 2 --count 300 --out "$DATA" ;;
  vision) /usr/bin/python3 tools/train/gen_images.py --split eval --seed 2 --count 300 --out "$DATA" ;;
  *) echo "run.sh: EVAL_SET must be text or vision, not '$EVAL_SET'" >&2; exit 2 ;;
esac

source tools/eval/daemon.sh
PIDS=()
DAEMON_PID=
stop_daemons() {
  # DAEMON_PID: the last one started, also when it never became ready.
  for pid in "${PIDS[@]}" $DAEMON_PID; do kill -TERM "$pid" 2>/dev/null || true; done
  for pid in "${PIDS[@]}" $DAEMON_PID; do wait "$pid" 2>/dev/null || true; done
  rm -rf "$WORK"
}
trap stop_daemons EXIT
ENDPOINTS=()
IFS=, read -r -a DIRS <<<"$MODELS"
for i in "${!DIRS[@]}"; do
  dir=${DIRS[$i]}
  start_daemon "$BUILD" "$dir" "$WORK/daemon.$i.log"
  PIDS+=("$DAEMON_PID")
  port=$DAEMON_PORT
  ENDPOINTS+=("$(basename "$dir")=http://127.0.0.1:$port/v1")
done
node tools/eval/eval.mjs --endpoints "$(IFS=,; echo "${ENDPOINTS[*]}")" --model tiny-agent --data "$DATA" "$@"
