"""Optimum Graphcore's Stable Diffusion notebooks, run cell by cell after the one changed import, on tiny random
`diffusers` folders under their checkpoint ids (`tests/notebooks/standins.py`)."""

from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

pytest.importorskip("diffusers")


def _saved(printed: str, tmp_path: Path, name: str, size: int) -> None:
    assert "<PIL.Image.Image image mode=RGB size=" in printed  # the cells showing `out.images[0]`
    assert f"size={size}x{size}" in printed, printed[-1500:]
    assert Image.open(tmp_path / name).size[0] > 0  # the figure the notebook saves


@pytest.mark.parametrize(
    ("notebook", "figure", "size"),
    [
        ("stable_diffusion/text_to_image.ipynb", "sample_images/text_to_image.png", 512),
        ("stable_diffusion/text_to_image_sd2.ipynb", "sample_images/text_to_image_sd2.png", 768),
        ("stable_diffusion/image_to_image.ipynb", "image_to_image.png", 512),
        ("stable_diffusion/inpainting.ipynb", "sample_images/inpainting.png", 512),
    ],
)
def test_stable_diffusion_notebook(notebook, figure, size, run_notebook, tmp_path):
    summary, printed = run_notebook(notebook)
    assert summary["not_applicable"] == 1  # the Hub login
    _saved(printed, tmp_path, figure, size)
