"""Low-latency inference (`optimum_ipu.runtime.inference.runner`): buckets, backend choice, ONNX Runtime's exported
graph equal to the model, and `pipeline()`'s backends giving the eager answers; Optimum Graphcore's positional order and
precision default; the caller's config left as it was."""

from __future__ import annotations

import numpy as np
import onnx
import pytest
import torch
import transformers

from optimum_ipu import IPUConfig, to_pipelined
from optimum_ipu.pipelines import pipeline
from optimum_ipu.pipelines.base import resolve_precision
from optimum_ipu.runtime.inference.onnx import OnnxRuntimeModel
from optimum_ipu.runtime.inference.runner import (
    bucket_for,
    check_buckets,
    default_buckets,
    default_precision,
    resolve_backend,
)

CPU, CUDA = torch.device("cpu"), torch.device("cuda")
QUESTIONS = [
    ("Who commanded the ship?", "Captain Amelia Hartwell commanded the ship during the storm of 1912. " * 3),
    ("Where is the tower?", "The Eiffel tower is in Paris, in France."),
    ("When was it built?", "It was built in 1889 for the World's Fair in Paris, " + "a fair of many nations. " * 12),
]


def _tiny_bert(cls: str = "BertForQuestionAnswering") -> torch.nn.Module:
    torch.manual_seed(0)
    config = transformers.BertConfig(
        vocab_size=99, hidden_size=32, num_hidden_layers=2, num_attention_heads=2, intermediate_size=37
    )
    return getattr(transformers, cls)(config).eval()


def _tokens(batch: int, length: int, padded: int = 0) -> dict[str, torch.Tensor]:
    inputs = {
        "input_ids": torch.randint(3, 99, (batch, length)),
        "token_type_ids": torch.zeros(batch, length, dtype=torch.long),
        "attention_mask": torch.ones(batch, length, dtype=torch.long),
    }
    if padded:
        inputs["attention_mask"][0, -padded:] = 0
    return inputs


def test_buckets_and_backend_choice():
    assert default_buckets(384) == [64, 128, 192, 256, 320, 384]
    assert default_buckets(128) == [32, 64, 96, 128] and default_buckets(512) == [128, 256, 384, 512]
    assert default_buckets(24) == [16, 24] and default_buckets(8) == [8]
    assert [bucket_for(n, [64, 128, 384]) for n in (1, 64, 65, 200, 384)] == [64, 64, 128, 384, 384]
    assert check_buckets([384, 128, 128], 384) == [128, 384]
    with pytest.raises(ValueError, match="buckets: the longest is 256 but max_seq_length is 384"):
        check_buckets([128, 256], 384)
    with pytest.raises(ValueError, match="at most 8"):
        check_buckets(list(range(16, 385, 16)), 384)
    with pytest.raises(ValueError, match="positive number of tokens"):
        check_buckets([0, 384], 384)
    assert resolve_backend("auto", CPU) == "onnxruntime" and resolve_backend("auto", CUDA) == "compile"
    assert resolve_backend("auto", CPU, ("eager", "compile")) == "eager"
    assert resolve_backend("auto", CUDA, ("eager",)) == "eager"
    with pytest.raises(ValueError, match="backend: got 'tensorrt'"):
        resolve_backend("tensorrt", CPU)
    with pytest.raises(ValueError, match="this task runs eager; choose one of them"):
        resolve_backend("onnxruntime", CPU, ("eager",))
    # Optimum Graphcore's pipeline(fp16=True) on accelerators; fp32 on CPUs; fp16=False says fp32
    assert default_precision(CUDA) == "fp16" and default_precision(CPU) == "fp32"
    assert resolve_precision() is None and resolve_precision(fp16=False) == "fp32"
    assert resolve_precision(fp16=True) == "fp16" and resolve_precision(bf16=True) == "bf16"


