"""`benchmarks/gpu_check.sh`, the prepared GPU check, run end to end on this CPU in its tiny mode (`GPU_CHECK_TINY=1`:
the benchmark's tiny models, seq 32, 4 steps). The same script, runs and outputs as on the GPU, within the device
tool's return limits. `bert_qa_compiled` runs without `--compile` in tiny mode (a cold `torch.compile` of the tiny
model costs ~45 s on a 2-core CPU): this test checks it says so, not that compilation works."""

from __future__ import annotations

import io
import json
import os
import re
import subprocess
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
    "bert_qa_compiled",
]
OTHER_RUNS = ("gpt2_balance", "t5_balance", "pipeline_bubbles")  # not `optimum-ipu benchmark`: their own reports
BENCHMARK_RUNS = [name for name in RUNS if name not in OTHER_RUNS]
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


@pytest.mark.slow  # the whole script, a minute or two on a CPU
def test_tiny_gpu_check_end_to_end(tmp_path):
    out = tmp_path / "out"
    result = run_check(out)
    assert result.returncode == 0, result.stdout[-4000:] + result.stderr[-2000:]

    assert {p.name for p in returned_files(out)} == {"gpu_check.log", "summary.json", "summary.png", "results.tar.gz"}
    log = (out / "gpu_check.log").read_text()
    assert "--- nvidia-smi" in log and re.search(r"versions: optimum-ipu \S+, python \S+, torch \S+", log)
    assert "stages share a device and run in turn" in log  # `optimum-ipu env` on the pipeline config
    assert log == result.stdout  # everything printed is in the log

    summary = json.loads((out / "summary.json").read_text())
    assert summary["tiny"] is True and summary["not_ok"] == {} and summary["ok"] == RUNS
    assert summary["versions"]["torch"] and summary["versions"]["transformers"] and summary["device"] == "cpu"
    assert list(summary["runs"]) == RUNS
    for name, run in summary["runs"].items():
        assert run["status"] == "ok" and run["exit_code"] == 0 and run["seconds"] > 0, name
        report = run["benchmark"]
        if name in OTHER_RUNS:
            assert report["headline"], name
            continue
        # two baselines; the latency modes also compare the time around the model with each (two ratios a baseline)
        ratios = 4 if report["mode"] in ("latency", "throughput") else 2
        assert len(report["ratios"]) == ratios and all(r > 0 for r in report["ratios"].values()), name
        assert all(r["samples_per_second"] > 0 for r in report["results"]), name
    runs = summary["runs"]
    assert runs["bert_qa_inference"]["benchmark"]["mode"] == "inference"
    # latency (batch 1) and throughput (batches of 4): SQuAD questions answered end to end by every runner
    latency, throughput = runs["bert_qa_latency"]["benchmark"], runs["bert_qa_throughput"]["benchmark"]
    assert latency["mode"] == "latency" and latency["batch_size"] == 1 and latency["requests"] == 4
    assert throughput["mode"] == "throughput" and throughput["batch_size"] == 4 and throughput["requests"] == 8
    assert latency["results"][0]["name"] == "optimum-ipu pipeline (eager)"
    assert all(r["p50_ms"] > 0 for r in latency["results"])
    assert runs["gpt2_clm"]["benchmark"]["model"] == "tiny-gpt2-config"
    pipeline = runs["bert_qa_pipeline2"]["benchmark"]
    # 2 stages, 4 micro-batches per optimizer step: the same global batch as bert_qa_eager
    assert pipeline["micro_batches_per_step"] == 4 and pipeline["ipu_config"].endswith(".json")
    assert pipeline["batch_size"] == runs["bert_qa_eager"]["benchmark"]["batch_size"]
    # --packing: ours on packed rows, the baselines on the same features padded; ratios in features/s
    packed = runs["bert_qa_packed"]["benchmark"]
    assert packed["packing"]["packing_factor"] > 1 and packed["batch_size"] == 8
    assert {r["packing"]["features"] for r in packed["results"]} == {packed["packing"]["features"]}
    assert set(packed["ratios"]) == {"ours / transformers.Trainer (padded)", "ours / plain PyTorch loop (padded)"}
    served = ("bert_qa_packed", "bert_qa_latency", "bert_qa_throughput")
    trained = [name for name in BENCHMARK_RUNS if name not in served]
    assert all(runs[name]["benchmark"]["packing"] is None for name in trained)
    # stages balanced from measured costs (an encoder-decoder too), and each schedule's bubble beside its theory
    for name in ("gpt2_balance", "t5_balance"):
        report = runs[name]["benchmark"]
        assert sum(report["balanced"]["layers_per_ipu"]) == sum(report["even"]["layers_per_ipu"]), name
        assert len(report["balanced"]["measured_stage_s"]) == 2, name
    bubbles = runs["pipeline_bubbles"]["benchmark"]["schedules"]
    assert set(bubbles) == {"GPipe", "1F1B", "Interleaved1F1B", "ZeroBubble"}
    assert bubbles["1F1B"]["theory"] == pytest.approx(1 / 5) and bubbles["ZeroBubble"]["stages"] == 4
    # tiny mode skips --compile, and says so
    assert runs["bert_qa_compiled"]["benchmark"]["compile"] is False
    assert "--compile skipped" in runs["bert_qa_compiled"]["note"]

    assert (out / "summary.png").read_bytes()[:8] == PNG_MAGIC
    with tarfile.open(out / "results.tar.gz") as archive:
        names = set(archive.getnames())
        for name in RUNS:
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
