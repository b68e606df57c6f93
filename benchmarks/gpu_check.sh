#!/usr/bin/env bash
# One prepared GPU check, sized for under 8 minutes on one H200. Each run is `optimum-ipu benchmark` in its own
# process (ours vs transformers vs a plain loop, same batches, random weights, bf16); a run that fails or overruns
# is recorded and the next one runs. In order (the compiled run last: it costs the most and gets what is left):
#
#   run                 what                                                           H200 estimate (s)
#   preflight           versions, nvidia-smi, imports, `optimum-ipu env`                  10
#   bert_qa_eager       BERT-base QA training, seq 384, batch 64, 30 steps                 30  (~1,200 samples/s:
#                       53 ms a step, x 90 steps; process start, imports, 4 model builds)
#   bert_qa_pipeline2   the same with benchmarks/ipu_config_bert_pipeline2.json: 2 stages   30
#                       (layers 6 + 6) in turn on the one GPU, 4 micro-batches of 16 per step (global batch 64)
#   gpt2_clm            GPT-2 124M causal LM training, seq 1024, batch 16, 20 steps         30
#   bert_qa_inference   BERT-base QA inference (engine vs Trainer.predict vs no_grad),      25
#                       seq 384, batch 128, 30 steps
#   bert_qa_packed      --packing: real SQuAD feature lengths; ours 30 steps of 64 packed   40  (~2.1 features a
#                       rows (~4,100 features) vs the same features padded, 64 a step (~64   row: ~2.1x the
#                       steps) in the baselines; SQuAD features/s                            features of a step)
#   bert_qa_latency     --mode latency: 200 SQuAD questions answered one at a time, end to 150  (6 buckets compiled
#                       end: pipeline() compiled per bucket with CUDA graphs in fp16 (auto)      up front, ~15 s
#                       and eager fp16 in buckets vs transformers eager fp32 padded to 384        each)
#                       (vs ONNX Runtime on the CPU when installed); p50/p90/p99 ms
#   bert_qa_throughput  --mode throughput: batches of 32 questions, pipeline() eager fp16     40
#                       in buckets vs the same baselines; requests/s
#   gpt2_balance        optimum-ipu config balance gpt2-config --n-ipu 4: each layer timed     25
#                       on the GPU, balanced split vs even, each stage of both timed apart
#   t5_balance          the same for t5-small-config (encoder-decoder) on 2 stages             20
#   pipeline_bubbles    benchmarks/pipeline_schedules.py on 2 CPU processes (the host's idle     60
#                       cores): GPipe, 1F1B, Interleaved1F1B, ZeroBubble, bubble vs theory
#   tensor_parallel     benchmarks/tensor_parallel.py --mode steps on 2 GPUs: one process vs     60  (skipped, said
#                       tensor_parallel_size=2 vs 2 pipeline stages, 160 M Llama, s/step          and recorded, with
#                                                                                                 fewer than 2 GPUs)
#   bert_qa_compiled    bert_qa_eager under torch.compile, 30 steps (8 warm-up)            250  (~1,500 samples/s;
#                       compilation 60-120 s per compiled runner, the later ones partly from the caches)
#   summary             summary.json, summary.png, results.tar.gz                            5
#   total                                                                                715  (775 with 2 GPUs; hard stop: below)
#
# Budget: GPU_CHECK_BUDGET_S (default 520 s: the device tool allows 600 s a command and 15 minutes a session,
# machine start included; the compiled run, last, gets what is left) bounds the whole check: each run has a time limit (`timeout`) of at
# most what is left, less 20 s kept for the summary; a run with under 30 s left is skipped and recorded so.
#
# Writes under $OUT (./gpu_check when unset) four files, within the device tool's 8: gpu_check.log (everything
# printed), summary.json (date, GPU, versions, and per run its status, exit code, seconds, estimate and whole
# benchmark.json), summary.png (one panel per run) and results.tar.gz (each run's folder under its name:
# benchmark.json, benchmark.png, run.log). Exit 0 when every run succeeded, 1 when one did not, 2 when the
# package cannot be imported (the missing packages named in one line).
#
# GPU_CHECK_TINY=1: the same script on a CPU in about a minute (CI: tests/test_gpu_check.py): the benchmark's tiny
# models, seq 32, batch 8, 4 steps (latency / throughput: seq 64, 4 requests / 2 batches of 4, our eager backend) (bert_qa_packed: SQuAD lengths scaled to seq 32), fp32 (Trainer refuses bf16 on a CPU), no --peak-tflops; bert_qa_compiled then
# runs without --compile (a cold torch.compile of the tiny model took ~45 s on a 2-core CPU) and says so.
#
# GPU_CHECK_RUNS=name,name: only these runs (e.g. a rerun of the ones that failed, in what is left of the session's
# device time); the summary lists only them. An unknown name stops the check up front (exit 2), naming it.
# GPU_CHECK_DRY_RUN=1: print each selected run's command line (`+ NAME: COMMAND`, shell-quoted) and run nothing: what
# CI checks every run's arguments with, in both modes, without the minutes they take.
#
# Needs: python3 (or $PYTHON) with torch and transformers; this package is taken from this checkout (PYTHONPATH).
set -uo pipefail # no -e: a failed run is recorded, and the next one runs

