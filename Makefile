# quota-lease. `make help` lists the targets.
SHELL := /bin/bash
GO    ?= go
PKGS  ?= ./...
FUZZTIME ?= 10s

# Code generation, pinned. `make proto` installs exactly these generators;
# protoc itself is Debian's protobuf-compiler (libprotoc 3.21.12).
PROTOC_GEN_GO_VERSION      := v1.36.12
PROTOC_GEN_GO_GRPC_VERSION := v1.6.2
GOBIN := $(shell $(GO) env GOPATH)/bin

.PHONY: help deps deps-redis build test test-short test-rlqs test-edge-e2e vet fmt-check bench bench-peers record-envoy-original bench-identity-scale fuzz redis redis-stop proto demo load clean robustness certs console-screenshot images helm manifests

# The images' registry and tag: set in deploy/images.env, the one place
# (REGISTRY, VERSION); override on the command line.
include deploy/images.env

# Helm, pinned: `make helm` installs it; go test ./deploy lints and renders
# the chart with it when it is on PATH (and checks the templates without it
# otherwise).
HELM_VERSION := v4.3.2

help: ## list targets
	@grep -hE '^[a-z0-9-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-14s %s\n", $$1, $$2}'

# apt-get needs root: sudo when not root (and sudo is there).
SUDO := $(shell [ "$$(id -u)" = 0 ] || command -v sudo)

deps-redis: ## install Debian's redis-server if missing (the demo, make redis, make load)
	@command -v redis-server >/dev/null 2>&1 || { \
	  echo "installing redis-server (Debian)" >&2; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq redis-server >/dev/null; }
	@command -v redis-server >/dev/null 2>&1 || { echo "redis-server still missing: install it and retry" >&2; exit 1; }

deps: deps-redis ## install what the tests need (redis-server, and chromium for the console's browser test, from Debian) if missing
	@command -v chromium >/dev/null 2>&1 || { \
	  echo "installing chromium (Debian)" >&2; \
	  $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; }
	@command -v chromium >/dev/null 2>&1 || { echo "chromium still missing: install Debian's chromium and retry" >&2; exit 1; }

# The VCS revision --version and quotalease_build_info report, also where
# the toolchain does not record it (GOFLAGS=-buildvcs=false).
REVISION ?= $(shell git rev-parse --short=12 HEAD 2>/dev/null)
LDFLAGS  := -X github.com/quota-lease/quota-lease/internal/version.revision=$(REVISION)

build: ## build all binaries into bin/ (--version names the revision), and the example service
	$(GO) build -ldflags '$(LDFLAGS)' -o bin/ ./cmd/... ./examples/limited-service

# The Go files, NUL-separated: those git tracks, or outside a checkout every
# one outside hidden folders.
GO_FILES = { git ls-files -z -- '*.go' 2>/dev/null || find . -name '*.go' ! -path './.*' -print0; }

fmt-check: ## fail if any file is not gofmt-clean, or a non-test, non-generated Go line is over 120 characters
	@set -o pipefail; out=$$($(GO_FILES) | xargs -0 gofmt -l) || exit 1; \
	  if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi
	@set -o pipefail; out=$$($(GO_FILES) | grep -zv -e '_test\.go$$' -e '\.pb\.go$$' \
	  | xargs -0 env LC_ALL=C awk 'length > 120 { print FILENAME ":" FNR }') || exit 1; \
	  if [ -n "$$out" ]; then echo "lines over 120 bytes (a tab counts one):"; echo "$$out"; exit 1; fi

vet: ## go vet
	$(GO) vet $(PKGS)

test: deps fmt-check vet ## every test: the short ones without -race (as fast as a quiet machine runs them), then all with -race: unit, real Redis and etcd integration, fuzz seeds, end-to-end over real processes
	$(GO) test -short -count=1 $(PKGS)
	PATH=$(GOBIN):$$PATH $(GO) test -race -count=1 -timeout 15m $(PKGS)

test-rlqs: ## the agent's RLQS tests, the slow ones too (a tenant's share moving between regions at the edge)
	QUOTALEASE_RLQS_LONG=1 $(GO) test -race -count=1 -run 'RLQS|Edge|MatchBucket' -v ./internal/agent/

test-edge-e2e: deps ## the edge at full size over real processes: 20 Envoy-like clients per region, 1,000 buckets, every fault (about 1 minute; make test runs a smaller one)
	QUOTALEASE_EDGE_LONG=1 $(GO) test -race -count=1 -run '^TestEdgeE2E$$' -v ./internal/testenv/cluster/