def test_onnxruntime_model_equals_the_model_at_any_batch_and_length(tmp_path):
    model = _tiny_bert()
    names = ["input_ids", "token_type_ids", "attention_mask"]  # the tokenizer's order, not the forward's
    ort_model = OnnxRuntimeModel(model, names, cache_dir=str(tmp_path))
    assert ort_model.input_names == ["input_ids", "attention_mask", "token_type_ids"]
    assert ort_model.output_names == ["start_logits", "end_logits"]
    fused = {node.op_type for node in onnx.load(ort_model.path).graph.node}
    assert {"Attention", "SkipLayerNormalization"} <= fused  # ONNX Runtime's fused encoder
    torch.manual_seed(1)
    for batch, length, padded in [(1, 5, 0), (1, 200, 0), (2, 16, 3), (3, 7, 2)]:
        inputs = _tokens(batch, length, padded)
        with torch.no_grad():
            expected = model(**inputs)
        outputs = ort_model(**inputs)
        for name in ("start_logits", "end_logits"):
            real = inputs["attention_mask"].bool()  # padded positions are not compared (masked anyway)
            torch.testing.assert_close(outputs[name][real], expected[name][real], atol=1e-4, rtol=0)
    # the exported graph is kept under a key of the weights: a second build reads it, new weights export again
    again = OnnxRuntimeModel(model, names, cache_dir=str(tmp_path))
    assert again.path == ort_model.path
    with torch.no_grad():
        model.qa_outputs.bias.add_(1.0)
    assert OnnxRuntimeModel(model, names, cache_dir=str(tmp_path)).path != ort_model.path
    with pytest.raises(ValueError, match=r"\['pixel_values'\] are not inputs of BertForQuestionAnswering.forward"):
        OnnxRuntimeModel(model, ["input_ids", "pixel_values"])


def test_int8_quantization_runs_quantized_matmuls():
    model = _tiny_bert("BertForSequenceClassification")
    quantized = OnnxRuntimeModel(model, ["input_ids", "attention_mask"], quantize=True)
    graph = onnx.load(quantized.path).graph
    ops = {node.op_type for node in graph.node}
    assert "DynamicQuantizeLinear" in ops or "MatMulInteger" in ops or "DynamicQuantizeMatMul" in ops
    # one scale per output channel (a vector, not a scalar) for every matrix weight of the 2 layers (q/k/v, output,
    # up, down), the pooler and the head: one scale per tensor cost 2.8 F1
    # on a fine-tuned MiniLM where per channel cost 0.4
    scales = [list(i.dims) for i in graph.initializer if i.name.endswith("_scale") and "embeddings" not in i.name]
    assert len(scales) >= 2 * 4 and all(len(dims) == 1 and dims[0] > 1 for dims in scales), scales
    inputs = _tokens(2, 12)
    del inputs["token_type_ids"]
    logits = quantized(**inputs)["logits"]
    with torch.no_grad():
        expected = model(**inputs).logits
    assert logits.shape == expected.shape and torch.isfinite(logits).all()
    assert "int8" in repr(quantized)


@pytest.mark.parametrize("backend", ["onnxruntime", "compile"])
def test_pipeline_backends_answer_as_eager(tiny_qa_model_dir, backend):
    """Every exact backend gives eager PyTorch's answers and scores (eager padded to the static length: what the
    pipeline ran before buckets)."""
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_qa_model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qa_model_dir)
    config = IPUConfig(layers_per_ipu=[1, -1])
    static = pipeline(
        "question-answering", model, config, tokenizer, backend="eager", buckets=[128], max_seq_length=128
    )
    # compile: one bucket (one graph), so that the test compiles once
    buckets = [128] if backend == "compile" else None
    ours = pipeline(
        "question-answering", model, config, tokenizer, backend=backend, buckets=buckets, max_seq_length=128
    )
    assert ours.runner.backend == backend
    for question, context in QUESTIONS:
        # the logits of every window, through each pipeline's own collation (bucket, own length or static length)
        windows = list(ours.preprocess({"question": question, "context": context}, doc_stride=32))
        for window in windows:
            inputs = {k: v for k, v in window.items() if isinstance(v, (torch.Tensor, np.ndarray))}
            length = inputs["input_ids"].shape[1]
            got, expected = ours.run_model(ours.collate([inputs])), static.run_model(static.collate([inputs]))
            for name in ("start_logits", "end_logits"):
                # ONNX Runtime's logits stay numpy arrays in this task (array_outputs)
                got_logits = torch.as_tensor(got[name][:, :length])
                torch.testing.assert_close(got_logits, expected[name][:, :length], atol=1e-4, rtol=0)
        one, reference = (
            ours(question=question, context=context, doc_stride=32),
            static(question=question, context=context, doc_stride=32),
        )
        assert one["answer"] == reference["answer"] and abs(one["score"] - reference["score"]) < 1e-4
    # batched rows of different lengths are padded together and give the same answers as one at a time
    batched = ours([{"question": q, "context": c} for q, c in QUESTIONS], batch_size=2, doc_stride=32)
    assert [a["answer"] for a in batched] == [
        static(question=q, context=c, doc_stride=32)["answer"] for q, c in QUESTIONS
    ]


