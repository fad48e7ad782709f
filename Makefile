# Tiergate: build, test, benchmark and demo. Run as root on Debian 12 with Go.
#   make demo   - install what is needed, build, and run the stack as far as it exists
#   make test   - install what is needed, then vet, staticcheck and the whole test suite
#   make bench  - every benchmark against its peer, in one run

SHELL      := /bin/bash
GO         ?= go
GOBIN      := $(shell $(GO) env GOPATH)/bin
STATICCHECK_VERSION := v0.8.2
STATICCHECK := $(GOBIN)/staticcheck
BIN        := bin
DEB_PACKAGES := softhsm2 opensc libdpdk-dev pkg-config openssl iproute2 curl procps nginx haproxy tshark ethtool etcd-server crowdsec prometheus chromium bird2 nghttp2-client wrk nftables linux-perf
DEMO_DIR   ?= $(CURDIR)/.demo
# More tgdemo flags: make demo DEMO_FLAGS="-duration 30s"
DEMO_FLAGS ?=
# bench-l4 flags, e.g. only the defence rows: make bench-l4 BENCH_L4_FLAGS="-phases defence"
BENCH_L4_FLAGS ?=
TEST_TIMEOUT ?= 40m

# Patches to the standard library (stdpatch/, see its doc.go): a `go build -overlay`
# file and the build tag whose test requires it, passed to every go command below when
# the patched files' originals are those of the Go in use. Otherwise the build goes on
# with the standard library as it is, and says so; but when the Go in use is the
# release the patches were made from, overlay.sh exits non-zero and `make test` fails
# (stdpatch-check) instead of testing the unpatched standard library.
STDPATCH_OVERLAY := $(shell stdpatch/overlay.sh $(GO) $(CURDIR)/.build/stdpatch-overlay.json)
STDPATCH_STATUS  := $(.SHELLSTATUS)
ifneq ($(STDPATCH_OVERLAY),)
export GOFLAGS := $(strip $(GOFLAGS) -overlay=$(STDPATCH_OVERLAY) -tags=tiergate_stdpatch)
endif

.PHONY: all build deps ui-assets test stdpatch-check vet lint unit fuzz bench bench-keyserver bench-handshake bench-policy bench-l4 bench-l4-cluster bench-control bench-blacklist demo clean vuln

all: build

# Debian packages (apt-get only when one is missing), staticcheck and Go modules. The
# services some packages bring (nginx, haproxy: peers for the benchmarks; bird: the BGP
# router of the L4 cluster tests, started by them in a namespace; etcd: the
# external store the control-plane tests start themselves; crowdsec: the risk engine whose
# Local API the crowdsec tests run themselves) are not started: policy-rc.d refuses that
# during the install, and they are disabled so a reboot does not start them. crowdsec's
# install registers with its online API unless that credentials file is already there, so
# one saying it is not used is put there first (the machine may have no way out).
deps:
	@missing=$$(for p in $(DEB_PACKAGES); do dpkg-query -W -f='$${Status}\n' $$p 2>/dev/null | grep -q '^install ok installed' || printf '%s ' $$p; done); \
	if [ -n "$$missing" ]; then \
		echo "deps: installing $$missing"; \
		if [ "$$(id -u)" != 0 ]; then echo "deps: must run as root to install: $$missing" >&2; exit 1; fi; \
		guard=; if [ ! -e /usr/sbin/policy-rc.d ]; then guard=1; printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d; chmod +x /usr/sbin/policy-rc.d; fi; \
		case " $$missing " in *" crowdsec "*) mkdir -p /etc/crowdsec; [ -s /etc/crowdsec/online_api_credentials.yaml ] || echo '# not registered with the online API' > /etc/crowdsec/online_api_credentials.yaml;; esac; \
		apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends $$missing >/dev/null; rc=$$?; \
		[ -n "$$guard" ] && rm -f /usr/sbin/policy-rc.d; \
		if [ $$rc = 0 ] && command -v systemctl >/dev/null; then systemctl disable -q nginx haproxy etcd crowdsec prometheus bird nftables 2>/dev/null || true; systemctl stop crowdsec prometheus bird 2>/dev/null || true; fi; exit $$rc; \
	fi
	@[ -x $(STATICCHECK) ] && $(STATICCHECK) -version 2>/dev/null | grep -q "$(STATICCHECK_VERSION:v%=%)" || { echo "deps: installing staticcheck $(STATICCHECK_VERSION)"; $(GO) install honnef.co/go/tools/cmd/staticcheck@$(STATICCHECK_VERSION); }
	@$(GO) mod download

