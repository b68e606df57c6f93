"""`benchmarks/serve_load.py` end to end at a small size: it starts the server, sends valid and malformed requests of
every fault, checks every answer, and its report says every criterion passed; and its checks do fail a wrong answer."""

from __future__ import annotations

import importlib.util
import json
import sys

from ..conftest import REPO_ROOT


def _script():
    spec = importlib.util.spec_from_file_location("serve_load", REPO_ROOT / "benchmarks" / "serve_load.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("serve_load", module)  # (its dataclasses look their module up)
    spec.loader.exec_module(sys.modules["serve_load"])
    return sys.modules["serve_load"]


def test_serve_load_passes_at_a_small_size(tmp_path):
    serve_load = _script()
    out = tmp_path / "load.json"
    argv = ["--task", "text-classification", "--requests", "120", "--concurrency", "8", "--malformed-every", "4"]
    assert serve_load.main([*argv, "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and all(report["criteria"].values()), report["criteria"]
    assert report["valid"] == {"sent": 90, "correct": 90}
    assert all(kind["sent"] == 5 == kind["4xx_naming_the_field"] for kind in report["malformed"].values())
    assert report["queue_depth_end"] == 0 and report["sigterm_exit_code"] == 0


def test_the_checks_fail_wrong_answers():
    serve_load = _script()
    malformed = serve_load.malformed_request("feature-extraction", 0, 1024)  # bad JSON: `body` must be named
    good = {"error": {"message": "body: not valid JSON", "type": "invalid_request_error", "param": "body"}}
    assert serve_load.check_malformed(malformed, 400, good) is None
    assert "status 500" in serve_load.check_malformed(malformed, 500, good)
    assert "names 'input'" in serve_load.check_malformed(malformed, 400, {"error": {**good["error"], "param": "input"}})
    two_lines = {"error": {**good["error"], "message": "body:\nnot valid"}}
    assert "one line" in serve_load.check_malformed(malformed, 400, two_lines)
    plan = serve_load.plan("text-generation", 60, 5, 1024, serve_load.texts_pool(10))
    assert [r.fault for r in plan[4::5]] == [*serve_load.FAULTS, *serve_load.FAULTS]  # evenly spread, in turn
    assert all(r.fault is None for i, r in enumerate(plan) if i % 5 != 4)


def test_serve_load_on_two_stages_with_clients_that_go(tmp_path):
    """The same under `torchrun`, the model's 2 stages on 2 processes (process 0 holds the socket), text generation
    with clients that close their stream after the first chunk: every other answer is right, nothing is left in
    flight, and SIGTERM to process 0 drains and releases the other (torchrun exits 0)."""
    serve_load = _script()
    out = tmp_path / "load.json"
    argv = ["--task", "text-generation", "--requests", "60", "--concurrency", "4", "--malformed-every", "10"]
    assert serve_load.main([*argv, "--gone-every", "5", "--nproc-per-node", "2", "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["passed"] and report["processes"] == 2, report["criteria"]
    assert report["gone"]["sent"] == 10 == report["gone"]["first_chunk"]
    assert report["valid"] == {"sent": 44, "correct": 44} and report["in_flight_end"] == 0


def test_gone_clients_are_spread_among_the_valid_requests():
    serve_load = _script()
    plan = serve_load.plan("text-generation", 40, 10, 1024, serve_load.texts_pool(10), gone_every=4)
    gone = [i for i, r in enumerate(plan) if r.shape == "gone"]
    assert len(gone) == 9 and all(plan[i].body["stream"] and plan[i].fault is None for i in gone)
    assert all(plan[i].body["max_tokens"] == serve_load.GONE_MAX_TOKENS for i in gone)
    assert not [
        r for r in serve_load.plan("text-classification", 40, 10, 1024, ["x"], gone_every=4) if r.shape == "gone"
    ]