here=$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)
root=$(dirname "$here")
OUT=${OUT:-gpu_check}
mkdir -p "$OUT" && OUT=$(cd "$OUT" && pwd) || exit 2
cd "$root" || exit 2
PY=${PYTHON:-python3}
tiny=${GPU_CHECK_TINY:-0}
budget=${GPU_CHECK_BUDGET_S:-520}
reserve=20 # seconds kept for the final summary and chart
work=$(mktemp -d "${TMPDIR:-/tmp}/gpu_check.XXXXXX") || exit 2
trap 'rm -rf "$work"' EXIT
# This checkout's package, installed or not (the device machine runs a bare copy of the repository).
export PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}"
export HF_HUB_OFFLINE=1 PYTHONUNBUFFERED=1 TQDM_DISABLE=1

runs=(bert_qa_eager bert_qa_pipeline2 gpt2_clm bert_qa_inference bert_qa_packed bert_qa_latency bert_qa_throughput
  gpt2_balance t5_balance pipeline_bubbles tensor_parallel bert_qa_compiled)
dry=${GPU_CHECK_DRY_RUN:-0}
if [[ -n ${GPU_CHECK_RUNS:-} ]]; then
  IFS=, read -r -a chosen <<<"$GPU_CHECK_RUNS"
  for name in "${chosen[@]}"; do
    if [[ " ${runs[*]} " != *" $name "* ]]; then
      echo "gpu_check: GPU_CHECK_RUNS: unknown run '$name'; choose from: ${runs[*]}"
      exit 2
    fi
  done
  selected=()
  for name in "${runs[@]}"; do # in the script's order, which is the order they run in
    [[ ",$GPU_CHECK_RUNS," == *",$name,"* ]] && selected+=("$name")
  done
  runs=("${selected[@]}")
fi
pipeline_config="$here/ipu_config_bert_pipeline2.json"
if [[ $tiny == 1 ]]; then
  bert=tiny-bert-config gpt2=tiny-gpt2-config t5=tiny-t5-config
  balance_gpt2=(--n-ipu 2 --seq-len 32 --repeats 1 --warmup 1) balance_t5=(--n-ipu 2 --seq-len 32 --repeats 1 --warmup 1)
  bubbles=(--layers 4 --seq-len 32 --steps 2)
  tensor_parallel=(--model llama-tiny --steps 3) # 2 gloo CPU processes
  bert_train=(--seq-len 32 --batch-size 8 --steps 4 --warmup 1)
  gpt2_train=(--seq-len 32 --batch-size 4 --steps 4 --warmup 1)
  bert_infer=(--seq-len 32 --batch-size 8 --steps 4 --warmup 1)
  compiled=(--steps 4 --warmup 1)
  latency=(--seq-len 64 --steps 4 --warmup 1 --backends eager) # no torch.compile on the CPU (see below)
  throughput=(--seq-len 64 --batch-size 4 --steps 2 --warmup 1 --backends eager)
  compile_note="tiny mode: --compile skipped (a cold torch.compile of the tiny model took ~45 s on a 2-core CPU)"
  common=(--precision fp32) # transformers.Trainer refuses bf16 on a CPU
  summary_flags=(--tiny)
  # tiny BERT has 2 layers: one per stage; every other field as on the GPU
  "$PY" - "$pipeline_config" "$work/ipu_config_pipeline2_tiny.json" <<'EOF' || exit 2
import json, sys
config = json.load(open(sys.argv[1]))
config["layers_per_ipu"] = [1, 1]
json.dump(config, open(sys.argv[2], "w"))
EOF
  pipeline_config="$work/ipu_config_pipeline2_tiny.json"
