"""The `optimum-ipu` command: `env`, `config check`, `config balance`, `benchmark`, `serve` and `plot` (and
`--version`).

Errors in what the user gave (a bad config, a model that cannot be found) end with exit code 2 and one
line on stderr; the traceback only with `--debug` (anywhere on the line) or `OPTIMUM_IPU_DEBUG=1`. Every dashed
option is also taken with underscores, as the training scripts spell it (`--n-ipu` and `--n_ipu`).
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
from collections.abc import Callable, Sequence
from typing import Any, NoReturn

from ..config import IPUConfig
from ..errors import DEBUG_ENV, IncompatibleIPUConfigError, debug_env
from ..serving.settings import BACKENDS as SERVE_BACKENDS  # (no torch: the parser is built without it)
from ..serving.settings import CONTINUOUS_ENGINES


def _cmd_env(args: argparse.Namespace) -> int:
    from ..runtime.devices import detect_devices
    from .env import environment_info, format_environment

    print(format_environment(environment_info()))
    print()
    info = detect_devices()
    print(f"Devices found: {info.count} x {info.kind}")
    for i, name in enumerate(info.names):
        print(f"  {info.kind}:{i}  {name}")
    print(f"Processes in this job (WORLD_SIZE): {info.world_size}")
    config = IPUConfig.from_pretrained(args.ipu_config) if args.ipu_config else IPUConfig()
    for mode in ("training", "inference"):
        config.train(mode == "training")
        slots = config.device_slots
        print(
            f"IPUs (device slots) for {mode}: {slots} = {config.ipus_per_replica} per replica x "
            f"{config.replication_factor} replicas{_tensor_parallel(config)}"
        )
        per_process = slots / info.world_size
        if per_process > 1:
            print(f"  here: {info.world_size} process(es) for {slots} slots: stages share a device and run in turn")
        else:
            print(f"  here: one slot per process with {info.world_size} process(es)")
    return 0


def _cmd_config_check(args: argparse.Namespace) -> int:
    from ..models.layout import format_layout, stage_layout
    from ..topology import check_processes, replication_for_devices

    pod = {} if args.n_ipu is None else {"n_ipu": args.n_ipu}  # >= 1: 0 is a usage error naming --n-ipu
    config = IPUConfig.from_pretrained(args.file, **pod)
    if args.n_ipu is not None:
        # as --n_ipu of the training scripts: the pod's devices set the number of replicas
        config.update_from_string(f"replication_factor={replication_for_devices(config, args.n_ipu)}")
    check_processes(config, args.nproc_per_node)
    print(f"{args.file}: valid IPUConfig")
    ignored = config.ipu_only_fields_set()
    if ignored:
        print(f"  note: {', '.join(ignored)} are IPU compiler knobs; kept in the file, no effect on GPUs or CPUs")
    num_layers, name = None, None
    if args.model:
        num_layers, name = _model_layers(args.model)
    for mode in ("training", "inference"):
        config.train(mode == "training")
        print(
            f"{mode}: {config.ipus_per_replica} IPUs per replica x {config.replication_factor} replicas"
            f"{_tensor_parallel(config)} = {config.device_slots} device slots; samples per host call = micro-batch x "
            f"{config.batch_size_factor()}"
        )
        if num_layers is None:
            print(f"  layers_per_ipu: {config.layers_per_ipu} (pass --model to resolve wildcards)")
        else:
            print(f"  stage layout for {name} ({num_layers} layers):")
            print(format_layout(stage_layout(config, num_layers)))
    return 0


def _tensor_parallel(config: IPUConfig) -> str:
    """The tensor-parallel factor of the device slots in the current mode, said only when it is more than 1."""
    tp = config.tensor_parallel_size
    return f" x {tp} tensor-parallel" if tp > 1 else ""


def _model_layers(name_or_dir: str) -> tuple[int, str]:
    from transformers import AutoConfig

    from ..files import model_folder_text_problem
    from ..models import plan_for_config

    problem = model_folder_text_problem(name_or_dir)
    if problem is not None:  # transformers would say only "not a valid JSON file"
        raise IncompatibleIPUConfigError(f"--model {name_or_dir}: {problem}")
    try:
        model_config = AutoConfig.from_pretrained(name_or_dir)
    except (OSError, ValueError) as err:
        first_line = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise IncompatibleIPUConfigError(
            f"--model {name_or_dir!r}: no transformers config found ({first_line}); "
            "give a folder with config.json or a model id in the local Hugging Face cache"
        ) from None
    plan = plan_for_config(model_config)
    name = (model_config.architectures or [plan.family])[0]
    return plan.num_layers(model_config), name


def _require_matplotlib(command: str) -> None:
    """matplotlib is in the `[benchmark]` and `[examples]` extras, not a dependency of the library."""
    import importlib.util

    if importlib.util.find_spec("matplotlib") is None:
        raise IncompatibleIPUConfigError(
            f"optimum-ipu {command} draws its chart with matplotlib, which is not installed: "
            "pip install 'optimum-ipu[benchmark]' (or pip install matplotlib)"
        )


def _cmd_plot(args: argparse.Namespace) -> int:
    from .plot import plot_training_curves

    _require_matplotlib("plot")

    try:
        path = plot_training_curves(args.output_dir, args.output)
    except (FileNotFoundError, ValueError) as err:
        raise IncompatibleIPUConfigError(str(err)) from None  # one line, exit code 2, as every error of the command
    if path is None:
        print(f"{args.output_dir}: the log history holds no loss and no evaluation yet; nothing drawn")
        return 1
    print(f"wrote {path}")
    return 0


def _cmd_benchmark(args: argparse.Namespace) -> int:
    _require_matplotlib("benchmark")
    from ..benchmark import format_report  # the harness (torch, transformers): only when it runs

    _check_output_folder(args.output_dir)  # before the measurement: a file in its path was found only after it
    try:
        report = _serve_benchmark(args) if args.mode == "serve" else _step_benchmark(args)
    except ValueError as err:
        raise IncompatibleIPUConfigError(str(err)) from None
    print(format_report(report))
    drawn = "" if report["mode"] == "recipe" else " and benchmark.png"
    print(f"wrote {args.output_dir}/benchmark.json{drawn}")
    return 0


def _check_output_folder(path: str) -> None:
    """`--output-dir` can be a folder: it is one, or its nearest existing parent is a writable folder (nothing is
    made here: a run refused for another argument leaves no folder behind)."""
    probe = os.path.abspath(path)
    while not os.path.exists(probe):
        probe = os.path.dirname(probe)
    if not os.path.isdir(probe) or not os.access(probe, os.W_OK):
        what = "a file" if not os.path.isdir(probe) else "not writable"
        raise IncompatibleIPUConfigError(f"--output-dir {path}: {probe} is {what}; give a folder that can be written")


def _step_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """Every mode but serve (`run_benchmark`): by default BERT-base (random weights) answering questions."""
    from ..benchmark import run_benchmark
    from ..benchmark.run import DEFAULT_ARCHITECTURE

    return run_benchmark(
        model=args.model or DEFAULT_ARCHITECTURE,
        task=args.task or "question-answering",
        seq_len=args.seq_len,
        batch_size=args.batch_size,
        steps=args.steps,
        warmup=args.warmup,
        precision=args.precision,
        compile=args.compile,
        ipu_config=args.ipu_config,
        peak_tflops=args.peak_tflops,
        output_dir=args.output_dir,
        mode=args.mode,
        packing=args.packing,
        backends=tuple(args.backends),
        pairs=args.pairs,
    )


def _serve_benchmark(args: argparse.Namespace) -> dict[str, Any]:
    """`--mode serve` (`run_serve_benchmark`): by default text generation on a random 124 M GPT-2."""
    from ..benchmark import run_serve_benchmark

    if len(args.backends) != 1 or args.backends[0] == "onnxruntime-int8":
        raise ValueError(f"--backends {' '.join(args.backends)}: --mode serve runs our server with one --backend")
    return run_serve_benchmark(
        backend=args.backends[0],
        model=args.model,
        task=args.task or "text-generation",
        concurrency=tuple(args.concurrency),
        requests=args.requests,
        max_tokens=args.max_tokens,
        servers=args.servers,
        output_dir=args.output_dir,
    )


def _cmd_serve(args: argparse.Namespace) -> int:
    import importlib.util

    if importlib.util.find_spec("fastapi") is None or importlib.util.find_spec("uvicorn") is None:
        raise IncompatibleIPUConfigError(
            "optimum-ipu serve needs FastAPI and uvicorn, which are not installed: pip install 'optimum-ipu[serving]'"
        )
    from ..serving import ServeSettings, serve  # the server (fastapi, uvicorn, torch): only when it runs

    if args.model.startswith(("/", "./", "../", "~")) and not os.path.isdir(os.path.expanduser(args.model)):
        raise IncompatibleIPUConfigError(
            f"serve {args.model}: no such folder; give a model folder or a Hub id in the local Hugging Face cache"
        )

    try:
        settings = ServeSettings(
            model=args.model,
            task=args.task,
            ipu_config=args.ipu_config,
            host=args.host,
            port=args.port,
            max_batch_size=args.max_batch_size,
            batch_wait_ms=args.batch_wait_ms,
            max_queue=args.max_queue,
            request_timeout=args.request_timeout,
            max_body_bytes=args.max_body_bytes,
            served_model_name=args.served_model_name,
            stage_timeout=args.stage_timeout,
            continuous_batching=args.continuous_batching,
            continuous_batching_engine=args.continuous_batching_engine,
            batches_in_flight=args.batches_in_flight,
            backend=args.backend,
            generate_kwargs=args.generate_kwargs,
        )
        return serve(settings)
    except (OSError, KeyError, ValueError) as err:  # a model, task or config that cannot be loaded: one line
        message = " ".join(str(err.args[0] if isinstance(err, KeyError) and err.args else err).split())
        raise IncompatibleIPUConfigError(f"serve {args.model}: {message}") from None


def _at_least(low: int) -> Callable[[str], int]:
    """An argparse type: an integer >= `low` (so `--seq-len 0` is a usage error naming the flag, exit code 2)."""

    def parse(text: str) -> int:
        value = int(text)  # a ValueError is argparse's "invalid ... value"
        if value < low:
            raise argparse.ArgumentTypeError(f"expected an integer >= {low}, got {value}")
        return value

    parse.__name__ = f"integer >= {low}"
    return parse


def _json_object(text: str) -> dict[str, Any]:
    """An argparse type: a JSON object (`{"num_beams": 1}`), else a usage error naming the flag (exit code 2)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise argparse.ArgumentTypeError(f"not JSON ({err.msg}): {text}; e.g. '{{\"num_beams\": 1}}'") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError(f"expected a JSON object, got {text}; e.g. '{{\"num_beams\": 1}}'")
    return value


