# Sourced by the scripts that serve the tiny agents through moe-daemon
# (tools/eval/run.sh, tools/eval/same_with_drafts.sh, bench/speculative/run.sh).
#
# start_daemon BUILD MODEL LOG [moe-daemon options...]
#   Starts BUILD/daemon/moe-daemon serving MODEL as "tiny-agent" on a free
#   loopback port (4,096 tokens of context, 192 tokens by default), its output
#   in LOG, and waits for /readyz. Sets DAEMON_PORT and DAEMON_PID. Returns 1,
#   with the log on stderr, when the daemon exits or is not ready in 60 s.
start_daemon() {
  local build=$1 model=$2 log=$3
  shift 3
  DAEMON_PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
  "$build/daemon/moe-daemon" --model "$model" --served-model-name tiny-agent --port "$DAEMON_PORT" \
    --max-context 4096 --default-max-tokens 192 "$@" >"$log" 2>&1 &
  DAEMON_PID=$!
  for _ in $(seq 1 300); do
    curl -sf "http://127.0.0.1:$DAEMON_PORT/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$DAEMON_PID" 2>/dev/null || { cat "$log" >&2; return 1; }
    sleep 0.2
  done
  echo "moe-daemon serving $model was not ready after 60 s" >&2
  cat "$log" >&2
  return 1
}
