#!/usr/bin/env bash
# Installs and caches the local control-plane toolchain for Ferry's end-to-end tests
# (DESIGN.md "Local control plane", "Tests" tier 3):
#
#   etcd, prometheus, promtool   Debian packages etcd-server and prometheus (apt)
#   kube-apiserver, kubectl,     built from k8s.io/kubernetes at $K8S_VERSION
#   kube-controller-manager      (the chart test runs only its clusterrole-aggregation controller)
#   kubelet, kube-scheduler,     the same, for the real one-node tier (make kube-up)
#   kube-proxy
#   helm                         built from helm.sh/helm/v3 at $HELM_VERSION
#   prometheus (with Kubernetes  built from github.com/prometheus/prometheus at $PROMETHEUS_VERSION
#   service discovery)           (Debian's has none; the real-node tier's check uses it)
#   kube-score                   built from github.com/zegl/kube-score at $KUBE_SCORE_VERSION (make test
#                                scores the rendered chart with it: scripts/kube-score.sh)
#   kube-router (--kube)         built from github.com/cloudnativelabs/kube-router/v2 at
#                                $KUBE_ROUTER_VERSION; only its NetworkPolicy firewall runs, so the
#                                real-node tier enforces the chart's NetworkPolicies
#   ferry-csi (--kube)           the real-node tier's CSI driver, built from e2e/csi in this repo
#                                (the kubernetes-csi hostpath driver is not served: e2e/csi/README.md)
#   prometheus-operator CRDs     ServiceMonitor, PodMonitor, PrometheusRule, copied from the Go
#                                module github.com/prometheus-operator/prometheus-operator at
#                                $PROMETHEUS_OPERATOR_VERSION (the chart test applies them)
#
# Go-built binaries are cached outside the repo, keyed by version:
#   ${FERRY_TOOLS:-/var/cache/ferry-tools}/k8s/<version>/bin/{kube-apiserver,kubectl,kube-controller-manager,
#                                                            kubelet,kube-scheduler,kube-proxy}
#   ${FERRY_TOOLS:-/var/cache/ferry-tools}/helm/<version>/bin/helm
#   ${FERRY_TOOLS:-/var/cache/ferry-tools}/kube-score/<version>/bin/kube-score
#   ${FERRY_TOOLS:-/var/cache/ferry-tools}/kube-router/<version>/bin/kube-router
#   ${FERRY_TOOLS:-/var/cache/ferry-tools}/ferry-csi/<hash of e2e/csi's sources>/bin/ferry-csi
# and ${FERRY_TOOLS}/env.sh exports PATH (those bins first) plus FERRY_* paths.
#
# Idempotent: a binary already in the cache is not rebuilt, so a second run takes seconds.
# Concurrent runs serialise on an flock of ${FERRY_TOOLS}/.install.lock.
# A cold build takes a long time on 2 cores (see e2e/tools/README.md); build logs go to
# ${FERRY_TOOLS}/logs/.
#
# Usage: e2e/tools/install.sh [--smoke] [--no-smoke] [--kube]
#   --smoke     also run smoke.sh (real etcd + kube-apiserver) even if nothing was built
#   --no-smoke  skip smoke.sh even after a fresh build
#   --kube      also kubelet, kube-scheduler, kube-proxy, prometheus with Kubernetes
#               discovery, kube-router and ferry-csi, for the real-node tier (make kube-up,
#               make test); without it make demo's first run does not wait for them
# By default smoke.sh runs only when this invocation built something.
set -euo pipefail

