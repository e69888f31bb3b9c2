# ipvs-proxy. `make test` is what CI runs; `make demo` shows it working.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
# One build configuration for everything — tests on this machine, the
# binaries for the VM (static, trimmed) and the Kubernetes binaries — so
# that each package is compiled once and shared through the build cache.
export CGO_ENABLED := 0
export GOFLAGS := -trimpath
# The Go release everything is built with, fetched through the Go module
# proxy when the machine's own is another: the machine's go1.26.8 has
# standard-library vulnerabilities the agent reaches (net/http,
# crypto/tls, crypto/x509; `make vulncheck`), fixed by 1.26.11.
export GOTOOLCHAIN := go1.26.11
GO ?= go
# The release this tree makes: the Helm chart's appVersion, the tag of the
# image the chart and deploy/ run. A build of a release's git tag (vX.Y.Z)
# is that version; one after it, git describe's vX.Y.Z-N-gHASH; one of a
# tree without such a tag, APP_VERSION-dev (its revision tells it apart).
APP_VERSION := $(shell sed -n 's/^appVersion: *//p' deploy/helm/ipvs-proxy/Chart.yaml)
VERSION ?= $(shell git describe --tags --match 'v[0-9]*' --dirty 2>/dev/null || echo $(APP_VERSION)-dev)
# The commit built (-dirty with uncommitted changes); empty outside a git
# checkout, where the binary reports the revision Go stamped, if any.
REVISION ?= $(shell r=$$(git rev-parse HEAD 2>/dev/null) && { git diff --quiet HEAD 2>/dev/null || r=$$r-dirty; echo $$r; })
LDFLAGS := -s -w -X main.version=$(VERSION) -X main.revision=$(REVISION)
# Kernel and end-to-end tests boot a VM under software emulation: be generous.
E2E_TIMEOUT ?= 80m

.PHONY: all build image test test-full checks deps bed unit e2e e2e-run lint vulncheck monitoring-check demo bench bench-large bench-go bench-busy bench-heap exec-paths clean fuzz conformance conformance-ci conformance-list chaos chaos-nodes chaos-outage chaos-soak takeover cluster hash dsr dsr-ecmp dsr-prototype results

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ipvs-proxy ./cmd/ipvs-proxy

# The container image, an OCI archive assembled without a container engine
# from bin/ipvs-proxy and Debian's iptables and kmod (see deploy/image).
# Files carry the last commit's time, so a rebuild gives the same digest.
# The binary's SBOM (CycloneDX, by cyclonedx-gomod pinned in
# e2e/tools/cyclonedx-gomod: every Go module linked in, with its version)
# is bin/ipvs-proxy.cdx.json and /sbom.cdx.json in the image.
IMAGE ?= ipvs-proxy:$(APP_VERSION)
image: build
	$(GO) -C e2e/tools/cyclonedx-gomod tool cyclonedx-gomod bin -json -noserial -notimestamp -version '$(VERSION)' \
		-output $(CURDIR)/bin/ipvs-proxy.cdx.json $(CURDIR)/bin/ipvs-proxy
	SOURCE_DATE_EPOCH=$$(git log -1 --format=%ct 2>/dev/null || echo 0) \
		$(GO) run ./deploy/image --binary bin/ipvs-proxy --sbom bin/ipvs-proxy.cdx.json --output bin/ipvs-proxy-image.tar --tag '$(IMAGE)' --version '$(VERSION)'

# The bed is a module of its own in e2e/, which requires this one through
# a replace: its tests and commands build there. E2E_GO runs go in it;
# E2E_CMD runs one of its commands here, at the repository's root, where
# they find deploy/ and write bin/.
E2E_GO = $(GO) -C e2e
E2E_CMD = $(E2E_GO) run -exec 'env -C $(CURDIR)'

