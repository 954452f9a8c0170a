.PHONY: test run build

test: ## every test, as CI runs it (scripts/test: installs what it needs if missing)
	./scripts/test

run: ## tablease on the embedded memory engine, in dev mode
	go run ./cmd/tablease serve --dev

# VERSION is what `tablease version` prints: the commit, from git, unless given.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo devel)

build: ## bin/tablease, its version the commit it was built from
	go build -ldflags "-X main.version=$(VERSION)" -o bin/tablease ./cmd/tablease
