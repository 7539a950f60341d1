#!/usr/bin/env bash
# Debian packages the tests and the demo need. Idempotent: installs only what is missing.
set -euo pipefail
need=()
have() { command -v "$1" >/dev/null 2>&1; }
have mkfs.xfs || need+=(xfsprogs)
have mkfs.btrfs || need+=(btrfs-progs)
have xxh128sum || need+=(xxhash)
have getfattr || need+=(attr)
have setfacl || need+=(acl)
have filefrag || need+=(e2fsprogs)
have setpriv || need+=(util-linux)
# A FUSE filesystem whose reads fail (EIO) for the I/O-error tests.
/usr/bin/python3 -c 'import fusepy' 2>/dev/null || need+=(python3-fusepy)
have fusermount3 || need+=(fuse3)
# prometheus and promtool (one package) for e2e/tests/prometheus.rs; without its
# Recommends (a node exporter service the tests do not use).
lean=()
{ have prometheus && have promtool; } || lean+=(prometheus)
# The real one-node tier (e2e/kube/) and its image (make image): a container runtime, pod
# networking, iptables for kube-proxy, and buildah to build the image without a daemon.
have containerd || lean+=(containerd)
have runc || lean+=(runc)
[[ -x /usr/lib/cni/bridge ]] || lean+=(containernetworking-plugins)
have iptables || lean+=(iptables)
# ipset for kube-router, which enforces the chart's NetworkPolicies in that tier.
have ipset || lean+=(ipset)
have buildah || lean+=(buildah)
if ((${#need[@]} + ${#lean[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing tools: ${need[*]} ${lean[*]}; install them (apt-get install ${need[*]} ${lean[*]}) or run as root" >&2
    exit 1
  fi
  echo "installing: ${need[*]} ${lean[*]}"
  export DEBIAN_FRONTEND=noninteractive
  # No package may start a service (containerd's would run with the host's defaults; the
  # tier runs its own): invoke-rc.d asks policy-rc.d, and 101 means "not now".
  if [[ ! -e /usr/sbin/policy-rc.d ]]; then
    printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d
    chmod +x /usr/sbin/policy-rc.d
    trap 'rm -f /usr/sbin/policy-rc.d' EXIT
  fi
  apt-get update -qq
  if ((${#need[@]})); then apt-get install -y -qq "${need[@]}" >/dev/null; fi
  if ((${#lean[@]})); then apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null; fi
fi
