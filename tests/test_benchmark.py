"""`optimum-ipu benchmark` on a tiny model, training and inference: every runner runs, valid JSON and a PNG chart."""

from __future__ import annotations

import json
from functools import partial

import pytest

from optimum_ipu.benchmark import ARCHITECTURES, flops_per_sample, format_report, run_benchmark
from optimum_ipu.benchmark.packing import build_workload, load_feature_lengths, sample_feature_lengths

from .conftest import REPO_ROOT
from .helpers import env, run_python

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
        command = ["-m", "optimum_ipu.cli", "benchmark", "--mode", mode, *args, "--output-dir", str(out)]
        result = run_python(command, env=env(), timeout=600)
        assert result.returncode == 0, result.stderr[-3000:]
        stdout = result.stdout
    else:
        report = run_benchmark(
            model="tiny-bert-config", seq_len=32, batch_size=4, steps=4, warmup=1, mode=mode, output_dir=str(out)
        )
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
        main(["benchmark", "--mode", "serving"])
    assert exit_info.value.code == 2 and "invalid choice: 'serving'" in capsys.readouterr().err
    # --packing is question-answering training of a BERT-family encoder: anything else is refused up front
    assert main(["benchmark", "--packing", "--task", "causal-lm", "--model", "tiny-gpt2-config"]) == 2
    assert "--packing with --task causal-lm: packing trains on SQuAD feature lengths" in capsys.readouterr().err
    assert main(["benchmark", "--packing", "--mode", "inference", "--model", "tiny-bert-config"]) == 2
    assert "--packing with --mode inference: packing measures training; use --mode train" in capsys.readouterr().err
    assert main(["benchmark", "--packing", "--model", "tiny-gpt2-config", "--output-dir", str(tmp_path / "o")]) == 2
    assert "packing: GPT2ForQuestionAnswering (gpt2) is not supported" in capsys.readouterr().err


def test_flop_count_of_bert_base_qa():
    import transformers

    model = transformers.AutoModelForQuestionAnswering.from_config(ARCHITECTURES["bert-base-uncased-config"]())
    # training: 6 x 85.1M non-embedding parameters x 384 tokens + 12 x 12 layers x 768 x 384^2 = 212 GFLOP per sample;
    # inference: 2 x 85.1M x 384 + 4 x 12 x 768 x 384^2 = 70.7 GFLOP per sample (the forward pass)
    assert flops_per_sample(model, model.config, 384, training=True) / 1e9 == pytest.approx(212, rel=0.01)
    assert flops_per_sample(model, model.config, 384, training=False) / 1e9 == pytest.approx(70.7, rel=0.01)


def test_feature_flops_fit_equals_counting_every_length():
    """The mean FLOPs over many lengths, from three counts and the quadratic through them, is the counted mean."""
    import transformers

    from optimum_ipu.benchmark.packing import feature_flops

    model = transformers.AutoModelForQuestionAnswering.from_config(ARCHITECTURES["tiny-bert-config"]())
    count = partial(flops_per_sample, model, model.config, training=True)
    lengths = [17, 40, 40, 63, 90, 128, 128, 128]
    counted = sum(count(length) for length in lengths) / len(lengths)
    assert feature_flops(lengths, count) == pytest.approx(counted, rel=1e-9)


PACKING_RUNNERS = ["optimum-ipu IPUTrainer (packed)", "transformers.Trainer (padded)", "plain PyTorch loop (padded)"]
# sha256 of /work/shared/data/squad/squad-v1.1-dev-articles-00-39.json, as its README lists it
SQUAD_SHA256 = "48cc30b09a8c46388d52e7244857758a101804e45f742c1006043662e0e9556a"