else
  bert=bert-base-uncased-config gpt2=gpt2-config t5=t5-small-config
  balance_gpt2=(--n-ipu 4 --seq-len 1024 --batch-size 8 --micro-batches 16)
  balance_t5=(--n-ipu 2 --seq-len 512 --batch-size 8 --micro-batches 8)
  bubbles=(--layers 8 --seq-len 128 --steps 5)
  tensor_parallel=(--model llama-8x1024 --steps 8)
  bert_train=(--seq-len 384 --batch-size 64 --steps 30 --warmup 5)
  gpt2_train=(--seq-len 1024 --batch-size 16 --steps 20 --warmup 5)
  bert_infer=(--seq-len 384 --batch-size 128 --steps 30 --warmup 5)
  compiled=(--compile --steps 30 --warmup 8)
  latency=(--seq-len 384 --steps 200 --warmup 10 --backends auto eager)
  throughput=(--seq-len 384 --batch-size 32 --steps 10 --warmup 2 --backends eager)
  compile_note=""
  common=(--precision bf16 --peak-tflops 989) # H200 dense bf16 peak, for MFU
  summary_flags=()
fi

summarize() {
  "$PY" "$here/gpu_check_report.py" summarize --work "$work" --out "$OUT" --runs "$(IFS=,; echo "${runs[*]}")" \
    ${summary_flags[@]+"${summary_flags[@]}"} "$@"
}

record() { # record NAME EXIT_CODE START END ESTIMATE NOTE: one line of runs.tsv, read by summarize
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$@" >>"$work/runs.tsv"
}

limited() { # limited SECONDS COMMAND...: the command, stopped after SECONDS (exit 124) where `timeout` exists
  if command -v timeout >/dev/null; then timeout -k 15 "$@"; else shift; "$@"; fi
}

bench() { # bench NAME ESTIMATE_S LIMIT_S NOTE ARGS...: one `optimum-ipu benchmark` run
  local name=$1 estimate=$2 cap=$3 note=$4
  shift 4
  run_one "$name" "$estimate" "$cap" "$note" "$PY" -m optimum_ipu.cli benchmark "${common[@]}" "$@" --output-dir "$work/$name"
}

run_one() { # run_one NAME ESTIMATE_S LIMIT_S NOTE COMMAND...: one run in its own process, never fatal; it writes
  # $work/NAME/benchmark.json (what summarize merges)
  local name=$1 estimate=$2 cap=$3 note=$4
  shift 4
  [[ " ${runs[*]} " == *" $name "* ]] || return 0 # not among GPU_CHECK_RUNS
  if [[ $dry == 1 ]]; then
    printf '+ %s:' "$name" && printf ' %q' "$@" && echo
    return 0
  fi
  local dir="$work/$name" left=$((budget - reserve - SECONDS)) start rc
  mkdir -p "$dir"
  start=$(date +%s.%N)
  if ((left < 30)); then
    echo "=== $name: SKIPPED, ${left}s left of the ${budget}s budget"
    record "$name" 0 "$start" "$start" "$estimate" "skipped: ${left}s left of the ${budget}s budget"
    summarize >/dev/null
    return
  fi
  ((cap > left)) && cap=$left
  echo "=== $name (H200 estimate ${estimate}s, limit ${cap}s)${note:+ [$note]}"
  echo "+ $*"
  limited "$cap" "$@" 2>&1 | tee "$dir/run.log"
  rc=${PIPESTATUS[0]}
  record "$name" "$rc" "$start" "$(date +%s.%N)" "$estimate" "$note"
  case $rc in
  0) echo "=== $name: ok" ;;
  124 | 137) echo "=== $name: TIMED OUT after ${cap}s (exit $rc); carrying on" ;;
  *) echo "=== $name: FAILED (exit $rc); carrying on" ;;
  esac
  summarize >/dev/null # after every run: a check stopped half-way still leaves what ran
}

main() {
  SECONDS=0
  echo "gpu_check: $(date '+%Y-%m-%d %H:%M:%S %Z'), tiny=$tiny, budget ${budget}s, OUT=$OUT"
  echo "--- nvidia-smi"
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee "$work/gpu.txt"
  else
    echo "nvidia-smi: not found (no NVIDIA driver here)"
  fi
  echo "--- preflight ($PY)"
  if ! "$PY" "$here/gpu_check_report.py" preflight --work "$work" --ipu-config "$pipeline_config" 2>&1 |
    tee "$work/preflight.log"; then
    echo "gpu_check: preflight failed: no benchmark can run (see the line above)"
    summarize # no chart: matplotlib may be what is missing
    return 2
  fi
  echo "--- pipeline config of bert_qa_pipeline2"
  "$PY" -m optimum_ipu.cli config check "$pipeline_config"
  all_runs
  report
}

