#!/usr/bin/env bash
# Encode throughput of moe-tokenize (C++) beside @huggingface/tokenizers
# (JavaScript) on the 10 MB corpus of tools/tokenizers/corpus.mjs, for the
# gpt-oss, DeepSeek-V3 and Qwen3 tokenizer.json files, with the ids of the
# whole corpus required identical (the full run of the ctest
# engine.hf_tokenizer_reference, which checks a 150 kB slice). Prints each
# speed and the ratio. js-tiktoken is left out unless --tiktoken: its BPE is
# quadratic in a piece's length and takes minutes on the corpus's long runs.
#
#   bench/tokenizers/throughput.sh [BUILD_DIR] [--bytes N] [--tiktoken]
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
build="$root/build"
if [[ $# -gt 0 && $1 != --* ]]; then build="$1"; shift; fi
bytes=10500000
tiktoken=--no-tiktoken
while [[ $# -gt 0 ]]; do
  case "$1" in
    --bytes) bytes="$2"; shift 2 ;;
    --tiktoken) tiktoken=""; shift ;;
    *) echo "usage: $0 [BUILD_DIR] [--bytes N] [--tiktoken]" >&2; exit 2 ;;
  esac
done
binary="$build/engine/moe-tokenize"
[[ -x $binary ]] || { echo "$binary missing: cmake --build $build --target moe-tokenize" >&2; exit 1; }
workdir="$(mktemp -d)"
trap 'rm -rf "$workdir"' EXIT
node "$root/tools/tokenizers/compare.mjs" --moe-tokenize "$binary" --bytes "$bytes" --workdir "$workdir" --sequential $tiktoken |
  tee "$workdir/report.txt"
# Speed ratio per tokenizer, from the lines compare.mjs printed.
awk '/equal @huggingface\/tokenizers/ {
  match($0, /moe-tokenize [0-9.]+ MB\/s/); ours = substr($0, RSTART + 13, RLENGTH - 18)
  match($0, /tokenizers [0-9.]+ MB\/s/); theirs = substr($0, RSTART + 11, RLENGTH - 16)
  printf "%-12s moe-tokenize %6.2f MB/s  @huggingface/tokenizers %6.2f MB/s  ratio %.1fx\n", $2, ours, theirs, ours / theirs
}' "$workdir/report.txt"
