"""`AutoModelFor*` classes that return pipelined models, as in the optimum-graphcore announcement:

```python
from optimum_ipu import AutoModelForQuestionAnswering
model = AutoModelForQuestionAnswering.from_pretrained(path, ipu_config="Graphcore/bert-base-ipu")
```
"""

from __future__ import annotations

import logging
from typing import Any

import transformers
from transformers.utils.hub import cached_file

from ..config import IPUConfig
from ..config_schema import CONFIG_NAME
from ..config_validation import check_subfolder
from ..errors import IncompatibleIPUConfigError
from .pipelined import PipelinedModel, to_pipelined
from .plans import AUTO_CLASSES, load_model_modules
from .stage_loading import HUB_KWARGS, load_stage, loads_stage_only
from .stage_placement import STAGES, stages_device_map

logger = logging.getLogger(__name__)

load_model_modules()  # the model types of the plans' own models (GroupBERT's) known to transformers' auto classes


def repo_ipu_config(pretrained_model_name_or_path: str, **kwargs: Any) -> IPUConfig | None:
    """The `ipu_config.json` that sits beside a model (in its folder, the local cache, or its Hub repo, found by
    `transformers`' own file resolution with the same `revision`, `token`, ...), or None when it has none.

    Args:
        pretrained_model_name_or_path (`str`): a model folder or Hub id.
        kwargs: `from_pretrained`'s keyword arguments; those that locate a file on the Hub are used.
    """
    found = cached_file(
        pretrained_model_name_or_path,
        CONFIG_NAME,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
        **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs},
    )
    if found is None:
        return None
    logger.info("using the IPU config saved with the model: %s", found)
    return IPUConfig.from_json_file(found)


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
            pretrained_model_name_or_path (`str`): a model folder or a Hub id (downloaded as `transformers` does,
                or read from the local cache offline).
            ipu_config (`IPUConfig` or `str`, *optional*): a config, a folder / JSON file / id of one
                (e.g. `"Graphcore/bert-base-ipu"`); defaults to the `ipu_config.json` saved with the model (as
                `IPUTrainer.save_model` and Optimum Graphcore write it), else `IPUConfig()` (one stage, one replica).
            args, kwargs: passed to `transformers`' `from_pretrained`; `device_map="stages"` places each stage of the
                inference layout on its own GPU of this process (`stage_placement`: stage i on GPU i).

        Under `torchrun`, with the config's stages on separate processes, each process builds the model on the meta
        device and reads only the tensors of its own stage (`optimum_ipu.models.stage_loading.load_stage`).
        """
        if kwargs.get("subfolder"):  # one line, before transformers or huggingface_hub read a path outside
            check_subfolder(str(kwargs["subfolder"]))
        if ipu_config is None:
            ipu_config = repo_ipu_config(pretrained_model_name_or_path, **kwargs) or IPUConfig()
        if not isinstance(ipu_config, IPUConfig):
            ipu_config = IPUConfig.from_pretrained(ipu_config)
        placed = kwargs.get("device_map") == STAGES
        if placed and loads_stage_only(ipu_config):
            raise IncompatibleIPUConfigError(
                'device_map="stages" places every stage in this process, but under torchrun each process loads its '
                "own stage already: drop device_map, or run one process"
            )
        if placed:
            kwargs["device_map"] = stages_device_map(
                cls._hf_auto_class, pretrained_model_name_or_path, ipu_config, **kwargs
            )
        if loads_stage_only(ipu_config) and not args:
            # under torchrun with stages on separate processes: build on the meta device, read this stage's tensors
            return load_stage(cls._hf_auto_class, pretrained_model_name_or_path, ipu_config, **kwargs)
        model = cls._auto().from_pretrained(pretrained_model_name_or_path, *args, **kwargs)
        return to_pipelined(model, ipu_config, parallelize=True)

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
