"""`optimum-ipu config balance MODEL --n-ipu N`: each layer's cost measured here, the split that balances the stages,
and the predicted step time of the pipeline schedule beside the even split's (`optimum_ipu.runtime.stages.balance`)."""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from ..errors import IncompatibleIPUConfigError

# what the last class-name part says of the head, for a model folder (the benchmark's tasks)
_TASK_BY_CLASS = (("QuestionAnswering", "question-answering"), ("LMHead", "causal-lm"), ("CausalLM", "causal-lm"))


def _model_and_task(name: str, task: str) -> tuple[Any, str]:
    """A model with random weights (costs do not depend on them) from a benchmark architecture name or a folder."""
    import transformers

    from ..benchmark.architectures import ARCHITECTURES, TASKS, make_model
    from ..models.plans import plan_for_config

    if name in ARCHITECTURES:
        if task == "auto":  # the head its family's plan is measured with
            task = plan_for_config(ARCHITECTURES[name]()).default_task()
        return make_model(name, task), task
    try:
        config = transformers.AutoConfig.from_pretrained(name)
    except (OSError, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise IncompatibleIPUConfigError(
            f"MODEL {name!r}: no transformers config found ({first}); give a folder with config.json or one of "
            f"{', '.join(ARCHITECTURES)}"
        ) from None
    if task == "auto":
        arch = (config.architectures or [""])[0]
        found = [t for part, t in _TASK_BY_CLASS if part in arch]
        task = "translation" if config.is_encoder_decoder else (found[0] if found else "")
    if task not in TASKS:
        raise IncompatibleIPUConfigError(
            f"--task: cannot tell the head of {name!r} from its config; pass --task {' or '.join(TASKS)}"
        )
    return getattr(transformers, TASKS[task]).from_config(config), task


def _format_units(costs: Any) -> list[str]:
    lines = [f"  {'unit':12s} {'forward ms':>10s} {'backward ms':>11s} {'params MiB':>10s} {'activations MiB':>15s}"]
    for unit in (costs.embeddings, *costs.layers, costs.heads):
        lines.append(
            f"  {unit.name:12s} {unit.forward_s * 1e3:10.1f} {unit.backward_s * 1e3:11.1f} "
            f"{unit.param_bytes / 2**20:10.1f} {unit.activation_bytes / 2**20:15.1f}"
        )
    return lines


def balance_report(args: argparse.Namespace) -> dict[str, Any]:
    """Measure, split, predict (and with `--measure-stages`, time each stage of both splits run apart)."""
    import torch

    from ..benchmark.architectures import synthetic_batches
    from ..config import IPUConfig
    from ..models.layout import resolve_layers_per_ipu
    from ..models.pipelined import to_pipelined
    from ..runtime.stages import balance

    model, task = _model_and_task(args.model, args.task)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device).train()
    pipelined = to_pipelined(model, IPUConfig(layers_per_ipu=[-1] * args.n_ipu))
    cut = pipelined.stage_cut()
    if len(cut.layer_paths) < 1:
        raise IncompatibleIPUConfigError(f"MODEL {args.model!r}: no pipeline layers to balance")
    batch = synthetic_batches(task, model.config, args.batch_size, args.seq_len, 1)[0]
    costs = balance.measure_layer_costs(model, cut, batch, repeats=args.repeats, warmup=args.warmup)
    limit = args.memory_gb * 2**30 if args.memory_gb else balance.device_memory_bytes(device, args.n_ipu)
    m = args.micro_batches or 2 * args.n_ipu
    chosen = balance.split_for(costs, args.n_ipu, m, memory_limit=limit)
    even = resolve_layers_per_ipu([-1] * args.n_ipu, len(cut.layer_paths))
    report: dict[str, Any] = {
        "model": args.model,
        "class": type(model).__name__,
        "task": task,
        "device": str(device),
        "seq_len": args.seq_len,
        "batch_size": args.batch_size,
        "micro_batches": m,
        "memory_limit_bytes": limit,
        "units": [vars(u) for u in (costs.embeddings, *costs.layers, costs.heads)],
    }
    for name, counts in (("balanced", chosen), ("even", even)):
        stages = costs.stage_cost(counts)
        seconds = [s.seconds for s in stages]
        report[name] = {
            "layers_per_ipu": counts,
            "predicted_stage_s": seconds,
            "memory_bytes": [s.memory(balance.in_flight(i, args.n_ipu, m)) for i, s in enumerate(stages)],
            "predicted_step_s": balance.predicted_step_seconds(seconds, m),
        }
        if args.measure_stages:
            measured = balance.measure_stage_seconds(model, cut, counts, batch, args.repeats, args.warmup)
            report[name]["measured_stage_s"] = measured
            report[name]["measured_step_s"] = balance.predicted_step_seconds(measured, m)
    b, e = report["balanced"], report["even"]
    report["headline"] = (
        f"{b['layers_per_ipu']} vs even {e['layers_per_ipu']}: predicted slowest stage "
        f"{max(b['predicted_stage_s']) / max(e['predicted_stage_s']):.2f}x"
        + (
            f", measured {max(b['measured_stage_s']) / max(e['measured_stage_s']):.2f}x"
            if "measured_stage_s" in b
            else ""
        )
    )
    return report


