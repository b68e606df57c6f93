"""`optimum-ipu serve`: an HTTP front (FastAPI, uvicorn) over one `pipeline()` held whole in this process.

Requests are batched by arrival and handed to the same pipelines a Python user calls; nothing about models or
layouts lives here. OpenAI-compatible endpoints (`/v1/completions`, `/v1/chat/completions`, `/v1/embeddings`,
`/v1/audio/transcriptions`, `/v1/models`), every task at `/v1/pipeline/<task>`, `/health` and `/metrics`.
Needs the `[serving]` extra (`pip install "optimum-ipu[serving]"`).

```python
from optimum_ipu.pipelines import pipeline
from optimum_ipu.serving import ServeSettings, create_app

app = create_app(pipeline("text-classification", model="path/to/model"), ServeSettings("path/to/model"))
```

Names are loaded on first use, so that `import optimum_ipu.serving` costs nothing until one is used.
"""

from __future__ import annotations

import importlib
from typing import Any

_LAZY: dict[str, str] = {
    "ServeSettings": ".settings",
    "create_app": ".app",
    "ServerState": ".app",
    "ServerMetrics": ".metrics",
    "serve": ".server",
    "load_pipeline": ".server",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name], __name__), name)
    raise AttributeError(f"module 'optimum_ipu.serving' has no attribute {name!r}")


__all__ = list(_LAZY)
