# Ferry's task runner: the README's commands are these targets.
SHELL := /bin/bash
CARGO ?= cargo

.PHONY: all build release test lint fmt demo demo-copy dev-up dev-down bench deps clean generate check-generated

all: build

build:
	$(CARGO) build --workspace

release:
	$(CARGO) build --release -p ferry-agent

## Install what the tests use (needs root; a no-op when present): Debian tools, and etcd +
## kube-apiserver + kubectl + helm for the end-to-end tests (built from Go modules once,
## cached in /var/cache/ferry-tools; ~10 minutes the first time on 2 cores).
deps:
	@./.ci/deps.sh
	@./e2e/tools/install.sh --no-smoke

## Every check: format, lints, unit/integration tests (root-only ones run as root).
test: deps check-generated
	$(CARGO) fmt --all -- --check
	$(CARGO) clippy --workspace --all-targets -- -D warnings
	$(CARGO) test --workspace

## Regenerate generated files (CRD YAML from the Rust types).
generate:
	$(CARGO) run -q -p ferry-crds --bin crdgen

## Fail when a generated file differs from what its generator writes now.
check-generated: generate
	@git diff --exit-code -- charts/ferry/crds || { echo "generated files are stale: run 'make generate' and commit" >&2; exit 1; }

lint:
	$(CARGO) clippy --workspace --all-targets -- -D warnings

fmt:
	$(CARGO) fmt --all

## Ferry's main job on a local default: a local control plane (etcd + kube-apiserver), the
## operator and two node agents; applies deploy/examples/ and waits for Succeeded.
demo: deps
	$(CARGO) run -q -p ferry-e2e --bin ferry-dev -- demo

## The same control plane, operator and agents, left running (see the printed KUBECONFIG).
dev-up: deps
	$(CARGO) run -q -p ferry-e2e --bin ferry-dev -- up

dev-down:
	$(CARGO) run -q -p ferry-e2e --bin ferry-dev -- down

## ferry-agent copy on its own: copy a generated tree, verify, check the manifest.
demo-copy: release
	@./scripts/demo.sh

## Benchmarks against cp, xcp, cpz, fcp; writes bench/RESULTS.md.
bench:
	@./bench/run.sh

clean:
	$(CARGO) clean