test-short: ## fast tests: go test -short, no multi-process or browser suites
	$(GO) test -short -count=1 $(PKGS)

SEEDS    ?= 10
SEED     ?=
DURATION ?= 60s
robustness: deps ## random fault schedules over real processes, checked against the bound: SEEDS=N (seeds 1..N, default 10) or SEED=S, DURATION=D each (default 60s); prints a table per seed
	QUOTALEASE_ROBUSTNESS_SEEDS=$(SEEDS) QUOTALEASE_ROBUSTNESS_SEED=$(SEED) QUOTALEASE_ROBUSTNESS_DURATION=$(DURATION) \
	  $(GO) test -race -count=1 -timeout 24h -run '^TestRobustness$$' -v ./internal/testenv/cluster/

bench: deps ## benchmarks (real Redis, embedded etcd, gRPC; numbers in docs/benchmarks.md)
	$(GO) test -run '^$$' -bench . -benchtime 2s -count 1 ./regional/ ./internal/coordinator/ ./internal/agent/... ./sim/

# The peer compared side by side in make bench-peers, pinned.
PEER_RATELIMIT_VERSION := v1.4.1-0.20260122083618-3fb702589d36
PEERBIN := $(CURDIR)/.peers/bin
bench-peers: deps ## quota-lease against envoyproxy/ratelimit (built here, pinned) on Envoy's API, same machine, same run; prints checks/s, p99 and the ratio; QUOTALEASE_BENCH_PROFILES=/abs/dir also saves CPU profiles of the agent over the edge shapes
	@test -x $(PEERBIN)/service_cmd || { echo "building envoyproxy/ratelimit $(PEER_RATELIMIT_VERSION) (about 2 minutes)"; \
	  GOBIN=$(PEERBIN) $(GO) install github.com/envoyproxy/ratelimit/src/service_cmd@$(PEER_RATELIMIT_VERSION); }
	QUOTALEASE_PEER_RATELIMIT=$(PEERBIN)/service_cmd $(GO) test -run '^$$' -bench 'EnvoyAPIPeers|EdgePeers' -benchtime 1x -v ./internal/testenv/cluster/

record-envoy-original: ## record envoyproxy/ratelimit's answers (built here, pinned) to the Envoy parity cases into internal/agent/testdata/envoy-original.json
	@test -x $(PEERBIN)/service_cmd || { echo "building envoyproxy/ratelimit $(PEER_RATELIMIT_VERSION) (about 2 minutes)"; \
	  GOBIN=$(PEERBIN) $(GO) install github.com/envoyproxy/ratelimit/src/service_cmd@$(PEER_RATELIMIT_VERSION); }
	QUOTALEASE_RECORD_ENVOY_ORIGINAL=$(PEERBIN)/service_cmd $(GO) test -run '^TestRecordEnvoyOriginal$$' -count=1 -v ./internal/agent/

SCALE ?= 1000000
bench-identity-scale: ## identity shares at scale: SCALE identities (default 1,000,000, a tenth hot) against one coordinator process; prints RSS, CPU per round, etcd writes, bytes per renewal, time to 90%
	QUOTALEASE_SCALE=$(SCALE) $(GO) test -run '^TestIdentityShareScale$$' -v -count=1 -timeout 40m ./internal/testenv/cluster/

fuzz: ## run every fuzz target for FUZZTIME each (default 10s)
	@set -e; for t in FuzzTokenBucket FuzzWindows FuzzReturns FuzzPostHoc FuzzParsePolicies FuzzParseEnvoyConfig; do \
	  echo "== policy $$t"; $(GO) test ./policy/ -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME); done
	@echo "== admission FuzzParseReservation"; $(GO) test ./admission/ -run '^$$' -fuzz '^FuzzParseReservation$$' -fuzztime $(FUZZTIME)
	@echo "== regional FuzzStateKey"; $(GO) test ./regional/ -run '^$$' -fuzz '^FuzzStateKey$$' -fuzztime $(FUZZTIME)
	@echo "== sim FuzzParseScenario"; $(GO) test ./sim/ -run '^$$' -fuzz '^FuzzParseScenario$$' -fuzztime $(FUZZTIME)
	@echo "== sfv FuzzRoundTrip"; $(GO) test ./httplimit/sfv/ -run '^$$' -fuzz '^FuzzRoundTrip$$' -fuzztime $(FUZZTIME)
	@echo "== ratelimitxds FuzzConvert"; $(GO) test ./internal/ratelimitxds/ -run '^$$' -fuzz '^FuzzConvert$$' -fuzztime $(FUZZTIME)
	@set -e; for t in FuzzAppendJSONString FuzzDecodeCheckBody; do \
	  echo "== checkapi $$t"; $(GO) test ./internal/agent/checkapi/ -run '^$$' -fuzz "^$$t\$$" -fuzztime $(FUZZTIME); done
	@echo "== agent FuzzMatchBucket"; $(GO) test ./internal/agent/ -run '^$$' -fuzz '^FuzzMatchBucket$$' -fuzztime $(FUZZTIME)

