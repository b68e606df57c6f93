"""Inference backends: `runner` (`InferenceRunner`: eager, `torch.compile` or ONNX Runtime, sequence buckets) and
`onnx` (the exported graph on ONNX Runtime)."""
