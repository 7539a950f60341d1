#!/usr/bin/env bash
# make kube-down: remove everything e2e/kube/up.sh made, in the order that lets each part go:
# pod processes, the components and containerd's shims, mounts, pod network namespaces,
# cgroups, the tier's network namespace (and its veth), the host's FORWARD rule, and the
# kernel settings the kubelet changed (back to what up.sh recorded). Safe to run again, or
# after a start that failed half-way: what is not there is skipped.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=e2e/kube/common.sh
source "$here/common.sh"

[[ $(id -u) -eq 0 ]] || die "needs root"

forward_rule() { grep -m1 -F -- "--comment \"$NETNS: nothing leaves\"" <<<"$(iptables -S FORWARD 2>/dev/null)"; }

anything_left() {
    [[ -e "$STATE" || -e "$RUN" ]] || netns_exists "$NETNS" || [[ -n "$(forward_rule)" ]]
}

if ! anything_left; then
    log "nothing to remove"
    exit 0
fi

# Processes of pods: everything in the kubelet's pod cgroups (cgroup v1: one tree per
# hierarchy), killed first so no container outlives its shim.
pod_cgroups() { find /sys/fs/cgroup/*"$KUBEPODS" -depth -type d 2>/dev/null || true; }
kill_pods() {
    local d pids
    for d in $(pod_cgroups); do
        pids="$(cat "$d/cgroup.procs" 2>/dev/null || true)"
        [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null || true
    done
}
kill_pods

# The components, politely first (the kubelet and containerd clean up after themselves).
if [[ -d "$STATE/pids" ]]; then
    for f in "$STATE"/pids/*; do
        [[ -e "$f" ]] || continue
        kill -TERM "$(cat "$f")" 2>/dev/null || true
    done
    for _ in $(seq 1 50); do
        alive=0
        for f in "$STATE"/pids/*; do
            [[ -e "$f" ]] || continue
            kill -0 "$(cat "$f")" 2>/dev/null && alive=1
        done
        ((alive)) || break
        sleep 0.1
    done
fi
# Whatever still runs in the namespace (containerd's shims, a component that ignored TERM).
if netns_exists "$NETNS"; then
    pids="$(ip netns pids "$NETNS" 2>/dev/null || true)"
    [[ -z "$pids" ]] || kill -9 $pids 2>/dev/null || true
fi
kill_pods

# Mounts under the tier's directories, deepest first (pod volumes, service-account tokens,
# overlayfs roots of containers, the shm of sandboxes).
for base in "$STATE" "$RUN"; do
    { findmnt -rn -o TARGET | grep -E "^$base(/|$)" || true; } | sort -r | while read -r m; do
        umount -l "$m" 2>/dev/null || log "could not unmount $m"
    done
done

# Pod network namespaces containerd made (named cni-*), not ones that were there before.
if [[ -f "$STATE/netns.before" ]]; then
    for ns in $(ip netns list | awk '{print $1}' | grep '^cni-' || true); do
        grep -qx "$ns" "$STATE/netns.before" || ip netns delete "$ns" 2>/dev/null || true
    done
fi

# The pod cgroups, leaves first; rmdir refuses a cgroup that still has processes.
for d in $(pod_cgroups); do
    rmdir "$d" 2>/dev/null || true
done
# A second cluster's own cgroup root.
if [[ "$CGROUP_ROOT" != / ]]; then
    for h in /sys/fs/cgroup/*/; do
        [[ -L "${h%/}" ]] || rmdir "$h${CGROUP_ROOT#/}" 2>/dev/null || true
    done
fi
left="$(pod_cgroups)"
[[ -z "$left" ]] || log "cgroups left (processes still in them?): $(echo "$left" | head -n3 | tr '\n' ' ')"

if netns_exists "$NETNS"; then
    ip netns delete "$NETNS"
fi
ip link delete "$HOST_IF" 2>/dev/null || true
while rule="$(forward_rule)" && [[ -n "$rule" ]]; do
    # shellcheck disable=SC2086
    eval "iptables ${rule/-A /-D }"
done

# Kernel settings the kubelet sets (kernel.panic=10, panic_on_oops=1, overcommit_memory=1).
if [[ -f "$STATE/sysctl.before" ]]; then
    read -r panic oops overcommit <"$STATE/sysctl.before"
    sysctl -q -w kernel.panic="$panic" kernel.panic_on_oops="$oops" vm.overcommit_memory="$overcommit"
fi
if [[ "$(cat "$STATE/root-propagation.before" 2>/dev/null)" == private ]]; then
    mount --make-rprivate /
fi

# The kubelet links each container's log into /var/log/containers (a path it does not let
# be configured); the links into this tier's pod logs go with it.
if [[ -d /var/log/containers ]]; then
    find /var/log/containers -maxdepth 1 -type l -lname "$STATE/*" -delete 2>/dev/null || true
fi

rm -rf "$STATE" "$RUN"
if anything_left; then
    die "could not remove everything: see above"
fi
log "removed"
