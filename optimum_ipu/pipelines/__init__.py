"""`pipeline(task, model=..., ipu_config=...)`: `transformers` pipelines on pipelined models at static shapes.

```python
from optimum_ipu.pipelines import pipeline

classifier = pipeline("text-classification", model="path/to/model", ipu_config="Graphcore/bert-base-ipu")
classifier(["I love it", "I hate it"], batch_size=4)
```

Names are loaded on first use, so `optimum_ipu.pipelines.question_answering` (the span selection that
`examples/question-answering` shares) imports without the other tasks.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "pipeline": ".factory",
    "SUPPORTED_TASKS": ".factory",
    "TASK_ALIASES": ".factory",
    "supported_tasks": ".factory",
    "list_tasks": ".factory",
    "check_task": ".factory",
    "TASK_DEFAULTS": ".defaults",
    "NoDefaultModelOfflineError": ".defaults",
    "infer_task": ".defaults",
    "StaticBatchingPipeline": ".base",
    "IPUTextClassificationPipeline": ".classification",
    "IPUTokenClassificationPipeline": ".classification",
    "IPUFillMaskPipeline": ".classification",
    "IPUZeroShotClassificationPipeline": ".classification",
    "IPUQuestionAnsweringPipeline": ".question_answering",
    "answer_span_candidates": ".question_answering",
    "nbest_with_probabilities": ".question_answering",
    "IPUTextGenerationPipeline": ".generation",
    "IPUText2TextGenerationPipeline": ".generation",
    "IPUSummarizationPipeline": ".generation",
    "IPUTranslationPipeline": ".generation",
    "IPUImageClassificationPipeline": ".vision",
    "IPUAudioClassificationPipeline": ".speech",
    "IPUAutomaticSpeechRecognitionPipeline": ".speech",
    "IPUFeatureExtractionPipeline": ".embeddings",
    "IPUSentenceEmbeddingsPipeline": ".embeddings",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'optimum_ipu.pipelines' has no attribute {name!r}")


__all__ = list(_LAZY)
