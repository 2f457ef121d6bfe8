#!/usr/bin/env bash
# models/tiny-vision-agent from models/tiny-agent, on the CPU: the tower stage,
# the full stage, then both exports (bf16/ and mxfp4/, with manifests).
#
#   tools/train/train_tiny_vision_agent.sh RUN_DIR [OUT_DIR]
#
# OUT_DIR (default RUN_DIR) receives bf16/ and mxfp4/; the shipped model is
# OUT_DIR=models/tiny-vision-agent. Stages (tools/train/train_vision.py says
# what each does):
#   1. tower: the tower and projector write each image's caption grid as the
#      tiny agent's own byte embeddings (no language model in the loop);
#   2. full: the chat tasks through the whole model (indexers kept), first
#      assistant turns, with text-only tool conversations in every step.
# One torch thread: on a busy 2-core machine extra threads wait more than they
# work. With Debian's libopenblas0-pthread installed (or OPENBLAS_DIR naming
# a directory holding its libblas.so.3) torch's BLAS calls go to OpenBLAS
# rather than the reference BLAS, several times faster at these shapes.
set -euo pipefail
cd "$(dirname "$0")/../.."
RUN=${1:?usage: tools/train/train_tiny_vision_agent.sh RUN_DIR [OUT_DIR]}
OUT=${2:-$RUN}
PY=${PY:-/usr/bin/python3}
BASE=models/tiny-agent/bf16
OPENBLAS_DIR=${OPENBLAS_DIR:-/usr/lib/x86_64-linux-gnu/openblas-pthread}
if [[ -e $OPENBLAS_DIR/libblas.so.3 ]]; then
  export LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
mkdir -p "$RUN"
start=$(date +%s)

# TOWER_INIT=weights.pt takes the tower stage's output from an earlier run
# (that stage reads no question, so a change to the chat data leaves it valid).
if [[ -n ${TOWER_INIT:-} ]]; then
  mkdir -p "$RUN/tower"
  cp "$TOWER_INIT" "$RUN/tower/weights.pt"
  [[ -e $(dirname "$TOWER_INIT")/train_log.json ]] && cp "$(dirname "$TOWER_INIT")/train_log.json" "$RUN/tower/"
else
  $PY tools/train/train_vision.py --base "$BASE" --stage tower --steps "${TOWER_STEPS:-2400}" --batch 32 --lr 3e-3 \
    --warmup 50 --eval-every 200 --eval-count 128 --seed 1 --out "$RUN/tower" > "$RUN/tower.out"
  grep '^eval' "$RUN/tower.out" | tail -n 1
fi

$PY tools/train/train_vision.py --base "$BASE" --stage full --init "$RUN/tower/weights.pt" --first-turn \
  --steps "${FULL_STEPS:-500}" --batch 8 --text-batch 3 --lr 1e-3 --lm-lr 6e-4 --warmup 10 --eval-every 100 \
  --eval-count 60 --seed 2 --out "$RUN/full" > "$RUN/full.out"
grep '^eval' "$RUN/full.out" | tail -n 1
echo "train_tiny_vision_agent: trained in $(( $(date +%s) - start )) s"

# The tiny agent's config (MXFP4 experts) with the tower's keys.
$PY - "$RUN/config.json" <<'PYEOF'
import json, sys
sys.path.insert(0, "tools/train")
import train_vision
with open("tools/train/config.json") as f:
    raw = json.load(f)
raw["vision"] = dict(train_vision.VISION)
with open(sys.argv[1], "w") as f:
    json.dump(raw, f, indent=2)
    f.write("\n")
PYEOF
for fmt in bf16 mxfp4; do
  $PY tools/train/export.py --weights "$RUN/full/weights.pt" --config "$RUN/config.json" \
    --tokenizer "$BASE/tokenizer.json" --out "$OUT/$fmt" --expert-format "$fmt" --note "tiny-vision-agent"
done
mkdir -p "$OUT/training"
cp "$RUN/tower/train_log.json" "$OUT/training/tower_log.json"
cp "$RUN/full/train_log.json" "$OUT/training/full_log.json"
