# ipvs-proxy. `make test` is what CI runs; `make demo` shows it working.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
GO ?= go
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -s -w -X main.version=$(VERSION)
# Kernel and end-to-end tests boot a VM under software emulation: be generous.
E2E_TIMEOUT ?= 60m

.PHONY: all build test unit e2e lint demo clean

all: build

build:
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o bin/ipvs-proxy ./cmd/ipvs-proxy

# Unit tests run on this machine (netlinkutil's kernel tests skip here and
# run inside the VM as part of e2e).
unit:
	$(GO) test -count=1 $$($(GO) list ./... | grep -v /e2e)

# The test bed: a real kube-apiserver and a QEMU VM with Debian's kernel.
e2e:
	$(GO) test -count=1 -timeout $(E2E_TIMEOUT) -v ./e2e/...

test: lint unit e2e

lint:
	@bad=$$(gofmt -l $$(find . -name '*.go' -not -path './.git/*')); if [ -n "$$bad" ]; then echo "gofmt needed:"; echo "$$bad"; exit 1; fi
	$(GO) vet ./...

demo:
	$(GO) run ./e2e/demo

clean:
	rm -rf bin