# Unit tests run on this machine, then the Helm
# chart's, in deploy/helm, a module of its own so that Helm's SDK stays
# out of the agent's go.mod.
# VM_ONLY_TESTS need the VM's kernel (IPVS, dummy links) or change the
# network of the machine they run on: on the host they are left out by
# name, never skipped; the bed runs them inside its VM
# (TestKernelPackagesInVM, vm.TestSmoke). A new one that skips on the
# host fails `make unit` until it is named here.
VM_ONLY_TESTS = TestIPVSBatch|TestOrderedTablesAgreeOnKernel|TestIPVSBatchLarge|TestConntrackClearUDP|TestIPVSTable|TestIPVSRealTraffic|TestIPVSMissingScheduler|TestDummy|TestNFTViewOnKernel|TestIPVSViewMissingOnKernel|TestServeAndHitAcrossNamespaces|TestHold|TestNetnsErrors|TestIPVSTunnelRealTraffic|TestTunnelEndsOnKernel|TestIPVSTakesForwardedReplyOfAnotherFlow
unit:
	set -o pipefail; $(GO) test -json -count=1 -skip '^($(VM_ONLY_TESTS))$$' ./... | $(E2E_CMD) ./cmd/testlog -suite unit -out $(RESULTS)
	set -o pipefail; $(GO) -C deploy/helm test -json -count=1 ./... | $(E2E_CMD) ./cmd/testlog -suite unit-chart -out $(RESULTS)

# The bed's tests (the e2e package: a real kube-apiserver, QEMU VMs with
# Debian's kernel, real clusters) are chosen by -run and -skip lists, never
# by t.Skip. `make test` runs all but TEST_SKIP, a deny-list: a new test
# joins CI unless named here. The named targets below run the rest. Every
# run goes through e2e/cmd/testlog: per-test times, a table of the slowest,
# a failure on any skipped test, and the figures as data in bin/results.
E2E_CHAOS_LONG := TestChaosAPIServerDown|TestChaosConntrackFull|TestChaosEndpointChurn|TestChaosManualDamage|TestChaosRollingUpdate|TestHostTrafficDuringEndpointMove
E2E_TAKEOVER := TestKubeProxyIPVSMode|TestTakeoverFromKubeProxy|TestTakeoverNodePortsOnNodeAddressesOnly
E2E_CLUSTER := TestPrometheusScrapesAgents|TestClusterNode
E2E_HASH := TestHashSchedulersAgreeAcrossNodes
E2E_CHAOS_NODES := TestChaosNodes
E2E_CHAOS_OUTAGE := TestChaosAPIServerLongOutage
E2E_CHAOS_SOAK := TestChaosSoak
E2E_PROTOTYPES := TestDSRPrototype
E2E_DSR := TestDirectServerReturn
E2E_DSR_ECMP := TestDSRSurvivesRehash
TEST_SKIP = ^($(E2E_CHAOS_LONG)|$(E2E_CHAOS_OUTAGE)|$(E2E_CHAOS_SOAK)|$(E2E_TAKEOVER)|$(E2E_CLUSTER)|$(E2E_HASH)|$(E2E_CHAOS_NODES)|$(E2E_PROTOTYPES)|$(E2E_DSR)|$(E2E_DSR_ECMP))$$$$|^TestChaosKernelFaults$$$$/^kernel-faults-(0|10)pct$$$$
E2E_RUN ?= .
E2E_SKIP ?=
E2E_PKGS ?= ./...
E2E_SUITE ?= e2e
RESULTS ?= $(CURDIR)/bin/results
# Where every suite writes its figures (framework/results).
export RESULTS_DIR = $(RESULTS)
TESTLOG = $(E2E_CMD) ./cmd/testlog -v -suite $(E2E_SUITE) -out $(RESULTS)

