#!/usr/bin/env bash
# Install the tools the benchmark needs, idempotently, caching outside the repo.
#   Debian: hyperfine, time (/usr/bin/time), rsync (what the rsync-based movers run),
#           socat (the tar pipe of bench/network-peers.sh), python3-matplotlib (the charts),
#           openssh-server and openssh-client (rsync over ssh, make bench-clusters; the
#           package's own sshd service is not started), iptables (its byte counters)
#   crates.io (cargo install --locked --root $FERRY_TOOLS/cargo): ftzz, xcp, cpz (from the fuc project), fcp
# Env:
#   FERRY_TOOLS        cache dir (default /var/cache/ferry-tools)
#   FERRY_TOOLS_JOBS   cargo build jobs for the installs (default: nproc)
set -euo pipefail

FERRY_TOOLS="${FERRY_TOOLS:-/var/cache/ferry-tools}"
CARGO_ROOT="$FERRY_TOOLS/cargo"
JOBS="${FERRY_TOOLS_JOBS:-$(nproc)}"
mkdir -p "$CARGO_ROOT/bin" "$FERRY_TOOLS/logs"

log() { printf '[install-tools] %s\n' "$*" >&2; }

# --- Debian packages ---------------------------------------------------------
apt_missing=()
command -v hyperfine >/dev/null 2>&1 || apt_missing+=(hyperfine)
[[ -x /usr/bin/time ]] || apt_missing+=(time)
command -v rsync >/dev/null 2>&1 || apt_missing+=(rsync)
command -v socat >/dev/null 2>&1 || apt_missing+=(socat)
command -v qemu-img >/dev/null 2>&1 || apt_missing+=(qemu-utils)
[[ -x /usr/sbin/sshd ]] || apt_missing+=(openssh-server)
command -v ssh >/dev/null 2>&1 || apt_missing+=(openssh-client)
command -v iptables >/dev/null 2>&1 || apt_missing+=(iptables)
# The report's charts (bench/report.py draws none without it).
/usr/bin/python3 -c 'import matplotlib' 2>/dev/null || apt_missing+=(python3-matplotlib)
if ((${#apt_missing[@]})); then
    log "apt-get install ${apt_missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -qq
    # No service is started by a package (openssh-server's sshd would listen on every
    # address): the benchmarks start their own servers on loopback addresses.
    policy=/usr/sbin/policy-rc.d
    made_policy=0
    if [[ ! -e $policy ]]; then
        printf '#!/bin/sh\nexit 101\n' >"$policy" && chmod +x "$policy" && made_policy=1
    fi
    apt-get install -y -qq "${apt_missing[@]}"
    if ((made_policy)); then rm -f "$policy"; fi
fi

# --- crates -------------------------------------------------------------------
# crate:binary  (the fuc project publishes its copy tool as the crate `cpz`;
# there is no crate named `fuc` on crates.io)
crates=(ftzz:ftzz xcp:xcp cpz:cpz fcp:fcp)
installed=0
for spec in "${crates[@]}"; do
    crate="${spec%%:*}" bin="${spec##*:}"
    if [[ -x "$CARGO_ROOT/bin/$bin" ]]; then
        continue
    fi
    log "cargo install --locked $crate (bin $bin) into $CARGO_ROOT, -j $JOBS"
    start=$(date +%s)
    # Build in a cache target dir so a re-run after an interruption is incremental.
    CARGO_TARGET_DIR="$FERRY_TOOLS/target" \
        cargo install --locked --root "$CARGO_ROOT" -j "$JOBS" "$crate" \
        >"$FERRY_TOOLS/logs/$crate.log" 2>&1 || {
            log "cargo install $crate failed; see $FERRY_TOOLS/logs/$crate.log"
            tail -n 30 "$FERRY_TOOLS/logs/$crate.log" >&2
            exit 1
        }
    log "installed $crate in $(( $(date +%s) - start ))s"
    [[ -x "$CARGO_ROOT/bin/$bin" ]] || { log "binary $bin missing after installing $crate"; exit 1; }
    installed=1
done
# The binaries are all we keep; the shared build dir is only reused within one install run.
if ((installed)); then rm -rf "$FERRY_TOOLS/target"; fi
