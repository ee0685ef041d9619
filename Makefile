# Two commands do all set-up on a fresh machine: `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# torch 2.13.0 CPU comes from the machine's local wheel store; pinning it keeps pip from
# pulling a multi-GB CUDA build.
TORCH ?= torch==2.13.0

.PHONY: env demo test bench-plan clean

$(BIN)/liver: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH)"
	$(BIN)/pip install -q -e ".[test,sim,megatron]"
	touch $@

env: $(BIN)/liver

demo: env
	OMP_NUM_THREADS=1 $(BIN)/liver run --digest

test: env
	OMP_NUM_THREADS=1 $(BIN)/python -m pytest -q -x --durations=25 tests

clean:
	rm -rf $(VENV) runs
