"""`AutoModelFor*` classes that return pipelined models, as in the optimum-graphcore announcement:

```python
from optimum_ipu import AutoModelForQuestionAnswering
model = AutoModelForQuestionAnswering.from_pretrained(path, ipu_config="Graphcore/bert-base-ipu")
```
"""

from __future__ import annotations

from typing import Any

import transformers

from ..config import IPUConfig
from .pipelined import PipelinedModel, to_pipelined
from .plans import AUTO_CLASSES


class _IPUAutoModel:
    _hf_auto_class: str = "AutoModel"

    def __init__(self) -> None:
        raise OSError(f"{type(self).__name__} is built with `from_pretrained` or `from_config`")

    @classmethod
    def _auto(cls) -> Any:
        return getattr(transformers, cls._hf_auto_class)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: str, *args: Any, ipu_config: IPUConfig | str | None = None, **kwargs: Any
    ) -> PipelinedModel:
        """Load with `transformers.<same name>.from_pretrained(...)`, then pipeline and parallelize.

        Args:
            pretrained_model_name_or_path (`str`): a model folder or an id in the local Hugging Face cache.
            ipu_config (`IPUConfig` or `str`, *optional*): a config, a folder / JSON file / id of one
                (e.g. `"Graphcore/bert-base-ipu"`); defaults to `IPUConfig()` (one stage, one replica).
            args, kwargs: passed to `transformers`' `from_pretrained`.
        """
        model = cls._auto().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        return to_pipelined(model, ipu_config if ipu_config is not None else IPUConfig(), parallelize=True)

    @classmethod
    def from_config(cls, config: Any, ipu_config: IPUConfig | str | None = None, **kwargs: Any) -> PipelinedModel:
        """Build with random weights from a `transformers` config, then pipeline and parallelize."""
        model = cls._auto().from_config(config, **kwargs)
        return to_pipelined(model, ipu_config if ipu_config is not None else IPUConfig(), parallelize=True)


def _make(name: str) -> type[_IPUAutoModel]:
    doc = f"Like `transformers.{name}`, returning a `PipelinedModel`. See `_IPUAutoModel.from_pretrained`."
    return type(name, (_IPUAutoModel,), {"_hf_auto_class": name, "__doc__": doc})


# One class per name of transformers' auto classes (listed in plans.AUTO_CLASSES).
AutoModel = _make("AutoModel")
AutoModelForPreTraining = _make("AutoModelForPreTraining")
AutoModelForMaskedLM = _make("AutoModelForMaskedLM")
AutoModelForCausalLM = _make("AutoModelForCausalLM")
AutoModelForSeq2SeqLM = _make("AutoModelForSeq2SeqLM")
AutoModelForSequenceClassification = _make("AutoModelForSequenceClassification")
AutoModelForTokenClassification = _make("AutoModelForTokenClassification")
AutoModelForQuestionAnswering = _make("AutoModelForQuestionAnswering")
AutoModelForMultipleChoice = _make("AutoModelForMultipleChoice")
AutoModelForImageClassification = _make("AutoModelForImageClassification")
AutoModelForAudioClassification = _make("AutoModelForAudioClassification")
AutoModelForCTC = _make("AutoModelForCTC")
AutoModelForSpeechSeq2Seq = _make("AutoModelForSpeechSeq2Seq")
assert {name for name in globals() if name.startswith("AutoModel")} == set(AUTO_CLASSES)
