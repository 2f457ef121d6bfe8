#!/usr/bin/env bash
# config/ and examples/ as a platform engineer and a tenant apply them, with
# the real kubectl, on a fresh API double whose pod runner starts the
# operator's pods: `kubectl apply -k config/default`, then `kubectl apply -k`
# of examples/ (through an overlay that only gives the tiny agent this
# machine's store, port and key), until the tiny agent's endpoint answers a
# chat completion. The example's revision must be what `moe-daemon publish`
# prints for models/tiny-agent/mxfp4. The examples that need what this node
# lacks (GPUs, a bucket at s3.internal) must not run.
#
#   tests/e2e/front_door_install.sh BUILD_DIR WORK_DIR
set -euo pipefail
SRC=$(realpath "$(dirname "$0")/../..")
BUILD=$(realpath "$1")
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && WORK=$(realpath "$WORK")
cd "$SRC"
for tool in kubectl node; do
  command -v "$tool" >/dev/null || { echo "SKIP: $tool is not installed"; exit 77; }
done
[[ -f node_modules/s3rver/bin/s3rver.js ]] || { echo "SKIP: s3rver is not installed (scripts/setup)"; exit 77; }

# N free loopback ports, distinct (held together until printed); one python start for all.
free_ports() { python3 -c 'import socket,sys; ss=[socket.socket() for _ in range(int(sys.argv[1]))]; [s.bind(("127.0.0.1",0)) for s in ss]; print(*[s.getsockname()[1] for s in ss])' "$1"; }
PIDS=()
cleanup() {
  local rc=$?
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    if kill -0 "${PIDS[i]}" 2>/dev/null; then kill -TERM "${PIDS[i]}"; wait "${PIDS[i]}" 2>/dev/null || true; fi
  done
  if [[ $rc -ne 0 ]]; then
    tail -n 40 "$WORK"/*.log >&2 || true
    find "$WORK/node" -name '*.log' -exec tail -n 20 {} + >&2 2>/dev/null || true
  fi
}
trap cleanup EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }
export HOME="$WORK/home" XDG_STATE_HOME="$WORK/home/state" KUBECONFIG="$WORK/kubeconfig"
mkdir -p "$HOME"
read -r S3_PORT WEBHOOK_PORT AGENT_PORT < <(free_ports 3)
KEY=install-test-$RANDOM$RANDOM

node node_modules/s3rver/bin/s3rver.js -d "$WORK/s3" -a 127.0.0.1 -p "$S3_PORT" --silent \
  --configure-bucket models --service-endpoint localhost >"$WORK/s3rver.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 200); do (exec 3<>"/dev/tcp/127.0.0.1/$S3_PORT") 2>/dev/null && break; sleep 0.1; done
REVISION=$(AWS_ACCESS_KEY_ID=S3RVER AWS_SECRET_ACCESS_KEY=S3RVER "$BUILD/daemon/moe-daemon" publish \
  models/tiny-agent/mxfp4 s3://models/tiny-agent/ --endpoint "http://127.0.0.1:$S3_PORT" 2>"$WORK/publish.log" |
  sed -n 's/^revision: //p')
grep -q "revision: \"$REVISION\"" examples/moedeployment-tiny-agent.yaml ||
  fail "examples/moedeployment-tiny-agent.yaml does not name the revision publish printed ($REVISION)"

"$BUILD/tests/fakes/moe-fake-apiserver" --kubeconfig "$KUBECONFIG" --run-pods "$WORK/node" \
  --image "moeserve/moe-daemon=$BUILD/daemon/moe-daemon" \
  --endpoints "moeserve-system/moeserve-webhook=$WEBHOOK_PORT" >"$WORK/apiserver.url" 2>"$WORK/apiserver.log" &
PIDS+=($!)
for _ in $(seq 1 100); do [[ -s "$WORK/apiserver.url" && -s "$KUBECONFIG" ]] && break; sleep 0.1; done

# The platform engineer's install, as written.
kubectl apply -k config/default >"$WORK/install.txt" || fail "kubectl apply -k config/default: $(cat "$WORK/install.txt")"
# moe-operator runs beside the double (its pod runner makes no Deployment pods),
# with the Deployment's own arguments where they make sense off-cluster.
kubectl scale deployment moeserve-operator -n moeserve-system --replicas=0 >/dev/null
mapfile -t ARGS < <(kubectl get deployment moeserve-operator -n moeserve-system \
  -o go-template='{{range (index .spec.template.spec.containers 0).args}}{{.}}{{"\n"}}{{end}}' |
  grep -v -e '^--leader-elect' -e '^--leader-election' -e '^--identity' -e '^--lease-duration' -e '^--renew-deadline' \
    -e '^--retry-period' -e '^--metrics-addr' -e '^--health-addr' -e '^--webhook-addr' -e '^--operator-namespace' \
    -e '^--cache-root')
"$BUILD/operator/moe-operator" --kubeconfig "$KUBECONFIG" "${ARGS[@]}" --operator-namespace=moeserve-system \
  --webhook-addr="127.0.0.1:$WEBHOOK_PORT" --metrics-addr=0 --health-addr=0 --cache-root="$WORK/node/cache-root" \
  >"$WORK/operator.log" 2>&1 &
PIDS+=($!)
for _ in $(seq 1 200); do
  [[ -n $(kubectl get validatingwebhookconfiguration moeserve-quota -o 'jsonpath={.webhooks[0].clientConfig.caBundle}') ]] && break
  kill -0 "${PIDS[-1]}" || fail "moe-operator exited"
  sleep 0.1
done

# The tenant's examples, in one command, through an overlay with this machine's values.
mkdir -p "$WORK/overlay"
EXAMPLES=$(realpath --relative-to="$WORK/overlay" "$SRC/examples")  # kustomize takes no absolute roots
cat >"$WORK/overlay/kustomization.yaml" <<EOF
apiVersion: kustomize.config.k8s.io/v1beta1
kind: Kustomization
sortOptions: {order: fifo}  # an overlay sorts again: keep examples/ order
resources:
  - $EXAMPLES
patches:
  - target: {kind: MoEDeployment, name: tiny-agent}
    patch: |-
      - {op: replace, path: /spec/model/endpoint, value: "http://127.0.0.1:$S3_PORT"}
      - {op: replace, path: /spec/endpoint/port, value: $AGENT_PORT}
  - target: {kind: Secret, name: tiny-agent-api-keys}
    patch: |-
      - {op: replace, path: /stringData/agents, value: "$KEY"}
EOF
kubectl apply -k "$WORK/overlay" >"$WORK/examples.txt" 2>&1 || fail "kubectl apply -k examples: $(cat "$WORK/examples.txt")"
for name in tiny-agent gpt-oss-20b ultra; do
  grep -q "moedeployment.moeserve.io/$name created" "$WORK/examples.txt" || fail "$name not created: $(cat "$WORK/examples.txt")"
done
kubectl wait moed/tiny-agent -n team-a --for=jsonpath='{.status.phase}'=Ready --timeout=120s >/dev/null ||
  fail "tiny-agent never Ready: $(kubectl get moed,pods -n team-a 2>&1)"

# The Service's endpoint answers a chat completion with the tenant's key.
EP=$(kubectl get endpoints tiny-agent -n team-a -o 'jsonpath={.subsets[0].addresses[0].ip}:{.subsets[0].ports[0].port}')
[[ $EP == "127.0.0.1:$AGENT_PORT" ]] || fail "endpoints of Service tiny-agent: '$EP', want 127.0.0.1:$AGENT_PORT"
curl -sS -o "$WORK/chat.json" -w '%{http_code}' "http://$EP/v1/chat/completions" -H "Authorization: Bearer $KEY" \
  -H 'Content-Type: application/json' \
  -d '{"model":"tiny-agent","messages":[{"role":"user","content":"Say hello."}],"max_tokens":48}' >"$WORK/chat.code"
[[ $(cat "$WORK/chat.code") == 200 ]] || fail "chat completion: HTTP $(cat "$WORK/chat.code"): $(cat "$WORK/chat.json")"
python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); assert r["choices"][0]["message"], r' "$WORK/chat.json" ||
  fail "chat completion body: $(cat "$WORK/chat.json")"
# A wrong key is refused: the pod reads the Secret the tenant applied.
code=$(curl -s -o /dev/null -w '%{http_code}' "http://$EP/v1/chat/completions" -H "Authorization: Bearer wrong" \
  -H 'Content-Type: application/json' -d '{"model":"tiny-agent","messages":[{"role":"user","content":"hi"}]}')
[[ $code == 401 ]] || fail "a wrong key got HTTP $code, want 401"

# What this node cannot run stays off it: nothing of ultra (GPUs) or gpt-oss-20b (its bucket) is Ready.
for name in ultra gpt-oss-20b; do
  phase=$(kubectl get moed "$name" -n team-a -o 'jsonpath={.status.phase}')
  [[ $phase != Ready ]] || fail "$name is Ready on a node without what it needs"
done
# The pod runner says why, as the scheduler would.
why=$(kubectl get pod ultra-r0-0 -n team-a -o 'jsonpath={.status.conditions[?(@.type=="PodScheduled")].message}')
[[ $why == "0/1 nodes are available: "* ]] || fail "ultra-r0-0 unscheduled without the scheduler's reason: '$why'"
kubectl get moed,pods -n team-a
echo "PASS: config/ and examples/ applied; tiny-agent answered at $EP"
