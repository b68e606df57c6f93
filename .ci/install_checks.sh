#!/usr/bin/env bash
# Install checks, each in a fresh virtual environment outside the checkout (removed afterwards):
#   lowest      the lowest versions pyproject.toml allows (.ci/lowest_constraints.py: transformers, huggingface_hub,
#               accelerate, safetensors, numpy, tqdm, datasets) install together and pass a smoke subset of tests;
#   wheel       the built wheel installs from the README's own words and runs the README's "## Quick start" block.
# torch is always the CPU wheel found on local disk (torch==2.13.0): any other build is a multi-GB download here.
#   bash .ci/install_checks.sh [lowest] [wheel]     (both by default)
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
PYTHON=${PYTHON:-python3}
TORCH=torch==2.13.0
WORK=$(mktemp -d)
trap 'rm -rf "$WORK"' EXIT
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false PIP_DISABLE_PIP_VERSION_CHECK=1
# the smoke subset: the config, the trainer (its resume of checkpoints included), pipelines, one example script
SMOKE=(tests/test_config.py tests/test_trainer.py tests/test_pipelines.py tests/test_resume_trainer_checkpoints.py
       tests/examples/test_run_glue.py
       # transformers < 5.20 still has the old RobertaTokenizerFast, which the pipeline encodes through its generic
       # path (same windows): the test of the fast path's use does not apply
       --deselect "tests/test_pipelines.py::test_question_windows_are_the_tokenizers_own[roberta]")

fresh_venv() {  # fresh_venv DIR: a virtual environment with pip and the CPU torch wheel
    "$PYTHON" -m venv "$1"
    "$1/bin/python" -m pip install -q --upgrade pip
    "$1/bin/python" -m pip install -q "$TORCH"
}

lowest() {
    local venv=$WORK/lowest start=$SECONDS
    fresh_venv "$venv"
    "$venv/bin/python" -m pip install -q packaging
    "$venv/bin/python" .ci/lowest_constraints.py datasets > "$WORK/lowest.txt"
    echo "lowest versions: $(tr '\n' ' ' < "$WORK/lowest.txt")"
    "$venv/bin/python" -m pip install -q -c "$WORK/lowest.txt" -e ".[dev,examples]"
    "$venv/bin/python" -m pip list 2>/dev/null | grep -iE '^(torch|transformers|huggingface.hub|accelerate|datasets|safetensors|numpy|tqdm) '
    "$venv/bin/python" -m pytest -q -p no:cacheprovider -n 2 --dist loadfile "${SMOKE[@]}"
    echo "lowest versions: installed and smoke-tested in $((SECONDS - start)) s"
}

wheel() {
    local venv=$WORK/wheel start=$SECONDS
    "$PYTHON" -m pip wheel -q --no-deps --wheel-dir "$WORK/dist" . > "$WORK/build.log" 2>&1 || {
        tail -20 "$WORK/build.log"; exit 1; }
    local whl
    whl=$(ls "$WORK"/dist/optimum_ipu-*.whl)
    fresh_venv "$venv"
    # the README's install commands (its "## Install..." and "## Quick start" sections), the wheel for the package
    mapfile -t packages < <("$PYTHON" .ci/readme_blocks.py pip "$whl")
    echo "installing: ${packages[*]}"
    "$venv/bin/python" -m pip install -q "${packages[@]}"
    "$PYTHON" .ci/readme_blocks.py python > "$WORK/quick_start.py"
    # run from outside the checkout, so that the installed package is imported, not the checkout's source
    (cd "$WORK" && timeout 300 "$venv/bin/python" quick_start.py)
    echo "wheel: built, installed and ran the README's quick start in $((SECONDS - start)) s"
}

for check in "${@:-lowest wheel}"; do
    for each in $check; do
        "$each"
    done
done
