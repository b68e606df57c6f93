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