def _finite(unit: str, above_zero: bool) -> Callable[[str], float]:
    """An argparse type: a finite number of `unit`, > 0 (`above_zero`) or >= 0."""
    bound = "> 0" if above_zero else ">= 0"

    def parse(text: str) -> float:
        value = float(text)  # a ValueError is argparse's "invalid ... value"
        if not (value > 0 if above_zero else value >= 0) or value == float("inf"):
            raise argparse.ArgumentTypeError(f"expected a number of {unit} {bound}, got {text}")
        return value

    parse.__name__ = unit
    return parse


def _port(text: str) -> int:
    """An argparse type: a TCP port, 0 (any free port) to 65535."""
    value = int(text)
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"expected a TCP port from 0 to 65535, got {value}")
    return value


_port.__name__ = "port"


class _OneLineParser(argparse.ArgumentParser):
    """argparse, with a usage error on one line (exit code 2), like every other error of the command, and each
    `--dashed-option` taken as `--dashed_option` too (the training scripts' spelling)."""

    def add_argument(self, *names: str, **kwargs: Any) -> argparse.Action:
        twins = ["--" + n[2:].replace("-", "_") for n in names if n.startswith("--") and "-" in n[2:]]
        return super().add_argument(*names, *twins, **kwargs)

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def build_parser() -> argparse.ArgumentParser:
    from .. import __version__

    parser = _OneLineParser(prog="optimum-ipu", description="optimum-ipu command line")
    parser.add_argument("--version", action="version", version=f"optimum-ipu {__version__}")
    parser.add_argument(
        "--debug", action="store_true", help=f"on an error, the full traceback instead of one line (or {DEBUG_ENV}=1)"
    )
    sub = parser.add_subparsers(dest="command", required=True)
    for add in (_add_env, _add_config, _add_plot, _add_benchmark, _add_serve):
        add(sub)
    return parser


