"""`benchmarks/gpu_check.sh`, the prepared GPU check, run end to end on this CPU in its tiny mode (`GPU_CHECK_TINY=1`:
the benchmark's tiny models, seq 32, 4 steps). The same script, runs and outputs as on the GPU, within the device
tool's return limits. `bert_qa_compiled` runs without `--compile` in tiny mode (a cold `torch.compile` of the tiny
model costs ~45 s on a 2-core CPU): this test checks it says so, not that compilation works."""

from __future__ import annotations

import importlib.util
import io
import json
import os
import re
import shlex
import subprocess
import sys
import tarfile

import pytest

from optimum_ipu.config import IPUConfig
from optimum_ipu.models.layout import layers_per_stage

from .conftest import PYTHON, REPO_ROOT

SCRIPT = REPO_ROOT / "benchmarks" / "gpu_check.sh"
RUNS = [
    "bert_qa_eager",
    "bert_qa_pipeline2",
    "gpt2_clm",
    "bert_qa_inference",
    "bert_qa_packed",
    "bert_qa_latency",
    "bert_qa_throughput",
    "gpt2_balance",
    "t5_balance",
    "pipeline_bubbles",
    "tensor_parallel",
    "bert_qa_compiled",
]
OTHER_RUNS = (
    "gpt2_balance",
    "t5_balance",
    "pipeline_bubbles",
    "tensor_parallel",
)  # not `optimum-ipu benchmark`: their own reports
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
# what the device tool returns from $OUT: at most 8 files, 16 MiB each, 2 folders down, plain names
MAX_FILES, MAX_BYTES, MAX_FOLDERS = 8, 16 * 2**20, 2
NAME = re.compile(r"^[A-Za-z0-9._-]+$")


def run_check(out, **env: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(out), "GPU_CHECK_TINY": "1", "PYTHON": PYTHON, "OMP_NUM_THREADS": "1", **env}
    return subprocess.run(["bash", str(SCRIPT)], capture_output=True, text=True, env=env, timeout=600)


def returned_files(out) -> list:
    """The files under `out`, checked against the device tool's limits."""
    files = [p for p in out.rglob("*") if p.is_file()]
    assert len(files) <= MAX_FILES, files
    for path in files:
        parts = path.relative_to(out).parts
        assert len(parts) - 1 <= MAX_FOLDERS and all(NAME.match(part) for part in parts), path
        assert path.stat().st_size <= MAX_BYTES, path
    return files


# One run of each kind the script handles: a benchmark under an IPU config it rewrites in tiny mode, a report of its
# own (balance), a torchrun job (the bubbles), and a run with a note (compiled). The other runs are `optimum-ipu
# benchmark` modes tested on their own (tests/test_benchmark.py, tests/test_latency_benchmark.py); their arguments
# are checked below from the dry run, in both modes. All 11 runs end to end took 232 s of the suite.
END_TO_END = ["bert_qa_pipeline2", "gpt2_balance", "pipeline_bubbles", "bert_qa_compiled"]


