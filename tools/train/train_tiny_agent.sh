#!/usr/bin/env bash
# The training stages of the tiny agent model (no export): copy drills, then
# conversations, each deterministic from its seed on a given device kind.
#
#   tools/train/train_tiny_agent.sh RUN_DIR DEVICE [SECONDS]
#
# DEVICE is cpu or cuda. SECONDS (default 2400) bounds the whole run: the
# conversation stage runs warm-up-stable-decay and starts its decay so as to
# end inside what is left after the copy drills; its log (train_log.json,
# decay_start) records the step the decay started at, and the same command
# with DECAY_START=N (and DRILL_DECAY_START=N for the copy drills, whose
# decay is timed the same way) replays that run exactly on the same device kind.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:?usage: tools/train/train_tiny_agent.sh RUN_DIR DEVICE [SECONDS]}
DEVICE=${2:?usage: tools/train/train_tiny_agent.sh RUN_DIR DEVICE [SECONDS]}
SECONDS_TOTAL=${3:-2400}
end=$(( $(date +%s) + SECONDS_TOTAL ))
mkdir -p "$RUN"
PY=${PY:-/usr/bin/python3}
WORKERS=${DATA_WORKERS:-$(( $(nproc) > 2 ? $(nproc) / 2 : 1 ))}
THREADS=${TRAIN_THREADS:-$(( $(nproc) > 2 ? 2 : $(nproc) ))}
common=(--config tools/train/config.json --batch "${BATCH:-128}" --lr 3e-3 --device "$DEVICE" --threads "$THREADS"
        --data-workers "$WORKERS")

# Stage 0: copy drills (short random strings the assistant repeats), which get
# the model past the copying plateau before it sees a conversation.
# At most 1,200 steps and 15% of the time (its decay timed like stage 1's).
if [[ -n ${DRILL_DECAY_START:-} ]]; then drill=(--decay-start "$DRILL_DECAY_START"); else drill=(--time-budget $(( SECONDS_TOTAL * 15 / 100 ))); fi
$PY tools/train/train.py "${common[@]}" --seed 5 --steps 1200 --warmup 50 --decay-steps 200 "${drill[@]}" \
  --dense-steps 1200 --copy-drills --out "$RUN/stage0" > "$RUN/stage0.out"
tail -n 1 "$RUN/stage0.out"

# Stage 1: conversations (seed 1). The first 300 steps attend densely in the
# dsa layers while the indexer warms up by KL, then top-k. The call id each
# tool message repeats is a training target too (--copy-ids).
left=$(( end - $(date +%s) - 20 ))
if [[ -n ${DECAY_START:-} ]]; then schedule=(--decay-start "$DECAY_START"); else schedule=(--time-budget "$left"); fi
$PY tools/train/train.py "${common[@]}" --seed 1 --steps 40000 --warmup 200 --decay-steps 600 "${schedule[@]}" \
  --dense-steps 300 --copy-ids --init "$RUN/stage0/weights.pt" --out "$RUN/stage1" > "$RUN/stage1.out"
tail -n 1 "$RUN/stage1.out"
