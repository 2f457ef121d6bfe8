#!/usr/bin/env bash
# Reproduces models/tiny-agent/{bf16,mxfp4} from nothing: three training runs
# on the CPU (each deterministic from its seed), then the two exports of the same
# trained values (routed experts BF16 in one, MXFP4 in the other).
#
#   tools/train/make_tiny_agent.sh BUILD_DIR [OUT_DIR]
#
# BUILD_DIR holds a build with moe-model-gen (for tokenizer.json). Training is
# not part of CI. Debian's python3-torch links the generic reference BLAS;
# when an OpenBLAS build is unpacked at $OPENBLAS_DIR (apt-get download
# libopenblas0-pthread && dpkg -x ... ; the directory holding libblas.so.3),
# it is used for this process only, about six times faster on small matrices.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:?usage: tools/train/make_tiny_agent.sh BUILD_DIR [OUT_DIR]}
OUT=${2:-models/tiny-agent}
RUN=$BUILD/tiny-agent-run
mkdir -p "$RUN"
if [[ -n ${OPENBLAS_DIR:-} ]]; then
  export LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPENBLAS_NUM_THREADS=1
fi
PY="nice -n 2 /usr/bin/python3"

# Stage 0: copy drills (short random strings the assistant repeats), 700 + 800
# steps of 16, which get the model past the copying plateau.
$PY tools/train/train.py --config tools/train/config.json --seed 5 --steps 700 --batch 16 --lr 3e-3 \
  --dense-steps 700 --copy-drills --out "$RUN/stage0"
$PY tools/train/train.py --config tools/train/config.json --seed 6 --steps 800 --batch 16 --lr 3e-3 \
  --dense-steps 800 --copy-drills --init "$RUN/stage0/weights.pt" --out "$RUN/stage0b"
# Stage 1: 800 steps of 8 conversations (seed 1); the first 100 attend densely
# in the dsa layers while the indexer warms up by KL, then top-k. The call id
# each tool message repeats is a training target too (--copy-ids).
$PY tools/train/train.py --config tools/train/config.json --seed 1 --steps 800 --batch 8 --lr 3e-3 \
  --dense-steps 100 --copy-ids --init "$RUN/stage0b/weights.pt" --save-every 100 --out "$RUN/stage1"
WEIGHTS=$RUN/stage1/weights.pt

rm -rf "$RUN/template"
"$BUILD/engine/moe-model-gen" --config tools/train/config.json --seed 1 --out "$RUN/template" >/dev/null
for format in bf16 mxfp4; do
  rm -rf "${OUT:?}/$format"
  /usr/bin/python3 tools/train/export.py --weights "$WEIGHTS" --config tools/train/config.json \
    --tokenizer "$RUN/template/tokenizer.json" --out "$OUT/$format" --expert-format "$format" --note "copy drills seeds 5, 6; conversations seed 1"
done