def format_balance(report: dict[str, Any], costs_lines: list[str] | None = None) -> str:
    """The report as the command prints it."""
    b, e = report["balanced"], report["even"]
    lines = [
        f"{report['model']} ({report['class']}, {len(report['units']) - 2} layers) on {report['device']}: micro-batch "
        f"{report['batch_size']} x seq {report['seq_len']}, {report['micro_batches']} micro-batches a step",
        *(costs_lines or []),
        f"layers_per_ipu balanced: {b['layers_per_ipu']}   even: {e['layers_per_ipu']}",
        f"  {'stage':6s} {'balanced ms':>11s} {'even ms':>9s} {'memory MiB (balanced, 1F1B)':>28s}"
        + ("   measured ms: balanced  even" if "measured_stage_s" in b else ""),
    ]
    for i, (bs, es) in enumerate(zip(b["predicted_stage_s"], e["predicted_stage_s"], strict=True)):
        line = f"  {i:<6d} {bs * 1e3:11.1f} {es * 1e3:9.1f} {b['memory_bytes'][i] / 2**20:28.1f}"
        if "measured_stage_s" in b:
            line += f"   {b['measured_stage_s'][i] * 1e3:20.1f} {e['measured_stage_s'][i] * 1e3:5.1f}"
        lines.append(line)
    slow_b, slow_e = max(b["predicted_stage_s"]), max(e["predicted_stage_s"])
    lines.append(
        f"predicted step time (GPipe / 1F1B, sum of stages + (m - 1) x slowest): balanced "
        f"{b['predicted_step_s'] * 1e3:.1f} ms, even {e['predicted_step_s'] * 1e3:.1f} ms "
        f"({b['predicted_step_s'] / e['predicted_step_s']:.2f}x); slowest stage {slow_b * 1e3:.1f} vs "
        f"{slow_e * 1e3:.1f} ms ({slow_b / slow_e:.2f}x)"
    )
    if "measured_stage_s" in b:
        mb, me = max(b["measured_stage_s"]), max(e["measured_stage_s"])
        lines.append(f"measured slowest stage: balanced {mb * 1e3:.1f} ms, even {me * 1e3:.1f} ms ({mb / me:.2f}x)")
    lines.append(f'use: "layers_per_ipu": {json.dumps(b["layers_per_ipu"])}  (or "auto" to measure at parallelize)')
    return "\n".join(lines)


def cmd_config_balance(args: argparse.Namespace) -> int:
    from ..runtime.stages.balance import LayerCosts, UnitCost

    folder = os.path.dirname(os.path.abspath(args.json)) if args.json else None
    if folder is not None and not os.path.isdir(folder):  # said before the minutes of measuring, not after
        raise IncompatibleIPUConfigError(f"--json {args.json}: the folder {folder} is not there; create it first")
    report = balance_report(args)
    units = [UnitCost(**u) for u in report["units"]]
    costs_lines = _format_units(LayerCosts(units[0], units[1:-1], units[-1]))
    print(format_balance(report, costs_lines))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=2)
        print(f"wrote {args.json}")
    return 0


def add_balance_parser(config_sub: Any, at_least: Any, finite: Any) -> None:
    """`optimum-ipu config balance`'s arguments."""
    bal = config_sub.add_parser(
        "balance",
        help="measure each layer's time and memory here and print the layers_per_ipu that balances the stages",
    )
    bal.add_argument("model", help="model folder (config.json; random weights) or an architecture: gpt2-config, ...")
    bal.add_argument("--n-ipu", type=at_least(1), required=True, help="pipeline stages (device slots of a replica)")
    bal.add_argument("--seq-len", type=at_least(1), default=128)
    bal.add_argument("--batch-size", type=at_least(1), default=1, help="rows of one micro-batch")
    bal.add_argument("--micro-batches", type=at_least(1), help="micro-batches a step (default 2 x --n-ipu)")
    bal.add_argument("--task", default="auto", help="question-answering, causal-lm or translation (default: guessed)")
    bal.add_argument("--repeats", type=at_least(1), default=5, help="timed passes (each unit's median)")
    bal.add_argument("--warmup", type=at_least(0), default=2, help="passes run first, not timed")
    bal.add_argument(
        "--memory-gb", type=finite("GB", True), help="memory of one device (default: the GPU's, or the host's / N)"
    )
    bal.add_argument("--measure-stages", action="store_true", help="also time each stage of both splits run apart")
    bal.add_argument("--json", help="write the figures to this JSON file")
    bal.set_defaults(func=cmd_config_balance)
