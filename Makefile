# Two entry points for a fresh machine: `make run` and `make test`. Each builds .venv itself.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
# The CPU build of torch that this machine's pip finds on local disk; other machines may pick
# their own with `make TORCH_SPEC=torch ...`.
TORCH_SPEC ?= torch==2.13.0
PROMPT ?= What is the capital of France?

.PHONY: run chat test venv clean

$(BIN)/ladle: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[server,test]"
	touch $(BIN)/ladle

venv: $(BIN)/ladle

# The main job: serve the default model on http://127.0.0.1:8000 (OpenAI-compatible).
run: venv
	$(BIN)/ladle serve

# A one-shot answer from the default model, no server.
chat: venv
	$(BIN)/ladle chat --prompt "$(PROMPT)"

# Tests marked `slow` (more than ~10 s alone on a quiet 2-core machine, fixture included, or a
# server/model of their own beyond the session's shared ones) run only in CI, where .ci/run sets
# CI=true; `make test CI=true` runs them locally too. -rs prints every skip's reason.
PYTEST_SELECT := $(if $(filter true 1 yes,$(CI)),,-m "not slow")

# The Ray Serve tests (issue 13) need the `ray` extra: `make test` adds it (about 40 s), `make run`
# stays as light as before.
$(VENV)/.ray-extra: $(BIN)/ladle
	$(BIN)/pip install -q -e ".[ray]"
	touch $@

test: venv $(VENV)/.ray-extra
	$(BIN)/python -m pytest -q -x -rs --timeout=900 $(PYTEST_SELECT) tests

clean:
	rm -rf $(VENV)
