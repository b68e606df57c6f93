#!/usr/bin/env bash
# One prepared GPU check (sized for under 8 minutes on one H200): BERT-base QA training at seq 384 / batch 64,
# eager and compiled, and GPT-2 124M causal LM at seq 1024, each against transformers.Trainer and a plain loop
# on the same batches; then BERT-base QA inference at seq 384 / batch 128 (the engine in its inference layout vs
# Trainer.predict vs a plain no_grad loop). Writes JSON, PNG and the log under $OUT (or ./gpu_check when OUT is
# unset). Not run yet: no figures of it are claimed anywhere until it has been.
# Needs: torch with CUDA, transformers, and this package importable (pip install -e . or PYTHONPATH=.).
set -euo pipefail
OUT=${OUT:-gpu_check}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1
cli="python3 -m optimum_ipu.cli benchmark --precision bf16 --peak-tflops 989"
{
  nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
  $cli --model bert-base-uncased-config --task question-answering --seq-len 384 --batch-size 64 \
       --steps 30 --warmup 5 --output-dir "$OUT/bert_qa_eager"
  $cli --model bert-base-uncased-config --task question-answering --seq-len 384 --batch-size 64 \
       --steps 30 --warmup 8 --compile --output-dir "$OUT/bert_qa_compiled"
  $cli --model gpt2-config --task causal-lm --seq-len 1024 --batch-size 16 \
       --steps 20 --warmup 5 --output-dir "$OUT/gpt2_clm"
  $cli --mode inference --model bert-base-uncased-config --task question-answering --seq-len 384 \
       --batch-size 128 --steps 30 --warmup 5 --output-dir "$OUT/bert_qa_inference"
} 2>&1 | tee "$OUT/gpu_check.log"