# One `go test` in the e2e module of E2E_PKGS (the e2e package and its
# framework, whose tests boot VMs and control planes too) with E2E_RUN/E2E_SKIP, the
# VM-only tests always left out (they run inside the VM); the chaos cases
# among them (TestChaos*, at CHAOS_SIZE Services) leave one row of
# figures each in CHAOS_OUT, printed as a table after.
e2e-run:
	rm -rf $(CHAOS_OUT)
	set -o pipefail; CHAOS_SIZE=$(CHAOS_SIZE) CHAOS_OUT=$(CHAOS_OUT) $(E2E_GO) test -json -count=1 -timeout $(E2E_TIMEOUT) \
		-run '$(E2E_RUN)' -skip '^($(VM_ONLY_TESTS))$$$(if $(E2E_SKIP),|$(E2E_SKIP))' $(E2E_PKGS) | $(TESTLOG); \
		status=$$?; if ls $(CHAOS_OUT)/*.json >/dev/null 2>&1; then $(E2E_CMD) ./cmd/chaostable -dir $(CHAOS_OUT) -suite $(CHAOS_ROWS) || status=1; fi; exit $$status

# `make test`, what CI runs: the bed built beside lint and unit tests;
# then the bed's kernel tests in one VM (schedulers, glue, node edges,
# ops, RBAC, ranges, the kernel packages) with a bounded chaos slice
# (restart and SIGKILL mid-sync, watch gap, malformed objects, kernel
# faults at 50%, iptables-restore failing) at TEST_CHAOS_SIZE Services (`make chaos` runs the same
# cases at CHAOS_SIZE); then ONE two-node dual-stack cluster with the
# outside host: Kubernetes' upstream core first, then TestTwoNodes.
TEST_CHAOS_SIZE ?= 100
# TestTwoNodes' IPv6 endpoint move (45-50 s) is the IPv4 one's code in the
# other family: `make e2e` runs it.
TEST_CLUSTER_SKIP = ^TestTwoNodes$$$$/^IPv6:_endpoint_moving_from_node-1_to_node-2_under_traffic$$$$
test:
	$(MAKE) --no-print-directory deps
	$(MAKE) --no-print-directory -j2 bed checks
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=test-bed CHAOS_SIZE=$(TEST_CHAOS_SIZE) E2E_SKIP='$(TEST_SKIP)|^TestTwoNodes$$$$'
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=test-cluster E2E_PKGS=. E2E_RUN='^TestTwoNodes$$$$' E2E_SKIP='$(TEST_CLUSTER_SKIP)'

# The whole e2e package: every kernel, chaos, takeover and cluster test.
e2e:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=e2e E2E_RUN=.

# The reliability suite: agent restarts, an apiserver outage, watch gaps,
# damage by hand, endpoint churn, kernel faults, a rolling update, the
# node's own connections through endpoint moves, each
# under live traffic, at CHAOS_SIZE Services (300 by default; by hand
# e.g. `make chaos CHAOS_SIZE=3000`).
CHAOS_SIZE ?= 300
# The name the chaos rows are kept under: `make chaos`'s, or <target>-cases
# for the suites that boot beds of their own (README: one table a run).
CHAOS_ROWS ?= chaos
CHAOS_OUT ?= $(CURDIR)/bin/chaos
chaos:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=chaos-tests E2E_PKGS=. E2E_RUN='^(TestChaos|TestHostTrafficDuringEndpointMove$$$$)' \
		E2E_SKIP='^($(E2E_CHAOS_NODES)|$(E2E_CHAOS_OUTAGE)|$(E2E_CHAOS_SOAK))$$$$'

# Issue 45's cases 1, 3, 4, 5 and 7 on two nodes and the outside host, at
# CHAOS_SIZE Services (TestChaosNodes, left out of `make chaos`: it boots
# its own cluster): iptables-restore failing in one node's agent for 3
# minutes, then mended; a node's address replaced; a stale second agent
# pod; the DaemonSet rolled and rolled back; UDP through pod cycles with
# both VMs loaded; a node's VM killed and booted again. One chaos row each.
# The test takes E2E_TIMEOUT (80m) less 2 minutes: at 2,000 Services about
# an hour; give a bigger CHAOS_SIZE more (`E2E_TIMEOUT=150m` for 5,000).
chaos-nodes:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=chaos-nodes CHAOS_ROWS=chaos-nodes-cases E2E_PKGS=. E2E_RUN='^($(E2E_CHAOS_NODES))$$$$'

# Issue 45's case 8, the soak, on chaos-nodes' two nodes and outside
# host: CHAOS_SOAK (a Go duration, 60m by default) of endpoint churn at
# CHAOS_SIZE Services under live traffic to an unchanged Service; the
# agents' RSS every minute (TestChaosSoak, left out of `make chaos` and
# `make test`). One chaos row, and chaos-soak-memory-*.json in the
# results. Issue 45's size: `make chaos-soak CHAOS_SIZE=2000`.
# CHAOS_SOAK_ROUND (a Go duration, 30s by default) is a round's period:
# the emulated bed's kubelets fell behind 30 s rounds at 2,000 Services.
CHAOS_SOAK_TIMEOUT ?= 150m
chaos-soak:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=chaos-soak CHAOS_ROWS=chaos-soak-cases E2E_PKGS=. E2E_RUN='^($(E2E_CHAOS_SOAK))$$$$' E2E_TIMEOUT=$(CHAOS_SOAK_TIMEOUT)

# Issue 45's case 2 on the one-node bed: the agent without the apiserver
# for CHAOS_OUTAGE (5 minutes), refused and then black-holed, under live
# traffic (TestChaosAPIServerLongOutage, 11-13 minutes; left out of
# `make chaos` and `make test`). One chaos row each.
chaos-outage:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=chaos-outage CHAOS_ROWS=chaos-outage-cases E2E_PKGS=. E2E_RUN='^($(E2E_CHAOS_OUTAGE))$$$$'

# Taking a node over from kube-proxy's IPVS mode (kube-proxy v1.36.3 runs
# in the bed's VM first).
takeover:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=takeover E2E_PKGS=. E2E_RUN='^($(E2E_TAKEOVER))$$$$'

# The one-node cluster: ipvs-proxy from the Helm chart with non-default
# values, monitoring on; a real Prometheus scrapes it through the chart's
# ServiceMonitor and answers both dashboards' queries.
cluster:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=cluster E2E_PKGS=. E2E_RUN='^($(E2E_CLUSTER))$$$$'

# Hash schedulers on three nodes and the outside host: every node maps a
# client to the same pod, across restarts and a scale-up.
hash:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=hash E2E_PKGS=. E2E_RUN='^($(E2E_HASH))$$$$'

# Direct server return on two nodes and the outside host: ipvs-proxy
# tunnels a LoadBalancer IP's traffic to its pod, whose node answers the
# client; the switch nat -> tunnel under held connections.
dsr:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=direct-server-return E2E_PKGS=. E2E_RUN='^($(E2E_DSR))$$$$'

# Direct server return with mh and sloppy_tcp on three nodes, the outside
# host's ECMP route over them: held connections keep their pods through a
# rehash and a node's loss; rr as the control breaks them.
dsr-ecmp:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=dsr-ecmp E2E_PKGS=. E2E_RUN='^($(E2E_DSR_ECMP))$$$$'

# Issue 43's direct server return, set up by hand on two nodes and the
# outside host (no ipvs-proxy): the prototype behind proxier/DSR.md.
dsr-prototype:
	$(MAKE) --no-print-directory e2e-run E2E_SUITE=dsr E2E_PKGS=. E2E_RUN='^($(E2E_PROTOTYPES))$$$$'

# Today's everything-at-once: the bed and checks, the bounded fuzz run,
# the Go benchmarks and the heap bench at 1,000 Services, the whole e2e
# package, the [Conformance] share on two nodes.
test-full:
	$(MAKE) --no-print-directory deps
	$(MAKE) --no-print-directory -j2 bed checks
	$(MAKE) --no-print-directory fuzz FUZZTIME=300x
	$(MAKE) --no-print-directory bench-go BENCH_GO_SIZES='1000' BENCH_GO_TIME=1x
	$(MAKE) --no-print-directory bench-heap HEAP_SIZES=1000
	$(MAKE) --no-print-directory e2e
	$(MAKE) --no-print-directory conformance-ci

# lint, unit tests (the fuzz targets' seed corpora among them: `make fuzz`
# runs the fuzzers) and a build of the e2e test binaries (they run none).
checks: lint
	$(MAKE) --no-print-directory unit
	$(E2E_GO) test -count=1 -run '^$$' ./... >/dev/null

# Each fuzz target for FUZZTIME (one -fuzz target per go test run); `make
# test` runs only their seed corpora, as unit tests. The default is a
# count of executions, not a duration: Go 1.26's fuzz coordinator can
# report its own -fuzztime deadline as a failure ("context deadline
# exceeded", no crasher written; golang/go#75804, fixed in Go 1.27), and
# a count has no deadline to race. Longer: e.g. FUZZTIME=100000x.
FUZZTIME ?= 5000x
FUZZ_TARGETS := FuzzBuild:./proxier/model FuzzSchedulerAnnotations:./scheduler \
	FuzzConfigFile:./proxier/config FuzzFlags:./proxier/config
fuzz:
	@for t in $(FUZZ_TARGETS); do \
		echo "fuzz $${t%%:*} for $(FUZZTIME)"; \
		$(GO) test -run '^$$' -fuzz "^$${t%%:*}$$" -fuzztime $(FUZZTIME) $${t#*:} || exit 1; \
	done

# Every module's dependencies at once (the agent's, the wrapper modules'
# of Kubernetes, Ginkgo and CoreDNS, the chart's), before anything builds:
# on a fresh machine the downloads overlap instead of each waiting behind
# the compiles of the build before it.
MODULES := . e2e e2e/tools/k8sbin e2e/tools/k8se2e e2e/tools/ginkgo e2e/tools/coredns e2e/tools/golangci-lint e2e/tools/govulncheck e2e/tools/cyclonedx-gomod e2e/tools/prometheus deploy/helm
deps:
	@t0=$$(date +%s); pids=; for m in $(MODULES); do (cd $$m && GOWORK=off $(GO) mod download) & pids="$$pids $$!"; done; \
		status=0; for p in $$pids; do wait $$p || status=1; done; \
		echo "deps: $(words $(MODULES)) modules' dependencies downloaded in $$(( $$(date +%s) - t0 )) s"; exit $$status

bed:
	$(E2E_CMD) ./cmd/prepare
	$(E2E_CMD) ./cmd/conformance --images --procs 2 >/dev/null

# golangci-lint (.golangci.yml; pinned by e2e/tools/golangci-lint's go.mod,
# built into bin/) over the three modules whose code is ours, after gofmt
# over every file and go vet; then vulncheck.
GOLANGCI_LINT := $(CURDIR)/bin/golangci-lint
lint:
	@bad=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...
	$(E2E_GO) vet ./...
	cd deploy/helm && $(GO) vet ./...
	$(GO) -C e2e/tools/golangci-lint build -o $(GOLANGCI_LINT) github.com/golangci/golangci-lint/v2/cmd/golangci-lint
	$(GOLANGCI_LINT) run ./...
	cd e2e && $(GOLANGCI_LINT) run --config ../.golangci.yml ./...
	cd deploy/helm && $(GOLANGCI_LINT) run --config ../../.golangci.yml ./...
	$(MAKE) --no-print-directory vulncheck
	$(MAKE) --no-print-directory monitoring-check

# govulncheck over the agent's module (what the binary and the image
# builder link), offline: govulncheck and the Go vulnerability database
# come pinned through the Go module proxy from e2e/tools/govulncheck's
# go.mod (golang.org/x/vulndb holds the database's OSV entries; its
# indexdb writes them as a database for -db file://), so vuln.go.dev is
# never asked. It fails on any vulnerability the code reaches, the Go
# standard library's included: those are fixed by the Go release that
# builds, not by go.mod.
vulncheck:
	$(GO) -C e2e/tools/govulncheck build -o $(CURDIR)/bin/govulncheck golang.org/x/vuln/cmd/govulncheck
	$(GO) -C e2e/tools/govulncheck build -o $(CURDIR)/bin/indexdb golang.org/x/vulndb/cmd/indexdb
	rm -rf bin/vulndb && bin/indexdb -vulns "$$($(GO) -C e2e/tools/govulncheck list -m -f '{{.Dir}}' golang.org/x/vulndb)/data/osv" -out bin/vulndb
	@echo "vulncheck: database golang.org/x/vulndb@$$($(GO) -C e2e/tools/govulncheck list -m -f '{{.Version}}' golang.org/x/vulndb), $$(ls bin/vulndb/ID | wc -l) entries; $$($(GO) env GOVERSION)"
	bin/govulncheck -db file://$(CURDIR)/bin/vulndb ./...

# The chart's alert rules (its PrometheusRule's spec, rendered with the
# default values) through promtool: `check rules`, then `test rules`
# with deploy/helm/promtool's cases (alerts that fire and alerts that
# do not). promtool is Prometheus's, pinned by e2e/tools/prometheus's
# go.mod and built into bin/ without service discovery (remove_all_sd:
# rule checks need none), as golangci-lint is.
PROMTOOL := $(CURDIR)/bin/promtool
MONITORING_OUT := $(CURDIR)/bin/monitoring
monitoring-check:
	$(GO) -C e2e/tools/prometheus build -tags remove_all_sd -o $(PROMTOOL) github.com/prometheus/prometheus/cmd/promtool
	rm -rf $(MONITORING_OUT) && mkdir -p $(MONITORING_OUT)
	$(GO) -C deploy/helm run ./render -alert-rules > $(MONITORING_OUT)/alerts.yaml
	cp deploy/helm/promtool/alerts_test.yaml $(MONITORING_OUT)/
	$(PROMTOOL) check rules $(MONITORING_OUT)/alerts.yaml
	cd $(MONITORING_OUT) && $(PROMTOOL) test rules alerts_test.yaml

demo:
	$(E2E_CMD) ./cmd/demo

# ipvs-proxy and kube-proxy v1.36.3 in IPVS and nftables modes side by side
# in the bed (not a test: it prints), at 1,000 and 10,000 Services of two
# endpoints and 2,000 and 5,000 of fifty; e.g.
# BENCH_ARGS="-proxies ipvs-proxy,kube-proxy-nftables -shapes 1000x2".
bench:
	$(E2E_CMD) ./cmd/bench $(BENCH_ARGS)

# The largest clusters (issue 46 part 2): 50,000 Services of two
# endpoints, 5,000 of fifty and of a hundred (250,000 and 500,000
# endpoints), ipvs-proxy and both kube-proxy modes in one run, each
# proxy's every measure bounded by BENCH_LARGE_BOUND (reported as "more
# than" it), in a VM of 6 GiB: hours, most of them kube-proxy's.
BENCH_LARGE_BOUND ?= 20m
bench-large:
	$(E2E_CMD) ./cmd/bench -shapes 50000x2,5000x50,5000x100 -proxies ipvs-proxy,kube-proxy-ipvs,kube-proxy-nftables \
		-bound $(BENCH_LARGE_BOUND) -vm-memory 6144 -datapath 0 -rounds 3 -resync-rounds 0 -floor=false $(BENCH_ARGS)

# Where the agent's memory goes, on the host (no VM): the bed's
# kube-apiserver with HEAP_SIZES Services, the proxier and its informers
# against the fake kernel; the heap's peak during the first sync, what
# stays after it by owner, and a heap profile per size in bin/heapbench.
# `make test-full` runs 1,000 Services.
HEAP_SIZES ?= 1000,10000
bench-heap:
	$(E2E_CMD) ./cmd/heapbench -sizes $(HEAP_SIZES) -out bin/heapbench

# Growth of the agent's own work (build + reconcile against the fake
# kernel) at 1k, 10k and 100k Services: time and allocations per Service,
# and one change, which must stay flat. `make test-full` runs the 1k size
# once.
BENCH_GO_SIZES ?= 1000|10000|100000
BENCH_GO_TIME ?= 3x
bench-go:
	$(GO) test -run '^$$' -bench 'Growth.*/services=($(BENCH_GO_SIZES))$$' -benchtime $(BENCH_GO_TIME) ./proxier/agent/

