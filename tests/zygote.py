"""A process that imports torch, transformers, datasets and optimum_ipu once, then forks a child for every Python
process a test would start (an example script, a `torchrun` worker), so each child starts in milliseconds instead of
paying the ~6 s of imports again. The suite starts about 150 such processes.

Each child is a fresh process as far as the test can tell: its own argv, working directory, environment, standard
streams (files the client reads back), exit code, `atexit` handlers; nothing of one child reaches another. What a fork
cannot give is an environment variable read at import time: the client (`tests/processes.py`) runs such a request as
a real subprocess instead.

Protocol (one JSON line each way, on stdin/stdout): a request `{"procs": [{"argv", "cwd", "env", "out", "err"}],
"timeout": seconds, "group": bool}` forks one child per entry; the reply `{"codes": [...], "timed_out": bool}` comes
once all have exited. With `"group"` (a `torchrun` job), the first failing child gets the others terminated, as
`torchrun` does.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import runpy
import signal
import sys
import time
import traceback

# What most child processes import: paid once here. Each is optional (a module missing here is imported by the child).
PRELOAD = (
    "torch",
    "torch.distributed",
    "torch.distributed.pipelining",
    "torch.distributed.fsdp",
    "transformers",
    "transformers.trainer",
    "transformers.models.bert.modeling_bert",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.t5.modeling_t5",
    "transformers.models.llama.modeling_llama",
    "transformers.models.bart.modeling_bart",
    "transformers.models.whisper.modeling_whisper",
    "datasets",
    "accelerate",
    "safetensors.torch",
    "optimum_ipu",
    "optimum_ipu.trainer",
    "optimum_ipu.pipelines",
    "optimum_ipu.runtime.stages.engine",
)


def preload() -> None:
    import importlib

    for name in PRELOAD:
        with contextlib.suppress(ImportError):
            importlib.import_module(name)


def run_child(spec: dict) -> None:
    """In the forked child: become the requested process, run it, exit with its code (never returns)."""
    code = 1
    try:
        os.setpgid(0, 0)  # its own process group: a timeout kills whatever it started too
        for fd, path, flags in ((1, spec["out"], os.O_WRONLY), (2, spec["err"], os.O_WRONLY)):
            os.dup2(os.open(path, flags | os.O_CREAT | os.O_TRUNC, 0o644), fd)
        os.dup2(os.open(os.devnull, os.O_RDONLY), 0)
        os.chdir(spec["cwd"])
        os.environ.clear()
        os.environ.update(spec["env"])
        code = run_argv(spec["argv"])
    except BaseException:  # noqa: BLE001 - a child reports every failure as a Python process would
        traceback.print_exc()
    with contextlib.suppress(BaseException):
        atexit._run_exitfuncs()
    with contextlib.suppress(BaseException):
        sys.stdout.flush()
        sys.stderr.flush()
    os._exit(code)


def run_argv(argv: list[str]) -> int:
    """Run `python ARGV` in this process (`-m module`, `-c code` or a script path); returns the exit code."""
    try:
        if argv[0] == "-m":
            sys.argv = [argv[1], *argv[2:]]
            sys.path.insert(0, os.getcwd())
            runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
        elif argv[0] == "-c":
            sys.argv = ["-c", *argv[2:]]
            sys.path.insert(0, "")
            exec(compile(argv[1], "<string>", "exec"), {"__name__": "__main__"})  # noqa: S102
        else:
            sys.argv = list(argv)
            sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))
            runpy.run_path(argv[0], run_name="__main__")
    except SystemExit as exit_:
        if exit_.code is None:
            return 0
        if isinstance(exit_.code, int):
            return exit_.code
        print(exit_.code, file=sys.stderr)
        return 1
    except BaseException:  # noqa: BLE001
        traceback.print_exc()
        return 1
    return 0


def serve(request: dict) -> dict:
    pids = []
    for spec in request["procs"]:
        pid = os.fork()
        if pid == 0:
            run_child(spec)
        pids.append(pid)
    codes: dict[int, int] = {}
    deadline, terminated_at = time.monotonic() + request["timeout"], None
    while len(codes) < len(pids):
        for pid in pids:
            if pid in codes:
                continue
            done, status = os.waitpid(pid, os.WNOHANG)
            if done:
                codes[pid] = os.waitstatus_to_exitcode(status)
        failed = any(code != 0 for code in codes.values())
        if request.get("group") and failed and terminated_at is None and len(codes) < len(pids):
            terminated_at = time.monotonic()  # as torchrun: one worker failed, the others are stopped
            _signal_all(pids, codes, signal.SIGTERM)
        if terminated_at is not None and time.monotonic() - terminated_at > 10:
            _signal_all(pids, codes, signal.SIGKILL)
        if time.monotonic() > deadline:
            _signal_all(pids, codes, signal.SIGKILL)
            for pid in pids:
                if pid not in codes:
                    codes[pid] = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            return {"codes": [codes[p] for p in pids], "timed_out": True}
        time.sleep(0.02)
    return {"codes": [codes[p] for p in pids], "timed_out": False}


def _signal_all(pids: list[int], codes: dict[int, int], sig: int) -> None:
    for pid in pids:
        if pid not in codes:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, sig)


def main() -> None:
    preload()
    replies = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)  # anything printed while serving goes to stderr, not into the protocol
    print(json.dumps({"ready": True}), file=replies, flush=True)
    for line in sys.stdin:
        print(json.dumps(serve(json.loads(line))), file=replies, flush=True)


if __name__ == "__main__":
    main()
