"""Stable Diffusion through `diffusers`' own pipelines, with Optimum Graphcore's `optimum.graphcore.diffusers` API.

`IPUStableDiffusionPipeline`, `IPUStableDiffusionImg2ImgPipeline` and `IPUStableDiffusionInpaintPipeline` are
subclasses of `diffusers`' `StableDiffusionPipeline`, `StableDiffusionImg2ImgPipeline` and
`StableDiffusionInpaintPipeline`: every step of a call (prompt encoding, the scheduler, the UNet, the VAE, the safety
checker) is `diffusers`' code, so the images are those of `diffusers` on the same components, seed and arguments.
What Optimum Graphcore added is kept:

- `from_pretrained(..., n_ipu=4, num_prompts=1, num_images_per_prompt=1, unet_ipu_config=None,
  text_encoder_ipu_config=None, vae_ipu_config=None, safety_checker_ipu_config=None,
  common_ipu_config_kwargs=None)`: an `IPUConfig` per component, built as Optimum Graphcore built it
  (`get_default_ipu_configs`: its table for Stable Diffusion 1 and 2, `common_ipu_config_kwargs` over its defaults,
  then the component's own dict), kept as `pipe.ipu_configs`. The components are placed on this machine's devices
  (`place_components`): with one device (a GPU, or the CPU) all of them share it; with several GPUs and `n_ipu` >= 2
  the UNet, which runs at every step, has the first to itself and the others share the second, tensors moving
  between them through `accelerate`'s hooks as with `diffusers`' own `device_map="balanced"`. On IPUs the UNet was
  cut into `ipus_per_replica` stages; here it runs whole on its device (it fits one).
- `torch_dtype=torch.float16` (the notebooks' choice) on a device that computes it; on a CPU without native half
  precision matrix units the pipeline runs in float32 (bfloat16 where the CPU has AVX512-BF16 or AMX), said once.
- `num_prompts` and `num_images_per_prompt` were compile-time batch sizes on IPUs. Here nothing is compiled: a call
  takes any number of prompts, and `num_images_per_prompt` becomes the default of each call's
  `num_images_per_prompt` (an IPU pipeline only ran calls that matched it). `executable_cache_dir` and the IPU
  compiler knobs (`matmul_proportion`, `attn_matrix_target_mem_mb`) have no effect. One line says so at load.
- `init_image=`, the img2img argument of the `diffusers` of Optimum Graphcore's notebooks, is today's `image=`.
- `detach_from_device()` released the IPUs to other processes; here no device is held exclusively, so it releases
  nothing and the pipeline stays usable.

`pipeline("text-to-image", model=folder)` (`text_to_image_pipeline`) wraps `IPUStableDiffusionPipeline` and returns
the images of each call as a list of `PIL.Image`, as `diffusers`' output `.images`.
"""

from __future__ import annotations

import functools
import inspect
import logging
import os
from typing import Any

import torch
from accelerate.hooks import AlignDevicesHook, add_hook_to_module

from ..config import IPUConfig
from ..runtime.devices import cpu_supports_bf16, default_device, detect_devices, supports_bf16
from ..runtime.inference.runner import default_precision
from ..runtime.precision import PRECISIONS
from .base import resolve_ipu_config

try:
    import diffusers
    from diffusers import StableDiffusionImg2ImgPipeline, StableDiffusionInpaintPipeline, StableDiffusionPipeline
except ModuleNotFoundError as err:
    if err.name != "diffusers":  # installed, and broken: its own error says why
        raise
    raise ImportError(
        'Stable Diffusion (optimum_ipu.diffusers, pipeline("text-to-image")) needs diffusers, which is not '
        'installed: pip install "optimum-ipu[diffusers]"'
    ) from err

logger = logging.getLogger(__name__)

