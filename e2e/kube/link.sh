#!/usr/bin/env bash
# Join the tier's two clusters (e2e/kube/up.sh, and up.sh with FERRY_KUBE_INSTANCE=2) by one
# veth pair between their network namespaces, as two clusters on one network: each node
# reaches the other's address (10.251.0.2, 10.241.0.2) through it, and their pods the other
# node through their own node (the bridge plugin masquerades what leaves the pod network).
# Nothing goes through the host: the host forwards neither namespace's packets (up.sh's
# FORWARD rule), and neither namespace has any other way out. `link.sh down` removes the
# pair (it goes too when either namespace is removed). Needs root.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
# shellcheck source=e2e/kube/common.sh
FERRY_KUBE_INSTANCE=1 source "$here/common.sh"
one_ns=$NETNS one_ip=$NODE_IP
# shellcheck source=e2e/kube/common.sh
FERRY_KUBE_INSTANCE=2 source "$here/common.sh"
two_ns=$NETNS two_ip=$NODE_IP
# The pair's own addresses, outside both clusters' ranges ($LINK_CIDR, which the pods of
# both route to).
one_link=10.250.0.1 two_link=10.250.0.2

[[ $(id -u) -eq 0 ]] || die "needs root"
if [[ "${1:-up}" == down ]]; then
    ip -n "$one_ns" link delete fklink 2>/dev/null || true
    log "the clusters' link is gone"
    exit 0
fi
for ns in "$one_ns" "$two_ns"; do
    netns_exists "$ns" || die "network namespace $ns is not there: bring both clusters up first"
done
ip link add fklink netns "$one_ns" type veth peer name fklink netns "$two_ns"
ip -n "$one_ns" addr add "$one_link/30" dev fklink
ip -n "$two_ns" addr add "$two_link/30" dev fklink
ip -n "$one_ns" link set fklink up
ip -n "$two_ns" link set fklink up
ip -n "$one_ns" route add "$two_ip/32" via "$two_link"
ip -n "$two_ns" route add "$one_ip/32" via "$one_link"
log "linked: $one_ns ($one_ip) <-> $two_ns ($two_ip) over fklink $one_link/$two_link"
