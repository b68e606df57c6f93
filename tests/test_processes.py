"""The test launcher's one rerun of a `torchrun` job whose ranks broke in gloo's connection setup (a known flake of
gloo on a loaded machine, pytorch/pytorch#11364), and never of a job that failed on its own error."""

from __future__ import annotations

import textwrap

from .helpers import TORCHRUN, free_port, launch

FLAKY_SETUP = """
import os, sys, time
from pathlib import Path
import torch.distributed as dist

def new_group(marker):  # stands for torch's: the frame name is what the launcher recognises
    if not marker.exists():
        marker.touch()  # before anything: a rank terminated by the launcher passes on the rerun
        time.sleep(float(os.environ["RANK"]))  # rank 0's error comes first, whatever the machine's load
        raise dist.DistNetworkError("Broken pipe")

marker = Path(sys.argv[1]) / ("tried" + os.environ["RANK"])
new_group(marker)
if FAIL_AFTER:
    raise ValueError("the job's own error")
"""


def _job(tmp_path, *, fail_after: bool):
    script = tmp_path / "job.py"
    script.write_text(textwrap.dedent(FLAKY_SETUP.replace("FAIL_AFTER", str(fail_after))))
    return launch(*TORCHRUN, "--nproc_per_node=2", f"--master_port={free_port()}", str(script), str(tmp_path))


def test_a_job_broken_in_gloo_setup_runs_once_more(tmp_path):
    run = _job(tmp_path, fail_after=False)
    assert run.returncode == 0, run.stderr
    assert "rerun once" in run.stderr and "Broken pipe" in run.stderr


def test_a_job_failing_on_its_own_error_is_not_rerun(tmp_path):
    (tmp_path / "tried0").touch()  # rank 0 gets past the setup and fails on its own error: no rerun
    run = _job(tmp_path, fail_after=True)
    assert run.returncode == 1
    assert "rerun once" not in run.stderr
    assert run.stderr.rstrip().endswith("ValueError: the job's own error"), "the cause is in the tail"
