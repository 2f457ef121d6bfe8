#!/usr/bin/env bash
# The README's first screen gives the two commands a newcomer runs, and they
# are the ones that exist: the first code block is ./scripts/demo and
# ./scripts/test, both executable, and CI (.ci/run) runs exactly the
# README's test command.
#
#   tests/e2e/readme_commands.sh BUILD_DIR WORK_DIR   (neither is used)
set -euo pipefail
cd "$(dirname "$0")/../.."
fail() { echo "FAIL: $*" >&2; exit 1; }
mapfile -t block < <(awk '/^```/ { if (open) exit; open = 1; next } open' README.md)
[[ ${#block[@]} -eq 2 ]] || fail "the README's first code block has ${#block[@]} lines, want 2: ${block[*]}"
demo=${block[0]%%#*} test=${block[1]%%#*}
demo=${demo%"${demo##*[![:space:]]}"} test=${test%"${test##*[![:space:]]}"}
[[ $demo == ./scripts/demo ]] || fail "first command is '$demo', want ./scripts/demo"
[[ $test == ./scripts/test ]] || fail "second command is '$test', want ./scripts/test"
for cmd in "$demo" "$test"; do [[ -x $cmd ]] || fail "$cmd is not an executable file"; done
[[ $(head -n 12 README.md | grep -c '^\./scripts/') -eq 2 ]] || fail "the two commands are not on the README's first screen"
ci=$(grep -v '^#' .ci/run | grep -E '^(exec )?\./' | sed 's/^exec //')
[[ $ci == "$test" ]] || fail ".ci/run runs '$ci', the README says '$test'"
echo "PASS: README: $demo, $test; .ci/run: $ci"
