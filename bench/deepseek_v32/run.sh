#!/usr/bin/env bash
# Prefill and decode of a DeepSeek-V3.2 real-shape checkpoint (make_checkpoint.py)
# against the rooflines of the bytes and FLOPs one token needs, the ceilings
# measured in the same run: bench_roofline --ceilings before and after moe-run,
# the higher of each kept, then roofline.py prints the fractions.
#
# moe-run's "weights read per decoded token" is the engine's own count
# (decode_weight_bytes: the FP8 matrices a byte a weight plus their block
# scales); roofline.py prints the same from the shapes, and what the former
# load (every matrix BF16) read, for comparison.
#
#   bench/deepseek_v32/run.sh BUILD_DIR MODEL_DIR [bf16|mxfp4] [PROMPT_TOKENS] [DECODE_TOKENS] [bf16|f32]
#
# The last argument is how kv_b_proj was converted: bf16 for power-of-two
# block scales (make_checkpoint.py --scales pow2, the release), f32 otherwise.
set -euo pipefail
build=${1:?build directory}
model=${2:?model directory}
experts=${3:-bf16}
prompt=${4:-64}
decode=${5:-8}
kv_b=${6:-bf16}
here=$(cd "$(dirname "$0")" && pwd)
ids=$(/usr/bin/python3 -c "print(','.join(str(i * 7919 % 16000) for i in range($prompt)))")
flag=()
[ "$experts" = mxfp4 ] && flag=(--experts mxfp4)

ceiling() { "$build/bench/roofline/bench_roofline" --ceilings; }
field() { sed -n "s/.*$1=\([0-9.]*\).*/\1/p"; }

before=$(ceiling)
run=$(/usr/bin/time -f 'max_rss_kb=%M' "$build/engine/moe-run" --model "$model" --prompt-ids "$ids" \
      --max-tokens "$((decode + 1))" --ignore-eos "${flag[@]}" 2>&1)
after=$(ceiling)
echo "ceilings before: $before"
echo "ceilings after:  $after"
echo "$run" | grep -E 'family|prefill|max_rss_kb|weights read per decoded token'
bw=$(printf '%s\n%s\n' "$before" "$after" | field read_bw_GBps | sort -g | tail -1)
peak=$(printf '%s\n%s\n' "$before" "$after" | field fma_peak_GFLOPs | sort -g | tail -1)
prefill=$(echo "$run" | sed -n 's/^prefill \([0-9.]*\) tokens\/s, decode.*/\1/p')
dec=$(echo "$run" | sed -n 's/^prefill .*, decode \([0-9.]*\) tokens\/s.*/\1/p')
/usr/bin/python3 "$here/roofline.py" --model "$model" --experts "$experts" --prompt "$prompt" --kv-b "$kv_b" \
  --read-gbs "$bw" --gflops "$peak" --prefill-tps "$prefill" --decode-tps "$dec"
echo "before FP8 was kept (every matrix BF16):"
/usr/bin/python3 "$here/roofline.py" --model "$model" --experts "$experts" --prompt "$prompt" --weights bf16 \
  --read-gbs "$bw" --gflops "$peak"
