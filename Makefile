# Ferry's task runner: the README's commands are these targets.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build release image kube-deps kube-up kube-down test score lint fmt demo demo-copy dev-up dev-down bench bench-cold bench-control-plane bench-throughput bench-throughput-cold bench-throughput-kube bench-network-peers bench-rerun deps clean generate check-generated fuzz

all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release -p ferry-agent

## Ferry's OCI image (ferry-operator and ferry-agent, static, FROM scratch; see Containerfile)
## built with buildah: no daemon, no registry. Tagged as the chart's default image; also
## written to target/image/ferry-<tag>.oci.tar for `ctr images import` or `skopeo copy`.
image:
	@./scripts/build-image.sh

## Install what the tests use (needs root; a no-op when present): Debian tools, and etcd +
## kube-apiserver + kubectl + helm for the end-to-end tests (built from Go modules once,
## cached in /var/cache/ferry-tools; ~10 minutes the first time on 2 cores).
deps:
	@./.ci/deps.sh
	@./e2e/tools/install.sh --no-smoke

## What the real one-node tier adds (kubelet, kube-scheduler, kube-proxy, a Prometheus with
## Kubernetes discovery), built once into the same cache; make demo does not wait for them.
kube-deps: deps
	@./e2e/tools/install.sh --no-smoke --kube

## Every check: format, lints, the chart scored by kube-score, unit/integration tests
## (root-only ones run as root).
test: kube-deps check-generated score test-csi
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace

## The real-node tier's CSI driver (e2e/csi, Go): formatting, vet and its tests (as root they
## mount; otherwise they say why they skip).
.PHONY: test-csi
test-csi:
	@cd e2e/csi && out=$$(gofmt -l .) && { [ -z "$$out" ] || { echo "gofmt would change: $$out" >&2; exit 1; }; }
	cd e2e/csi && GOFLAGS=-buildvcs=false go vet ./... && GOFLAGS=-buildvcs=false go test -count=1 ./...

## Regenerate generated files: the CRD YAML from the Rust types, the snapshot-metadata client
## from its .proto (cbt/src/api.rs), then (helm lint, helm template) the rendered chart in
## deploy/ (helm from `make deps`).
generate:
	$(CARGO) run -q -p ferry-crds --bin crdgen
	$(CARGO) run -q -p ferry-cbt-protogen
	@./scripts/render-deploy.sh

## Fail when a generated file differs from what its generator writes now.
check-generated: generate
	@git diff --exit-code -- charts/ferry/crds deploy cbt/src/api.rs || { echo "generated files are stale: run 'make generate' and commit" >&2; exit 1; }

## Score every render of the chart with kube-score (built by `make deps`); fails on a
## CRITICAL finding that is not a documented exception (charts/ferry/README.md).
score:
	@./scripts/kube-score.sh

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## A real one-node cluster (containerd, kubelet, scheduler, controller-manager, kube-proxy)
## in a network namespace with no route out, with Ferry installed by its chart from
## `make image`; prints the KUBECONFIG. See e2e/kube/README.md.
kube-up: kube-deps image
	@./e2e/kube/up.sh

## Remove everything kube-up made (processes, mounts, network, iptables, cgroups, sysctls).
kube-down:
	@./e2e/kube/down.sh

## Ferry's main job on a local default: a local control plane (etcd + kube-apiserver) with
## the chart's RBAC and admission policies (deploy/ferry.yaml), the operator and two node
## agents as the chart runs them (node tokens, transfer ports on 127.0.0.2/.3); applies
## deploy/examples/ (a copy on node-a, one from node-a to node-b), waits for Succeeded and
## checks both copies against the source.
demo: deps
	$(CARGO) run -q -p ferry-e2e --bin ferry-dev -- demo

## The same control plane, operator and agents, left running: prints the KUBECONFIG, each
## node's host root and how to try a copy between nodes.
dev-up: deps
	$(CARGO) run -q -p ferry-e2e --bin ferry-dev -- up

## Stop everything make dev-up started.
dev-down:
	$(CARGO) run -q -p ferry-e2e --bin ferry-dev -- down

## kubectl ferry packed for krew: target/krew/kubectl-ferry-linux-amd64.tar.gz and the
## manifest deploy/krew/ferry.yaml filled in for it (target/krew/ferry.yaml).
.PHONY: krew
krew:
	@./scripts/krew.sh

## ferry-agent copy on its own: copy a generated tree, verify, check the manifest.
demo-copy: release
	@./scripts/demo.sh

## Benchmarks against cp, xcp, cpz, fcp; writes bench/RESULTS.md.
bench:
	@./bench/run.sh