# `from_pretrained`'s name of the dtype: `dtype` from diffusers 0.40 (`torch_dtype` is then deprecated), before that
# `torch_dtype` (what Optimum Graphcore's notebooks pass)
DTYPE_KEY = "dtype" if tuple(map(int, diffusers.__version__.split(".")[:2])) >= (0, 40) else "torch_dtype"

# Optimum Graphcore's `training_args.ALLOWED_N_IPU`: the pod sizes
ALLOWED_N_IPU = [2**i for i in range(7)]
COMPONENTS = ("unet", "text_encoder", "vae", "safety_checker")
# Optimum Graphcore's `IPUStableDiffusionPipelineMixin.__init__` defaults of `common_ipu_config_kwargs`
DEFAULT_COMMON_IPU_CONFIG_KWARGS: dict[str, Any] = {
    "enable_half_partials": True,
    "executable_cache_dir": "./exe_cache",
    "inference_device_iterations": 1,
    "inference_replication_factor": 1,
}
# keys of Optimum Graphcore's component configs that are no `IPUConfig` field (its UNet's attention slicing target)
IPU_MEMORY_KNOBS = ("attn_matrix_target_mem_mb",)

# Optimum Graphcore's `ipu_configs.py`, as it was (deprecated there too)
INFERENCE_ENGINES_TO_MODEL_NAMES = {
    "stable-diffusion-v1": "CompVis/stable-diffusion-v1-4",
    "stable-diffusion-v1-5": "runwayml/stable-diffusion-v1-5",
    "stable-diffusion-512-v2-0": "stabilityai/stable-diffusion-2-base",
    "stable-diffusion-768-v2-0": "stabilityai/stable-diffusion-2",
    "stable-diffusion-512-v2-1": "stabilityai/stable-diffusion-2-1-base",
    "stable-diffusion-768-v2-1": "stabilityai/stable-diffusion-2-1",
    "stable-inpainting-v1-0": "runwayml/stable-diffusion-inpainting",
    "stable-inpainting-512-v2-0": "stabilityai/stable-diffusion-2-inpainting",
}
_TEXT_ENCODER = {"ipus_per_replica": 1, "matmul_proportion": 0.6}
_SAFETY_CHECKER = {"ipus_per_replica": 1, "matmul_proportion": 0.6}
_UNET_512 = {"ipus_per_replica": 4, "matmul_proportion": [0.6, 0.6, 0.1, 0.3], "attn_matrix_target_mem_mb": 100}
_VAE_512 = {"ipus_per_replica": 2, "matmul_proportion": 0.3}
STABLE_DIFFUSION_V1_512_IPU_CONFIG = {
    "text_encoder": _TEXT_ENCODER,
    "unet": _UNET_512,
    "vae": _VAE_512,
    "safety_checker": _SAFETY_CHECKER,
}
STABLE_DIFFUSION_V2_512_IPU_CONFIG = dict(STABLE_DIFFUSION_V1_512_IPU_CONFIG)
STABLE_DIFFUSION_V2_768_IPU_CONFIG = {
    "text_encoder": _TEXT_ENCODER,
    "unet": {"ipus_per_replica": 4, "matmul_proportion": [0.06, 0.1, 0.1, 0.1], "attn_matrix_target_mem_mb": 45},
    "vae": None,  # "not supported yet" on IPUs
    "safety_checker": _SAFETY_CHECKER,
}


def _model_ipu_configs(unet_config: Any) -> dict[str, dict[str, Any] | None]:
    """Optimum Graphcore's table for a UNet: SD1 (cross_attention_dim 768), SD2 at 512 (1024, sample_size 64) or at
    768 (1024, 96); another UNet gets SD1's, said in the log (Optimum Graphcore said so, then failed on it)."""
    cross_attention_dim = getattr(unet_config, "cross_attention_dim", None)
    sample_size = getattr(unet_config, "sample_size", None)
    if cross_attention_dim == 768:
        return STABLE_DIFFUSION_V1_512_IPU_CONFIG
    if cross_attention_dim == 1024 and sample_size in (64, 96):
        return STABLE_DIFFUSION_V2_512_IPU_CONFIG if sample_size == 64 else STABLE_DIFFUSION_V2_768_IPU_CONFIG
    logger.info(
        "UNet config: cross_attention_dim=%s, sample_size=%s matches no known IPU configs (SD1 = (768, 64), SD2 "
        "512x512 = (1024, 64), SD2 768x768 = (1024, 96)): using the SD1 configs",
        cross_attention_dim,
        sample_size,
    )
    return STABLE_DIFFUSION_V1_512_IPU_CONFIG


