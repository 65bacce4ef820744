"""The streamed image path's transforms, with Pillow only (torchvision does not run here).

Evaluation (and the registered model, ``tasks/pyfunc_image.py``, which repeats it line for line; a
unit test checks they agree): scale the image so it covers ``size / crop_ratio`` (aspect kept), then
cut the centre ``size``. Training: a random resized crop (an area share in ``crop_scale`` of the image,
an aspect ratio in [3/4, 4/3]) scaled to ``size``, a left-right flip (``hflip``) and a colour jitter
(brightness, contrast and saturation each times a factor in [1 - jitter, 1 + jitter]). Every draw
comes from a generator seeded by (seed, epoch, sample id): the same sample in the same epoch gets the
same pixels in any worker, on any world size, after any resume.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

import numpy as np

from tasks.image_data import _array, open_image

if TYPE_CHECKING:
    from tasks.image_options import ImageAugment

# The share of the scaled image the evaluation's centre crop keeps (ImageNet's 224 of 256).
CROP_RATIO = 0.875
_AUGMENT = 0x61  # the transforms' own stream of seeded draws


def centre_crop(img, size: tuple[int, int], ratio: float = CROP_RATIO):
    """``img`` scaled (bilinear) to cover ``size / ratio``, then its centre ``size`` = (height, width)."""
    from PIL import Image

    h, w = size
    k = max(h / ratio / img.height, w / ratio / img.width)
    sw, sh = max(w, round(img.width * k)), max(h, round(img.height * k))
    img = img.resize((sw, sh), Image.Resampling.BILINEAR)
    left, top = (sw - w) // 2, (sh - h) // 2
    return img.crop((left, top, left + w, top + h))


def eval_pixels(data: bytes, size: tuple[int, int], channels: int, name: str = "the file") -> np.ndarray:
    """uint8 ``[channels, height, width]``: the evaluation transform of one encoded image."""
    return _array(centre_crop(open_image(data, channels, name), size))


def _crop_box(rng: np.random.Generator, width: int, height: int, scale: tuple[float, float]) -> tuple[int, ...]:
    """torchvision's RandomResizedCrop box: ten tries at an area share in ``scale`` and an aspect ratio in
    [3/4, 4/3] (log-uniform), else the whole image cut to the nearest ratio in range."""
    area = width * height
    for _ in range(10):
        target = area * rng.uniform(*scale)
        aspect = math.exp(rng.uniform(math.log(3 / 4), math.log(4 / 3)))
        w, h = round(math.sqrt(target * aspect)), round(math.sqrt(target / aspect))
        if 0 < w <= width and 0 < h <= height:
            left, top = int(rng.integers(0, width - w + 1)), int(rng.integers(0, height - h + 1))
            return left, top, left + w, top + h
    aspect = width / height
    if aspect > 4 / 3:  # too wide: full height, the width cut to 4/3 of it
        w, h = min(width, round(height * 4 / 3)), height
    elif aspect < 3 / 4:  # too tall: full width, the height cut to 4/3 of it
        w, h = width, min(height, round(width * 4 / 3))
    else:
        w, h = width, height
    left, top = (width - w) // 2, (height - h) // 2
    return left, top, left + w, top + h


def train_pixels(data: bytes, size: tuple[int, int], channels: int, augment: "ImageAugment", seed: int, epoch: int,
                 sample: int, name: str = "the file") -> np.ndarray:
    """uint8 ``[channels, height, width]``: the training transform of one encoded image, its draws a
    function of (seed, epoch, sample) alone."""
    from PIL import Image, ImageEnhance, ImageOps

    rng = np.random.default_rng([seed % 2**64, epoch, sample, _AUGMENT])
    img = open_image(data, channels, name)
    if augment.crop_scale is not None:
        box = _crop_box(rng, img.width, img.height, tuple(augment.crop_scale))
        img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR, box=box)
    else:
        img = centre_crop(img, size)
    if augment.hflip and rng.random() < 0.5:
        img = ImageOps.mirror(img)
    if augment.jitter:
        lo, hi = 1 - augment.jitter, 1 + augment.jitter
        img = ImageEnhance.Brightness(img).enhance(rng.uniform(lo, hi))
        img = ImageEnhance.Contrast(img).enhance(rng.uniform(lo, hi))
        if channels == 3:
            img = ImageEnhance.Color(img).enhance(rng.uniform(lo, hi))
    return _array(img)