K8S_VERSION=${K8S_VERSION:-v1.35.4}
HELM_VERSION=${HELM_VERSION:-v3.22.0}
PROMETHEUS_OPERATOR_VERSION=${PROMETHEUS_OPERATOR_VERSION:-v0.85.0}
PROMETHEUS_VERSION=${PROMETHEUS_VERSION:-v0.316.0}
KUBE_SCORE_VERSION=${KUBE_SCORE_VERSION:-v1.19.0}
# The only kube-router v2 release the Go module proxy serves (later tags answer 403).
KUBE_ROUTER_VERSION=${KUBE_ROUTER_VERSION:-v2.1.0}
# The CSI sidecars' releases the proxy serves (nearest to what Kubernetes 1.35's own e2e runs).
CSI_PROVISIONER_VERSION=${CSI_PROVISIONER_VERSION:-v6.4.0}
CSI_ATTACHER_VERSION=${CSI_ATTACHER_VERSION:-v4.13.0}
CSI_SNAPSHOTTER_VERSION=${CSI_SNAPSHOTTER_VERSION:-v8.4.0}
# The proxy serves external-snapshot-metadata only at v0.2.0 (its version list answers 403),
# and its client module (which its go.mod replaces with ./client) only at v0.1.0.
CSI_SNAPSHOT_METADATA_VERSION=${CSI_SNAPSHOT_METADATA_VERSION:-v0.2.0}
CSI_SNAPSHOT_METADATA_CLIENT_VERSION=${CSI_SNAPSHOT_METADATA_CLIENT_VERSION:-v0.1.0}
FERRY_TOOLS=${FERRY_TOOLS:-/var/cache/ferry-tools}
export FERRY_TOOLS

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
smoke=auto
kube=no
for arg in "$@"; do
  case "$arg" in
    --smoke) smoke=yes ;;
    --no-smoke) smoke=no ;;
    --kube) kube=yes ;;
    -h|--help) sed -n '2,/^# By default/p' "${BASH_SOURCE[0]}"; exit 0 ;;
    *) echo "install.sh: unknown argument: $arg" >&2; exit 2 ;;
  esac
done

log() { printf '[ferry-tools] %s\n' "$*" >&2; }
die() { log "ERROR: $*"; exit 1; }

mkdir -p "$FERRY_TOOLS/logs"
exec 9>"$FERRY_TOOLS/.install.lock"
if ! flock -n 9; then
  log "another install.sh holds $FERRY_TOOLS/.install.lock; waiting"
  flock 9
fi

built_any=0
# Leftovers of an interrupted earlier run (we hold the lock, so nobody else is writing them).
rm -rf "$FERRY_TOOLS"/k8s/*/bin/.*.tmp.* "$FERRY_TOOLS"/{helm,prometheus,kube-score,kube-router}/*/.gobin.* \
  "$FERRY_TOOLS"/ferry-csi/*/bin/.*.tmp.* "$FERRY_TOOLS"/csi/*/bin/.*.tmp.* 2>/dev/null || true

# ---------------------------------------------------------------------------
# 1. Debian packages
# ---------------------------------------------------------------------------
apt_install() {
  local sudo=()
  if [[ $(id -u) -ne 0 ]]; then
    command -v sudo >/dev/null || die "need root or sudo to apt-get install $*"
    sudo=(sudo)
  fi
  log "apt-get install $*"
  local aptargs=(-y -qq -o=Dpkg::Use-Pty=0 --no-install-recommends)
  if ! "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install "${aptargs[@]}" "$@" \
      >"$FERRY_TOOLS/logs/apt.log" 2>&1; then
    log "apt-get install failed; running apt-get update and retrying"
    "${sudo[@]}" apt-get update -qq >>"$FERRY_TOOLS/logs/apt.log" 2>&1
    "${sudo[@]}" env DEBIAN_FRONTEND=noninteractive apt-get install "${aptargs[@]}" "$@" \
      >>"$FERRY_TOOLS/logs/apt.log" 2>&1 || {
        tail -20 "$FERRY_TOOLS/logs/apt.log" >&2; die "apt-get install $* failed"; }
  fi
}

