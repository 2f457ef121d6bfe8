#!/usr/bin/env bash
# Reproduces models/tiny-agent/{bf16,mxfp4} from nothing: the training stages
# (tools/train/train_tiny_agent.sh: copy drills, then conversations), then the
# two exports of the same trained values (routed experts BF16 in one, MXFP4 in
# the other).
#
#   tools/train/make_tiny_agent.sh BUILD_DIR DEVICE [SECONDS] [OUT_DIR]
#
# BUILD_DIR holds a build with moe-model-gen (for tokenizer.json). DEVICE is
# cuda or cpu; SECONDS bounds the training (default 2400). The shipped model:
#   DRILL_DECAY_START=203 DECAY_START=725 tools/train/make_tiny_agent.sh build cuda 490
# (one H200, PyTorch 2.11, 8 minutes). Training is not part of CI. On the
# CPU, Debian's python3-torch links the generic reference BLAS; when an
# OpenBLAS build is unpacked at $OPENBLAS_DIR (apt-get download
# libopenblas0-pthread && dpkg -x ...; the directory holding libblas.so.3),
# it is used for this process only, about six times faster on small matrices.
set -euo pipefail
cd "$(dirname "$0")/../.."
usage="usage: tools/train/make_tiny_agent.sh BUILD_DIR DEVICE [SECONDS] [OUT_DIR]"
BUILD=${1:?$usage}
DEVICE=${2:?$usage}
SECONDS_TOTAL=${3:-2400}
OUT=${4:-models/tiny-agent}
RUN=$BUILD/tiny-agent-run
if [[ -n ${OPENBLAS_DIR:-} ]]; then
  export LD_LIBRARY_PATH=$OPENBLAS_DIR${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} OPENBLAS_NUM_THREADS=1
fi
tools/train/train_tiny_agent.sh "$RUN" "$DEVICE" "$SECONDS_TOTAL"
WEIGHTS=$RUN/stage1/weights.pt

rm -rf "$RUN/template"
"$BUILD/engine/moe-model-gen" --config tools/train/config.json --seed 1 --out "$RUN/template" >/dev/null
for format in bf16 mxfp4; do
  rm -rf "${OUT:?}/$format"
  /usr/bin/python3 tools/train/export.py --weights "$WEIGHTS" --config tools/train/config.json \
    --tokenizer "$RUN/template/tokenizer.json" --out "$OUT/$format" --expert-format "$format" \
    --note "copy drills seed 5, conversations seed 1 ($DEVICE)"
done
mkdir -p "$OUT/training"
cp "$RUN/stage0/train_log.json" "$OUT/training/stage0_log.json"
cp "$RUN/stage1/train_log.json" "$OUT/training/stage1_log.json"
