"""The benchmark harness behind `optimum-ipu benchmark` (DESIGN.md: the layer below `cli`, which only dispatches
to it): ours against plain `transformers` and the best alternative, in one run, on the same work.

- `run`: `run_benchmark` (every mode) and `format_report`; `--mode train | inference` timed steps;
- `architectures`: the named architectures (random weights), their batches and FLOPs counts;
- `runners`: the training / inference runners (ours, `transformers.Trainer`, a plain PyTorch loop);
- `packing`: the `--packing` workload (real SQuAD feature lengths, packed rows and padded features);
- `report`: the `--mode train | inference` report, chart and table, and what every report shares;
- `latency`: `--mode latency | throughput`, answering SQuAD requests end to end (`qa_runners`, `squad`,
  `latency_report`);
- `speech_latency`: `--mode latency --task automatic-speech-recognition`, transcribing recordings one at a time (ours
  vs `transformers`' pipeline on the same model folder);
- `recipe`: `--mode recipe`, `IPUTrainer` against `transformers.Trainer` on the demo's question-answering recipe
  (real SQuAD features, a pretrained model), each run in its own process;
- `serve`: `--mode serve`, `optimum-ipu serve` against `transformers serve` on the same requests, each server in its
  own process (`serve_load` starts them and sends the load, `serve_report` writes the report), or with
  `--task question-answering` our server's overhead over `pipeline()` in process;
- `squad_accuracy`: the SQuAD EM/F1 of each `pipeline()` backend on a fine-tuned model
  (`python -m optimum_ipu.benchmark.squad_accuracy`; not imported here, so that it runs as a module cleanly).

The library below imports neither matplotlib nor tqdm: they are drawn here and in `cli` only, matplotlib when a chart
is drawn.
"""

from .architectures import ARCHITECTURES, TASKS, flops_per_sample
from .latency import LATENCY_MODES, run_latency_benchmark
from .latency_report import format_latency_report
from .run import MODES, format_report, run_benchmark
from .serve import SERVE_TASKS, run_serve_benchmark
from .serve_report import format_serve_report

__all__ = [
    "run_benchmark",
    "format_report",
    "run_latency_benchmark",
    "format_latency_report",
    "run_serve_benchmark",
    "format_serve_report",
    "SERVE_TASKS",
    "flops_per_sample",
    "ARCHITECTURES",
    "TASKS",
    "MODES",
    "LATENCY_MODES",
]