## Cold page cache (caches dropped before every run) on the disk and an XFS image: ferry
## against xcp, cpz, fcp, cp -a and rsync -a on 20k files, 100k files and 2 x 1 GiB;
## writes bench/COLD.md and its charts. Root needed.
bench-cold:
	@BENCH_COLD=1 ./bench/run.sh

## Control-plane benchmark (operator issue): apply->Succeeded latency, 500 jobs at once,
## status writes per job, operator RSS; writes bench/CONTROL-PLANE.md (keeping the section
## that bench-throughput writes).
bench-control-plane: deps
	@{ echo "# Control-plane benchmark"; echo; echo "Generated by \`make bench-control-plane\` on $$(date -u '+%Y-%m-%d %H:%M UTC'), nproc $$(nproc), debug builds of ferry-operator and ferry-agent, local etcd 3.4 + kube-apiserver 1.35.4."; echo; \
	  $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench 20 500 && \
	  if grep -q '^## Throughput' bench/CONTROL-PLANE.md 2>/dev/null; then echo; sed -n '/^## Throughput/,$$p' bench/CONTROL-PLANE.md; fi; } \
	  > bench/CONTROL-PLANE.md.tmp && mv bench/CONTROL-PLANE.md.tmp bench/CONTROL-PLANE.md && cat bench/CONTROL-PLANE.md

## Re-runs over a destination that has the 100k-file tree (overwrite IfChanged), Ferry's CLI
## and a CopyJob against rsync -a, no change and 1% touched; writes bench/RERUN.md.
## RERUN_RUNS=5 rounds of each.
RERUN_RUNS ?= 5
bench-rerun: deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-rerun $(RERUN_RUNS) bench/RERUN.md

## Throughput of a CopyJob against `ferry-agent copy` on bench/run.sh's 100k-file tree (release
## builds, a tmpfs; root needed; a few minutes): replaces the "Throughput" section of
## bench/CONTROL-PLANE.md. THROUGHPUT_RUNS=5 timed runs of each.
THROUGHPUT_RUNS ?= 5
bench-throughput: deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-throughput $(THROUGHPUT_RUNS) bench/CONTROL-PLANE.md

## The same on cold data: the tree on the disk, caches dropped before every run (root); writes
## bench/COLD-COPYJOB.md.
bench-throughput-cold: deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-throughput-cold $(THROUGHPUT_RUNS) bench/COLD-COPYJOB.md

## System calls per file of ferry (defaults, --verify none, and cpz's work), cpz, xcp and
## cp -a on bench/run.sh's 100k-file tree on a tmpfs, counted by strace; writes
## bench/SYSCALLS.md. Root.
.PHONY: bench-syscalls
bench-syscalls:
	@./bench/install-tools.sh
	./bench/syscalls.sh

## Issue 35's small-file rows in one interleaved run (ferry defaults, --verify none, cpz's
## work; cpz, xcp, cp -a) on the 100k-file tree on a tmpfs, SMALL_RUNS=7 rounds; writes
## bench/SMALL-FILES.md. Root.
.PHONY: bench-small-files
bench-small-files:
	@./bench/install-tools.sh
	./bench/small-files.py

## xxHash3-128 from xxhash-rust (SIMD fixed at compile time) and twox-hash (detected at run
## time, what the engine uses), one thread, interleaved rounds; writes bench/HASH.md.
.PHONY: bench-hash
bench-hash:
	cd bench/hash && HASH_WHEN="$$(date -u '+%Y-%m-%d %H:%M UTC')" \
		HASH_REV="$$(git rev-parse --short=12 HEAD)" $(CARGO) run -q --release -- ../HASH.md

## Block devices (issue 36): ferry-agent copy-block against dd conv=sparse, blkdiscard + dd
## and qemu-img convert on a 4 GiB loop device (half random, half zeros), warm and cold,
## and a re-run after 0.1% of the chunks changed against rsync --inplace --no-whole-file;
## writes bench/BLOCK.md. Root.
.PHONY: bench-block
bench-block:
	@./bench/install-tools.sh
	./bench/block.py

## A million files (what grows faster than the file count): ferry (defaults, --verify none),
## cpz and rsync -a on ftzz trees of 1M and 100k files and on 1M files in one directory, on a
## tmpfs, MILLION_RUNS=3 rounds, wall, CPU and peak RSS; writes bench/MILLION.md. Root.
.PHONY: bench-million
bench-million:
	@./bench/install-tools.sh
	./bench/million.py