def _add_env(sub: Any) -> None:
    env = sub.add_parser(
        "env", help="versions and machine (to paste in an issue), devices, and the device slots a config would get"
    )
    env.add_argument("--ipu-config", help="folder, JSON file or id of an IPU config (default: IPUConfig())")
    env.set_defaults(func=_cmd_env)


def _add_config(sub: Any) -> None:
    config = sub.add_parser("config", help="work with ipu_config.json files")
    config_sub = config.add_subparsers(dest="config_command", required=True)
    check = config_sub.add_parser("check", help="validate a config and print its stage layout")
    check.add_argument("file", help="folder holding ipu_config.json, a JSON file, or a config id")
    check.add_argument("--model", help="model folder or cached id whose layer count resolves the wildcards")
    check.add_argument(
        "--n-ipu",
        type=_at_least(1),
        help="devices of the pod, as --n_ipu of the training scripts: resolves per-pod values "
        "(pod4, pod16, ...) and sets replication_factor = n_ipu / (ipus_per_replica x tensor_parallel_size)",
    )
    check.add_argument(
        "--nproc-per-node",
        type=_at_least(1),
        default=1,
        help="processes of the torchrun job that will train with the "
        "config (default 1: every device slot runs in turn in one process); checks the slots and micro-batches fit",
    )
    check.set_defaults(func=_cmd_config_check)
    from .balance import add_balance_parser

    add_balance_parser(config_sub, _at_least, _finite)