def check_n_ipu(n_ipu: int) -> None:
    """Refuse an `n_ipu` that is no pod size (1, 2, 4, ..., 64), as Optimum Graphcore did."""
    if n_ipu not in ALLOWED_N_IPU:
        raise ValueError(
            f"n_ipu={n_ipu!r} is not a valid value for a Pod type, supported Pod types: "
            f"{', '.join(map(str, ALLOWED_N_IPU))}"
        )


def get_default_ipu_configs(
    unet_config: Any, n_ipu: int = 4, num_prompts: int = 1, num_images_per_prompt: int = 1, **common_kwargs: Any
) -> tuple[dict[str, Any] | None, ...]:
    """Optimum Graphcore's default IPU config dicts of `(unet, text_encoder, vae, safety_checker)`.

    The UNet always has one; the others only with `n_ipu` > 4 (with 4 IPUs, Optimum Graphcore ran them on the host).
    `common_kwargs` go into each, and `inference_device_iterations` is the batch each runs per call:
    `num_prompts x num_images_per_prompt`, the text encoder's `num_prompts`.

    Args:
        unet_config: the UNet's config (`cross_attention_dim` and `sample_size` choose the table).
        n_ipu (`int`, *optional*, defaults to 4): the pod size.
        num_prompts (`int`, *optional*, defaults to 1): prompts per call.
        num_images_per_prompt (`int`, *optional*, defaults to 1): images per prompt.
        common_kwargs: `IPUConfig` fields given to every component.
    """
    check_n_ipu(n_ipu)
    table = _model_ipu_configs(unet_config)
    common_kwargs["inference_device_iterations"] = num_prompts * num_images_per_prompt
    unet = {**table["unet"], **common_kwargs}
    others = [table[name] if n_ipu > 4 else None for name in ("text_encoder", "vae", "safety_checker")]
    text_encoder, vae, safety_checker = [{**other, **common_kwargs} if other else None for other in others]
    if text_encoder:  # run once per prompt (or batch of prompts); its outputs are repeated per image
        text_encoder["inference_device_iterations"] = num_prompts
    return unet, text_encoder, vae, safety_checker


def common_ipu_config_kwargs_of(common_ipu_config_kwargs: dict[str, Any] | None) -> dict[str, Any]:
    """`common_ipu_config_kwargs` over Optimum Graphcore's defaults (`DEFAULT_COMMON_IPU_CONFIG_KWARGS`)."""
    if common_ipu_config_kwargs is not None and not isinstance(common_ipu_config_kwargs, dict):
        raise TypeError(f"`common_ipu_config_kwargs` must be a dict, received {type(common_ipu_config_kwargs)}.")
    return {**DEFAULT_COMMON_IPU_CONFIG_KWARGS, **(common_ipu_config_kwargs or {})}


