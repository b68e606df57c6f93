"""`optimum-ipu benchmark` on a tiny model, training and inference: every runner runs, valid JSON and a PNG chart."""

from __future__ import annotations

import json
import subprocess

import pytest

from optimum_ipu.benchmark import ARCHITECTURES, flops_per_sample, format_report, run_benchmark

from .conftest import PYTHON

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
RUNNERS = {
    "train": ["optimum-ipu IPUTrainer", "transformers.Trainer", "plain PyTorch loop"],
    "inference": ["optimum-ipu engine (inference)", "transformers.Trainer.predict", "plain torch.no_grad loop"],
}


def _run(tmp_path, mode: str) -> tuple[str, dict]:
    """Training end to end through the command (a subprocess); inference through `run_benchmark` in this process
    (one interpreter start less), printing what the command prints."""
    out = tmp_path / mode
    args = ["--model", "tiny-bert-config", "--seq-len", "32", "--batch-size", "4", "--steps", "4", "--warmup", "1"]
    if mode == "train":
        result = subprocess.run(
            [PYTHON, "-m", "optimum_ipu.cli", "benchmark", "--mode", mode, *args, "--output-dir", str(out)],
            capture_output=True, text=True, timeout=600,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
        stdout = result.stdout
    else:
        report = run_benchmark(model="tiny-bert-config", seq_len=32, batch_size=4, steps=4, warmup=1, mode=mode,
                               output_dir=str(out))  # fmt: skip
        stdout = format_report(report)
    assert (out / "benchmark.png").read_bytes()[:8] == PNG_MAGIC
    report = json.loads((out / "benchmark.json").read_text())
    return stdout, report


@pytest.mark.parametrize("mode", ["train", "inference"])
def test_benchmark_writes_json_and_chart(tmp_path, mode):
    stdout, report = _run(tmp_path, mode)
    assert report["mode"] == mode and report["seq_len"] == 32 and report["batch_size"] == 4
    assert [r["name"] for r in report["results"]] == RUNNERS[mode]
    for r in report["results"]:
        assert r["samples_per_second"] > 0 and len(r["step_times_s"]) == 4
        assert r["tokens_per_second"] == pytest.approx(32 * r["samples_per_second"])
        assert r["tflops"] > 0 and r["time_to_first_step_s"] > 0
    baselines = RUNNERS[mode][1:]
    assert set(report["ratios"]) == {f"ours / {name}" for name in baselines}
    ours = report["results"][0]["samples_per_second"]
    for r in report["results"][1:]:
        ratio = report["ratios"][f"ours / {r['name']}"]
        assert isinstance(ratio, float) and ratio > 0 and ratio == pytest.approx(ours / r["samples_per_second"])
    model = _tiny_model()
    assert report["flops_per_sample"] == flops_per_sample(model, model.config, 32, training=mode == "train")
    assert f"ours / {baselines[0]}:" in stdout
    assert report["anchors"] == {}  # the published anchor is BERT-base training at seq 384 only


def _tiny_model():
    import transformers

    return transformers.AutoModelForQuestionAnswering.from_config(ARCHITECTURES["tiny-bert-config"]())


def test_bad_benchmark_arguments_exit_2(tmp_path, capsys):
    from optimum_ipu.cli import main

    assert main(["benchmark", "--model", "nope"]) == 2
    assert "--model 'nope': expected one of" in capsys.readouterr().err
    (tmp_path / "ipu_config.json").write_text(json.dumps({"inference_device_iterations": 3}))
    args = ["benchmark", "--mode", "inference", "--model", "tiny-bert-config", "--batch-size", "4"]
    assert main([*args, "--ipu-config", str(tmp_path), "--output-dir", str(tmp_path / "out")]) == 2
    assert "--batch-size 4: one inference host call runs inference_device_iterations=3" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:
        main(["benchmark", "--mode", "serve"])
    assert exit_info.value.code == 2 and "invalid choice: 'serve'" in capsys.readouterr().err


def test_flop_count_of_bert_base_qa():
    import transformers

    model = transformers.AutoModelForQuestionAnswering.from_config(ARCHITECTURES["bert-base-uncased-config"]())
    # training: 6 x 85.1M non-embedding parameters x 384 tokens + 12 x 12 layers x 768 x 384^2 = 212 GFLOP per sample;
    # inference: 2 x 85.1M x 384 + 4 x 12 x 768 x 384^2 = 70.7 GFLOP per sample (the forward pass)
    assert flops_per_sample(model, model.config, 384, training=True) / 1e9 == pytest.approx(212, rel=0.01)
    assert flops_per_sample(model, model.config, 384, training=False) / 1e9 == pytest.approx(70.7, rel=0.01)
