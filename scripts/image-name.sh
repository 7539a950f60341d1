# Sourced by scripts/build-image.sh and e2e/kube/common.sh, with $repo set to the repository
# root: the image `make image` builds, which the chart names by default (its
# image.repository and appVersion) unless FERRY_IMAGE_REPOSITORY or FERRY_IMAGE_TAG say
# otherwise, and the OCI archive it is written to.
IMAGE_REPOSITORY="${FERRY_IMAGE_REPOSITORY:-$(sed -n 's/^  repository: *//p' "$repo/charts/ferry/values.yaml" | head -n1)}"
IMAGE_TAG="${FERRY_IMAGE_TAG:-$(sed -n 's/^appVersion: *"\{0,1\}\([^"]*\)"\{0,1\}$/\1/p' "$repo/charts/ferry/Chart.yaml")}"
IMAGE="$IMAGE_REPOSITORY:$IMAGE_TAG"
IMAGE_ARCHIVE="$repo/target/image/ferry-$IMAGE_TAG.oci.tar"
