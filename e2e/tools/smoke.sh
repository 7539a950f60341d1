#!/usr/bin/env bash
# Smoke test of the local control plane: starts a real etcd and kube-apiserver on 127.0.0.1
# (random free ports, temp dir), talks to it with kubectl through a bearer-token kubeconfig,
# proves CRDs and server-side apply work, then stops both processes.
# The kube-apiserver flags here are the ones the Rust e2e harness copies (see README.md).
#
# Needs the binaries from install.sh (uses ${FERRY_TOOLS}/env.sh when present).
# Usage: e2e/tools/smoke.sh [--keep]   (--keep: leave the temp dir and print its path)
set -euo pipefail

FERRY_TOOLS=${FERRY_TOOLS:-/var/cache/ferry-tools}
# shellcheck disable=SC1091
[[ -f $FERRY_TOOLS/env.sh ]] && source "$FERRY_TOOLS/env.sh"
ETCD=${FERRY_ETCD:-$(command -v etcd || true)}
APISERVER=${FERRY_KUBE_APISERVER:-$(command -v kube-apiserver || true)}
KUBECTL=${FERRY_KUBECTL:-$(command -v kubectl || true)}
keep=0
[[ ${1-} == --keep ]] && keep=1

log() { printf '[smoke] %s\n' "$*" >&2; }
die() { log "FAIL: $*"; exit 1; }
for b in "$ETCD" "$APISERVER" "$KUBECTL"; do [[ -x $b ]] || die "missing binary '$b'; run install.sh"; done
command -v openssl >/dev/null || die "openssl not found (apt-get install openssl)"
command -v curl >/dev/null || die "curl not found (apt-get install curl)"