# controld's /ui page draws with uPlot, vendored in control/ui/assets so that go build
# needs neither npm nor a network. This fetches the same npm package again from the
# registry (npm pack), checks the tarball against the integrity control/ui/server.go
# records (UPlotIntegrity) and its files against their SHA-256 (TestAssetsPinned).
UPLOT_VERSION = $(shell sed -n 's/.*UPlotVersion *= *"\(.*\)"/\1/p' control/ui/server.go)
ui-assets:
	@tmp=$$(mktemp -d) && trap 'rm -rf "$$tmp"' EXIT && cd "$$tmp" && \
	npm pack --silent uplot@$(UPLOT_VERSION) >/dev/null && \
	want=$$(sed -n 's/.*UPlotIntegrity *= *"\(.*\)"/\1/p' $(CURDIR)/control/ui/server.go) && \
	got="sha512-$$(openssl dgst -sha512 -binary uplot-$(UPLOT_VERSION).tgz | base64 -w0)" && \
	if [ "$$got" != "$$want" ]; then echo "ui-assets: uplot $(UPLOT_VERSION) from npm is $$got, not $$want" >&2; exit 1; fi && \
	tar xzf uplot-$(UPLOT_VERSION).tgz && \
	cp package/dist/uPlot.iife.min.js package/dist/uPlot.min.css $(CURDIR)/control/ui/assets/ && \
	cp package/LICENSE $(CURDIR)/control/ui/assets/uPlot.LICENSE
	$(GO) test -count=1 -run TestAssetsPinned ./control/ui

build:
	@mkdir -p $(BIN)
	$(GO) build -o $(BIN)/ ./cmd/...

vet:
	$(GO) vet ./...

lint: vet
	$(STATICCHECK) ./...

# Fails when stdpatch/overlay.sh did (see STDPATCH_OVERLAY above).
stdpatch-check:
	@if [ "$(STDPATCH_STATUS)" != 0 ]; then \
		echo "stdpatch: overlay.sh failed (exit status $(STDPATCH_STATUS), reason above): the standard library patches were not applied on the Go they were made from; failing rather than testing without them" >&2; \
		exit 1; \
	fi

# TIERGATE_REQUIRE_ALL=1 turns every "needs root / needs package X" skip into a failure,
# so a green run means every test really ran.
unit: stdpatch-check
	TIERGATE_REQUIRE_ALL=1 $(GO) test -race -count=1 -timeout $(TEST_TIMEOUT) ./...

test: deps stdpatch-check lint unit

# Short coverage-guided runs of every fuzz target (seeds also run in `make test`).
FUZZTIME ?= 20s
fuzz:
	@set -e; for pkg in $$($(GO) list ./...); do \
		for f in $$($(GO) test -list '^Fuzz' $$pkg | grep '^Fuzz' || true); do \
			echo "fuzz $$pkg $$f"; $(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) -fuzzminimizetime=1s $$pkg; \
		done; done

# govulncheck against the Go vulnerability database: vuln.go.dev where it is reachable,
# else one built from the golang.org/x/vulndb module (tools/vuln.sh says which, and
# how old). It fails when the code calls a known vulnerability, and when no database
# could be had: never a silent pass.
vuln:
	GO=$(GO) tools/vuln.sh

bench: bench-keyserver bench-handshake bench-policy bench-l4 bench-l4-cluster bench-control bench-blacklist

bench-keyserver: deps build
	$(GO) run ./bench/keyserver

# Built, not `go run`: the floor servers are this program re-executed, and its CPU
# breakdown reads their functions' names from the binary's symbol table, which
# `go run` leaves out.
bench-handshake: deps build
	$(GO) build -o $(BIN)/bench-handshake ./bench/handshake && $(BIN)/bench-handshake

bench-policy: deps build
	$(GO) run ./bench/policy

bench-l4: deps build
	$(GO) run ./bench/l4 $(BENCH_L4_FLAGS)

bench-l4-cluster: deps build
	$(GO) run ./bench/l4cluster

bench-control: deps build
	$(GO) run ./bench/control

bench-blacklist: deps build
	$(GO) run ./bench/blacklist -bin $(BIN)

demo: deps build
	$(BIN)/tgdemo -dir $(DEMO_DIR) -bin $(BIN) $(DEMO_FLAGS)

clean:
	rm -rf $(BIN) $(DEMO_DIR)
