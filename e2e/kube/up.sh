#!/usr/bin/env bash
# make kube-up: a real one-node Kubernetes cluster on this machine, with Ferry installed in it
# by its Helm chart from the image `make image` builds.
#
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, containerd (+ runc, bridge
# CNI), kubelet, kube-proxy and kube-router (its NetworkPolicy firewall only) all run inside
# the network namespace `ferry-kube`, which has no route out: the host reaches it over one
# veth pair (host 10.251.0.1, node 10.251.0.2) and drops anything the namespace would have it
# forward. Pods get 10.252.0.0/24 on a bridge inside the namespace; Services 10.253.0.0/24
# (kube-proxy, iptables mode, in the namespace).
# Every component authenticates with a static token; the cluster is for tests, not for use.
#
# Needs root. State: $FERRY_KUBE_DIR (default /var/lib/ferry-kube). `make kube-down`
# (e2e/kube/down.sh) removes everything this made; a start that fails removes it itself.
# FERRY_KUBE_INSTANCE=2 (for both scripts) makes and removes a second cluster beside the
# first: namespace ferry-kube-2, 10.241-10.243 for 10.251-10.253, /var/lib/ferry-kube-2,
# its kubelet's pods under the cgroup root /ferry-kube-2 (e2e/kube/common.sh). Take it down
# before the first one, which puts back the mount propagation of / that both change.
# Facts behind the configuration: ../shared/notes/real-node.md in the project's notes and
# e2e/kube/README.md.
set -Eeuo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
repo="$(cd "$here/../.." && pwd)"
# shellcheck source=e2e/kube/common.sh
source "$here/common.sh"

preflight() {
    [[ $(id -u) -eq 0 ]] || die "needs root (it creates a network namespace, mounts and cgroups)"
    local missing=()
    for c in containerd containerd-shim-runc-v2 runc ctr nsenter ip iptables ipset openssl etcd; do
        command -v "$c" >/dev/null || missing+=("$c")
    done
    [[ -x /usr/lib/cni/bridge && -x /usr/lib/cni/host-local ]] || missing+=("/usr/lib/cni (containernetworking-plugins)")
    ((${#missing[@]} == 0)) || die "missing: ${missing[*]}; run 'make kube-deps' (apt-get install containerd runc containernetworking-plugins iptables ipset)"
    for b in kube-apiserver kube-controller-manager kube-scheduler kubelet kube-proxy kubectl; do
        [[ -x "$K8S_BIN/$b" ]] || die "$K8S_BIN/$b is missing; run 'make kube-deps' (e2e/tools/install.sh --kube builds it)"
    done
    [[ -x "$HELM" ]] || die "$HELM is missing; run 'make deps'"
    [[ -x "$KUBE_ROUTER" ]] || die "$KUBE_ROUTER is missing; run 'make kube-deps' (e2e/tools/install.sh --kube builds it)"
    for b in "$CSI_DRIVER" "$CSI_PROVISIONER" "$CSI_ATTACHER" "$CSI_SNAPSHOTTER" "$SNAPSHOT_CONTROLLER" "$SNAPSHOT_METADATA"; do
        [[ -x "$b" ]] || die "$b is missing; run 'make kube-deps' (e2e/tools/install.sh --kube builds it)"
    done
    [[ -f "$SNAPSHOT_CRDS/snapshot.storage.k8s.io_volumesnapshots.yaml" ]] ||
        die "the VolumeSnapshot CRDs are missing from $SNAPSHOT_CRDS; run 'make kube-deps'"
    [[ -f "$SNAPSHOT_METADATA_CRDS/cbt.storage.k8s.io_snapshotmetadataservices.yaml" ]] ||
        die "the SnapshotMetadataService CRD is missing from $SNAPSHOT_METADATA_CRDS; run 'make kube-deps'"
    [[ -f "$IMAGE_ARCHIVE" ]] || die "$IMAGE_ARCHIVE is missing; run 'make image'"
    if [[ -e "$STATE" ]] || netns_exists "$NETNS"; then
        die "a cluster is already up (or left over) at $STATE / netns $NETNS: run 'make kube-down' first"
    fi
    if grep -q " 10\.${NET}[123]\." <<<"$(ip -o addr)"; then
        die "an interface of this machine already uses 10.${NET}1-10.${NET}3.x.x, which the tier needs; remove it or run 'make kube-down'"
    fi
    if [[ "$(findmnt -n -o FSTYPE /sys/fs/cgroup)" != tmpfs ]]; then
        die "/sys/fs/cgroup is not a cgroup v1 hierarchy; this tier is written for cgroup v1 (kubelet failCgroupV1: false)"
    fi
    # The node's filesystem holds containerd's images, the pods' volumes and ferry-csi's
    # volumes; below this the checks would fail one by one on a full disk instead.
    local parent free_mib
    parent=$(dirname "$STATE")
    mkdir -p "$parent"
    free_mib=$(($(stat -f -c '%a * %S' "$parent") / 1048576))
    ((free_mib >= MIN_FREE_MIB)) ||
        die "$parent has ${free_mib} MiB free; the tier needs ${MIN_FREE_MIB} MiB (free space, e.g. 'cargo clean' in an old checkout, or set FERRY_KUBE_DIR to a larger filesystem)"
}

# What this machine had before, so down.sh can put it back.
record_host() {
    mkdir -p "$STATE"/{pids,logs,pki} "$RUN"
    sysctl -n kernel.panic kernel.panic_on_oops vm.overcommit_memory | paste -sd' ' >"$STATE/sysctl.before"
    findmnt -n -o PROPAGATION / >"$STATE/root-propagation.before"
    ip netns list | awk '{print $1}' >"$STATE/netns.before"
}

network() {
    log "network namespace $NETNS: veth $HOST_IF $HOST_IP <-> $NODE_IP, no route out"
    ip netns add "$NETNS"
    ip -n "$NETNS" link set lo up
    ip link add "$HOST_IF" type veth peer name eth0 netns "$NETNS"
    ip addr add "$HOST_IP/30" dev "$HOST_IF"
    ip link set "$HOST_IF" up
    ip -n "$NETNS" addr add "$NODE_IP/30" dev eth0
    ip -n "$NETNS" link set eth0 up
    # Nothing from the namespace is forwarded by the host, whatever routes appear in it
    # later; the counter of this rule is what the tests check stayed at zero.
    iptables -I FORWARD -i "$HOST_IF" -m comment --comment "$NETNS: nothing leaves" -j DROP
    # The kubelet and kube-proxy expect these in their namespace.
    in_ns sysctl -q -w net.ipv4.ip_forward=1 net.bridge.bridge-nf-call-iptables=1 2>/dev/null ||
        in_ns sysctl -q -w net.ipv4.ip_forward=1
}

pki() {
    log "certificates and tokens"
    local p="$STATE/pki"
    openssl req -x509 -newkey rsa:2048 -nodes -days 30 -subj "/CN=ferry-kube-ca" \
        -keyout "$p/ca.key" -out "$p/ca.crt" 2>/dev/null
    serving_cert apiserver kube-apiserver "IP:$SVC_IP, IP:$NODE_IP, IP:127.0.0.1, DNS:kubernetes, DNS:kubernetes.default, DNS:kubernetes.default.svc, DNS:kubernetes.default.svc.cluster.local"
    # The snapshot-metadata sidecar serves TLS at the node's address; its clients trust the
    # tier's CA through the SnapshotMetadataService object.
    serving_cert snapshot-metadata csi-snapshot-metadata "IP:$NODE_IP"
    openssl genrsa -out "$p/sa.key" 2048 2>/dev/null
    openssl rsa -in "$p/sa.key" -pubout -out "$p/sa.pub" 2>/dev/null
    # One token per component. All are in system:masters: this tier tests Ferry's RBAC (its
    # ServiceAccounts get exactly the chart's roles), not the components'.
    : >"$p/tokens.csv"
    local who
    for who in admin "system:node:$NODE" kube-controller-manager kube-scheduler kube-proxy csi; do
        local token
        token="$(openssl rand -hex 16)"
        local groups='"system:masters"'
        [[ "$who" != system:node:* ]] || groups='"system:masters,system:nodes"'
        echo "$token,$who,$who,$groups" >>"$p/tokens.csv"
        kubeconfig "$STATE/${who//:/-}.kubeconfig" "$token"
    done
    cp "$STATE/admin.kubeconfig" "$KUBECONFIG_OUT"
}

# serving_cert NAME CN SANS: $STATE/pki/NAME.{key,crt}, a server certificate of the tier's CA.
serving_cert() {
    local p="$STATE/pki" name=$1
    printf 'subjectAltName = %s\nextendedKeyUsage = serverAuth\n' "$3" >"$p/$name.ext"
    openssl req -newkey rsa:2048 -nodes -subj "/CN=$2" \
        -keyout "$p/$name.key" -out "$p/$name.csr" 2>/dev/null
    openssl x509 -req -in "$p/$name.csr" -CA "$p/ca.crt" -CAkey "$p/ca.key" -CAcreateserial \
        -days 30 -extfile "$p/$name.ext" -out "$p/$name.crt" 2>/dev/null
}

# kubeconfig FILE TOKEN: talks to the apiserver at the node's address, trusting our CA.
kubeconfig() {
    cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: ferry-kube
  cluster:
    server: https://$NODE_IP:6443
    certificate-authority-data: $(base64 -w0 "$STATE/pki/ca.crt")
users:
- name: user
  user:
    token: $2
contexts:
- name: ferry-kube
  context: {cluster: ferry-kube, user: user}
current-context: ferry-kube
EOF
}

control_plane() {
    log "etcd and kube-apiserver"
    start etcd etcd --data-dir "$STATE/etcd" --listen-client-urls http://127.0.0.1:2379 \
        --advertise-client-urls http://127.0.0.1:2379 --listen-peer-urls http://127.0.0.1:2380 \
        --unsafe-no-fsync
    local p="$STATE/pki"
    start kube-apiserver "$K8S_BIN/kube-apiserver" \
        --etcd-servers=http://127.0.0.1:2379 \
        --bind-address=0.0.0.0 --advertise-address="$NODE_IP" --secure-port=6443 \
        --tls-cert-file="$p/apiserver.crt" --tls-private-key-file="$p/apiserver.key" \
        --client-ca-file="$p/ca.crt" \
        --service-account-issuer=https://kubernetes.default.svc \
        --service-account-key-file="$p/sa.pub" --service-account-signing-key-file="$p/sa.key" \
        --authorization-mode=Node,RBAC --token-auth-file="$p/tokens.csv" \
        --service-cluster-ip-range="$SVC_CIDR" --allow-privileged=true --profiling=false \
        --kubelet-preferred-address-types=InternalIP
    wait_until "kube-apiserver /readyz" 90 kc get --raw /readyz
    log "kube-controller-manager and kube-scheduler"
    start kube-controller-manager "$K8S_BIN/kube-controller-manager" \
        --kubeconfig="$STATE/kube-controller-manager.kubeconfig" \
        --root-ca-file="$p/ca.crt" --service-account-private-key-file="$p/sa.key" \
        --use-service-account-credentials=false --leader-elect=false \
        --controllers='*,-nodeipam,-cloud-node-lifecycle,-service,-route,-persistentvolume-expander' \
        --bind-address=127.0.0.1 --secure-port=10257
    start kube-scheduler "$K8S_BIN/kube-scheduler" \
        --kubeconfig="$STATE/kube-scheduler.kubeconfig" --leader-elect=false \
        --bind-address=127.0.0.1 --secure-port=10259
    wait_until "the default ServiceAccount" 60 kc get serviceaccount default -n default
}

runtime() {
    log "containerd (runc, bridge CNI) and the Ferry image"
    mkdir -p "$STATE/cni" "$STATE/containerd"
    cat >"$STATE/cni/10-ferry-kube.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "ferry-kube",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "ipMasq": true, "hairpinMode": true,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": "$POD_CIDR"}]],
              "routes": [{"dst": "$SVC_CIDR"}, {"dst": "$NODE_IP/32"}, {"dst": "$OTHER_NODE_IP/32"},
                         {"dst": "$LINK_CIDR"}],
              "dataDir": "$STATE/cni/ipam"}},
    {"type": "portmap", "capabilities": {"portMappings": true}},
    {"type": "loopback"}
  ]
}
EOF
    cat >"$STATE/containerd.toml" <<EOF