def _add_plot(sub: Any) -> None:
    plot = sub.add_parser(
        "plot", help="draw training_curves.png (loss, learning rate, evaluation metrics) of a training run"
    )
    plot.add_argument("output_dir", help="the run's --output_dir (its trainer_state.json, or its latest checkpoint's)")
    plot.add_argument("--output", help="where to write the PNG (default: OUTPUT_DIR/training_curves.png)")
    plot.set_defaults(func=_cmd_plot)


def _add_benchmark(sub: Any) -> None:
    bench = sub.add_parser(
        "benchmark",
        help="ours vs transformers (Trainer / Trainer.predict) vs a plain loop, on the same batches; "
        "--mode serve: optimum-ipu serve vs transformers serve on the same requests",
    )
    bench.add_argument(
        "--mode",
        default="train",
        choices=["train", "inference", "latency", "throughput", "recipe", "serve"],
        help="train: IPUTrainer vs Trainer vs a training loop; inference: the engine vs Trainer.predict vs no_grad; "
        "latency / throughput: pipeline() vs transformers eager vs ONNX Runtime answering SQuAD questions end to end "
        "(batch 1 / --batch-size; --steps requests; --model a folder or an architecture); recipe: IPUTrainer vs "
        "Trainer on the demo's QA recipe, real SQuAD features, each in its own process, --pairs times (--model a "
        "pretrained folder, by default the PyPI MiniLM); serve: optimum-ipu serve vs transformers serve (with and "
        "without --continuous-batching) on the same /v1/completions requests, one server process at a time "
        "(--model a causal LM folder, by default a random 124 M GPT-2; --concurrency, --requests, --max-tokens, "
        "--servers), with --task automatic-speech-recognition on the same /v1/audio/transcriptions uploads, or with "
        "--task question-answering our server's overhead over pipeline() in process",
    )
    bench.add_argument(
        "--model",
        help="an architecture, random weights (default: bert-base-uncased-config); a model folder for latency, "
        "recipe and serve",
    )
    bench.add_argument(
        "--task",
        help="question-answering (the default), causal-lm, translation; with --mode latency also "
        "automatic-speech-recognition (--model a speech folder such as whisper-tiny.en: pipeline() vs transformers' "
        "pipeline on jfk.flac and --steps FSDD clips); with --mode serve text-generation (the default), "
        "question-answering or automatic-speech-recognition (--model a speech folder: /v1/audio/transcriptions of "
        "jfk.flac and 7 FSDD clips, ours vs transformers serve)",
    )
    bench.add_argument("--seq-len", type=_at_least(1), default=384)
    bench.add_argument(
        "--batch-size",
        type=_at_least(1),
        default=64,
        help="samples of one optimizer step (training) or one host call (inference), in every runner",
    )
    bench.add_argument("--steps", type=_at_least(1), default=20, help="steps (batches) per runner, warm-up included")
    bench.add_argument("--warmup", type=_at_least(0), default=3, help="first steps timed apart (compilation)")
    bench.add_argument("--precision", default="auto", choices=["auto", "fp32", "bf16"])
    bench.add_argument("--compile", action="store_true", help="torch.compile in every runner")
    bench.add_argument(
        "--packing",
        action="store_true",
        help="question-answering training on real SQuAD feature lengths: ours on "
        "packed rows (--batch-size rows a step), the baselines on the same features padded; reports features/s",
    )
    bench.add_argument(
        "--backends",
        nargs="+",
        default=["auto"],
        choices=["auto", "eager", "compile", "onnxruntime", "onnxruntime-int8"],
        help="latency / throughput: our pipeline's backends, one runner each (default: auto); serve: our "
        "server's --backend (one)",
    )
    bench.add_argument("--pairs", type=_at_least(1), default=3, help="recipe: runs of each trainer, alternating")
    bench.add_argument("--ipu-config", help="IPU config of our runner (default: one device slot)")
    bench.add_argument("--peak-tflops", type=float, help="the device's peak, for model FLOPs utilisation")
    _add_serve_benchmark_flags(bench)
    bench.add_argument("--output-dir", default="benchmark_results")
    bench.set_defaults(func=_cmd_benchmark)


