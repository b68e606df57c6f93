"""training_curves.png from a log history: the series drawn, the state file found, `optimum-ipu plot`."""

from __future__ import annotations

import json
import struct
import subprocess

import pytest

from optimum_ipu.cli.plot import curves_from_log_history, find_trainer_state, plot_training_curves

from .conftest import PYTHON
from .helpers import env, run_python

HISTORY = [
    {"epoch": 0.5, "step": 5, "loss": 2.5, "learning_rate": 1e-4, "grad_norm": 3.0},
    {"epoch": 1.0, "step": 10, "loss": 1.5, "learning_rate": 5e-5},
    {
        "epoch": 1.0,
        "step": 10,
        "eval_loss": 1.7,
        "eval_f1": 40.0,
        "eval_exact_match": 30.0,
        "eval_runtime": 2.0,
        "eval_samples_per_second": 9.0,
        "eval_steps_per_second": 1.0,
    },
    {"epoch": 1.0, "step": 10, "train_runtime": 20.0, "train_loss": 2.0, "total_flos": 1.0},
]


def png_size(path) -> tuple[int, int]:
    header = path.read_bytes()[:24]
    assert header[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    return struct.unpack(">II", header[16:24])


def test_series_are_losses_learning_rate_and_eval_metrics_without_timings():
    series = curves_from_log_history(HISTORY)
    assert set(series) == {"loss", "learning_rate", "eval_loss", "eval_f1", "eval_exact_match"}
    assert series["loss"] == [(5.0, 2.5), (10.0, 1.5)]
    assert series["eval_f1"] == [(10.0, 40.0)]
    assert curves_from_log_history([{"step": 3, "train_runtime": 1.0}]) == {}


def test_picture_from_a_run_folder_and_its_latest_checkpoint(tmp_path):
    for step in (5, 10):
        ckpt = tmp_path / f"checkpoint-{step}"
        ckpt.mkdir()
        (ckpt / "trainer_state.json").write_text(json.dumps({"log_history": HISTORY[: step // 5]}))
    assert find_trainer_state(tmp_path) == tmp_path / "checkpoint-10" / "trainer_state.json"
    path = plot_training_curves(tmp_path)
    assert path == tmp_path / "training_curves.png"
    width, height = png_size(path)
    assert width > 2 * height  # two panels side by side: loss, learning rate (no evaluation yet)
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": HISTORY}))
    three = plot_training_curves(tmp_path, tmp_path / "three.png")
    assert png_size(three)[0] > width  # a third panel: the evaluation metrics


def test_nothing_to_draw_and_bad_sources(tmp_path):
    assert plot_training_curves([{"step": 1, "train_runtime": 3.0}], tmp_path / "x.png") is None
    assert not (tmp_path / "x.png").exists()
    with pytest.raises(ValueError, match="give output_path"):
        plot_training_curves(HISTORY)
    with pytest.raises(FileNotFoundError, match="no trainer_state.json there nor in a checkpoint-N folder"):
        plot_training_curves(tmp_path)
    (tmp_path / "trainer_state.json").write_text("{")
    with pytest.raises(ValueError, match="trainer_state.json is not valid JSON"):
        plot_training_curves(tmp_path)
    for history in ("nope", [{"step": 1, "loss": 2.0}, 5], {"loss": 1}):  # edited or damaged (issue 42, item 12)
        (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": history}))
        with pytest.raises(ValueError, match="its log_history is not a list of logged dicts"):
            plot_training_curves(tmp_path)


def test_optimum_ipu_plot_command(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": HISTORY}))
    run = run_python(["-m", "optimum_ipu.cli", "plot", str(tmp_path)], env=env(), timeout=300)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == f"wrote {tmp_path / 'training_curves.png'}"
    png_size(tmp_path / "training_curves.png")
    missing = run_python(["-m", "optimum_ipu.cli", "plot", str(tmp_path / "none")], env=env(), timeout=300)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1
    assert "no trainer_state.json" in missing.stderr


def test_without_matplotlib_the_command_names_the_extra(tmp_path):
    (tmp_path / "trainer_state.json").write_text(json.dumps({"log_history": HISTORY}))
    code = (
        "import sys; sys.modules['matplotlib'] = None\n"
        "from optimum_ipu.cli import main\n"
        f"sys.exit(main(['plot', {str(tmp_path)!r}]))"
    )
    run = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=300)
    assert run.returncode == 2 and not (tmp_path / "training_curves.png").exists()
    assert "pip install 'optimum-ipu[benchmark]'" in run.stderr and len(run.stderr.strip().splitlines()) == 1
