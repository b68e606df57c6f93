"""Optimum Graphcore's `optimum.graphcore.diffusers`: Stable Diffusion through `diffusers`' own pipelines.

```python
from optimum_ipu.diffusers import IPUStableDiffusionPipeline  # was: from optimum.graphcore.diffusers import ...
```

The names are loaded on first use from `optimum_ipu.pipelines.diffusion` (see there), so `import optimum_ipu` never
needs `diffusers`; without it, a name asked for raises one `ImportError` saying `pip install "optimum-ipu[diffusers]"`.
"""

from __future__ import annotations

import importlib
from typing import Any

_NAMES = (
    "IPUStableDiffusionPipeline",
    "IPUStableDiffusionImg2ImgPipeline",
    "IPUStableDiffusionInpaintPipeline",
    "IPUStableDiffusionPipelineMixin",
    "INFERENCE_ENGINES_TO_MODEL_NAMES",
    "get_default_ipu_configs",
)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(".pipelines.diffusion", "optimum_ipu"), name)
    raise AttributeError(f"module 'optimum_ipu.diffusers' has no attribute {name!r}")


__all__ = list(_NAMES)
