"""Stage i on device i in one process: a `device_map` that places each pipeline stage of the inference layout on its
own accelerator, for `transformers`' `from_pretrained(device_map=...)`.

`transformers` and `accelerate` do the placing, as for any `device_map`: each module's weights are read straight onto
its device, and accelerate's hooks move the activations from one device to the next (and a tied embedding's weight to
the head's device). What is ours is only which stage holds which module (`PipelinedModel.stage_modules()`: the
embeddings with stage 0, the layers as `inference_layers_per_ipu` lays them out, heads and final norms with the last
stage), so that a model past one GPU's memory is served in one process across the GPUs of a machine, as launching one
process per stage would split it.

```python
from optimum_ipu import AutoModelForCausalLM, IPUConfig

model = AutoModelForCausalLM.from_pretrained("path/or/hub-id", ipu_config=IPUConfig(layers_per_ipu=[-1, -1]),
                                             device_map="stages")  # stage 0 on cuda:0, stage 1 on cuda:1
```

Not run on GPUs yet: no machine with two GPUs has been lent to this project (the map itself is tested on the CPU).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch
import transformers
from accelerate import init_empty_weights

from ..config import IPUConfig
from ..errors import IncompatibleIPUConfigError
from ..runtime.devices import detect_devices
from .pipelined import to_pipelined
from .stage_loading import HUB_KWARGS

STAGES = "stages"  # the `device_map` value that asks for this placement


def stage_devices(stages: int) -> list[torch.device]:
    """The accelerators stage 0, 1, ... run on: one each, in order.

    Raises:
        `IncompatibleIPUConfigError`: fewer accelerators than stages, naming both and the alternatives.
    """
    found = detect_devices()
    if found.kind not in ("cuda", "xpu") or found.count < stages:
        raise IncompatibleIPUConfigError(
            f'device_map="stages": the inference layout has {stages} stages but this process sees {found.count} '
            f"{found.kind} device(s); give it one GPU a stage, launch one process per stage (torchrun), or drop "
            "device_map to run the stages in turn on one device"
        )
    return [torch.device(found.kind, i) for i in range(stages)]


def stage_device_map(model: torch.nn.Module, ipu_config: IPUConfig, devices: Sequence[Any]) -> dict[str, Any]:
    """
    `{module path: device}` placing each stage of `ipu_config`'s inference layout of `model` on `devices[stage]`.

    Args:
        model (`nn.Module`): the stock model (its weights may be on the meta device: only its structure is read).
        ipu_config (`IPUConfig`): the layout (`inference_layers_per_ipu`, else `layers_per_ipu`).
        devices (`Sequence`): one device (or accelerate device name / index) per stage.

    Returns:
        `dict[str, Any]`: the stage-owned modules that hold parameters or buffers, and the own tensors of any other
        module that holds some, each mapped to a device, as `from_pretrained(device_map=...)` takes it.
    """
    pipelined = to_pipelined(model, ipu_config)
    pipelined.train(False)  # stage_modules() reads the layout of the mode: the inference one
    owned = pipelined.stage_modules()
    if len(owned) != len(devices):
        raise ValueError(f"{len(owned)} stages but {len(devices)} devices")
    placed = {path: devices[stage] for stage, paths in enumerate(owned) for path in paths}
    by_depth = sorted(placed, key=len, reverse=True)
    device_map: dict[str, Any] = {}
    for name, module in model.named_modules():
        own = [n for n, _ in module.named_parameters(recurse=False)] + [
            n for n, _ in module.named_buffers(recurse=False)
        ]
        if not own or any(name == p or name.startswith(p + ".") for p in device_map):
            continue
        owner = next((p for p in by_depth if name == p or name.startswith(p + ".")), None)
        if owner is not None:  # the stage-owned module it is (or is inside)
            device_map[owner] = placed[owner]
        else:  # a module no stage names, which may hold stages' modules (Wav2Vec2's mask embedding beside its
            # encoder): its own tensors only, on stage 0, where what runs before the first layer runs
            device_map.update({f"{name}.{tensor}" if name else tensor: devices[0] for tensor in own})
    return device_map


def stages_device_map(auto_class: str, name_or_path: str, ipu_config: IPUConfig, **kwargs: Any) -> dict[str, Any]:
    """The `device_map` for `from_pretrained(name_or_path, device_map="stages")`: the model built on the meta device
    from its config (nothing read but the config), each stage of the inference layout on its own accelerator."""
    config = kwargs.get("config") or transformers.AutoConfig.from_pretrained(  # as load_stage reads it
        name_or_path,
        trust_remote_code=kwargs.get("trust_remote_code", False),
        **{k: kwargs[k] for k in HUB_KWARGS if k in kwargs},
    )
    with init_empty_weights():
        model = getattr(transformers, auto_class).from_config(config)
    stages = len(to_pipelined(model, ipu_config).stage_layout(inference=True))
    return stage_device_map(model, ipu_config, stage_devices(stages))