def dry_run(tmp_path, tiny: bool) -> dict[str, list[str]]:
    """Each run's command line from `GPU_CHECK_DRY_RUN=1`, by name."""
    result = run_check(tmp_path / "dry", GPU_CHECK_DRY_RUN="1", GPU_CHECK_TINY="1" if tiny else "0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    lines = [line[2:].split(": ", 1) for line in result.stdout.splitlines() if line.startswith("+ ")]
    return {name: shlex.split(command) for name, command in lines}


@pytest.mark.parametrize("tiny", [True, False], ids=["tiny", "gpu"])
def test_every_run_s_arguments_parse(tmp_path, tiny):
    """Every run's command line, as the GPU (or tiny mode) would run it, is taken by its parser, and names a model
    the benchmark knows and files that exist: a typo fails here, not in the session's few minutes of device time."""
    from optimum_ipu.benchmark.architectures import ARCHITECTURES
    from optimum_ipu.cli.main import build_parser

    commands = dry_run(tmp_path, tiny)
    assert list(commands) == RUNS
    schedules = importlib.util.spec_from_file_location("pipeline_schedules", SCRIPT.with_name("pipeline_schedules.py"))
    module = importlib.util.module_from_spec(schedules)
    schedules.loader.exec_module(module)
    for name, argv in commands.items():
        assert argv[0] == PYTHON, name
        if argv[1:3] == ["-m", "optimum_ipu.cli"]:
            args = build_parser().parse_args(argv[3:])  # a bad flag or value: SystemExit here
            assert args.model in ARCHITECTURES, (name, args.model)
            if getattr(args, "ipu_config", None) and not tiny:  # tiny mode's is rewritten in a folder now gone
                assert os.path.isfile(args.ipu_config), name
        elif argv[1].endswith("tensor_parallel.py"):  # it starts its own torchrun jobs, one per layout
            sys.path.insert(0, str(SCRIPT.parent))  # it imports its worker module from its own folder, as a script does
            tensor_parallel = importlib.util.spec_from_file_location("tensor_parallel", argv[1])
            benchmark = importlib.util.module_from_spec(tensor_parallel)
            tensor_parallel.loader.exec_module(benchmark)
            args = benchmark.build_parser().parse_args(argv[2:])
            assert args.mode == "steps" and args.model == ("llama-tiny" if tiny else "llama-8x1024"), argv
        else:
            assert argv[1:3] == ["-m", "torch.distributed.run"], argv
            script = next(i for i, arg in enumerate(argv) if arg.endswith("pipeline_schedules.py"))
            module.build_parser().parse_args(argv[script + 1 :])
        assert ("--compile" in argv) == (name == "bert_qa_compiled" and not tiny), name


def test_tensor_parallel_run_is_not_applicable_below_two_gpus(tmp_path):
    """On a machine with fewer than 2 GPUs (this one has none) the tensor-parallel run is said and recorded as not
    applicable, not failed: the check still exits 0."""
    out = tmp_path / "out"
    result = run_check(out, GPU_CHECK_RUNS="tensor_parallel", GPU_CHECK_TINY="0")
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-2000:]
    assert "tensor_parallel: SKIPPED, tensor parallelism needs 2 GPUs or more; this machine has 0" in result.stdout
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"]["tensor_parallel"]["status"] == "not applicable" and summary["not_ok"] == {}


def test_an_unknown_run_is_named_up_front(tmp_path):
    result = run_check(tmp_path / "out", GPU_CHECK_RUNS="bert_qa_eager,bert_qa_eagre")
    assert result.returncode == 2 and "GPU_CHECK_RUNS: unknown run 'bert_qa_eagre'" in result.stdout


