"""Memory proportional to the stage, measured (`benchmarks/stage_memory.py`, the ~60 M Llama): with 4 stages on 4
gloo processes, each loaded stage-local, every process's peak resident memory above its base (the same job on a model
of next to no weights) is at most 1.3 x its share (the parameters it holds, their gradients and two AdamW moments)."""

from __future__ import annotations

import json

from ..conftest import REPO_ROOT
from ..helpers import TORCHRUN, launch

BENCHMARK = str(REPO_ROOT / "benchmarks" / "stage_memory.py")


def test_each_process_peaks_near_its_stage_share(tmp_path):
    args = ["--preset", "small", "--scenarios", "stage-4x1", "--out", str(tmp_path)]
    run = launch(TORCHRUN[0], BENCHMARK, *args, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    print(run.stdout)
    (result,) = json.loads((tmp_path / "stage_memory.json").read_text())["results"]
    ranks = result["ranks"]
    assert len(ranks) == 4
    whole = ranks[0]["whole"]
    for rank in ranks:
        assert rank["held"] < whole * 0.5  # a stage's layers, and the embeddings or head it runs
        assert rank["ratio_to_share"] <= 1.3, rank
    # the middle stages hold neither the embeddings nor the head: a quarter of the layers only
    assert ranks[1]["held"] < whole * 0.2 and ranks[2]["held"] < whole * 0.2