def _add_serve_benchmark_flags(bench: argparse.ArgumentParser) -> None:
    """The flags of `benchmark --mode serve` only."""
    bench.add_argument(
        "--concurrency",
        type=_at_least(1),
        nargs="+",
        default=[1, 8, 32],
        help="serve: requests in flight, one level after the other",
    )
    bench.add_argument(
        "--requests", type=_at_least(1), default=64, help="serve: timed requests at each concurrency level"
    )
    bench.add_argument("--max-tokens", type=_at_least(1), default=32, help="serve: new tokens of each completion")
    bench.add_argument(
        "--servers",
        nargs="+",
        choices=["ours", "transformers", "transformers-cb", "transformers-compile"],
        help="serve: which servers run, in this order (default: ours, transformers, transformers-cb; a transformers "
        "serve that cannot run here is then skipped with a note; transformers-compile: its --compile)",
    )


def _add_serve(sub: Any) -> None:
    serve = sub.add_parser(
        "serve",
        help="answer HTTP requests with a pipeline(): OpenAI-compatible endpoints, every task at /v1/pipeline/<task>, "
        "/health and /metrics (the [serving] extra)",
    )
    serve.add_argument("model", help="model folder, or Hub id in the local cache")
    serve.add_argument("--task", help="a pipeline() task (default: inferred from the model, as pipeline() infers it)")
    serve.add_argument(
        "--ipu-config", help="folder, JSON file or id of an IPU config: its inference layout runs the model"
    )
    serve.add_argument("--host", default="127.0.0.1", help="address to listen on (0.0.0.0: every interface)")
    serve.add_argument("--port", type=_port, default=8000, help="TCP port (0: any free port)")
    serve.add_argument(
        "--max-batch-size",
        type=_at_least(1),
        help="inputs of one pipeline call at most (default: 8; 1 for speech recognition on a CPU, where a batch gains "
        "nothing)",
    )
    serve.add_argument(
        "--batch-wait-ms",
        type=_finite("milliseconds", above_zero=False),
        default=5.0,
        help="how long a batch waits for more requests at most (and at most a tenth of the previous batch's time)",
    )
    serve.add_argument("--max-queue", type=_at_least(1), default=64, help="requests waiting at most; then 429")
    serve.add_argument(
        "--request-timeout",
        type=_finite("seconds", above_zero=True),
        default=60.0,
        help="seconds a request may take, queue included; then 504",
    )
    serve.add_argument(
        "--max-body-bytes", type=_at_least(1), default=25 * 1024 * 1024, help="largest request body; then 413"
    )
    serve.add_argument("--served-model-name", help="the name clients give as `model` (default: the model's)")
    serve.add_argument(
        "--stage-timeout",
        type=_finite("seconds", above_zero=True),
        default=300.0,
        help="under torchrun: seconds a call waits for a stopped or hung stage process; then 500, /health 503, exit 1",
    )
    serve.add_argument(
        "--continuous-batching",
        action="store_true",
        help="generation requests (one choice, no seed) join the running batch at the next step",
    )
    serve.add_argument(
        "--continuous-batching-engine",
        choices=CONTINUOUS_ENGINES,
        default="auto",
        help="with --continuous-batching: transformers' managers (one process) or optimum-ipu's decoding (one process, "
        "or a model split over torchrun's processes or its stages on them); auto: transformers in one process, "
        "optimum-ipu under torchrun",
    )
    serve.add_argument(
        "--batches-in-flight",
        type=_at_least(1),
        default=2,
        help="under torchrun, a generation model's stages on the processes: batches decoding at once, a batch that "
        "arrives while another decodes starting at the stages' next turns (1: one at a time)",
    )
    serve.add_argument(
        "--backend",
        choices=SERVE_BACKENDS,
        default="auto",
        help="what runs the model, as pipeline(backend=...); compile: text generation's decoding steps through "
        "torch.compile, compiled during the warm-up (default: auto, per device and task)",
    )
    serve.add_argument(
        "--generate-kwargs",
        type=_json_object,
        help="speech recognition: generate() arguments of every transcription, as JSON (e.g. '{\"num_beams\": 1}': "
        "greedy decoding, where the pipeline's default is Whisper's 5 beams)",
    )
    serve.set_defaults(func=_cmd_serve)


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv or debug_env()  # --debug anywhere on the line (taken out), or OPTIMUM_IPU_DEBUG=1
    argv = [arg for arg in argv if arg != "--debug"]
    parser = build_parser()
    args = parser.parse_args(argv)
    # The library's warnings (deprecated keys, ...) belong to the report on stdout, so that stderr holds one
    # line, the error, when there is one. Only while the command runs: main() may be called in a process.
    notes = logging.StreamHandler(sys.stdout)
    notes.setFormatter(logging.Formatter("  note: %(message)s"))
    library = logging.getLogger("optimum_ipu")
    library.addHandler(notes)
    try:
        return args.func(args)
    except IncompatibleIPUConfigError as err:
        if debug:
            raise
        print(f"optimum-ipu: error: {err}", file=sys.stderr)
        return 2
    finally:
        library.removeHandler(notes)
