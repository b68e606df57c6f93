"""`optimum-ipu benchmark` on a tiny model: it runs every runner, writes valid JSON and a PNG chart."""

from __future__ import annotations

import json
import subprocess

import pytest

from optimum_ipu.benchmark import ARCHITECTURES, flops_per_sample

from .conftest import PYTHON


def test_benchmark_command_writes_json_and_chart(tmp_path):
    result = subprocess.run(
        [PYTHON, "-m", "optimum_ipu.cli", "benchmark", "--model", "tiny-bert-config", "--seq-len", "32",
         "--batch-size", "4", "--steps", "4", "--warmup", "1", "--output-dir", str(tmp_path)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    report = json.loads((tmp_path / "benchmark.json").read_text())
    names = [r["name"] for r in report["results"]]
    assert names == ["optimum-ipu IPUTrainer", "transformers.Trainer", "plain PyTorch loop"]
    assert all(r["samples_per_second"] > 0 and len(r["step_times_s"]) == 4 for r in report["results"])
    assert set(report["ratios"]) == {"ours / transformers.Trainer", "ours / plain PyTorch loop"}
    assert all(ratio > 0 for ratio in report["ratios"].values())
    assert (tmp_path / "benchmark.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "ours / transformers.Trainer:" in result.stdout


def test_bad_benchmark_arguments_exit_2(tmp_path):
    result = subprocess.run([PYTHON, "-m", "optimum_ipu.cli", "benchmark", "--model", "nope"], capture_output=True,
                            text=True, timeout=300)  # fmt: skip
    assert result.returncode == 2 and "--model 'nope': expected one of" in result.stderr


@pytest.mark.parametrize(("seq", "expected_gflop"), [(384, 212)])
def test_flop_count_of_bert_base_qa(seq, expected_gflop):
    import transformers

    model = transformers.AutoModelForQuestionAnswering.from_config(ARCHITECTURES["bert-base-uncased-config"]())
    # 6 x 85.1M non-embedding parameters x 384 tokens + 12 x 12 layers x 768 x 384^2 = 212 GFLOP per sample
    assert flops_per_sample(model, model.config, seq, training=True) / 1e9 == pytest.approx(expected_gflop, rel=0.01)