def test_eager_buckets_pad_each_batch_to_its_bucket(tiny_qa_model_dir):
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_qa_model_dir)
    seen = []
    model.register_forward_pre_hook(lambda m, a, kw: seen.append(tuple(kw["input_ids"].shape)), with_kwargs=True)
    qa = pipeline("question-answering", model=model, backend="eager")
    assert qa.runner.buckets == [64, 128, 192, 256, 320, 384]
    qa(question=QUESTIONS[1][0], context=QUESTIONS[1][1])
    qa(question=QUESTIONS[0][0], context=QUESTIONS[0][1] * 2)
    assert seen == [(1, 64), (1, 128)]


def test_the_inference_layout_sets_the_buckets(tiny_qa_model_dir, caplog):
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_qa_model_dir)
    config = IPUConfig(inference_parallelize_kwargs={"sequence_buckets": [128, 384]})
    assert "sequence_buckets" not in caplog.text  # realised, so not reported as a key without effect
    qa = pipeline("question-answering", model, config, backend="eager")
    assert qa.runner.buckets == [128, 384]
    assert pipeline("question-answering", model, config, backend="eager", buckets=[384]).runner.buckets == [384]


def test_pipeline_takes_optimum_graphcores_order_and_leaves_the_config_alone(tiny_qa_model_dir):
    model = transformers.AutoModelForQuestionAnswering.from_pretrained(tiny_qa_model_dir)
    tokenizer = transformers.AutoTokenizer.from_pretrained(tiny_qa_model_dir)
    config = IPUConfig(layers_per_ipu=[1, -1], inference_layers_per_ipu=[2], inference_device_iterations=2)
    qa = pipeline("question-answering", model, config, tokenizer, max_seq_length=64)
    assert config.mode == "training" and qa.ipu_config is not config  # a copy; the caller's stays in training
    assert qa.host_batch_rows() == 2 and qa.engine.precision == "fp32"  # CPU: fp32 by default
    assert qa(question="Who?", context="Ann and Bob.")["answer"] in "Ann and Bob."
    with pytest.raises(TypeError, match="third positional argument is the IPU config.*tokenizer="):
        pipeline("question-answering", model, tokenizer)
    # a pipelined model given as it is: its shared config keeps its mode (its trainer reads the training values)
    shared = IPUConfig(layers_per_ipu=[1, -1])
    pipelined = to_pipelined(model.train(), shared, parallelize=True)
    pipeline("question-answering", pipelined, tokenizer=tokenizer, max_seq_length=64, backend="eager")
    assert shared.mode == "training"


def test_compile_on_a_cpu_without_a_cpp_compiler_is_refused_in_one_line(monkeypatch):
    from optimum_ipu.runtime.inference import runner

    monkeypatch.delenv("CXX", raising=False)
    assert resolve_backend("compile", CPU) == "compile"  # this machine has one (torch.compile's tests need it)
    monkeypatch.setattr(runner.shutil, "which", lambda name: None)
    with pytest.raises(ValueError, match=r"backend='compile' on a CPU: .* C\+\+ compiler.* or choose backend='eager'"):
        resolve_backend("compile", CPU)
    assert resolve_backend("compile", CUDA) == "compile"  # a GPU's kernels are Triton's
    monkeypatch.setattr(runner.shutil, "which", lambda name: "/usr/bin/my-cxx" if name == "my-cxx" else None)
    monkeypatch.setenv("CXX", "my-cxx")
    assert resolve_backend("compile", CPU) == "compile"  # $CXX is the one looked for