def build_ipu_configs(
    unet_config: Any,
    n_ipu: int = 4,
    num_prompts: int = 1,
    num_images_per_prompt: int = 1,
    common_ipu_config_kwargs: dict[str, Any] | None = None,
    **given: IPUConfig | dict | str | None,
) -> dict[str, IPUConfig | None]:
    """The `IPUConfig` of each component (`None`: a component Optimum Graphcore ran on the host).

    A component's default (`get_default_ipu_configs`, with `common_ipu_config_kwargs` over Optimum Graphcore's
    defaults) is updated with its given dict; a given `IPUConfig`, folder, file or bundled id is used as it is. The
    IPU memory knob `attn_matrix_target_mem_mb` is dropped (no `IPUConfig` field; no effect here).

    Args:
        unet_config: the UNet's config.
        n_ipu, num_prompts, num_images_per_prompt, common_ipu_config_kwargs: as `from_pretrained` takes them.
        given: `unet_ipu_config`, `text_encoder_ipu_config`, `vae_ipu_config`, `safety_checker_ipu_config`.
    """
    common = common_ipu_config_kwargs_of(common_ipu_config_kwargs)
    defaults = get_default_ipu_configs(unet_config, n_ipu, num_prompts, num_images_per_prompt, **common)
    configs: dict[str, IPUConfig | None] = {}
    for name, default in zip(COMPONENTS, defaults, strict=True):
        own = given.get(f"{name}_ipu_config")
        if own is not None and not isinstance(own, dict):
            configs[name] = resolve_ipu_config(own).eval()
            continue
        if own is None and default is None:
            configs[name] = None
            continue
        fields = {**(default or common), **(own or {})}
        fields = {key: value for key, value in fields.items() if key not in IPU_MEMORY_KNOBS}
        configs[name] = IPUConfig.from_dict(fields).eval()
    return configs


def component_devices(n_ipu: int, device: str | torch.device | None = None) -> tuple[torch.device, torch.device]:
    """`(the UNet's device, the other components' device)`: `device` for all when given; else, with two or more
    GPUs of this process and `n_ipu` >= 2, the first two (the UNet alone on the first); else this process's device
    (its GPU under `torchrun`, GPU 0, Apple's MPS, or the CPU)."""
    if device is not None:
        device = torch.device(device)
        return device, device
    found = detect_devices()
    if found.kind in ("cuda", "xpu") and found.world_size == 1 and found.count >= 2 and n_ipu >= 2:
        return torch.device(found.kind, 0), torch.device(found.kind, 1)
    main = default_device()
    return main, main


def place_components(pipe: StableDiffusionPipeline, unet_device: torch.device, other_device: torch.device) -> str:
    """Move the pipeline's modules to their devices; return where they are, in words.

    On one device, `pipe.to(device)`. On two, each module goes to its device with `accelerate`'s `AlignDevicesHook`
    (inputs moved to it, outputs moved back to where the inputs were), as `diffusers` places them for
    `device_map="balanced"`, and `pipe.hf_device_map` says where each is (`pipe.reset_device_map()` undoes it).
    The VAE stays with the text encoder: `diffusers` computes on the first component's device, the VAE's.
    """
    if unet_device == other_device:
        pipe.to(unet_device)
        return f"all on {unet_device}"
    device_map = {}
    for name, module in pipe.components.items():
        if isinstance(module, torch.nn.Module):
            device = unet_device if name == "unet" else other_device
            add_hook_to_module(module.to(device), AlignDevicesHook(execution_device=device, io_same_device=True))
            device_map[name] = str(device)
    pipe.hf_device_map = device_map
    others = ", ".join(name for name, where in device_map.items() if name != "unet")
    return f"unet on {unet_device}; {others} on {other_device}"


def dtype_on(device: torch.device, requested: Any) -> tuple[Any, str | None]:
    """The dtype the pipeline runs in on `device` when `torch_dtype=requested`, and why it differs (or `None`).

    Half precision where the device computes it: a CPU without native half precision matrix units (AVX512-BF16 or
    AMX, `cpu_supports_bf16`) would emulate it, many times slower than float32, so it runs in float32 there (in
    bfloat16 where it has them); a CUDA GPU without bfloat16 runs float16.
    """
    if requested not in (torch.float16, torch.bfloat16):
        return requested, None
    if device.type == "cpu":
        if cpu_supports_bf16():
            use, why = torch.bfloat16, "which its AVX512-BF16/AMX units compute"
        else:
            use, why = torch.float32, "as this CPU has no native half precision matrix units (AVX512-BF16 or AMX)"
    elif device.type == "cuda" and requested == torch.bfloat16 and not supports_bf16():
        use, why = torch.float16, "as this GPU does not compute bfloat16"
    else:
        return requested, None
    if use == requested:
        return requested, None
    return use, f"torch_dtype={requested} runs in {use} on {device}, {why}"


