"""`training_curves.png`: the loss, learning rate and evaluation metrics of a run, from its `log_history`.

Every example script draws it beside `all_results.json` once its metrics are saved; `optimum-ipu plot OUTPUT_DIR`
draws it for any finished or interrupted run (the `trainer_state.json` of the folder, or of its latest
checkpoint). matplotlib is imported inside the drawing function only: the library imports without it.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..files import read_json_file

CURVES_FILE = "training_curves.png"
STATE_FILE = "trainer_state.json"
MAX_STATE_BYTES = 256 << 20  # a long run's log history is megabytes

# What `Trainer` logs beside the metrics of an evaluation: timings and counters, not curves worth a panel.
_NOT_A_METRIC = ("runtime", "samples_per_second", "steps_per_second", "samples", "epoch", "step", "jit_compilation")


def find_trainer_state(output_dir: str | os.PathLike) -> Path:
    """
    The `trainer_state.json` of a run: the one in `output_dir`, else the one of its latest `checkpoint-N` folder.

    Args:
        output_dir (`str` or `os.PathLike`): The run's `--output_dir`, or a checkpoint folder.

    Returns:
        `Path`: the state file.

    Raises:
        `FileNotFoundError`: if neither the folder nor any of its checkpoints holds one.
    """
    folder = Path(output_dir)
    if (folder / STATE_FILE).is_file():
        return folder / STATE_FILE
    numbered = []
    if folder.is_dir():
        for child in folder.iterdir():
            match = re.fullmatch(r"checkpoint-(\d+)", child.name)
            if match and (child / STATE_FILE).is_file():
                numbered.append((int(match.group(1)), child / STATE_FILE))
    if not numbered:
        raise FileNotFoundError(
            f"{folder}: no {STATE_FILE} there nor in a checkpoint-N folder; give the --output_dir of a training run "
            "(it is written when training ends and at every checkpoint)"
        )
    return max(numbered)[1]


def curves_from_log_history(log_history: Sequence[Mapping[str, Any]]) -> dict[str, list[tuple[float, float]]]:
    """
    The series to draw, each a list of `(step, value)`: `loss`, `learning_rate`, `eval_loss` and every other
    evaluation metric (`eval_f1`, `eval_accuracy`, ...), timings left out.

    Args:
        log_history (`Sequence[Mapping[str, Any]]`): `Trainer.state.log_history` (one dict per `log` call).

    Returns:
        `dict[str, list[tuple[float, float]]]`: series name -> points, in logging order; series without points are
        absent.
    """
    series: dict[str, list[tuple[float, float]]] = {}
    for entry in log_history:
        step = entry.get("step")
        if step is None:
            continue
        for key, value in entry.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                continue
            wanted = key in ("loss", "learning_rate") or (key.startswith("eval_") and not key.endswith(_NOT_A_METRIC))
            if wanted:
                series.setdefault(key, []).append((float(step), float(value)))
    return series


def plot_training_curves(
    source: str | os.PathLike | Sequence[Mapping[str, Any]], output_path: str | os.PathLike | None = None
) -> Path | None:
    """
    Draws `training_curves.png`: training and evaluation loss, learning rate, and the evaluation metrics, against
    the optimizer step.

    Args:
        source (`str`, `os.PathLike` or a log history): A run's output folder (its `trainer_state.json`, or its
            latest checkpoint's), a `trainer_state.json` file, or `Trainer.state.log_history` itself.
        output_path (`str` or `os.PathLike`, *optional*): Where to write the PNG. Defaults to
            `training_curves.png` in the folder of `source` (required when `source` is a log history).

    Returns:
        `Path` of the picture, or `None` when the history holds nothing to draw (no loss and no evaluation logged).

    Raises:
        `FileNotFoundError`: if `source` is a folder without a state file (see [`find_trainer_state`]).
        `ValueError`: if a log history is given without `output_path`, or the state file is not valid JSON.
    """
    if isinstance(source, (str, os.PathLike)):
        path = Path(source)
        state_file = path if path.is_file() else find_trainer_state(path)
        state = read_json_file(state_file, "a trainer_state.json", MAX_STATE_BYTES)
        history = state.get("log_history", []) if isinstance(state, dict) else None
        if not isinstance(history, list) or not all(isinstance(entry, dict) for entry in history):
            raise ValueError(
                f"{state_file}: its log_history is not a list of logged dicts, as Trainer writes it (the file was "
                "edited or damaged); nothing to draw"
            )
        default_dir = path if path.is_dir() else path.parent
    else:
        if output_path is None:
            raise ValueError("plot_training_curves: give output_path when drawing from a log history")
        history, default_dir = list(source), Path(".")
    series = curves_from_log_history(history)
    if not series:
        return None
    target = Path(output_path) if output_path is not None else default_dir / CURVES_FILE
    _draw(series, target)
    return target


def _draw(series: dict[str, list[tuple[float, float]]], target: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    metrics = sorted(k for k in series if k.startswith("eval_") and k != "eval_loss")
    panels = [("loss", ["loss", "eval_loss"]), ("learning rate", ["learning_rate"])]
    panels += [("evaluation metrics", metrics)] if metrics else []
    panels = [(title, [k for k in keys if k in series]) for title, keys in panels]
    panels = [(title, keys) for title, keys in panels if keys]
    fig, axes = plt.subplots(1, len(panels), figsize=(5.2 * len(panels), 3.8), squeeze=False)
    for ax, (title, keys) in zip(axes[0], panels, strict=True):
        for key in keys:
            steps, values = zip(*series[key], strict=True)
            # a lone point (one evaluation at the end) is invisible as a line
            ax.plot(steps, values, marker="o" if len(steps) < 30 else None, markersize=3, label=key)
        ax.set_title(title)
        ax.set_xlabel("optimizer step")
        ax.grid(alpha=0.3)
        if title == "learning rate":
            ax.ticklabel_format(axis="y", style="sci", scilimits=(-3, 3))
        ax.legend(fontsize=8)
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=110)
    plt.close(fig)