redis: deps-redis ## start a throwaway redis-server on a free loopback port; prints its address
	@scripts/redis.sh start .redis

redis-stop: ## stop the redis-server `make redis` started
	@scripts/redis.sh stop .redis

proto: ## regenerate the committed protobuf/gRPC code with the pinned generators
	@command -v protoc >/dev/null 2>&1 || { $(SUDO) apt-get update -qq && $(SUDO) env DEBIAN_FRONTEND=noninteractive apt-get install -y -qq protobuf-compiler >/dev/null; }
	GOBIN=$(GOBIN) $(GO) install google.golang.org/protobuf/cmd/protoc-gen-go@$(PROTOC_GEN_GO_VERSION)
	GOBIN=$(GOBIN) $(GO) install google.golang.org/grpc/cmd/protoc-gen-go-grpc@$(PROTOC_GEN_GO_GRPC_VERSION)
	@files=$$(find proto -name '*.proto'); if [ -z "$$files" ]; then echo "no .proto files yet"; exit 0; fi; \
	PATH=$(GOBIN):$$PATH protoc -I proto \
	  --go_out=proto --go_opt=paths=source_relative \
	  --go-grpc_out=proto --go-grpc_opt=paths=source_relative $$files

demo: deps-redis build ## the local demo: etcd, 2 coordinators, 3 regions with Redis and an agent each, a minute of traffic (KEEP=1 keeps its data and logs)
	bin/quota-lease-demo --bin bin $(if $(KEEP),--keep)

load: deps-redis ## traffic straight through the regional engine against one throwaway Redis
	@set -e; addr=$$(scripts/redis.sh start .redis/load); \
	  trap 'scripts/redis.sh stop .redis/load' EXIT; \
	  $(GO) run ./cmd/regional-agent load --redis $$addr --policies examples/policies.yaml

REGIONS ?= us,eu,ap
console-screenshot: deps ## run the console's browser test and keep its screenshot as docs/img/console.png (shown in docs/runbook.md)
	mkdir -p docs/img
	QUOTALEASE_CONSOLE_SCREENSHOT=$(CURDIR)/docs/img/console.png $(GO) test -count=1 -run TestConsoleInBrowser ./internal/console

images: ## build both images with Docker, tagged $(REGISTRY)/coordinator:$(VERSION) and $(REGISTRY)/regional-agent:$(VERSION) (deploy/images.env)
	@command -v docker >/dev/null 2>&1 || { echo "make images needs docker (or any builder that reads deploy/docker/Dockerfile)" >&2; exit 1; }
	@set -e; for bin in coordinator regional-agent; do \
	  docker build -f deploy/docker/Dockerfile --build-arg BIN=$$bin --build-arg REVISION=$(REVISION) -t $(REGISTRY)/$$bin:$(VERSION) .; done

helm: ## install Helm $(HELM_VERSION) into $(GOBIN) if it is missing (about 5 minutes of compiling, once)
	@command -v helm >/dev/null 2>&1 || test -x $(GOBIN)/helm || { echo "installing helm $(HELM_VERSION) (about 5 minutes)"; \
	  GOBIN=$(GOBIN) $(GO) install helm.sh/helm/v4/cmd/helm@$(HELM_VERSION); }

manifests: helm ## lint the Helm chart and render it into the kustomize base (deploy/kubernetes/base/quota-lease.yaml)
	PATH=$(GOBIN):$$PATH helm lint --strict deploy/helm/quota-lease
	@{ echo "# Generated by make manifests from deploy/helm/quota-lease with its default values: edit the chart, not this file."; \
	  PATH=$(GOBIN):$$PATH helm template quota-lease deploy/helm/quota-lease --namespace default; } > deploy/kubernetes/base/quota-lease.yaml

certs: ## a development CA and every certificate of a deployment in certs/ (REGIONS=us,eu,ap); see docs/security.md
	$(GO) run ./cmd/coordinator certs --dir certs --regions $(REGIONS)

clean: ## remove build output and throwaway Redis state
	-scripts/redis.sh stop .redis
	-scripts/redis.sh stop .redis/load
	rm -rf bin .redis out