@pytest.mark.slow  # four runs, a minute on a CPU
def test_tiny_gpu_check_end_to_end(tmp_path):
    out = tmp_path / "out"
    result = run_check(out, GPU_CHECK_RUNS=",".join(END_TO_END))
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

    assert {p.name for p in returned_files(out)} == {"gpu_check.log", "summary.json", "summary.png", "results.tar.gz"}
    log = (out / "gpu_check.log").read_text()
    assert "--- nvidia-smi" in log and re.search(r"versions: optimum-ipu \S+, python \S+, torch \S+", log)
    assert "stages share a device and run in turn" in log  # `optimum-ipu env` on the pipeline config
    assert log == result.stdout  # everything printed is in the log

    summary = json.loads((out / "summary.json").read_text())
    assert summary["tiny"] is True and summary["not_ok"] == {} and summary["ok"] == END_TO_END
    assert summary["versions"]["torch"] and summary["versions"]["transformers"] and summary["device"] == "cpu"
    assert list(summary["runs"]) == END_TO_END
    for name, run in summary["runs"].items():
        assert run["status"] == "ok" and run["exit_code"] == 0 and run["seconds"] > 0, name
        report = run["benchmark"]
        if name in OTHER_RUNS:
            assert report["headline"], name
            continue
        assert len(report["ratios"]) == 2 and all(r > 0 for r in report["ratios"].values()), name
        assert all(r["samples_per_second"] > 0 for r in report["results"]), name
        assert report["packing"] is None, name
    runs = summary["runs"]
    pipeline = runs["bert_qa_pipeline2"]["benchmark"]
    # 2 stages, 4 micro-batches per optimizer step: the same global batch (8) as bert_qa_eager's in tiny mode
    assert pipeline["micro_batches_per_step"] == 4 and pipeline["ipu_config"].endswith(".json")
    assert pipeline["batch_size"] == 8
    # stages balanced from measured costs, and each schedule's bubble beside its theory
    report = runs["gpt2_balance"]["benchmark"]
    assert sum(report["balanced"]["layers_per_ipu"]) == sum(report["even"]["layers_per_ipu"])
    assert len(report["balanced"]["measured_stage_s"]) == 2
    bubbles = runs["pipeline_bubbles"]["benchmark"]["schedules"]
    assert set(bubbles) == {"GPipe", "1F1B", "Interleaved1F1B", "ZeroBubble"}
    assert bubbles["1F1B"]["theory"] == pytest.approx(1 / 5) and bubbles["ZeroBubble"]["stages"] == 4
    # tiny mode skips --compile, and says so
    assert runs["bert_qa_compiled"]["benchmark"]["compile"] is False
    assert "--compile skipped" in runs["bert_qa_compiled"]["note"]

    assert (out / "summary.png").read_bytes()[:8] == PNG_MAGIC
    with tarfile.open(out / "results.tar.gz") as archive:
        names = set(archive.getnames())
        for name in END_TO_END:
            report = json.load(io.TextIOWrapper(archive.extractfile(f"{name}/benchmark.json")))
            assert report == summary["runs"][name]["benchmark"]
            if name in OTHER_RUNS:
                continue
            assert {f"{name}/benchmark.json", f"{name}/benchmark.png", f"{name}/run.log"} <= names
            assert archive.extractfile(f"{name}/benchmark.png").read()[:8] == PNG_MAGIC


def test_missing_package_is_named_in_one_line(tmp_path):
    """A package missing on the GPU machine stops the check up front, named in one line, with a summary."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text("import sys\nsys.modules['accelerate'] = None  # as if not installed\n")
    out = tmp_path / "out"
    result = run_check(out, PYTHONPATH=str(site))
    assert result.returncode == 2, result.stdout[-3000:]
    line = "gpu_check: missing Python package(s): accelerate (needed by optimum-ipu benchmark)"
    assert sum(line in row for row in result.stdout.splitlines()) == 1, result.stdout[-3000:]
    returned_files(out)
    summary = json.loads((out / "summary.json").read_text())
    assert any(line in row for row in summary["preflight_error"])
    assert set(summary["not_ok"].values()) == {"not run"} and list(summary["not_ok"]) == RUNS


def test_pipeline_config_splits_bert_base_in_two():
    """The GPU run's pipeline config: 2 stages of 6 BERT-base layers; its global batch is the batch-64 runs'."""
    config = IPUConfig.from_pretrained(str(REPO_ROOT / "benchmarks" / "ipu_config_bert_pipeline2.json"))
    assert config.ipus_per_replica == 2 and layers_per_stage(config, 12) == [6, 6]
    micro_batches = config.gradient_accumulation_steps * config.replication_factor
    assert micro_batches >= config.ipus_per_replica and 64 % micro_batches == 0
    assert "--batch-size 64" in SCRIPT.read_text()


def test_batch_that_the_pipeline_config_cannot_split_is_refused():
    """`--batch-size` is the samples of one optimizer step in every runner; ours splits it into the config's
    4 micro-batches, so a batch of 6 is refused before anything runs, naming the batch and the fix."""
    from optimum_ipu.benchmark import run_benchmark

    config = str(REPO_ROOT / "benchmarks" / "ipu_config_bert_pipeline2.json")
    with pytest.raises(ValueError, match=r"--batch-size 6: .* = 4 micro-batches; use a multiple of 4"):
        run_benchmark(model="tiny-bert-config", batch_size=6, steps=2, warmup=1, ipu_config=config)