all_runs() { # every run, in order; run_one leaves out those not selected (GPU_CHECK_RUNS)
  bench bert_qa_eager 30 120 "" --model "$bert" --task question-answering "${bert_train[@]}"
  bench bert_qa_pipeline2 30 120 "2 stages in turn on one device" --model "$bert" --task question-answering \
    "${bert_train[@]}" --ipu-config "$pipeline_config"
  bench gpt2_clm 30 120 "" --model "$gpt2" --task causal-lm "${gpt2_train[@]}"
  bench bert_qa_inference 25 120 "" --mode inference --model "$bert" --task question-answering "${bert_infer[@]}"
  bench bert_qa_packed 40 120 "" --model "$bert" --task question-answering --packing "${bert_train[@]}"
  bench bert_qa_latency 150 240 "" --mode latency --model "$bert" "${latency[@]}"
  bench bert_qa_throughput 40 120 "" --mode throughput --model "$bert" "${throughput[@]}"
  run_one gpt2_balance 25 90 "" "$PY" -m optimum_ipu.cli config balance "$gpt2" "${balance_gpt2[@]}" --measure-stages \
    --json "$work/gpt2_balance/benchmark.json"
  run_one t5_balance 20 90 "" "$PY" -m optimum_ipu.cli config balance "$t5" "${balance_t5[@]}" --measure-stages \
    --json "$work/t5_balance/benchmark.json"
  run_one pipeline_bubbles 60 150 "CPU processes" "$PY" -m torch.distributed.run --standalone --nproc_per_node 2 \
    "$here/pipeline_schedules.py" "${bubbles[@]}" --json "$work/pipeline_bubbles/benchmark.json"
  tensor_parallel_run
  bench bert_qa_compiled 250 400 "$compile_note" --model "$bert" --task question-answering "${bert_train[@]}" \
    "${compiled[@]}"
}

tensor_parallel_run() { # one process vs tensor_parallel_size=2 vs 2 stages (benchmarks/tensor_parallel.py): 2 GPUs
  # or more (NCCL); with fewer, recorded as skipped and said (tiny mode: 2 gloo CPU processes)
  local gpus
  gpus=$("$PY" -c 'import torch; print(torch.cuda.device_count())' 2>/dev/null || echo 0)
  if [[ $tiny != 1 && $dry != 1 && ${gpus:-0} -lt 2 ]]; then
    [[ " ${runs[*]} " == *" tensor_parallel "* ]] || return 0
    echo "=== tensor_parallel: SKIPPED, tensor parallelism needs 2 GPUs or more; this machine has ${gpus:-0}"
    record tensor_parallel 0 "$(date +%s.%N)" "$(date +%s.%N)" 60 \
      "not applicable: tensor parallelism needs 2 GPUs or more, this machine has ${gpus:-0}"
    summarize >/dev/null
    return
  fi
  run_one tensor_parallel 60 180 "2 processes" "$PY" "$here/tensor_parallel.py" --mode steps "${tensor_parallel[@]}" \
    --out "$work/tensor_parallel/benchmark.json"
}

report() { # the summary, its chart and a table of the runs
  echo "--- summary (${SECONDS}s so far)"
  summarize --chart
  local status=$?
  "$PY" - "$OUT/summary.json" <<'EOF'
import json, sys
summary = json.load(open(sys.argv[1]))
for name, run in summary["runs"].items():
    ratios = run.get("benchmark", {}).get("ratios", {})
    shown = ", ".join(f"{k}: {v:.3f}" for k, v in ratios.items())
    seconds, estimate = run.get("seconds", 0), run.get("h200_estimate_s", 0)
    print(f"{name:18s} {run['status']:9s} {seconds:6.1f}s (H200 estimate {estimate}s)  {shown}")
EOF
  echo "gpu_check: done in ${SECONDS}s; under $OUT:"
  ls -l "$OUT"
  return $status
}

if [[ $dry == 1 ]]; then
  all_runs
  exit 0
fi
main 2>&1 | tee "$OUT/gpu_check.log"
exit "${PIPESTATUS[0]}"
