#!/usr/bin/env bash
# Prints the key of ferry-csi's build in the tool cache: a hash of its sources' names and
# contents (e2e/tools/install.sh builds into $FERRY_TOOLS/ferry-csi/<this>/bin/ferry-csi,
# and e2e/kube/up.sh runs it from there), so an edited driver is rebuilt and used.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
LC_ALL=C sha256sum go.mod go.sum *.go | sha256sum | cut -c1-16
