"""What Optimum Graphcore's `optimum.graphcore.models.whisper` gave its Whisper notebooks that means something here.

Code written for it imports `WhisperProcessorTorch` from `optimum.graphcore.models.whisper`; change that line to
`optimum_ipu.models.whisper`. Its pipelined Whisper (`PipelinedWhisperForConditionalGeneration`: the encoder and the
decoder on their IPUs, a KV cache and an encoder-output buffer on the device) is what `to_pipelined(model,
ipu_config).parallelize(for_generation=True, ...)` gives here from the stock model, through the family's stage plan.
"""

from __future__ import annotations

from transformers import WhisperProcessor

# Optimum Graphcore's `WhisperProcessorTorch` swapped the numpy log-mel feature extractor of `transformers` 4 for one
# computed with torch; `transformers` 5's `WhisperFeatureExtractor` computes with torch already (same features),
# so its processor is the one.
WhisperProcessorTorch = WhisperProcessor

__all__ = ["WhisperProcessorTorch"]
