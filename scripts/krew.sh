#!/usr/bin/env bash
# `make krew`: kubectl-ferry built for release, packed as krew wants it (the binary and the
# licence at the top of a tar.gz), and deploy/krew/ferry.yaml filled in with that archive's
# uri and sha256, both in target/krew/. A release points uri at where the archive is served.
set -euo pipefail
cd "$(dirname "$0")/.."
out=target/krew
cargo build --release -q -p kubectl-ferry
version=$(sed -n 's/^version = "\(.*\)"/\1/p' Cargo.toml | head -1)
stage=$(mktemp -d)
trap 'rm -rf "$stage"' EXIT
mkdir -p "$out"
cp target/release/kubectl-ferry "$stage/"
if [[ -f LICENSE ]]; then cp LICENSE "$stage/"; else echo "Apache-2.0 (see the repository)" >"$stage/LICENSE"; fi
archive="$out/kubectl-ferry-linux-amd64.tar.gz"
tar -C "$stage" -czf "$archive" kubectl-ferry LICENSE
sum=$(sha256sum "$archive" | cut -d' ' -f1)
uri=${KREW_URI:-file://$(realpath "$archive")}
sed -e "s|@VERSION@|$version|" -e "s|@URI@|$uri|" -e "s|@SHA256@|$sum|" deploy/krew/ferry.yaml >"$out/ferry.yaml"
echo "wrote $archive ($sum) and $out/ferry.yaml"
