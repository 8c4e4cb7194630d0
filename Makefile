# The two commands of the README:
#   make up     install system packages, build, install the binary, start the quickstart
#   make test   install system packages, build, run every test
# And: make bench  full performance report into docs/benchmarks.{md,json,svg}
#      make images the Kubernetes harness's images, pushed to its registry
#                  (scripts/kube-cluster.sh up first; docs/kube-harness.md)
# Both need root (network namespaces, cgroups, apt-get).

TARGET_DIR := $(or $(CARGO_TARGET_DIR),/var/tmp/slipstream-target)
BIN        := $(TARGET_DIR)/release/slipstream
PREFIX     ?= /usr/local

.PHONY: setup build install up test bench down clean images

setup:
	./scripts/setup.sh

build: setup
	cargo build --release --locked -p slipstream-cli

install: build
	install -m 0755 $(BIN) $(PREFIX)/bin/slipstream
	@echo "installed $(PREFIX)/bin/slipstream"

up: install
	$(PREFIX)/bin/slipstream up

bench: build
	$(BIN) bench --update-docs

down:
	$(BIN) down

test: setup
	./scripts/test.sh

images: build
	./scripts/kube-images.sh

clean:
	cargo clean
