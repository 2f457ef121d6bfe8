#!/usr/bin/env bash
# docs/operations.md's install sections, followed as written: every `sh`
# block of "Install with kustomize" and of "Install on a cluster by hand",
# line by line, from the repository's root, with the real kubectl against a
# fresh API double (one per section) whose pod runner runs the operator's
# pods. The test plays only what the cluster itself would do: once the
# operator's Deployment exists, it runs moe-operator with that Deployment's
# arguments (the pod runner makes no Deployment pods), pointing the webhook
# Service at it. Then the installation must be whole: moeserve-system with
# the webhook's Secret, the webhook answering (MoEDeployments were admitted
# through it), the operator reconciling them (their StatefulSets exist).
#
#   tests/e2e/install_docs.sh BUILD_DIR WORK_DIR
set -euo pipefail
SRC=$(realpath "$(dirname "$0")/../..")
BUILD=$(realpath "$1")
WORK=$2
rm -rf "$WORK" && mkdir -p "$WORK" && WORK=$(realpath "$WORK")
cd "$SRC"
command -v kubectl >/dev/null || { echo "SKIP: kubectl is not installed"; exit 77; }

free_port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
PIDS=()
stop_all() {
  for ((i = ${#PIDS[@]} - 1; i >= 0; i--)); do
    if kill -0 "${PIDS[i]}" 2>/dev/null; then kill -TERM "${PIDS[i]}"; wait "${PIDS[i]}" 2>/dev/null || true; fi
  done
  PIDS=()
}
on_exit() {
  local rc=$?
  stop_all
  [[ $rc -eq 0 ]] || tail -n 30 "$WORK"/*/*.log >&2 2>/dev/null || true
}
trap on_exit EXIT
fail() { echo "FAIL: $*" >&2; exit 1; }

# The `sh` blocks of a section (from its "## " heading to the next "## "), one command a line.
section_commands() {
  awk -v want="$1" '
    /^## / { in_section = ($0 == want) }
    in_section && /^ *```sh$/ { in_block = 1; next }
    in_block && /^ *```$/ { in_block = 0; next }
    in_section && in_block { sub(/^ +/, ""); if ($0 != "") print }
  ' docs/operations.md
}

run_section() {
  local heading=$1 dir=$WORK/$2
  mkdir -p "$dir"
  export KUBECONFIG="$dir/kubeconfig" HOME="$dir/home"
  mkdir -p "$HOME"
  local webhook_port operator_started=0
  webhook_port=$(free_port)
  "$BUILD/tests/fakes/moe-fake-apiserver" --kubeconfig "$KUBECONFIG" --run-pods "$dir/node" \
    --image "moeserve/moe-daemon=$BUILD/daemon/moe-daemon" \
    --endpoints "moeserve-system/moeserve-webhook=$webhook_port" >"$dir/apiserver.url" 2>"$dir/apiserver.log" &
  PIDS+=($!)
  for _ in $(seq 1 100); do [[ -s "$dir/apiserver.url" && -s "$KUBECONFIG" ]] && break; sleep 0.1; done

  mapfile -t commands < <(section_commands "$heading")
  [[ ${#commands[@]} -gt 0 ]] || fail "docs/operations.md: no sh blocks under \"$heading\""
  for command in "${commands[@]}"; do
    echo "\$ $command"
    bash -c "$command" >"$dir/out.txt" 2>&1 || fail "\"$heading\": \`$command\` failed: $(cat "$dir/out.txt")"
    sed 's/^/  /' "$dir/out.txt"
    # The cluster's part: the operator's Deployment, once it exists, runs.
    if [[ $operator_started == 0 ]] && kubectl get deployment moeserve-operator -n moeserve-system >/dev/null 2>&1; then
      mapfile -t args < <(kubectl get deployment moeserve-operator -n moeserve-system \
        -o go-template='{{range (index .spec.template.spec.containers 0).args}}{{.}}{{"\n"}}{{end}}' |
        grep -v -e '^--leader-election-namespace' -e '^--identity' -e '^--metrics-addr' -e '^--health-addr' \
          -e '^--webhook-addr' -e '^--operator-namespace' -e '^--cache-root')
      POD_NAMESPACE=moeserve-system "$BUILD/operator/moe-operator" --kubeconfig "$KUBECONFIG" "${args[@]}" \
        --leader-election-namespace=moeserve-system --identity=moeserve-operator-0 --operator-namespace=moeserve-system \
        --webhook-addr="127.0.0.1:$webhook_port" --metrics-addr=0 --health-addr=0 --cache-root="$dir/node/cache-root" \
        >"$dir/operator.log" 2>&1 &
      PIDS+=($!)
      operator_started=1
    fi
  done

  [[ $operator_started == 1 ]] || fail "\"$heading\" never installed the operator's Deployment"
  kubectl get namespace moeserve-system >/dev/null || fail "\"$heading\" made no namespace moeserve-system"
  kubectl get secret moeserve-webhook-tls -n moeserve-system >/dev/null || fail "no webhook Secret in moeserve-system"
  local mds
  mds=$(kubectl get moed -n team-a -o 'jsonpath={.items[*].metadata.name}')
  [[ -n $mds ]] || fail "\"$heading\" admitted no MoEDeployment"
  for md in $mds; do
    for _ in $(seq 1 100); do kubectl get statefulset "$md-r0" -n team-a >/dev/null 2>&1 && break; sleep 0.2; done
    kubectl get statefulset "$md-r0" -n team-a >/dev/null 2>&1 || fail "the operator made no StatefulSet for $md"
  done
  echo "\"$heading\": installed; MoEDeployments $mds reconciled"
  stop_all
}

run_section "## Install with kustomize" kustomize
run_section "## Install on a cluster by hand" by-hand
echo "PASS: docs/operations.md's install sections, as written"