def test_packing_benchmark_counts_the_same_features_in_every_runner(tmp_path):
    """`--packing`: ours on packed rows, the baselines on the same features padded; features/s for each runner,
    over the steps after the warm-up. In this process (one interpreter start less), lengths scaled to seq 64."""
    out = tmp_path / "packing"
    report = run_benchmark(
        model="tiny-bert-config", seq_len=64, batch_size=4, steps=3, warmup=1, packing=True, output_dir=str(out)
    )
    assert json.loads((out / "benchmark.json").read_text()) == report
    assert (out / "benchmark.png").read_bytes()[:8] == PNG_MAGIC
    packing = report["packing"]
    assert packing["feature_lengths"]["source_sha256"] == SQUAD_SHA256 and packing["feature_lengths"]["stride"] == 128
    assert packing["length_scale"] == pytest.approx(64 / 384)
    assert packing["rows"] == 3 * 4 and packing["steps"] == {"packed": 3, "padded": packing["features"] // 4}
    assert packing["packing_factor"] == packing["features"] / packing["rows"] > 1
    assert 0 <= packing["padding_fraction"]["packed"] < packing["padding_fraction"]["padded"] < 1
    assert [r["name"] for r in report["results"]] == PACKING_RUNNERS
    for r in report["results"]:
        run = r["packing"]
        assert run["features"] == packing["features"], r["name"]  # the same work in every runner
        assert run["steps"] == len(r["step_times_s"]) and r["samples_per_second"] == run["features_per_second"] > 0
        assert run["features_per_second"] == pytest.approx(run["timed_features"] / run["timed_seconds"])
        assert r["tokens_per_second"] == pytest.approx(
            run["features_per_second"] * packing["mean_feature_length"], rel=1e-3
        )
    ours, *baselines = report["results"]
    assert ours["packing"]["steps"] == 3 and ours["packing"]["rows_per_step"] == 4
    assert all(b["packing"]["steps"] == packing["steps"]["padded"] for b in baselines)
    for b in baselines:
        ratio = report["ratios"][f"ours / {b['name']}"]
        assert ratio > 0 and ratio == pytest.approx(ours["samples_per_second"] / b["samples_per_second"])
    stdout = format_report(report)
    assert "features a row" in stdout and "ours / transformers.Trainer (padded) (features/s):" in stdout


def test_feature_length_sampler_and_workload():
    """Fixed seed: the same lengths (a shorter draw is a prefix of a longer one); every length in 1..seq; the
    workload packs every feature once into exactly steps x batch rows, and the features fill whole padded steps."""
    data = load_feature_lengths()
    histogram = data["histogram"]
    assert sum(histogram.values()) == data["features"] and max(histogram) <= data["max_length"] == 384
    assert data["source_sha256"] == SQUAD_SHA256
    assert (REPO_ROOT / "optimum_ipu" / "data" / "squad_v1.1_feature_lengths_seq384.json").is_file()
    first = sample_feature_lengths(histogram, 500, 384, seed=3)
    assert first == sample_feature_lengths(histogram, 500, 384, seed=3) != sample_feature_lengths(histogram, 500, 384)
    assert sample_feature_lengths(histogram, 200, 384, seed=3) == first[:200]
    assert set(first) <= set(histogram) and all(1 <= n <= 384 for n in first)
    short = sample_feature_lengths(histogram, 500, 64, max_length=384, seed=3)
    assert all(1 <= n <= 64 for n in short) and max(short) == 64  # scaled: the 384-token features fill a row
    workload = build_workload(histogram, seq_len=384, batch_size=8, steps=5, vocab_size=1000, max_length=384)
    assert len(workload.rows) == 40 and workload.num_features % 8 == 0
    assert sorted(i for row in workload.rows for i in row) == list(range(workload.num_features))
    assert all(sum(workload.lengths[i] for i in row) <= 384 for row in workload.rows)
    assert workload.lengths == sample_feature_lengths(histogram, workload.num_features, 384, 384)
    rows = workload.packed_rows()
    assert [len(r["input_ids"]) for r in rows] == [sum(workload.lengths[i] for i in row) for row in workload.rows]
    batches = workload.padded_batches
    assert len(batches) == workload.num_features // 8 and batches[0]["input_ids"].shape == (8, 384)
    assert int(sum(b["attention_mask"].sum() for b in batches)) == workload.real_tokens