pkgs=()
command -v etcd >/dev/null || pkgs+=(etcd-server)
{ command -v prometheus >/dev/null && command -v promtool >/dev/null; } || pkgs+=(prometheus)
command -v openssl >/dev/null || pkgs+=(openssl)
command -v curl >/dev/null || pkgs+=(curl)
if ((${#pkgs[@]})); then apt_install "${pkgs[@]}"; fi

# ---------------------------------------------------------------------------
# 2. Go builds
# ---------------------------------------------------------------------------
command -v go >/dev/null || die "go not found on PATH (needs Go >= 1.26 for helm $HELM_VERSION)"

export CGO_ENABLED=0
export GOFLAGS="-mod=mod -buildvcs=false"
export GOPROXY=${GOPROXY:-https://proxy.golang.org,direct}

# Value of a top-level string field in `go mod download -json` output.
json_field() { sed -n "s/^[[:space:]]*\"$1\": \"\\(.*\\)\",\\{0,1\\}\$/\\1/p" | head -n1; }

# go mod download -json MODULE@VERSION, dying with its error message on failure.
mod_download() {
  local out
  if ! out=$(go mod download -json "$1" 2>&1); then
    die "go mod download $1 failed: $out"
  fi
  printf '%s\n' "$out"
}

# run_build NAME LOGFILE CMD... : runs CMD with output to LOGFILE, timing it.
run_build() {
  local name=$1 logf=$2; shift 2
  local t0=$SECONDS
  log "building $name (log: $logf)"
  {
    echo "# $(date -u +%FT%TZ) $*"
  } >"$logf"
  if ! "$@" >>"$logf" 2>&1; then
    tail -30 "$logf" >&2
    die "building $name failed; see $logf"
  fi
  local dt=$((SECONDS - t0))
  echo "# built $name in ${dt}s" >>"$logf"
  log "built $name in ${dt}s"
  built_any=1
}

# --- kube-apiserver + kubectl from k8s.io/kubernetes ------------------------
k8s_dir=$FERRY_TOOLS/k8s/$K8S_VERSION
k8s_bin=$k8s_dir/bin
k8s_targets=()
[[ -x $k8s_bin/kube-apiserver ]] || k8s_targets+=(kube-apiserver)
[[ -x $k8s_bin/kubectl ]] || k8s_targets+=(kubectl)
[[ -x $k8s_bin/kube-controller-manager ]] || k8s_targets+=(kube-controller-manager)
if [[ $kube == yes ]]; then
  [[ -x $k8s_bin/kubelet ]] || k8s_targets+=(kubelet)
  [[ -x $k8s_bin/kube-scheduler ]] || k8s_targets+=(kube-scheduler)
  [[ -x $k8s_bin/kube-proxy ]] || k8s_targets+=(kube-proxy)
fi

if ((${#k8s_targets[@]})); then
  [[ $K8S_VERSION =~ ^v1\.([0-9]+)\.([0-9]+)$ ]] || die "K8S_VERSION must look like v1.N.M, got $K8S_VERSION"
  k8s_minor=${BASH_REMATCH[1]}
  staging_version="v0.${BASH_REMATCH[1]}.${BASH_REMATCH[2]}"

  log "downloading k8s.io/kubernetes@$K8S_VERSION"
  dl=$(mod_download "k8s.io/kubernetes@$K8S_VERSION")
  upstream_gomod=$(json_field GoMod <<<"$dl")
  info=$(json_field Info <<<"$dl")
  [[ -f $upstream_gomod ]] || die "no go.mod for k8s.io/kubernetes@$K8S_VERSION in: $dl"

  # Staging modules: every "k8s.io/X => ./staging/src/k8s.io/X" in upstream's go.mod.
  mapfile -t staging < <(sed -n 's#^[[:space:]]*\(k8s\.io/[^[:space:]]*\)[[:space:]]*=>[[:space:]]*\./staging/src/.*#\1#p' "$upstream_gomod")
  ((${#staging[@]})) || die "found no staging replace lines in $upstream_gomod"
  go_directive=$(grep -m1 '^go ' "$upstream_gomod")
  godebug_lines=$(grep '^godebug ' "$upstream_gomod" || true)

  # Throwaway module: requires k8s.io/kubernetes, pins each staging module to v0.N.M.
  src=$k8s_dir/src
  mkdir -p "$src" "$k8s_bin"
  {
    echo "// Generated by ferry e2e/tools/install.sh; throwaway module to build k8s.io/kubernetes $K8S_VERSION."
    echo "module ferry.local/k8s-tools"
    echo
    echo "$go_directive"
    [[ -z $godebug_lines ]] || { echo; echo "$godebug_lines"; }
    echo
    echo "require k8s.io/kubernetes $K8S_VERSION"
    echo
    echo "replace ("
    for m in "${staging[@]}"; do echo "	$m => $m $staging_version"; done
    echo ")"
  } >"$src/go.mod.new"
  if ! cmp -s "$src/go.mod.new" "$src/go.mod"; then
    mv "$src/go.mod.new" "$src/go.mod"
    rm -f "$src/go.sum"
  else
    rm -f "$src/go.mod.new"
  fi

  # Version stamping, as hack/lib/version.sh does; buildDate is the tag time (reproducible).
  build_date=$(sed -n 's/.*"Time":"\([^"]*\)".*/\1/p' "$info" 2>/dev/null || true)
  build_date=${build_date:-1970-01-01T00:00:00Z}
  ldflags="-s -w"
  for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    ldflags+=" -X $pkg.gitVersion=$K8S_VERSION -X $pkg.gitMajor=1 -X $pkg.gitMinor=$k8s_minor"
    ldflags+=" -X $pkg.gitTreeState=clean -X $pkg.buildDate=$build_date"
  done

  run_build "go.sum for k8s.io/kubernetes $K8S_VERSION" "$FERRY_TOOLS/logs/k8s-$K8S_VERSION-modules.log" \
    go -C "$src" get "k8s.io/kubernetes/cmd/kube-apiserver@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubectl@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-controller-manager@$K8S_VERSION" "k8s.io/kubernetes/cmd/kubelet@$K8S_VERSION" \
      "k8s.io/kubernetes/cmd/kube-scheduler@$K8S_VERSION" "k8s.io/kubernetes/cmd/kube-proxy@$K8S_VERSION"

  for t in "${k8s_targets[@]}"; do
    tmp=$k8s_bin/.$t.tmp.$$
    run_build "$t $K8S_VERSION" "$FERRY_TOOLS/logs/k8s-$K8S_VERSION-$t.log" \
      go -C "$src" build -p 2 -trimpath -ldflags "$ldflags" -o "$tmp" "k8s.io/kubernetes/cmd/$t"
    mv -f "$tmp" "$k8s_bin/$t"
  done
fi

# go_install DIR PKG@VERSION LDFLAGS: build the command PKG into DIR/bin/<its name>, through a
# temporary GOBIN so an interrupted build leaves no half-written binary. `go install
# pkg@version` ignores the current module, so GOFLAGS=-mod=mod must not be set.
go_install() {
  local dir=$1 pkg=$2 ldflags=$3 name gobin
  name=${pkg%@*}
  name=${name##*/}
  mkdir -p "$dir/bin"
  gobin=$(mktemp -d "$dir/.gobin.XXXXXX")
  run_build "$name ${pkg#*@}" "$FERRY_TOOLS/logs/$name-${pkg#*@}.log" \
    env GOFLAGS=-buildvcs=false GOBIN="$gobin" go install -p 2 -trimpath -ldflags "$ldflags" "$pkg"
  mv -f "$gobin/$name" "$dir/bin/$name"
  rm -rf "$gobin"
}

# --- helm ------------------------------------------------------------------
helm_dir=$FERRY_TOOLS/helm/$HELM_VERSION
helm_bin=$helm_dir/bin
if [[ ! -x $helm_bin/helm ]]; then
  log "downloading helm.sh/helm/v3@$HELM_VERSION"
  dl=$(mod_download "helm.sh/helm/v3@$HELM_VERSION")
  helm_gomod=$(json_field GoMod <<<"$dl")
  [[ -f $helm_gomod ]] || die "no go.mod for helm.sh/helm/v3@$HELM_VERSION in: $dl"
  if grep -q '^replace' "$helm_gomod"; then
    die "helm $HELM_VERSION's go.mod has replace directives; go install cannot build it (extend install.sh with a throwaway module as for kubernetes)"
  fi
  # As helm's Makefile: the default Capabilities.KubeVersion is client-go's v0.N.M -> 1.N.
  cg=$(sed -n 's#^[[:space:]]*k8s\.io/client-go[[:space:]]\{1,\}v0\.\([0-9]*\)\..*#\1#p' "$helm_gomod" | head -n1)
  ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$HELM_VERSION -X helm.sh/helm/v3/internal/version.gitTreeState=clean"
  if [[ -n $cg ]]; then
    for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
      ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$cg"
    done
  fi
  go_install "$helm_dir" "helm.sh/helm/v3/cmd/helm@$HELM_VERSION" "$ldflags"
fi

# --- prometheus with Kubernetes service discovery ---------------------------
# Debian's prometheus is built without kubernetes_sd_configs; the real-node tier
# (e2e/tests/kube.rs) scrapes pods the way the chart's PodMonitor/ServiceMonitor say, so it
# needs one that has it. The Go module's v0.3NN.M is Prometheus 3.NN.M.
prom_dir=$FERRY_TOOLS/prometheus/$PROMETHEUS_VERSION
prom_bin=$prom_dir/bin
if [[ $kube == yes && ! -x $prom_bin/prometheus ]]; then
  go_install "$prom_dir" "github.com/prometheus/prometheus/cmd/prometheus@$PROMETHEUS_VERSION" "-s -w"
fi

# --- kube-score: the outside linter make test runs on the rendered chart ---------------
score_dir=$FERRY_TOOLS/kube-score/$KUBE_SCORE_VERSION
if [[ ! -x $score_dir/bin/kube-score ]]; then
  go_install "$score_dir" "github.com/zegl/kube-score/cmd/kube-score@$KUBE_SCORE_VERSION" "-s -w"
fi

# --- kube-router: a NetworkPolicy enforcer for the real-node tier ----------------------
# The bridge CNI plugin enforces no NetworkPolicy; kube-router's firewall (iptables and
# ipset, run with --run-router=false --run-service-proxy=false) does, beside it.
router_dir=$FERRY_TOOLS/kube-router/$KUBE_ROUTER_VERSION
if [[ $kube == yes && ! -x $router_dir/bin/kube-router ]]; then
  go_install "$router_dir" "github.com/cloudnativelabs/kube-router/v2/cmd/kube-router@$KUBE_ROUTER_VERSION" "-s -w"
fi

# --- ferry-csi: the real-node tier's CSI driver (source in this repo) -------------------
# Keyed by a hash of its sources (names and contents), not a version: an edited driver is
# rebuilt, an unchanged one is not. Builds of older sources are left in place (another
# checkout sharing $FERRY_TOOLS may still use one). Built in its own module with
# -mod=readonly, so a build never rewrites the repo's go.mod or go.sum.
csi_src=$(cd "$here/../csi" && pwd)
csi_hash=$("$csi_src/source-hash.sh")
csi_dir=$FERRY_TOOLS/ferry-csi/$csi_hash
if [[ $kube == yes && ! -x $csi_dir/bin/ferry-csi ]]; then
  mkdir -p "$csi_dir/bin"
  tmp=$csi_dir/bin/.ferry-csi.tmp.$$
  run_build "ferry-csi $csi_hash" "$FERRY_TOOLS/logs/ferry-csi-$csi_hash.log" \
    env GOFLAGS=-buildvcs=false go -C "$csi_src" build -p 2 -trimpath \
      -ldflags "-s -w -X main.version=$csi_hash" -o "$tmp" .
  mv -f "$tmp" "$csi_dir/bin/ferry-csi"
fi

# --- the CSI sidecars: provisioner, attacher, snapshotter, snapshot-metadata (+ CRDs) ---
# The upstream controllers that drive a CSI driver's controller service, built from the
# exact releases the Go module proxy serves (most of kubernetes-csi answers 403:
# e2e/tools/CSI-PLAN.md, section 1). Each is built inside a writable copy of its own module,
# so its go.mod, go.sum and replace lines apply exactly; the snapshotter's (and the
# snapshot-metadata sidecar's) go.mod replaces its client module with ./client, which the
# proxy ships as a module of its own, and whose config/crd holds the CRDs, copied into crds/.
# csi_sidecar NAME MODULE VERSION [CLIENT_MODULE@CLIENT_VERSION CRD_FILE] -- CMD...
# CRD_FILE is the CRD whose presence in crds/ says the copy is complete.
csi_sidecar() {
  local name=$1 module=$2 version=$3 client="" crd_file=""
  shift 3
  if [[ $1 != -- ]]; then client=$1 crd_file=$2; shift 2; fi
  shift
  local dir=$FERRY_TOOLS/csi/$name-$version cmd missing=() crds=no
  for cmd in "$@"; do [[ -x $dir/bin/$cmd ]] || missing+=("$cmd"); done
  [[ -z $client || -f $dir/crds/$crd_file ]] || crds=yes
  ((${#missing[@]})) || [[ $crds == yes ]] || return 0
  log "downloading $module@$version"
  local mod src=$dir/src
  mod=$(json_field Dir <<<"$(mod_download "$module@$version")")
  rm -rf "$src"
  mkdir -p "$dir/bin"
  cp -r "$mod" "$src"
  if [[ -n $client ]]; then
    cp -r "$(json_field Dir <<<"$(mod_download "$client")")" "$src/client"
  fi
  chmod -R u+w "$src"
  for cmd in "${missing[@]}"; do
    local tmp=$dir/bin/.$cmd.tmp.$$
    run_build "$cmd $version" "$FERRY_TOOLS/logs/$cmd-$version.log" \
      go -C "$src" build -p 2 -trimpath -ldflags "-s -w -X main.version=$version" -o "$tmp" "./cmd/$cmd"
    mv -f "$tmp" "$dir/bin/$cmd"
  done
  if [[ $crds == yes ]]; then
    # The CRDs of CRD_FILE's group (for the snapshotter, the three snapshot.storage.k8s.io
    # ones, not the groupsnapshot ones: v8.4 leaves group snapshots off). Copied whole, then
    # renamed into place.
    rm -rf "$dir/crds.tmp"
    mkdir -p "$dir/crds.tmp"
    cp "$src"/client/config/crd/"${crd_file%%_*}"_*.yaml "$dir/crds.tmp/"
    rm -rf "$dir/crds"
    mv "$dir/crds.tmp" "$dir/crds"
  fi
  rm -rf "$src"
}
if [[ $kube == yes ]]; then
  csi_sidecar external-provisioner github.com/kubernetes-csi/external-provisioner/v6 \
    "$CSI_PROVISIONER_VERSION" -- csi-provisioner
  csi_sidecar external-attacher github.com/kubernetes-csi/external-attacher/v4 \
    "$CSI_ATTACHER_VERSION" -- csi-attacher
  csi_sidecar external-snapshotter github.com/kubernetes-csi/external-snapshotter/v8 \
    "$CSI_SNAPSHOTTER_VERSION" "github.com/kubernetes-csi/external-snapshotter/client/v8@$CSI_SNAPSHOTTER_VERSION" \
    snapshot.storage.k8s.io_volumesnapshots.yaml -- snapshot-controller csi-snapshotter
  # Changed-block tracking's sidecar: serves the Kubernetes-facing SnapshotMetadata API
  # (VolumeSnapshots by name, callers by token) in front of ferry-csi's CSI one.
  csi_sidecar external-snapshot-metadata github.com/kubernetes-csi/external-snapshot-metadata \
    "$CSI_SNAPSHOT_METADATA_VERSION" \
    "github.com/kubernetes-csi/external-snapshot-metadata/client@$CSI_SNAPSHOT_METADATA_CLIENT_VERSION" \
    cbt.storage.k8s.io_snapshotmetadataservices.yaml -- csi-snapshot-metadata
fi
csi_bin() { echo "$FERRY_TOOLS/csi/$1-$2/bin/$3"; }

# --- prometheus-operator CRDs (no binary: the YAML its module ships) -------
promop_crds=$FERRY_TOOLS/prometheus-operator/$PROMETHEUS_OPERATOR_VERSION/crds
promop_files=(monitoring.coreos.com_servicemonitors.yaml monitoring.coreos.com_podmonitors.yaml
  monitoring.coreos.com_prometheusrules.yaml)
if [[ ! -f $promop_crds/${promop_files[-1]} ]]; then
  log "downloading github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION (CRDs)"
  dl=$(mod_download "github.com/prometheus-operator/prometheus-operator@$PROMETHEUS_OPERATOR_VERSION")
  promop_dir=$(json_field Dir <<<"$dl")
  [[ -d $promop_dir/example/prometheus-operator-crd ]] || die "no example/prometheus-operator-crd in $promop_dir"
  mkdir -p "$promop_crds"
  # The last file is the marker that the copy is complete.
  for f in "${promop_files[@]}"; do
    cp "$promop_dir/example/prometheus-operator-crd/$f" "$promop_crds/.$f.tmp"
    mv -f "$promop_crds/.$f.tmp" "$promop_crds/$f"
  done
fi

# ---------------------------------------------------------------------------
# 3. env.sh and summary
# ---------------------------------------------------------------------------
etcd_path=$(command -v etcd)
prom_path=$(command -v prometheus)
promtool_path=$(command -v promtool)
cat >"$FERRY_TOOLS/env.sh.tmp" <<EOF
# Generated by ferry e2e/tools/install.sh; source it.
export FERRY_TOOLS="$FERRY_TOOLS"
export FERRY_K8S_VERSION="$K8S_VERSION"
export FERRY_HELM_VERSION="$HELM_VERSION"
export FERRY_KUBE_APISERVER="$k8s_bin/kube-apiserver"
export FERRY_KUBECTL="$k8s_bin/kubectl"
export FERRY_KUBE_CONTROLLER_MANAGER="$k8s_bin/kube-controller-manager"
export FERRY_PROMETHEUS_OPERATOR_CRDS="$promop_crds"
export FERRY_HELM="$helm_bin/helm"
export FERRY_KUBE_SCORE="$score_dir/bin/kube-score"
export FERRY_KUBE_ROUTER="$router_dir/bin/kube-router"
export FERRY_CSI="$csi_dir/bin/ferry-csi"
export FERRY_CSI_PROVISIONER="$(csi_bin external-provisioner "$CSI_PROVISIONER_VERSION" csi-provisioner)"
export FERRY_CSI_ATTACHER="$(csi_bin external-attacher "$CSI_ATTACHER_VERSION" csi-attacher)"
export FERRY_CSI_SNAPSHOTTER="$(csi_bin external-snapshotter "$CSI_SNAPSHOTTER_VERSION" csi-snapshotter)"
export FERRY_SNAPSHOT_CONTROLLER="$(csi_bin external-snapshotter "$CSI_SNAPSHOTTER_VERSION" snapshot-controller)"
export FERRY_SNAPSHOT_CRDS="$FERRY_TOOLS/csi/external-snapshotter-$CSI_SNAPSHOTTER_VERSION/crds"
export FERRY_SNAPSHOT_METADATA="$(csi_bin external-snapshot-metadata "$CSI_SNAPSHOT_METADATA_VERSION" csi-snapshot-metadata)"
export FERRY_SNAPSHOT_METADATA_CRDS="$FERRY_TOOLS/csi/external-snapshot-metadata-$CSI_SNAPSHOT_METADATA_VERSION/crds"
export FERRY_ETCD="$etcd_path"
export FERRY_PROMETHEUS="$prom_path"
export FERRY_PROMTOOL="$promtool_path"
case ":\$PATH:" in
  *":$k8s_bin:$helm_bin:"*) ;;
  *) export PATH="$k8s_bin:$helm_bin:\$PATH" ;;
esac
EOF
mv -f "$FERRY_TOOLS/env.sh.tmp" "$FERRY_TOOLS/env.sh"

# ---------------------------------------------------------------------------
# 4. Verify
# ---------------------------------------------------------------------------
check() {
  local out
  out=$("$@" 2>&1) || die "'$*' failed: $out (delete the cached binary to rebuild it)"
  printf '%s\n' "$out" | head -n1
}
v_apiserver=$(check "$k8s_bin/kube-apiserver" --version)
v_kubectl=$(check "$k8s_bin/kubectl" version --client)
v_kcm=$(check "$k8s_bin/kube-controller-manager" --version)
v_helm=$(check "$helm_bin/helm" version --short)
v_etcd=$(check "$etcd_path" --version)
v_prom=$(check "$prom_path" --version)
[[ $v_apiserver == "Kubernetes $K8S_VERSION" ]] || die "kube-apiserver reports '$v_apiserver', want 'Kubernetes $K8S_VERSION'"
[[ $v_kubectl == "Client Version: $K8S_VERSION" ]] || die "kubectl reports '$v_kubectl', want 'Client Version: $K8S_VERSION'"
[[ $v_kcm == "Kubernetes $K8S_VERSION" ]] || die "kube-controller-manager reports '$v_kcm', want 'Kubernetes $K8S_VERSION'"
[[ $v_helm == "$HELM_VERSION"* ]] || die "helm reports '$v_helm', want $HELM_VERSION"
if [[ $kube == yes ]]; then
  v_csi=$(check "$csi_dir/bin/ferry-csi" --version)
  [[ $v_csi == "ferry-csi $csi_hash" ]] || die "ferry-csi reports '$v_csi', want 'ferry-csi $csi_hash'"
  for sidecar in "external-provisioner $CSI_PROVISIONER_VERSION csi-provisioner" \
    "external-attacher $CSI_ATTACHER_VERSION csi-attacher" \
    "external-snapshotter $CSI_SNAPSHOTTER_VERSION csi-snapshotter" \
    "external-snapshotter $CSI_SNAPSHOTTER_VERSION snapshot-controller"; do
    read -r module version cmd <<<"$sidecar"
    bin=$(csi_bin "$module" "$version" "$cmd")
    v=$(check "$bin" --version)
    [[ $v == *" $version" ]] || die "$cmd reports '$v', want $version"
  done
fi

if [[ $smoke == yes || ($smoke == auto && $built_any == 1) ]]; then
  log "running smoke test ($here/smoke.sh)"
  "$here/smoke.sh"
fi

size() { du -h "$1" | cut -f1; }
cat <<EOF
kube-apiserver  $k8s_bin/kube-apiserver  ($v_apiserver, $(size "$k8s_bin/kube-apiserver"))
kubectl         $k8s_bin/kubectl  ($v_kubectl, $(size "$k8s_bin/kubectl"))
kube-controller-manager $k8s_bin/kube-controller-manager  ($v_kcm, $(size "$k8s_bin/kube-controller-manager"))
prometheus-operator CRDs $promop_crds ($PROMETHEUS_OPERATOR_VERSION)
helm            $helm_bin/helm  ($v_helm, $(size "$helm_bin/helm"))
kube-score      $score_dir/bin/kube-score  ($KUBE_SCORE_VERSION)
etcd            $etcd_path  ($v_etcd)
prometheus      $prom_path  ($v_prom)
promtool        $promtool_path
env file        $FERRY_TOOLS/env.sh
export PATH="$k8s_bin:$helm_bin:\$PATH"
EOF
if [[ $kube == yes ]]; then
  echo "ferry-csi       $csi_dir/bin/ferry-csi  ($v_csi, $(size "$csi_dir/bin/ferry-csi"))"
  echo "CSI sidecars    $FERRY_TOOLS/csi/  (provisioner $CSI_PROVISIONER_VERSION, attacher $CSI_ATTACHER_VERSION, snapshotter $CSI_SNAPSHOTTER_VERSION, snapshot-metadata $CSI_SNAPSHOT_METADATA_VERSION)"
fi
