#!/usr/bin/env bash
# Speculative decoding changes no token: the tiny agent's whole held-out set
# (300 tool-use tasks, greedy, tier high) through one moe-daemon started with
# `--speculative auto` (which loads the MTP layer), once with the request
# field `speculative: off`, two tasks at a time (a sequence's tokens do not
# depend on what it is batched with: engine.batched_decode), and again with
# `auto` one task at a time and two at a time (drafts verified for two
# sequences in one pass), each request with seed 1 (the daemon draws tool-call ids from it,
# and an id goes back into the next turn's prompt). Every assistant message
# must be byte-identical to the run without
# drafts (tools/eval/same_outputs.py), and the runs with drafts must have
# had drafts of both kinds accepted (read from /metrics), or the comparison
# would prove nothing.
#
#   tools/eval/same_with_drafts.sh BUILD_DIR [MODEL_DIR] [--limit N]
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: tools/eval/same_with_drafts.sh BUILD_DIR [MODEL_DIR] [--limit N]}
shift
MODEL=models/tiny-agent/mxfp4
if [[ $# -gt 0 && $1 != --* ]]; then MODEL=$1; shift; fi
LIMIT=300
while [[ $# -gt 0 ]]; do
  case $1 in
    --limit) LIMIT=$2; shift 2 ;;
    *) echo "same_with_drafts.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
WORK=${TMPDIR:-/tmp}/moe-same-with-drafts.$$
mkdir -p "$WORK"
/usr/bin/python3 tools/train/gen_data.py --split eval --seed 2 --count 300 --out "$WORK/eval.jsonl"
source tools/eval/daemon.sh
DAEMON_PID=
trap 'if [[ -n $DAEMON_PID ]]; then kill -TERM $DAEMON_PID 2>/dev/null || true; wait $DAEMON_PID 2>/dev/null || true; fi
      rm -rf "$WORK"' EXIT
start_daemon "$BUILD" "$MODEL" "$WORK/daemon.log" --speculative auto
port=$DAEMON_PORT
# accepted KIND: the accepted draft tokens of that kind so far.
accepted() {
  curl -sf "http://127.0.0.1:$port/metrics" |
    awk -v k="$1" '$1 == "moe_speculative_draft_tokens_total{kind=\"" k "\",outcome=\"accepted\"}" { print $2 + 0; found = 1 }
                   END { if (!found) print "missing" }'
}
run() {  # run NAME MODE CONCURRENCY
  node tools/eval/eval.mjs --base-url "http://127.0.0.1:$port/v1" --model tiny-agent --data "$WORK/eval.jsonl" \
    --limit "$LIMIT" --tiers high --json "$WORK/$1.json" --extra-body "{\"speculative\":\"$2\",\"seed\":1}" \
    --concurrency "$3" >"$WORK/$1.log"
  sed -n 1p "$WORK/$1.log"
}
run off off 2
status=0
for spec in auto:1 auto:2; do
  mode=${spec%:*} concurrency=${spec#*:} name=${spec/:/_}
  before_lookup=$(accepted lookup) before_mtp=$(accepted mtp)
  run "$name" "$mode" "$concurrency"
  lookup=$(( $(accepted lookup) - before_lookup )) mtp=$(( $(accepted mtp) - before_mtp ))
  echo "$mode, $concurrency at a time: accepted draft tokens: lookup $lookup, mtp $mtp"
  if (( lookup <= 0 || mtp <= 0 )); then
    echo "same_with_drafts.sh: no accepted drafts of some kind in the $name run; the comparison would prove nothing" >&2
    status=1
  fi
  /usr/bin/python3 tools/eval/same_outputs.py "$WORK/off.json" "$WORK/$name.json" --min-tasks "$LIMIT" || status=1
done
exit $status
