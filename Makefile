.PHONY: test run build

test: ## every test: installs redis-server if missing, go vet, go test -race
	./scripts/test

run: ## tablease on the embedded memory engine, in dev mode
	go run ./cmd/tablease serve --dev

build:
	go build -o bin/tablease ./cmd/tablease
