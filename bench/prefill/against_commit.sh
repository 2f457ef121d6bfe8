#!/usr/bin/env bash
# Prefill speed of this tree against an earlier commit's, measured in the
# same run: builds the earlier commit's moe-run in a git worktree (ccache
# makes a rebuild cheap), generates the small preset with each tree's own
# generator (seed 1), and prefills the same prompt with each in alternation,
# ROUNDS times, so that a busy moment of a shared machine hits both alike.
# Prints each build's median prefill tokens/s and its ratio to the earlier
# commit's.
#
# Usage: bench/prefill/against_commit.sh [COMMIT] [TOKENS] [ROUNDS]
#   COMMIT  default cadc3d4 (prefill before the work on it)
#   TOKENS  prompt length, default 4400 (the presets' tokenizer is byte-level)
#   ROUNDS  default 3
# Env: BUILD_DIR (this tree's build, default build), WORK (default /tmp).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
commit="${1:-cadc3d4}"
tokens="${2:-4400}"
rounds="${3:-3}"
build="${BUILD_DIR:-$root/build}"
work="${WORK:-/tmp}"
old="$work/moeserve-$(git -C "$root" rev-parse --short "$commit")"

export CCACHE_NOHASHDIR=1
if [[ ! -d "$old" ]]; then
  git -C "$root" worktree add --detach "$old" "$commit" >/dev/null 2>&1
fi
(export CCACHE_BASEDIR="$old"; cmake -S "$old" -B "$old/build" -DCMAKE_BUILD_TYPE=Release >/dev/null &&
  cmake --build "$old/build" --target moe-run moe-model-gen -j2 >/dev/null)
(export CCACHE_BASEDIR="$root"; cmake --build "$build" --target moe-run moe-model-gen -j2 >/dev/null)

models="$(mktemp -d "$work/against_commit.XXXXXX")"
trap 'rm -rf "$models"' EXIT
"$old/build/engine/moe-model-gen" --preset small --out "$models/old" --seed 1 >/dev/null
"$build/engine/moe-model-gen" --preset small --out "$models/new" --seed 1 >/dev/null
# A prompt of plain words, `tokens` bytes long.
prompt="$(python3 -c "
import random, sys
random.seed(3)
words = 'the agent calls a tool with json arguments and reads the result of the file then writes a summary'.split()
text = ''
while len(text) < $tokens: text += random.choice(words) + ' '
sys.stdout.write(text[:$tokens])")"

run() {  # prints prefill tokens/s of one run
  "$@" --prompt "$prompt" --max-tokens 1 --ignore-eos 2>&1 | sed -n 's/^prefill \([0-9.]*\) tokens\/s.*/\1/p'
}
declare -A got
names=("$commit" "now" "now --bf16-activations")
for ((r = 1; r <= rounds; r++)); do
  got["$commit"]+=" $(run "$old/build/engine/moe-run" --model "$models/old")"
  got["now"]+=" $(run "$build/engine/moe-run" --model "$models/new")"
  got["now --bf16-activations"]+=" $(run "$build/engine/moe-run" --model "$models/new" --bf16-activations)"
done
python3 - "$commit" "$tokens" "${got[$commit]}" "${got[now]}" "${got[now --bf16-activations]}" <<'PY'
import statistics, sys
commit, tokens = sys.argv[1], sys.argv[2]
runs = {commit: sys.argv[3], "now (fp32 products)": sys.argv[4], "now --bf16-activations": sys.argv[5]}
med = {k: statistics.median(float(x) for x in v.split()) for k, v in runs.items()}
base = med[commit]
print(f"prefill of a {tokens}-byte prompt, small preset, runs in alternation (tokens/s):")
for k, v in runs.items():
    print(f"  {k:26s} median {med[k]:8.1f}  runs {v.strip():30s} {med[k] / base:5.2f}x {commit}")
PY
