#!/usr/bin/env bash
# Reproduces models/tiny-agent/mxfp4 from nothing: two training stages on the
# CPU (deterministic from their seeds), then the MXFP4 export.
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
OUT=${2:-models/tiny-agent/mxfp4}
RUN=$BUILD/tiny-agent-run
mkdir -p "$RUN"
if [[ -n ${OPENBLAS_DIR:-} ]]; then
  export LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPENBLAS_NUM_THREADS=1
fi
PY="nice /usr/bin/python3"

# Stage 1: 220 steps of 4 conversations; the first 40 attend densely in the
# dsa layers while the indexer warms up by KL, then top-k.
$PY tools/train/train.py --config tools/train/config.json --seed 1 --steps 220 --batch 4 --lr 4e-3 \
  --dense-steps 40 --out "$RUN/stage1"
# Stage 2: new conversations (seed 3), sparse throughout, lower learning rate.
$PY tools/train/train.py --config tools/train/config.json --seed 3 --steps 260 --batch 4 --lr 2e-3 \
  --dense-steps 0 --init "$RUN/stage1/weights.pt" --out "$RUN/stage2" ${STAGE2_STOP_AFTER:+--stop-after $STAGE2_STOP_AFTER}

rm -rf "$RUN/template"
"$BUILD/engine/moe-model-gen" --config tools/train/config.json --seed 1 --out "$RUN/template" >/dev/null
rm -rf "$OUT"
/usr/bin/python3 tools/train/export.py --weights "$RUN/stage2/weights.pt" --config tools/train/config.json \
  --tokenizer "$RUN/template/tokenizer.json" --out "$OUT" --note "stage1 seed 1, stage2 seed 3"