## The peers of a cross-node copy (issue 14) alone, with hyperfine: rsync daemon and a tar |
## socat pipe between two loopback addresses, on bench/run.sh's tmpfs trees (run it first);
## writes bench/work/NETWORK-peers.md (bench/NETWORK.md is make bench-network's). Root.
bench-network-peers: release
	@./bench/install-tools.sh
	./bench/network-peers.sh

## Ferry's copy between nodes (issue 14) against its peers, in one run: a CopyJob node-a ->
## node-b (process tier, the chart's RBAC, transfer ports on 127.0.0.2/.3), an rsync daemon,
## tar | socat, ferry-agent copy and a CopyJob on one node, on bench/run.sh's trees many and
## large on tmpfs, NET_RUNS=5 interleaved runs each; then both agents' peak RSS over a copy
## between nodes of NET_RSS_FILES=1000000 tiny files. Each node's processes on a CPU of its
## own (NET_CPUS=split, the default; a cgroup v1 cpuset each) writes bench/NETWORK.md;
## NET_CPUS=shared (every process on every CPU) writes bench/NETWORK-shared.md. Root.
.PHONY: bench-network
bench-network: deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-network $(or $(NET_RUNS),5) bench/NETWORK$(if $(filter shared,$(NET_CPUS)),-shared).md

## Ferry between two clusters (issue 33) against its peers, in one run: two control planes
## (process tier, the chart with peering on, each trusting the other), a CopyJob of west
## reading a CopyExport of east, rsync from a daemon and over ssh, and a CopyJob between
## east's two nodes; on bench/run.sh's trees many and large on tmpfs, CLUSTER_RUNS=3 rounds
## of a first copy and a copy again after 0.1% of the files (many) or 16 bytes at 8 places
## of a 1 GiB file (large) changed; bytes on the wire (iptables) and each side's peak RSS;
## writes bench/CLUSTERS.md. CLUSTER_QUICK=1 tries the harness on small trees. Root.
.PHONY: bench-clusters
bench-clusters: deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-clusters $(or $(CLUSTER_RUNS),3) bench/CLUSTERS.md

## One large file (PATCH_MIB, default 1024) changed in 8 places of 16 bytes and copied again
## between two nodes: a CopyJob by checksum (mended from the destination's copy and the
## changed chunks) against rsync -a's delta transfer from a daemon, PATCH_RUNS rounds (5);
## on make bench-network's cluster; writes bench/PATCH.md. Root.
.PHONY: bench-patch
bench-patch: deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-patch $(or $(PATCH_RUNS),5) bench/PATCH.md

## A million files as CopyJobs (on node-a, and from node-a to node-b) and a dry run of ten
## million (issue 35): time, status size, peak RSS of the operator and the agents, API
## requests; on make bench-network's cluster; writes bench/MILLION-COPYJOB.md. Root.
.PHONY: bench-million-jobs
bench-million-jobs: deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-million bench/MILLION-COPYJOB.md

## The same through the real agent pod (the real one-node tier, built and brought up for it,
## removed after); writes bench/REAL-NODE.md. Root.
bench-throughput-kube: kube-deps
	@./bench/install-tools.sh
	FERRY_E2E_RELEASE=1 $(CARGO) run -q -p ferry-e2e --bin ferry-dev -- bench-throughput-kube $(THROUGHPUT_RUNS) bench/REAL-NODE.md

## A claim of 100,000 files migrated on the real one-node tier (brought up for it): the
## downtime against the final sync of the unchanged tree; writes bench/MIGRATE.md. Root.
.PHONY: bench-migrate
bench-migrate: kube-deps
	FERRY_KUBE_BENCH=1 FERRY_KUBE_ONLY="migration bench" $(CARGO) test -p ferry-e2e --test kube -- --nocapture

clean:
	$(CARGO) clean

## Fuzz tenant path resolution against the kernel's openat2, and the transfer protocol's
## decoder with arbitrary peer bytes (nightly + cargo-fuzz, installed into
## /var/cache/ferry-tools/cargo-fuzz on first use). FUZZ_SECONDS bounds each target's run.
FUZZ_SECONDS ?= 300
fuzz:
	@test -x /var/cache/ferry-tools/cargo-fuzz/bin/cargo-fuzz || cargo install cargo-fuzz --root /var/cache/ferry-tools/cargo-fuzz
	cd fuzz && for t in resolve_beneath transfer_frame; do PATH=/var/cache/ferry-tools/cargo-fuzz/bin:$$PATH cargo +nightly fuzz run $$t -- -max_total_time=$(FUZZ_SECONDS) || exit 1; done
