# Shared by e2e/kube/up.sh and down.sh: where the one-node tier keeps its state, its
# addresses, and small helpers. Sourced, not run.

FERRY_TOOLS="${FERRY_TOOLS:-/var/cache/ferry-tools}"
K8S_VERSION="${K8S_VERSION:-v1.35.4}"
HELM_VERSION="${HELM_VERSION:-v3.22.0}"
K8S_BIN="$FERRY_TOOLS/k8s/$K8S_VERSION/bin"
HELM="$FERRY_TOOLS/helm/$HELM_VERSION/bin/helm"
KUBE_ROUTER="$FERRY_TOOLS/kube-router/${KUBE_ROUTER_VERSION:-v2.1.0}/bin/kube-router"

# Which cluster of the tier (FERRY_KUBE_INSTANCE): 1, the default, is the one every test
# uses; 2 is a second one beside it (the tests between clusters), with its own state,
# network namespace, addresses (10.241-10.243 instead of 10.251-10.253) and cgroup root, so
# that neither kubelet takes the other's pods for orphans.
INSTANCE="${FERRY_KUBE_INSTANCE:-1}"
[[ "$INSTANCE" == 1 || "$INSTANCE" == 2 ]] || { echo "FERRY_KUBE_INSTANCE is 1 or 2, not $INSTANCE" >&2; exit 2; }
if [[ "$INSTANCE" == 1 ]]; then
    SUFFIX=""
    NET=25
    CGROUP_ROOT=/
else
    SUFFIX="-$INSTANCE"
    NET=24
    CGROUP_ROOT="/ferry-kube$SUFFIX"
fi
STATE="${FERRY_KUBE_DIR:-/var/lib/ferry-kube$SUFFIX}"
RUN="/run/ferry-kube$SUFFIX"
# Free space up.sh asks of $STATE's filesystem: images, volumes and the checks' trees fit in it.
MIN_FREE_MIB="${FERRY_KUBE_MIN_FREE_MIB:-1024}"
NETNS="ferry-kube$SUFFIX"
NODE="${FERRY_KUBE_NODE:-ferry-node$SUFFIX}"
HOST_IF="fkube$((INSTANCE - 1))"
HOST_IP="10.${NET}1.0.1"
NODE_IP="10.${NET}1.0.2"
POD_CIDR="10.${NET}2.0.0/24"
SVC_CIDR="10.${NET}3.0.0/24"
SVC_IP="10.${NET}3.0.1"
# The other cluster's node address: its pods have a route to it (through this node, and the
# two namespaces' link, e2e/kube/link.sh, when it is there).
if [[ "$INSTANCE" == 1 ]]; then OTHER_NODE_IP=10.241.0.2; else OTHER_NODE_IP=10.251.0.2; fi
# The link's own addresses (10.250.0.1 in ferry-kube, .2 in ferry-kube-2): what a connection
# from the other cluster comes from (masqueraded as it leaves its pod network), so pods
# route their answers to it.
LINK_CIDR=10.250.0.0/30
# Where the kubelet's pod cgroups are (cgroup v1: one tree per hierarchy).
KUBEPODS="${CGROUP_ROOT%/}/kubepods"
CONTAINERD_SOCK="$RUN/containerd.sock"
KUBECONFIG_OUT="$STATE/kubeconfig"

# The image `make image` builds (scripts/image-name.sh): IMAGE, IMAGE_ARCHIVE.
repo="${repo:-$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)}"
# shellcheck source=scripts/image-name.sh
source "$repo/scripts/image-name.sh"

# The CSI driver and sidecars e2e/tools/install.sh --kube builds (it exports these paths in
# env.sh; the defaults are where it puts them).
CSI_NAME=csi.ferry.dev
# The driver is this checkout's build, whatever env.sh says (it may be another checkout's).
CSI_DRIVER="$FERRY_TOOLS/ferry-csi/$("$repo/e2e/csi/source-hash.sh")/bin/ferry-csi"
CSI_PROVISIONER="${FERRY_CSI_PROVISIONER:-$FERRY_TOOLS/csi/external-provisioner-v6.4.0/bin/csi-provisioner}"
CSI_ATTACHER="${FERRY_CSI_ATTACHER:-$FERRY_TOOLS/csi/external-attacher-v4.13.0/bin/csi-attacher}"
CSI_SNAPSHOTTER="${FERRY_CSI_SNAPSHOTTER:-$FERRY_TOOLS/csi/external-snapshotter-v8.4.0/bin/csi-snapshotter}"
SNAPSHOT_CONTROLLER="${FERRY_SNAPSHOT_CONTROLLER:-$FERRY_TOOLS/csi/external-snapshotter-v8.4.0/bin/snapshot-controller}"
SNAPSHOT_CRDS="${FERRY_SNAPSHOT_CRDS:-$FERRY_TOOLS/csi/external-snapshotter-v8.4.0/crds}"
SNAPSHOT_METADATA="${FERRY_SNAPSHOT_METADATA:-$FERRY_TOOLS/csi/external-snapshot-metadata-v0.2.0/bin/csi-snapshot-metadata}"
SNAPSHOT_METADATA_CRDS="${FERRY_SNAPSHOT_METADATA_CRDS:-$FERRY_TOOLS/csi/external-snapshot-metadata-v0.2.0/crds}"
SNAPSHOT_METADATA_PORT=50051
SNAPSHOT_METADATA_AUDIENCE=snapshot-metadata.csi.ferry.dev

log() { printf '[kube %(%H:%M:%S)T] %s\n' -1 "$*" >&2; }
die() { printf '[kube] error: %s\n' "$*" >&2; exit 1; }

# netns_exists NAME: a network namespace of exactly that name (ferry-kube-2 is not
# ferry-kube).
netns_exists() { ip netns list | awk '{print $1}' | grep -qx -- "$1"; }

# Run a command in the tier's network namespace (and only that namespace: the mount
# namespace stays the host's, so the kubelet's mounts are seen by containerd and the agent).
in_ns() { nsenter --net="/run/netns/$NETNS" -- "$@"; }

# start NAME CMD...: a component in the namespace, in the background, in a session of its
# own, logging to $STATE/logs/NAME.log; its pid in $STATE/pids/NAME.
start() {
    local name=$1
    shift
    setsid nsenter --net="/run/netns/$NETNS" -- "$@" >"$STATE/logs/$name.log" 2>&1 </dev/null &
    echo $! >"$STATE/pids/$name"
}

# wait_until WHAT SECONDS CMD...: poll CMD (quietly) until it succeeds; fail naming WHAT.
wait_until() {
    local what=$1 secs=$2 deadline
    shift 2
    deadline=$((SECONDS + secs))
    until "$@" >/dev/null 2>&1; do
        ((SECONDS < deadline)) || { log "timed out after ${secs}s waiting for $what"; return 1; }
        sleep 0.5
    done
}

kc() { "$K8S_BIN/kubectl" --kubeconfig "$KUBECONFIG_OUT" "$@"; }
ctr_ns() { ctr --address "$CONTAINERD_SOCK" -n k8s.io "$@"; }