# One change's latency at 10,000 Services × 2 with the glue, on fake
# kernels that take time: idle, and while a periodic resync and a glue
# check run (50 changes spread over them); p50, p90, max and their ratio
# in one run (proxier/agent BenchmarkBusyChange, about a minute).
bench-busy:
	$(GO) test -run '^$$' -bench BusyChange -benchtime 1x ./proxier/agent/

# Kubernetes' own e2e tests of Services (e2e.test v1.36.3, built from Go
# modules and cached) against a running cluster; JUnit report and summary
# table in bin/conformance/$(PROXY)/. PROXY names the cluster's proxy
# (ipvs-proxy or kube-proxy); CONFORMANCE_ONLY=1 runs only the
# [Conformance] tests. Without KUBECONFIG it starts the bed's cluster of
# NODES nodes (default 1; 2 or more run the tests that need several;
# ipvs-proxy as its DaemonSet from deploy/, CoreDNS) and stops it after.
# CONFORMANCE_PROCS=N runs the tests on N parallel processes (Ginkgo's
# runner; [Serial] ones alone at the end). `make
# conformance-list` lists the focus and the skips.
# CONFORMANCE_FLAKE_ATTEMPTS=N gives a failed test up to N attempts in
# all; the summary names each test that passed only after a failed one.
# CONFORMANCE_PART=K/N runs part K of N of the tests (the whole focus on
# two nodes takes about 3 hours), reported in a folder of its own.
PROXY ?= ipvs-proxy
NODES ?= 1
CONFORMANCE_PROCS ?= 1
CONFORMANCE_FLAKE_ATTEMPTS ?= 1
conformance:
	$(E2E_CMD) ./cmd/conformance --proxy '$(PROXY)' --nodes $(NODES) $(if $(KUBECONFIG),--kubeconfig '$(KUBECONFIG)') $(if $(CONFORMANCE_ONLY),--conformance-only) $(if $(CONFORMANCE_PART),--part $(CONFORMANCE_PART)) --procs $(CONFORMANCE_PROCS) --flake-attempts $(CONFORMANCE_FLAKE_ATTEMPTS) $(CONFORMANCE_ARGS)