version = 2
root = "$STATE/containerd"
state = "$RUN/containerd"
[grpc]
  address = "$CONTAINERD_SOCK"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "$IMAGE"
  # The VM has no CAP_SYS_RESOURCE: the negative oom_score_adj the kubelet asks for fails
  # every sandbox unless it is clamped (real-node.md, blocker 1).
  restrict_oom_score_adj = true
  # A raw block claim's device node in a container owned by the pod's runAsUser/runAsGroup,
  # not root's: what lets a non-root pod (Ferry's restricted holder) open its own volumeDevices
  # (the Kubernetes "non-root containers and devices" setting, off by default).
  device_ownership_from_security_context = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "/usr/lib/cni"
    conf_dir = "$STATE/cni"
EOF
    start containerd containerd --config "$STATE/containerd.toml"
    wait_until "containerd" 30 ctr_ns version
    ctr_ns images import "$IMAGE_ARCHIVE" >"$STATE/logs/ctr-import.log"
    grep -qx "$IMAGE" <<<"$(ctr_ns images ls -q)" ||
        die "containerd does not list $IMAGE after importing $IMAGE_ARCHIVE (it has: $(ctr_ns images ls -q | tr '\n' ' '))"
}

node() {
    log "kubelet and kube-proxy ($NODE at $NODE_IP)"
    # The kubelet's mounts (volumes, the HostToContainer /host of the agent) need / shared;
    # without systemd it is private here (real-node.md, blocker 2). down.sh puts it back.
    mount --make-rshared /
    mkdir -p "$STATE/kubelet" "$STATE/pod-logs"
    cat >"$STATE/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
cgroupDriver: cgroupfs
failCgroupV1: false
failSwapOn: false
containerRuntimeEndpoint: unix://$CONTAINERD_SOCK
address: $NODE_IP
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous: {enabled: true}
  webhook: {enabled: false}
authorization: {mode: AlwaysAllow}
podLogsDir: $STATE/pod-logs
# Absolute floors, not percentages: 1% of a 250 GB disk is 2.5 GB, which a machine that has
# just built Ferry and Kubernetes may not have left, and the kubelet then evicts the operator
# over and over while every copy waits (CI, stop 45). The tier's own files are far smaller.
evictionHard: {memory.available: "1Mi", nodefs.available: "256Mi", imagefs.available: "256Mi"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
serializeImagePulls: false
EOF
    # A second cluster's kubelet keeps its pods under a cgroup root of its own (made here in
    # every hierarchy, as the kubelet wants it to exist), not beside the first one's.
    if [[ "$CGROUP_ROOT" != / ]]; then
        local h
        for h in /sys/fs/cgroup/*/; do
            [[ -L "${h%/}" ]] || mkdir -p "$h${CGROUP_ROOT#/}"
        done
        echo "cgroupRoot: $CGROUP_ROOT" >>"$STATE/kubelet.yaml"
    fi
    start kubelet "$K8S_BIN/kubelet" --config="$STATE/kubelet.yaml" \
        --kubeconfig="$STATE/system-node-$NODE.kubeconfig" --root-dir="$STATE/kubelet" \
        --hostname-override="$NODE" --node-ip="$NODE_IP"
    cat >"$STATE/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
mode: iptables
clusterCIDR: $POD_CIDR
hostnameOverride: $NODE
bindAddress: $NODE_IP
metricsBindAddress: 127.0.0.1:10249
healthzBindAddress: 127.0.0.1:10256
clientConnection:
  kubeconfig: $STATE/kube-proxy.kubeconfig
conntrack:
  maxPerCore: 0
EOF
    start kube-proxy "$K8S_BIN/kube-proxy" --config="$STATE/kube-proxy.yaml"
    wait_until "node $NODE Ready" 90 kc wait --for=condition=Ready "node/$NODE" --timeout=5s
    # The bridge plugin enforces no NetworkPolicy; kube-router's firewall does, with iptables
    # and ipsets in this namespace (gone with it). Like most enforcing plugins it always
    # admits the node's own traffic to its pods: the kubelet's probes, and Prometheus here.
    # It starts once the Node exists (it exits when it cannot find its node by name), and
    # Ferry is installed once its chains are in place, so no pod runs unguarded.
    start kube-router "$KUBE_ROUTER" --run-firewall=true --run-router=false \
        --run-service-proxy=false --kubeconfig="$STATE/admin.kubeconfig" \
        --hostname-override="$NODE" --service-cluster-ip-range="$SVC_CIDR" \
        --health-port=0 --metrics-port=0
    wait_until "kube-router's firewall chains" 60 in_ns iptables -S KUBE-ROUTER-FORWARD
    # Both accept a configuration with a misspelt field, ignoring it (and what it was to set).
    local f
    for f in kubelet kube-proxy; do
        if grep -q 'strict decoding' "$STATE/logs/$f.log"; then
            die "$f ignored part of its configuration: $(grep -m1 -o 'strict decoding error.*' "$STATE/logs/$f.log")"
        fi
    done
}

# A real CSI driver (e2e/csi: volumes are directories under $STATE/csi, snapshots copies of
# them) and the upstream controllers around it, all host processes like the control plane:
# the kubelet finds the driver through its plugins_registry socket and stages and publishes
# its volumes into pods; the attach-detach controller and csi-attacher make real
# VolumeAttachments; csi-provisioner provisions claims of the StorageClasses ferry-csi and
# ferry-csi-wffc; snapshot-controller and csi-snapshotter take VolumeSnapshots.
csi() {
    log "CSI driver $CSI_NAME, its sidecars and the snapshot controller"
    kc apply -f "$SNAPSHOT_CRDS" >/dev/null
    wait_until "the VolumeSnapshotClass CRD" 30 \
        kc wait --for=condition=Established crd/volumesnapshotclasses.snapshot.storage.k8s.io --timeout=5s
    kc apply -f "$here/csi.yaml" >/dev/null
    local sock="$STATE/kubelet/plugins/$CSI_NAME/csi.sock" kcfg="$STATE/csi.kubeconfig"
    start snapshot-controller "$SNAPSHOT_CONTROLLER" --kubeconfig="$kcfg" --leader-election=false
    start ferry-csi "$CSI_DRIVER" --driver-name="$CSI_NAME" --node-id="$NODE" \
        --csi-socket="$sock" --registration-dir="$STATE/kubelet/plugins_registry" \
        --data-dir="$STATE/csi" --topology-key="topology.$CSI_NAME/node"
    wait_until "the CSI socket $sock" 30 test -S "$sock"
    local common=(--csi-address="$sock" --kubeconfig="$kcfg" --leader-election=false)
    start csi-provisioner "$CSI_PROVISIONER" "${common[@]}" --extra-create-metadata
    start csi-attacher "$CSI_ATTACHER" "${common[@]}"
    start csi-snapshotter "$CSI_SNAPSHOTTER" "${common[@]}" --extra-create-metadata
    # Changed-block tracking: the sidecar serves the Kubernetes SnapshotMetadata API at the
    # node's address and asks ferry-csi; its SnapshotMetadataService object tells clients
    # where, with which CA, and for which token audience.
    kc apply -f "$SNAPSHOT_METADATA_CRDS" >/dev/null
    wait_until "the SnapshotMetadataService CRD" 30 \
        kc wait --for=condition=Established crd/snapshotmetadataservices.cbt.storage.k8s.io --timeout=5s
    start csi-snapshot-metadata "$SNAPSHOT_METADATA" --csi-address="$sock" --kubeconfig="$kcfg" \
        --port="$SNAPSHOT_METADATA_PORT" --audience="$SNAPSHOT_METADATA_AUDIENCE" \
        --tls-cert="$STATE/pki/snapshot-metadata.crt" --tls-key="$STATE/pki/snapshot-metadata.key"
    kc apply -f - >/dev/null <<EOF
apiVersion: cbt.storage.k8s.io/v1alpha1
kind: SnapshotMetadataService
metadata:
  name: $CSI_NAME
spec:
  address: $NODE_IP:$SNAPSHOT_METADATA_PORT
  audience: $SNAPSHOT_METADATA_AUDIENCE
  caCert: $(base64 -w0 "$STATE/pki/ca.crt")
EOF
    wait_until "the snapshot-metadata sidecar on $NODE_IP:$SNAPSHOT_METADATA_PORT" 30 \
        in_ns bash -c "exec 3<>/dev/tcp/$NODE_IP/$SNAPSHOT_METADATA_PORT"
    wait_until "the CSINode of $NODE to list $CSI_NAME" 60 csinode_lists_driver
}

# The kubelet has registered the driver: its CSINode names it.
csinode_lists_driver() {
    [[ " $(kc get csinode "$NODE" -o 'jsonpath={.spec.drivers[*].name}') " == *" $CSI_NAME "* ]]
}

ferry() {
    log "helm install ferry ($IMAGE) into ferry-system"
    kc create namespace ferry-system >/dev/null
    kc label namespace ferry-system pod-security.kubernetes.io/enforce=privileged >/dev/null
    KUBECONFIG="$KUBECONFIG_OUT" "$HELM" install ferry "$repo/charts/ferry" -n ferry-system \
        --set kubeletDir="$STATE/kubelet" \
        --set changedBlockTracking.enabled=true \
        --set-json "changedBlockTracking.egress=[{\"to\":[{\"ipBlock\":{\"cidr\":\"$NODE_IP/32\"}}],\"ports\":[{\"port\":$SNAPSHOT_METADATA_PORT,\"protocol\":\"TCP\"}]}]" \
        --set image.repository="$IMAGE_REPOSITORY" --set image.tag="$IMAGE_TAG" \
        >"$STATE/logs/helm-install.log"
    wait_until "the operator Deployment Available" 120 \
        kc -n ferry-system wait --for=condition=Available deploy/ferry-operator --timeout=5s
    wait_until "the agent DaemonSet Ready" 120 \
        kc -n ferry-system rollout status ds/ferry-agent --timeout=5s
}

main() {
    local t0=$SECONDS
    preflight
    record_host
    # From here on, a failure (a failed command, or a die) removes what was made (down.sh
    # reads what record_host saved).
    trap 'rc=$?; [[ $rc -eq 0 ]] || failed "$rc"' EXIT
    network
    pki
    control_plane
    runtime
    node
    csi
    ferry
    trap - EXIT
    log "up in $((SECONDS - t0)) s"
    cat <<EOF

export KUBECONFIG=$KUBECONFIG_OUT
Node: $NODE (address $NODE_IP inside network namespace $NETNS; kubelet dir $STATE/kubelet)
Ferry: helm release 'ferry' in ferry-system, image $IMAGE

A StorageRoot on this node (the node's real filesystem under /srv/ferry):
  mkdir -p /srv/ferry && kubectl apply -f - <<'YAML'
  apiVersion: ferry.dev/v1alpha1
  kind: StorageRoot
  metadata: {name: local}
  spec: {path: /srv/ferry, nodeSelector: {kubernetes.io/hostname: $NODE}, namespaces: {names: [default]}}
  YAML

make kube-down removes it all.
EOF
}

failed() {
    local rc=$1
    trap - EXIT
    log "kube-up failed (exit $rc); last lines of the logs in $STATE/logs:"
    for f in "$STATE"/logs/*.log; do
        [[ -s "$f" ]] || continue
        printf '\n== %s ==\n' "$(basename "$f")" >&2
        tail -n 15 "$f" >&2
    done
    log "removing what was made (e2e/kube/down.sh)"
    "$here/down.sh" >&2 || true
    exit "$rc"
}

main "$@"
