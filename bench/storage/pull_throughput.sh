#!/usr/bin/env bash
# Pull throughput from s3rver on loopback: `moe-daemon pull` (signed, ranged,
# parallel, verified, fsynced) against plain curl fetching the same objects
# (sequential, and curl --parallel with the same connection count).
#
#   bench/storage/pull_throughput.sh [BUILD_DIR] [SIZE_MIB] [CONNECTIONS]
#
# Prints one line per method with seconds and MiB/s. s3rver (node) is usually
# the bottleneck on loopback, so the interesting number is the ratio.
set -euo pipefail
cd "$(dirname "$0")/../.."
BUILD=${1:-build-pull}
SIZE_MIB=${2:-256}
CONN=${3:-8}
DAEMON=$BUILD/daemon/moe-daemon
[[ -x $DAEMON ]] || { echo "build moe-daemon first ($DAEMON)"; exit 1; }
[[ -f node_modules/s3rver/bin/s3rver.js ]] || { echo "npm ci first (s3rver)"; exit 1; }

WORK=$(mktemp -d /tmp/moe-pull-bench-XXXXXX)
S3PID=""
cleanup() { [[ -n $S3PID ]] && kill "$S3PID" 2>/dev/null; wait 2>/dev/null || true; rm -rf "$WORK"; }
trap cleanup EXIT

mkdir -p "$WORK/s3" "$WORK/model" "$WORK/curl"
node node_modules/s3rver/bin/s3rver.js -d "$WORK/s3" -a 127.0.0.1 -p 0 --silent --configure-bucket bench \
  > "$WORK/s3rver.out" 2>&1 &
S3PID=$!
for _ in $(seq 100); do grep -q "listening on" "$WORK/s3rver.out" && break; sleep 0.1; done
PORT=$(grep -o 'listening on [0-9.]*:[0-9]*' "$WORK/s3rver.out" | sed 's/.*://')
ENDPOINT=http://127.0.0.1:$PORT

# Four shards of random bytes plus a manifest, uploaded under bench/m/.
SHARD_MIB=$((SIZE_MIB / 4))
for i in 1 2 3 4; do head -c $((SHARD_MIB << 20)) /dev/urandom > "$WORK/model/model-0000$i.safetensors"; done
(cd "$WORK/model" && /usr/bin/python3 - <<'PY'
import hashlib, json, os
files = []
for name in sorted(os.listdir(".")):
    data = open(name, "rb").read()
    files.append({"path": name, "size": len(data), "sha256": hashlib.sha256(data).hexdigest()})
json.dump({"files": files}, open("manifest.json", "w"))
PY
)
for f in "$WORK"/model/*; do curl -sf -T "$f" "$ENDPOINT/bench/m/$(basename "$f")" > /dev/null; done
BYTES=$(du -cb "$WORK"/model/* | tail -1 | cut -f1)

now() { date +%s.%N; }
report() { /usr/bin/python3 -c "import sys; s=float(sys.argv[2]); print(f'{sys.argv[1]:<34} {s:7.2f} s {int(sys.argv[3])/s/2**20:8.1f} MiB/s')" "$@"; }

echo "model: $((BYTES >> 20)) MiB in 4 shards; s3rver at $ENDPOINT; $CONN connections; $(nproc) cores"

URLS=()
for f in "$WORK"/model/*; do URLS+=("$ENDPOINT/bench/m/$(basename "$f")"); done

t0=$(now)
for u in "${URLS[@]}"; do curl -sf "$u" -o "$WORK/curl/$(basename "$u")"; done
t1=$(now)
report "curl, sequential" "$(echo "$t1 - $t0" | bc)" "$BYTES"

rm -f "$WORK"/curl/*
ARGS=()
for u in "${URLS[@]}"; do ARGS+=("$u" -o "$WORK/curl/$(basename "$u")"); done
t0=$(now)
curl -sf --no-progress-meter --parallel --parallel-max "$CONN" "${ARGS[@]}"
t1=$(now)
report "curl --parallel (1 stream/object)" "$(echo "$t1 - $t0" | bc)" "$BYTES"

for part in 8MiB 32MiB; do
  rm -rf "$WORK/cache"
  t0=$(now)
  AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER "$DAEMON" pull s3://bench/m/ --revision r \
    --cache "$WORK/cache" --endpoint "$ENDPOINT" --connections "$CONN" --part-size "$part" --quiet > /dev/null
  t1=$(now)
  report "moe-daemon pull (part $part)" "$(echo "$t1 - $t0" | bc)" "$BYTES"
done