# said once per `from_pretrained`: what Optimum Graphcore's keywords became (`%s`: the class, n_ipu, where the
# components run, num_prompts, num_images_per_prompt)
SETTINGS_LINE = (
    "%s: Optimum Graphcore's IPU settings compile nothing here: n_ipu=%s: %s; num_prompts=%s: a call takes any number "
    "of prompts; num_images_per_prompt=%s: the default of each call; executable_cache_dir and the IPU memory knobs "
    "(matmul_proportion, attn_matrix_target_mem_mb) have no effect"
)


@functools.cache
def _call_parameters(cls: type) -> list[str]:
    """The parameter names of the `diffusers` `__call__` under the mixin in `cls`, in order (without `self`)."""
    return list(inspect.signature(super(IPUStableDiffusionPipelineMixin, cls).__call__).parameters)[1:]


class IPUStableDiffusionPipelineMixin:
    """Optimum Graphcore's `from_pretrained` keywords, `init_image=`, and `detach_from_device()` over a `diffusers`
    Stable Diffusion pipeline class (the next base class): see the module docstring."""

    @classmethod
    def from_pretrained(
        cls,
        pretrained_model_name_or_path: str | os.PathLike,
        n_ipu: int = 4,
        num_prompts: int = 1,
        num_images_per_prompt: int = 1,
        unet_ipu_config: IPUConfig | dict | str | None = None,
        text_encoder_ipu_config: IPUConfig | dict | str | None = None,
        vae_ipu_config: IPUConfig | dict | str | None = None,
        safety_checker_ipu_config: IPUConfig | dict | str | None = None,
        common_ipu_config_kwargs: dict[str, Any] | None = None,
        *,
        device: str | torch.device | None = None,
        **kwargs: Any,
    ) -> Any:
        """`diffusers`' `from_pretrained` with Optimum Graphcore's keywords; the components placed on the devices.

        Args:
            pretrained_model_name_or_path (`str` or `os.PathLike`): a `diffusers` folder or Hub id.
            n_ipu (`int`, *optional*, defaults to 4): Optimum Graphcore's pod size (1, 2, 4, ..., 64): here the most
                devices used (two at most: the UNet on one, the rest on the other).
            num_prompts (`int`, *optional*, defaults to 1): prompts per call on IPUs (a compile-time batch size).
                Here a call takes any number; it sets the configs' `inference_device_iterations` as it did.
            num_images_per_prompt (`int`, *optional*, defaults to 1): the default of each call's
                `num_images_per_prompt`.
            unet_ipu_config, text_encoder_ipu_config, vae_ipu_config, safety_checker_ipu_config (*optional*): a dict
                of `IPUConfig` fields over the component's default, or an `IPUConfig` / folder / bundled id.
            common_ipu_config_kwargs (`dict`, *optional*): `IPUConfig` fields of every component, over
                `DEFAULT_COMMON_IPU_CONFIG_KWARGS`.
            device (`str` or `torch.device`, *optional*): ours: every component on this device instead.
            kwargs: `diffusers`' own (`torch_dtype`, `revision`, `variant`, `safety_checker=None`, `device_map`,
                ...). With `device_map`, `diffusers` places the components.

        Returns:
            The pipeline, with `ipu_configs` (component name -> `IPUConfig` or `None`), `n_ipu`, `num_prompts` and
            `num_images_per_prompt` set.
        """
        check_n_ipu(n_ipu)
        unet_device, other_device = component_devices(n_ipu, device)
        dtype_key = "dtype" if "dtype" in kwargs else "torch_dtype"
        dtype, dtype_note = dtype_on(unet_device, kwargs.get(dtype_key))
        if dtype_note:
            kwargs[dtype_key] = dtype
            logger.warning("%s: %s", cls.__name__, dtype_note)
        pipe = super().from_pretrained(pretrained_model_name_or_path, **kwargs)
        pipe.ipu_configs = build_ipu_configs(
            pipe.unet.config,
            n_ipu,
            num_prompts,
            num_images_per_prompt,
            common_ipu_config_kwargs,
            unet_ipu_config=unet_ipu_config,
            text_encoder_ipu_config=text_encoder_ipu_config,
            vae_ipu_config=vae_ipu_config,
            safety_checker_ipu_config=safety_checker_ipu_config,
        )
        pipe.n_ipu, pipe.num_prompts, pipe.num_images_per_prompt = n_ipu, num_prompts, num_images_per_prompt
        if kwargs.get("device_map") is not None:
            where = f"placed by diffusers' device_map={kwargs['device_map']!r}"
        else:
            where = place_components(pipe, unet_device, other_device)
        logger.warning(SETTINGS_LINE, cls.__name__, n_ipu, where, num_prompts, num_images_per_prompt)
        return pipe

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """`diffusers`' call, with `init_image=` taken as `image=` (img2img and inpainting) and
        `num_images_per_prompt` defaulting to the one given to `from_pretrained`."""
        names = _call_parameters(type(self))
        if "init_image" in kwargs and "image" in names:
            if "image" in kwargs or len(args) > names.index("image"):
                raise TypeError("init_image= is the old name of image=: pass one of them")
            kwargs["image"] = kwargs.pop("init_image")
        default = getattr(self, "num_images_per_prompt", None)
        position = names.index("num_images_per_prompt") if "num_images_per_prompt" in names else len(args)
        if default is not None and "num_images_per_prompt" not in kwargs and len(args) <= position:
            kwargs["num_images_per_prompt"] = default
        return super().__call__(*args, **kwargs)

    def detach_from_device(self) -> None:
        """Optimum Graphcore's: detach the IPUs so that other processes can attach to them (the next call attached
        again). Here no device is held exclusively: nothing is released and the pipeline stays usable as it is. To
        free a GPU's memory, drop the pipeline (or move it with `pipe.to("cpu")`)."""
        return None


