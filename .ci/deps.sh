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
if ((${#need[@]} + ${#lean[@]})); then
  if [[ $(id -u) -ne 0 ]]; then
    echo "missing tools: ${need[*]} ${lean[*]}; install them (apt-get install ${need[*]} ${lean[*]}) or run as root" >&2
    exit 1
  fi
  echo "installing: ${need[*]} ${lean[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  if ((${#need[@]})); then apt-get install -y -qq "${need[@]}" >/dev/null; fi
  if ((${#lean[@]})); then apt-get install -y -qq --no-install-recommends "${lean[@]}" >/dev/null; fi
fi
