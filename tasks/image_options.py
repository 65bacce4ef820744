"""The ``image_classification`` task's config options: ``dataset.images`` (an image folder or a
manifest table) and ``model.weights``. Registered into ``core.config``'s schema (torch-free)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from core.config import Options, check_ranges, register_options
from core.config_id import add_later_key


class ImageExpectations(Options):
    """Data-quality bounds of an image folder (the ``image_classification`` task), reviewed like a
    table's expectations file: ``trainflow init`` writes them from a profile of the images."""

    # Every image's width and height in pixels, before the resize to ``images.size``.
    width: tuple[int, int] = (1, 100_000)
    height: tuple[int, int] = (1, 100_000)
    # Pillow modes the files may have (L: grey, RGB, RGBA, P: palette, ...); each is converted.
    modes: list[str] = ["L", "RGB"]
    train_images: tuple[int, int] = (1, 10_000_000)
    test_images: tuple[int, int] = (1, 10_000_000)
    # The smallest and largest share a class may have in a split.
    class_share: tuple[float, float] = (0.0, 1.0)
    # A file's size in bytes.
    file_bytes: tuple[int, int] = (1, 100_000_000)

    @model_validator(mode="after")
    def _ordered(self) -> "ImageExpectations":
        check_ranges(self, ("width", "height", "train_images", "test_images", "class_share", "file_bytes"))
        if self.class_share[1] > 1:
            raise ValueError(f"class_share: upper bound must be <= 1, got {self.class_share[1]}")
        if not self.modes:
            raise ValueError("modes: name at least one Pillow mode (e.g. L, RGB)")
        return self


class ImageAugment(Options):
    """Train-time augmentation, drawn anew for every training batch (never at evaluation)."""

    # Mirror each image left-right with probability 0.5 (off for digits and text: a mirrored 2 is no 2).
    hflip: bool = False
    # Shift each image by up to this many pixels in x and y (zero-padded, a random crop).
    shift: int = Field(0, ge=0)
    # Sharded sets (``images.shards``), in the DataLoader workers: a random resized crop of an area share
    # in [lo, hi] of the image (null: the evaluation's resize and centre crop, no random crop).
    crop_scale: tuple[float, float] | None = None
    # Sharded sets: brightness, contrast and saturation each times a factor in [1 - jitter, 1 + jitter].
    jitter: float = Field(0.0, ge=0, lt=1)

    @model_validator(mode="after")
    def _crop(self) -> "ImageAugment":
        if self.crop_scale is not None and not 0 < self.crop_scale[0] <= self.crop_scale[1] <= 1:
            raise ValueError(f"crop_scale: needs 0 < lo <= hi <= 1, got {list(self.crop_scale)}")
        return self


class ImagesConfig(Options):
    """An image folder: ``train/<class>/*`` and ``test/<class>/*`` (torchvision's ImageFolder
    layout) under ``dataset.path``, or a ``manifest`` table (CSV or Parquet) with columns ``path``
    (relative to ``dataset.path``), ``label`` and, optionally, ``split`` (train | test; left out:
    split by seed with ``dataset.test_fraction``). Files: .png, .jpg, .jpeg, .webp."""

    train_dir: str = "train"
    test_dir: str = "test"
    manifest: str | None = None
    # WebDataset tar shards: the folder (relative to ``path``; "." for ``path`` itself) holding
    # ``train_dir/000000.tar ...`` and ``test_dir/...``, streamed and decoded in DataLoader workers
    # (docs/images.md); null: image files, decoded once into a cache.
    shards: str | None = None
    # Sharded sets: DataLoader worker processes per rank decoding and augmenting (null: the CPUs per rank
    # less one, at least one).
    workers: int | None = Field(None, ge=0)
    # The model's input: every image is converted to `channels` (1: grey, 3: RGB) and resized to
    # [height, width] (bilinear), in training and in the registered model alike.
    size: tuple[int, int] = (32, 32)
    channels: Literal[1, 3] = 3
    augment: ImageAugment = ImageAugment()
    # The reviewed class set, in the model's output order (`trainflow init` writes it).
    classes: list[str] = []
    expectations: ImageExpectations = ImageExpectations()

    @model_validator(mode="after")
    def _size(self) -> "ImagesConfig":
        if min(self.size) < 4:
            raise ValueError(f"size: at least 4 x 4 pixels, got {list(self.size)}")
        if len(set(self.classes)) != len(self.classes):
            raise ValueError(f"classes: repeated class names in {self.classes}")
        return self


class ImageDataset(Options):
    # An image folder (the image_classification task), instead of a table.
    images: ImagesConfig | None = None


class ImageModel(Options):
    # image_cnn / resnet18 / resnet50 only: initial weights from a local file inside the repository:
    # *.safetensors (torchvision's and timm's resnet keys fit), or a torch file read with
    # torch.load(weights_only=True). Names must match; a head for another class count is replaced.
    weights: str | None = None
    # Image networks: the backbone's learning rate is this times training.lr (the head's is
    # training.lr), e.g. 0.1 when fine-tuning from model.weights.
    backbone_lr_scale: float = Field(1.0, gt=0)
    # Image networks: the backbone is not updated for the first this-many epochs (the head is).
    freeze_backbone_epochs: int = Field(0, ge=0)


register_options("dataset", ImageDataset)
# Keys of the images section added after image configs were first hashed.
for _path, _default in ((("images", "shards"), None), (("images", "workers"), None),
                        (("images", "augment", "crop_scale"), None), (("images", "augment", "jitter"), 0.0)):
    add_later_key(("dataset", *_path), _default)
register_options("model", ImageModel)