class IPUStableDiffusionPipeline(IPUStableDiffusionPipelineMixin, StableDiffusionPipeline):
    """`diffusers.StableDiffusionPipeline` (text to image) with Optimum Graphcore's `from_pretrained` keywords.

    Example:

    ```python
    >>> import torch
    >>> from optimum_ipu.diffusers import IPUStableDiffusionPipeline
    >>> pipe = IPUStableDiffusionPipeline.from_pretrained(
    ...     "stable-diffusion-v1-5/stable-diffusion-v1-5", torch_dtype=torch.float16, n_ipu=4, num_prompts=1,
    ...     num_images_per_prompt=1, common_ipu_config_kwargs={"executable_cache_dir": "./exe_cache"}
    ... )
    >>> image = pipe("apple", height=512, width=512, guidance_scale=7.5).images[0]
    ```
    """


class IPUStableDiffusionImg2ImgPipeline(IPUStableDiffusionPipelineMixin, StableDiffusionImg2ImgPipeline):
    """`diffusers.StableDiffusionImg2ImgPipeline` with Optimum Graphcore's `from_pretrained` keywords; a call takes
    the starting image as `image=` or, as the notebooks of Optimum Graphcore's `diffusers` passed it, `init_image=`."""


class IPUStableDiffusionInpaintPipeline(IPUStableDiffusionPipelineMixin, StableDiffusionInpaintPipeline):
    """`diffusers.StableDiffusionInpaintPipeline` (`image=`, `mask_image=`) with Optimum Graphcore's
    `from_pretrained` keywords."""


