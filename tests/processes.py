"""Python processes for the tests, started from a zygote (`tests/zygote.py`) that has the heavy imports done.

`run_python(argv, ...)` has `subprocess.run([python, *argv], capture_output=True, text=True, ...)`'s meaning and
result; `run_torchrun(argv, ...)` that of `python -m torch.distributed.run --nproc_per_node=N [--master_port=P]
SCRIPT ARGS...`: N workers with torchrun's environment (`RANK`, `LOCAL_RANK`, `WORLD_SIZE`, `MASTER_ADDR`, ...), their
output merged, exit 1 when one fails (the others are terminated). A request whose environment differs from the
zygote's in a variable read at import time (the Hub's offline switch, cache folders, thread counts), or a `torchrun`
option not listed here, runs as a real subprocess instead: never a different meaning, only a slower start.
"""

from __future__ import annotations

import atexit
import itertools
import json
import os
import socket
import subprocess
import sys
import tempfile
from collections.abc import Mapping, Sequence

from .conftest import REPO_ROOT

PYTHON = sys.executable
ZYGOTE_ENV = {"PYTHONPATH": str(REPO_ROOT), "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
# read when a module is imported or the interpreter starts (a forked child would keep the zygote's value), by prefix;
# torch's own (TORCHINDUCTOR_CACHE_DIR, which a compile test sets in the test process) are read when used
IMPORT_TIME_PREFIXES = ("HF_", "HUGGINGFACE_", "TRANSFORMERS_", "DATASETS_", "OMP_", "MKL_", "XDG_", "PYTHON")


class Zygote:
    """The zygote process of this test process (one per pytest worker), started on first use."""

    def __init__(self) -> None:
        self.env = {**os.environ, **ZYGOTE_ENV}
        self.process = subprocess.Popen(
            [PYTHON, "-m", "tests.zygote"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            cwd=REPO_ROOT,
            env=self.env,
            text=True,
        )
        ready = self.process.stdout.readline()
        if not ready:
            raise RuntimeError("the test zygote (tests/zygote.py) did not start")
        atexit.register(self.close)

    def serves(self, env: Mapping[str, str]) -> bool:
        """Whether a child forked here would see `env` as a fresh process would (import-time variables equal)."""
        keys = {k for k in (*env, *self.env) if k.startswith(IMPORT_TIME_PREFIXES)}
        return self.process.poll() is None and all(env.get(k) == self.env.get(k) for k in keys)

    def run(self, procs: list[dict], timeout: float, group: bool) -> tuple[list[int], list[str], list[str]]:
        with tempfile.TemporaryDirectory() as folder:
            for i, spec in enumerate(procs):
                spec["out"], spec["err"] = os.path.join(folder, f"{i}.out"), os.path.join(folder, f"{i}.err")
            self.process.stdin.write(json.dumps({"procs": procs, "timeout": timeout, "group": group}) + "\n")
            self.process.stdin.flush()
            reply = json.loads(self.process.stdout.readline())
            outs = [_read(spec["out"]) for spec in procs]
            errs = [_read(spec["err"]) for spec in procs]
        if reply["timed_out"]:
            raise subprocess.TimeoutExpired([p["argv"] for p in procs], timeout, "".join(outs), "".join(errs))
        return reply["codes"], outs, errs

    def close(self) -> None:
        if self.process.poll() is None:
            self.process.stdin.close()
            self.process.wait(timeout=30)


def _read(path: str) -> str:
    with open(path, encoding="utf-8", errors="replace") as f:
        return f.read()


_zygote: Zygote | None = None


def zygote() -> Zygote:
    global _zygote
    if _zygote is None or _zygote.process.poll() is not None:
        _zygote = Zygote()
    return _zygote


def run_python(
    argv: Sequence[str], *, cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None, timeout=600
) -> subprocess.CompletedProcess:
    """`python ARGV` (a script, `-m module` or `-c code`), as `subprocess.run(..., capture_output=True, text=True)`."""
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    server = zygote()
    if not server.serves(env):
        return subprocess.run([PYTHON, *argv], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    codes, outs, errs = server.run([{"argv": list(argv), "cwd": cwd, "env": env}], timeout, group=False)
    return subprocess.CompletedProcess([PYTHON, *argv], codes[0], outs[0], errs[0])


def run_torchrun(
    argv: Sequence[str], *, cwd: str | os.PathLike | None = None, env: Mapping[str, str] | None = None, timeout=600
) -> subprocess.CompletedProcess:
    """`python -m torch.distributed.run ARGV` on one node: `--nproc_per_node` workers of a script."""
    env = dict(os.environ if env is None else env)
    cwd = str(cwd or os.getcwd())
    parsed = _parse_torchrun(list(argv))
    server = zygote()
    if parsed is None or not server.serves(env):
        command = [PYTHON, "-m", "torch.distributed.run", *argv]
        return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    nproc, port, script = parsed
    codes, outs, errs = _run_group(server, nproc, port, script, cwd, env, timeout)
    rerun = ""
    if any(codes) and _only_transport_failures(codes, errs):
        # gloo's connection setup breaks now and then on a loaded machine (pytorch/pytorch#11364: "Broken pipe" in
        # ProcessGroupGloo): torchrun's --max-restarts answer, once, on a fresh port; a failure of the job's own
        # shows a traceback of another kind on some rank and is never rerun
        rerun = f"[tests/processes.py] rerun once, every failing rank broke in gloo's setup:\n{''.join(errs)}"
        codes, outs, errs = _run_group(server, nproc, free_port(), script, cwd, env, timeout)
    code = 0 if all(c == 0 for c in codes) else 1
    # ranks that only lost their connection first, so a job's tail (what a failing test prints) shows the cause
    errs = sorted(errs, key=lambda err: "Traceback" in err and not _setup_broke(err))
    return subprocess.CompletedProcess(["torchrun", *argv], code, "".join(outs), rerun + "".join(errs))


def _setup_broke(err: str) -> bool:
    """Whether a rank's error is a connection broken while its process groups were being set up."""
    setup = ("ProcessGroupGloo(", "new_group(", "init_process_group(")
    return "DistNetworkError" in err and any(frame in err for frame in setup)


def _only_transport_failures(codes: list[int], errs: list[str]) -> bool:
    """Whether the ranks that failed with a traceback all failed in their groups' setup, none of another error."""
    tracebacks = [err for code, err in zip(codes, errs, strict=True) if code != 0 and "Traceback" in err]
    return bool(tracebacks) and all(_setup_broke(err) for err in tracebacks)


def _run_group(server, nproc, port, script, cwd, env, timeout) -> tuple[list[int], list[str], list[str]]:
    common = {"WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc), "MASTER_ADDR": "127.0.0.1"}
    common |= {"MASTER_PORT": str(port), "GROUP_RANK": "0", "ROLE_RANK": "0", "TORCHELASTIC_RESTART_COUNT": "0"}
    ranks = [{**env, **common, "RANK": str(r), "LOCAL_RANK": str(r)} for r in range(nproc)]
    procs = [{"argv": script, "cwd": cwd, "env": rank_env} for rank_env in ranks]
    return server.run(procs, timeout, group=True)


def _parse_torchrun(argv: list[str]) -> tuple[int, int, list[str]] | None:
    """(processes, port, script argv) of a one-node torchrun command line; None for anything else."""
    nproc, port = 1, None
    while argv and argv[0].startswith("--"):
        option = argv.pop(0)
        name, _, value = option.partition("=")
        if name in ("--nproc_per_node", "--nproc-per-node", "--master_port", "--master-port") and not value:
            value = argv.pop(0)
        if name in ("--nproc_per_node", "--nproc-per-node"):
            nproc = int(value)
        elif name in ("--master_port", "--master-port"):
            port = int(value)
        elif name != "--standalone":
            return None  # several nodes, restarts, ...: the real torchrun
    if not argv:
        return None
    return nproc, port if port is not None else free_port(), argv


_ports = itertools.count()
PORTS_PER_WORKER = 2000


def free_port() -> int:
    """A port for a rendezvous, below Linux's ephemeral range (32768 and up, where the kernel picks the ports of
    gloo's connections and of `bind(0)`), in a block of its own per pytest-xdist worker, never handed out twice by
    this process: two workers, or a port just closed by one job and taken by another's connection, never collide."""
    worker = int(os.environ.get("PYTEST_XDIST_WORKER", "gw0").removeprefix("gw") or 0)
    first = 20000 + (worker % 6) * PORTS_PER_WORKER
    for _ in range(PORTS_PER_WORKER):
        port = first + next(_ports) % PORTS_PER_WORKER
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue  # in use
            return port
    raise RuntimeError(f"no free port in {first}-{first + PORTS_PER_WORKER - 1}")