work=$(mktemp -d "${TMPDIR:-/tmp}/ferry-smoke.XXXXXX")
etcd_pid="" apiserver_pid=""
stop() {  # stop PID: SIGTERM, wait up to 10 s, then SIGKILL
  local pid=$1 i
  [[ -n $pid ]] && kill -0 "$pid" 2>/dev/null || return 0
  kill -TERM "$pid" 2>/dev/null || true
  for ((i = 0; i < 100; i++)); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  wait "$pid" 2>/dev/null || true
}
cleanup() {
  local rc=$?
  stop "$apiserver_pid"
  stop "$etcd_pid"
  if ((rc != 0)); then
    for f in etcd.log kube-apiserver.log; do
      [[ -f $work/$f ]] && { log "last lines of $f:"; tail -n 25 "$work/$f" >&2; }
    done
  fi
  if ((keep || rc != 0)); then log "kept $work"; else rm -rf "$work"; fi
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# A port nobody listens on. Racy (another process may take it before we bind) but fine here.
taken_ports=" "
free_port() {
  local p
  while :; do
    p=$((20000 + RANDOM % 40000))
    [[ $taken_ports == *" $p "* ]] && continue
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      taken_ports+="$p "; echo "$p"; return
    fi
  done
}
now() { date +%s.%N; }
elapsed() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.1f", b - a }'; }

# wait_for DESCRIPTION TIMEOUT_S PID CMD... : poll CMD every 0.2 s until it succeeds.
wait_for() {
  local what=$1 timeout=$2 pid=$3; shift 3
  local deadline=$((SECONDS + timeout))
  until "$@" >/dev/null 2>&1; do
    kill -0 "$pid" 2>/dev/null || die "$what: process $pid exited"
    ((SECONDS < deadline)) || die "$what: not ready after ${timeout}s"
    sleep 0.2
  done
}

# ---------------------------------------------------------------- etcd
etcd_client=$(free_port) etcd_peer=$(free_port) secure_port=$(free_port)
t_etcd=$(now)
"$ETCD" \
  --name=ferry-smoke \
  --data-dir="$work/etcd" \
  --listen-client-urls="http://127.0.0.1:$etcd_client" \
  --advertise-client-urls="http://127.0.0.1:$etcd_client" \
  --listen-peer-urls="http://127.0.0.1:$etcd_peer" \
  --initial-advertise-peer-urls="http://127.0.0.1:$etcd_peer" \
  --initial-cluster="ferry-smoke=http://127.0.0.1:$etcd_peer" \
  --initial-cluster-state=new \
  --logger=zap --log-outputs=stderr --log-level=warn \
  >"$work/etcd.log" 2>&1 &
etcd_pid=$!
wait_for "etcd /health" 30 "$etcd_pid" \
  sh -c "curl -fsS http://127.0.0.1:$etcd_client/health | grep -q '\"health\":\"true\"'"
log "etcd $("$ETCD" --version | head -n1 | cut -d' ' -f3) ready on 127.0.0.1:$etcd_client in $(elapsed "$t_etcd")s"

# ---------------------------------------------------------------- kube-apiserver
openssl genrsa -out "$work/sa.key" 2048 2>/dev/null
openssl rsa -in "$work/sa.key" -pubout -out "$work/sa.pub" 2>/dev/null
token=$(openssl rand -hex 16)
# token,user,uid,"group,..."
echo "$token,ferry-admin,ferry-admin,\"system:masters\"" >"$work/tokens.csv"
mkdir -p "$work/pki"

apiserver_flags=(
  --etcd-servers="http://127.0.0.1:$etcd_client"
  --bind-address=127.0.0.1
  --advertise-address=127.0.0.1
  --secure-port="$secure_port"
  --cert-dir="$work/pki"
  --service-account-issuer=https://kubernetes.default.svc
  --service-account-key-file="$work/sa.pub"
  --service-account-signing-key-file="$work/sa.key"
  --authorization-mode=RBAC
  --token-auth-file="$work/tokens.csv"
  --service-cluster-ip-range=10.0.0.0/24
  --allow-privileged=true
  --endpoint-reconciler-type=none
  --disable-admission-plugins=ServiceAccount
  --profiling=false
)
t_api=$(now)
"$APISERVER" "${apiserver_flags[@]}" >"$work/kube-apiserver.log" 2>&1 &
apiserver_pid=$!

cat >"$work/kubeconfig" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ferry-smoke
  cluster:
    server: https://127.0.0.1:$secure_port
    insecure-skip-tls-verify: true
users:
- name: ferry-admin
  user:
    token: $token
contexts:
- name: ferry-smoke
  context:
    cluster: ferry-smoke
    user: ferry-admin
current-context: ferry-smoke
EOF
export KUBECONFIG=$work/kubeconfig
k() { "$KUBECTL" --request-timeout=20s "$@"; }

wait_for "kube-apiserver /readyz" 120 "$apiserver_pid" k get --raw /readyz
ready_s=$(elapsed "$t_api")
log "kube-apiserver ready on https://127.0.0.1:$secure_port in ${ready_s}s"
log "readyz etcd checks: $(k get --raw '/readyz?verbose' | grep etcd | tr '\n' ' ')"

# ---------------------------------------------------------------- checks
server_version=$(k get --raw /version | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p')
log "server /version gitVersion: $server_version"
[[ -z ${FERRY_K8S_VERSION-} || $server_version == "$FERRY_K8S_VERSION" ]] ||
  die "server reports $server_version, want $FERRY_K8S_VERSION"

# The self-signed serving cert in --cert-dir also works as a CA bundle for 127.0.0.1, for
# clients that would rather verify TLS than skip verification.
if curl -fsS --cacert "$work/pki/apiserver.crt" -H "Authorization: Bearer $token" \
    "https://127.0.0.1:$secure_port/readyz" >/dev/null 2>"$work/curl-ca.txt"; then
  log "TLS verifies with --cacert $work/pki/apiserver.crt"
else
  log "note: TLS does not verify with pki/apiserver.crt as CA: $(cat "$work/curl-ca.txt")"
fi

log "kubectl get ns"; k get ns >&2
k api-resources >"$work/api-resources.txt"
log "kubectl api-resources | head ($(wc -l <"$work/api-resources.txt") lines)"; head -n 10 "$work/api-resources.txt" >&2
[[ $(k auth can-i '*' '*') == yes ]] || die "token user is not cluster-admin"

cat >"$work/crd.yaml" <<'EOF'
apiVersion: apiextensions.k8s.io/v1
kind: CustomResourceDefinition
metadata:
  name: widgets.smoke.ferry.dev
spec:
  group: smoke.ferry.dev
  scope: Namespaced
  names: {plural: widgets, singular: widget, kind: Widget, shortNames: [wd]}
  versions:
  - name: v1alpha1
    served: true
    storage: true
    subresources: {status: {}}
    additionalPrinterColumns:
    - {name: SIZE, type: integer, jsonPath: .spec.size}
    schema:
      openAPIV3Schema:
        type: object
        properties:
          spec:
            type: object
            required: [size]
            properties:
              size: {type: integer, minimum: 1, x-kubernetes-validations: [{rule: "self <= 100", message: "size must be <= 100"}]}
          status:
            type: object
            properties:
              phase: {type: string}
EOF
log "apply CRD"
k apply -f "$work/crd.yaml" >&2
k wait --for=condition=Established --timeout=30s crd/widgets.smoke.ferry.dev >&2
# Discovery of a fresh CRD may lag Established by a moment.
wait_for "widgets in discovery" 30 "$apiserver_pid" k get widgets -A

k create ns smoke >&2
cat >"$work/widget.yaml" <<'EOF'
apiVersion: smoke.ferry.dev/v1alpha1
kind: Widget
metadata: {name: w1, namespace: smoke}
spec: {size: 3}
EOF
k apply --server-side --field-manager=ferry-smoke -f "$work/widget.yaml" >&2
k patch -n smoke widget w1 --subresource=status --type=merge -p '{"status":{"phase":"Done"}}' >&2
[[ $(k get -n smoke widget w1 -o 'jsonpath={.status.phase}') == Done ]] || die "status subresource patch not visible"
k get -n smoke widgets >&2
# Schema (OpenAPI minimum) and CEL validation must reject bad objects.
if k apply --server-side --field-manager=ferry-smoke -f - >/dev/null 2>"$work/reject.txt" <<'EOF'
apiVersion: smoke.ferry.dev/v1alpha1
kind: Widget
metadata: {name: w2, namespace: smoke}
spec: {size: 1000}
EOF
then die "CEL validation did not reject size=1000"; fi
grep -q 'size must be <= 100' "$work/reject.txt" || die "unexpected rejection: $(cat "$work/reject.txt")"
log "CEL validation rejected size=1000 as expected"

rss() { awk '/^VmRSS/ { printf "%d MiB", $2 / 1024 }' "/proc/$1/status" 2>/dev/null || echo "?"; }
log "resident memory: kube-apiserver $(rss "$apiserver_pid"), etcd $(rss "$etcd_pid")"
log "stopping kube-apiserver and etcd"
stop "$apiserver_pid"; apiserver_pid=""
stop "$etcd_pid"; etcd_pid=""
echo "smoke: OK (kube-apiserver $server_version ready in ${ready_s}s)"