class IPUTextToImagePipeline:
    """The `"text-to-image"` task of `pipeline()`: a Stable Diffusion pipeline whose calls return the images.

    Args:
        diffusion (`StableDiffusionPipeline`): the `diffusers` pipeline that runs (`IPUStableDiffusionPipeline`
            when loaded by `pipeline()`).
        defaults: arguments of every call (e.g. `num_inference_steps=25`, `guidance_scale=7.5`).
    """

    task = "text-to-image"

    def __init__(self, diffusion: StableDiffusionPipeline, **defaults: Any) -> None:
        self.diffusion = diffusion
        self.defaults = defaults

    def __call__(self, prompt: str | list[str], **kwargs: Any) -> Any:
        """The images of `prompt` (a list of `PIL.Image`, `num_images_per_prompt` per prompt, in order; an array
        with `output_type="np"`): `diffusers`' output `.images`. `kwargs` are the pipeline call's, over `defaults`.
        """
        return self.diffusion(prompt, **{**self.defaults, **kwargs}).images


def text_to_image_pipeline(
    model: str | os.PathLike | StableDiffusionPipeline | None,
    ipu_config: IPUConfig | dict | str | None = None,
    *,
    precision: str | None = None,
    device: str | torch.device | None = None,
    model_kwargs: dict[str, Any] | None = None,
    refused: tuple[str, ...] = (),
    **kwargs: Any,
) -> IPUTextToImagePipeline:
    """`pipeline("text-to-image", model, ipu_config)`: a `diffusers` folder or Hub id loaded with
    `IPUStableDiffusionPipeline.from_pretrained` (`model_kwargs` passed on), or a `StableDiffusionPipeline` object.

    Args:
        model: the folder, Hub id or pipeline object.
        ipu_config (*optional*): the UNet's IPU config (`unet_ipu_config`).
        precision (`str`, *optional*): `"fp32"`, `"fp16"` or `"bf16"`: the `torch_dtype`; by default fp16 on
            accelerators and fp32 on CPUs (`pipeline()`'s defaults). Half precision on a CPU without native units
            runs in float32 (see `dtype_on`).
        device (*optional*): every component on this device; by default placed as `component_devices` says.
        model_kwargs (`dict`, *optional*): `from_pretrained` arguments (`n_ipu`, `revision`, `variant`, ...).
        refused: the `pipeline()` arguments given that this task does not take (a `ValueError` names them).
        kwargs: defaults of every call (`num_inference_steps`, `guidance_scale`, `height`, `width`, ...).
    """
    if refused:
        raise ValueError(f"pipeline('text-to-image') does not take {', '.join(refused)} (a transformers task's)")
    if model is None:  # Optimum Graphcore's pipeline() had no such task, so no default checkpoint
        raise ValueError("pipeline('text-to-image') has no default model; pass model= a diffusers folder or Hub id")
    if isinstance(model, StableDiffusionPipeline):
        if model_kwargs or ipu_config is not None or precision is not None:
            raise ValueError("model_kwargs, ipu_config and precision apply when the model is loaded from a path")
        if device is not None:
            model.to(device)
        return IPUTextToImagePipeline(model, **kwargs)
    if not isinstance(model, (str, os.PathLike)):
        raise TypeError(f"model: got a {type(model).__name__}; pass a diffusers folder, Hub id or pipeline")
    options = dict(model_kwargs or {})
    if precision is None and "dtype" not in options and "torch_dtype" not in options:
        precision = default_precision(component_devices(options.get("n_ipu", 4), device)[0])
    if precision is not None:
        options[DTYPE_KEY] = PRECISIONS[precision] or torch.float32
    if ipu_config is not None:
        options["unet_ipu_config"] = ipu_config
    pipe = IPUStableDiffusionPipeline.from_pretrained(os.fspath(model), device=device, **options)
    return IPUTextToImagePipeline(pipe, **kwargs)
