# The two commands of the README. Each does its own set-up on a fresh machine.
#   make run   - train the laptop GRPO recipe end to end (the main job)
#   make test  - the whole test suite (what .ci/run calls)

CARGO ?= cargo

.PHONY: run test setup setup-test

setup:
	bash scripts/setup-libtorch.sh

setup-test: setup
	bash scripts/setup-test-deps.sh

# Each `make run` is a fresh run in runs/grpo-laptop (the previous one is replaced).
run: setup
	rm -rf runs/grpo-laptop
	$(CARGO) build --release --locked --bins
	./target/release/miles run recipes/grpo-laptop.miles --out runs/grpo-laptop --threads 1
	./target/release/miles report runs/grpo-laptop

test: setup-test
	bash scripts/deny.sh
	$(CARGO) test --workspace --locked
