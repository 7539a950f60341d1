#!/usr/bin/env bash
# make image: Ferry's OCI image, without a Docker daemon and without a registry.
#
#   1. cargo build --release of ferry-operator and ferry-agent, statically linked against
#      glibc (+crt-static, so the image needs no libc), stripped, into target/image/;
#   2. buildah build of Containerfile (FROM scratch, COPY only: nothing is pulled, nothing
#      runs) into local containers storage as REPOSITORY:TAG;
#   3. buildah push of it to target/image/ferry-TAG.oci.tar (an OCI archive), which
#      `ctr images import` or `skopeo copy` take to a runtime or a registry.
#
# REPOSITORY and TAG default to the chart's image.repository and appVersion, so the chart's
# defaults name what this builds. Env: FERRY_IMAGE_REPOSITORY, FERRY_IMAGE_TAG.
set -euo pipefail

repo="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$repo"
log() { printf '[image] %s\n' "$*" >&2; }
die() { printf '[image] error: %s\n' "$*" >&2; exit 1; }

# shellcheck source=scripts/image-name.sh
source "$repo/scripts/image-name.sh"
[[ -n "$IMAGE_REPOSITORY" && -n "$IMAGE_TAG" ]] || die "cannot read image.repository from charts/ferry/values.yaml or appVersion from Chart.yaml"
image="$IMAGE"

if ! command -v buildah >/dev/null; then
    [[ $(id -u) -eq 0 ]] || die "buildah is missing: apt-get install buildah (as root)"
    log "apt-get install buildah"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >/dev/null ||
        { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah >/dev/null; } ||
        die "apt-get install buildah failed"
fi

# The revision --version prints: the commit, and -dirty when the tree has uncommitted changes.
rev="$(git rev-parse --short=12 HEAD 2>/dev/null || echo unknown)"
if [[ -n "$(git status --porcelain --untracked-files=no 2>/dev/null)" ]]; then rev="$rev-dirty"; fi

out="$repo/target/image"
triple="$(rustc -vV | sed -n 's/^host: //p')"
log "building ferry-operator and ferry-agent $rev (release, static, $triple)"
# An explicit --target keeps RUSTFLAGS off build scripts and proc macros (they cannot be
# static); a target dir of its own keeps these flags from rebuilding target/release.
FERRY_GIT_REV="$rev" \
RUSTFLAGS="-C target-feature=+crt-static" \
CARGO_PROFILE_RELEASE_DEBUG=0 \
CARGO_PROFILE_RELEASE_STRIP=symbols \
CARGO_TARGET_DIR="$out/cargo" \
    cargo build --release --locked --target "$triple" -p ferry-operator -p ferry-agent

ctx="$out/context"
rm -rf "$ctx"
mkdir -p "$ctx"
for bin in ferry-operator ferry-agent; do
    cp "$out/cargo/$triple/release/$bin" "$ctx/$bin"
    # A dynamic binary would start in a scratch image only to fail on a missing loader.
    if grep -q 'Requesting program interpreter' <<<"$(readelf -l "$ctx/$bin")"; then
        die "$bin is dynamically linked; the image has no libc"
    fi
done
"$ctx/ferry-agent" --version >&2

log "buildah build -t $image (Containerfile, FROM scratch)"
buildah build --quiet --pull=never --layers=false -f Containerfile -t "$image" "$ctx" >/dev/null
archive="$IMAGE_ARCHIVE"
rm -f "$archive"
buildah push --quiet "$image" "oci-archive:$archive:$image"
size="$(buildah images --format '{{.Size}}' "$image" | head -n1)"
log "built $image: $size in local containers storage (buildah images), $(du -h "$archive" | cut -f1) as $archive"
echo "$archive"