# Every [Conformance] test of the focus (`make test` runs a core of 13), two at
# a time, on the bed's own cluster of two nodes with ipvs-proxy's DaemonSet;
# a failed test gets a second attempt (the VM is emulated: a pod can
# stall for seconds), and the closing line names any test that needed it.
conformance-ci:
	$(MAKE) --no-print-directory conformance KUBECONFIG= PROXY=ipvs-proxy NODES=2 CONFORMANCE_ONLY=1 CONFORMANCE_PROCS=2 CONFORMANCE_FLAKE_ATTEMPTS=2

conformance-list:
	$(E2E_CMD) ./cmd/conformance --list

# Lost exec outputs counted per path in the bed's cluster (ctr, CRI,
# kubelet, apiserver SPDY/WebSocket): the diagnosis of containerd 1.6.20's
# exec bug (README, "Known loss, upstream's"). EXEC_PATHS=all adds the
# kubelet's paths.
exec-paths:
	$(E2E_GO) test -count=1 -tags execpaths -timeout 30m -run TestClusterExecPaths -v .

# Keeps the runs' figures: moves bin/results/*.json (written by testlog,
# the chaos table, the conformance runs, the bench and heapbench) into
# docs/results and writes e2e/README.md's generated tables from them.
results:
	$(E2E_CMD) ./cmd/figures -from bin/results -dir docs/results -readme e2e/README.md

clean:
	rm -rf bin
