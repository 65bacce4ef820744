"""Image folders as people have them, torch-free: listing, profiling and decoding.

A dataset is ``train/<class>/*`` and ``test/<class>/*`` under ``dataset.path``, or a manifest table
(``path``, ``label``, optionally ``split``); no path may lead outside ``dataset.path``. Decoding is
Pillow's, as in the registered model (``tasks/pyfunc_image.py``; a unit test checks that they agree).
"""

from __future__ import annotations

import hashlib
import io
import warnings
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from core.errors import DataUnavailableError

if TYPE_CHECKING:
    import pandas as pd

    from core.config import DatasetConfig

SUFFIXES = (".png", ".jpg", ".jpeg", ".webp")
SPLITS = ("train", "test")
MODES = {1: "L", 3: "RGB"}
# Pixels (width x height) an image may have: its size is read from the header and a larger image
# is refused before it is decoded (a 13,000 x 13,000 PNG of a few hundred KB decodes to about a GB).
# A 48-megapixel photo fits. Pillow's own bomb check is set to the same bound where we decode.
MAX_PIXELS = 64 * 2**20
# Columns of the per-file profile (``profile``): what validation's expectations look at.
COLUMNS = ["file", "path", "label", "n_bytes", "sha256", "decodes", "error", "width", "height", "mode"]


def _inside(base: Path, rel: str, where: str) -> Path:
    """``base / rel``, refused (DataUnavailableError naming ``where``) unless it stays inside ``base``."""
    if not rel or Path(rel).is_absolute() or "\\" in rel:
        raise DataUnavailableError(f"{where}: path {rel!r} must be relative to the dataset folder")
    path = base / rel
    try:
        path.resolve().relative_to(base.resolve())
    except ValueError:
        raise DataUnavailableError(f"{where}: path {rel!r} leads outside the dataset folder {base}") from None
    return path


def list_images(cfg: "DatasetConfig", root: Path, seed: int) -> dict[str, list[tuple[str, str]]]:
    """``{"train": [(path, label)], "test": [...]}``, paths relative to ``dataset.path``, sorted by
    class then path; DataUnavailableError for a missing folder or a bad manifest."""
    images = cfg.images
    base = Path(root) / cfg.path
    if not base.is_dir():
        raise DataUnavailableError.not_pulled(base, cfg.dvc_file)
    if images.manifest is not None:
        return _from_manifest(cfg, base, seed)
    out = {}
    for split, folder in (("train", images.train_dir), ("test", images.test_dir)):
        top = _inside(base, folder, f"dataset.images.{split}_dir")
        if not top.is_dir():
            raise DataUnavailableError(f"{split} split not found: {top} is not a folder (expected "
                                       f"{folder}/<class>/*.png|jpg|jpeg|webp)")
        entries = []
        # Hidden folders and files (a name that starts with ".": .ipynb_checkpoints, ._x.png) are not
        # data; init and validation name each one skipped (``hidden_paths``, docs/images.md).
        for cls in sorted(p for p in top.iterdir() if p.is_dir() and not p.name.startswith(".")):
            for f in sorted(cls.rglob("*")):
                if f.is_file() and f.suffix.lower() in SUFFIXES and not _hidden(f.relative_to(cls)):
                    rel = f.relative_to(base).as_posix()
                    _inside(base, rel, f"{split}/{cls.name}")  # a symbolic link may lead out
                    entries.append((rel, cls.name))
        out[split] = entries
    return out


def _hidden(rel: Path) -> bool:
    return any(part.startswith(".") for part in rel.parts)


def hidden_paths(cfg: "DatasetConfig", root: Path) -> list[str]:
    """The hidden folders (``train/.cache/``) and image files (``train/a/.x.png``) that
    :func:`list_images` skips, relative to ``dataset.path``: what init and validation say they skipped."""
    images, base = cfg.images, Path(root) / cfg.path
    if images.manifest is not None or not base.is_dir():
        return []
    out = []
    for folder in (images.train_dir, images.test_dir):
        top = base / folder
        if not top.is_dir():
            continue
        for cls in sorted(p for p in top.iterdir() if p.is_dir()):
            if cls.name.startswith("."):
                out.append(cls.relative_to(base).as_posix() + "/")
                continue
            for f in sorted(cls.rglob("*")):
                rel = f.relative_to(cls)
                if _hidden(rel) and not _hidden(rel.parent) and (f.is_dir() or f.suffix.lower() in SUFFIXES):
                    out.append(f.relative_to(base).as_posix() + ("/" if f.is_dir() else ""))
    return out


def _from_manifest(cfg: "DatasetConfig", base: Path, seed: int) -> dict[str, list[tuple[str, str]]]:
    from tasks.base import label_key
    from tasks.table import read_table, seeded_split

    where = f"dataset.images.manifest {cfg.images.manifest}"
    df = read_table(_inside(base, cfg.images.manifest, "dataset.images.manifest"))
    missing = [c for c in ("path", "label") if c not in df.columns]
    if missing:
        raise DataUnavailableError(f"{where}: lacks column(s) {missing}; it needs path, label and optionally split")
    if df["path"].isna().any() or df["label"].isna().any():
        row = int(np.flatnonzero((df["path"].isna() | df["label"].isna()).to_numpy())[0])
        raise DataUnavailableError(f"{where}: row {row + 2} has no path or no label")
    rows = [(str(p), label_key(v)) for p, v in zip(df["path"], df["label"])]
    for i, (p, _) in enumerate(rows):
        _inside(base, p, f"{where} row {i + 2}")
    if "split" in df.columns:
        split = df["split"].astype("string").str.lower().fillna("")
        bad = sorted(set(split) - set(SPLITS))
        if bad:
            raise DataUnavailableError(f"{where}: column split holds {bad}; use train or test")
        keep, held = np.flatnonzero((split == "train").to_numpy()), np.flatnonzero((split == "test").to_numpy())
    else:
        import pandas as pd

        keep, held = seeded_split(pd.Series([r[1] for r in rows]), len(rows), cfg.test_fraction, seed, True)
    return {"train": sorted((rows[i] for i in keep), key=lambda r: (r[1], r[0])),
            "test": sorted((rows[i] for i in held), key=lambda r: (r[1], r[0]))}


def profile(base: Path, entries: list[tuple[str, str]]) -> "pd.DataFrame":
    """One row per file (``COLUMNS``): size, content hash, whether Pillow decodes it (or why not),
    width, height and mode; ``file``: its position in the split."""
    rows = []
    for i, (rel, label) in enumerate(entries):
        try:
            rows.append(profile_row(i, rel, label, (base / rel).read_bytes()))
        except OSError as exc:
            rows.append({**profile_row(i, rel, label, None), "error": f"unreadable: {exc.strerror or exc}"})
    return profile_frame(rows)


def profile_row(i: int, rel: str, label: str, data: bytes | None) -> dict:
    """One ``COLUMNS`` row of :func:`profile` for the encoded bytes ``data`` of the file ``rel``."""
    row = dict(file=i, path=rel, label=label, n_bytes=None, sha256=None, decodes=False, error=None,
               width=None, height=None, mode=None)
    if data is None:
        return row
    row.update(n_bytes=len(data), sha256=hashlib.sha256(data).hexdigest())
    buf = io.BytesIO(data)
    try:
        with _opened(buf) as img:
            _check_pixels(img)
            img.load()
            row.update(decodes=True, width=img.width, height=img.height, mode=img.mode)
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds; all mean "does not decode"
        row["error"] = _error_text(exc, buf, rel)
    return row


def profile_frame(rows: list[dict]) -> "pd.DataFrame":
    import pandas as pd

    df = pd.DataFrame(rows, columns=COLUMNS)
    return df.astype({"file": "int64", "n_bytes": "Int64", "decodes": "bool", "width": "Int64", "height": "Int64",
                      "path": object, "label": object, "sha256": object, "error": object, "mode": object})


def _opened(buf: io.BytesIO):
    """``PIL.Image.open`` (it reads the header only) with Pillow's bomb check at MAX_PIXELS."""
    from PIL import Image

    Image.MAX_IMAGE_PIXELS = MAX_PIXELS
    with warnings.catch_warnings():  # between one and two times the bound: _check_pixels refuses it
        warnings.simplefilter("ignore", Image.DecompressionBombWarning)
        return Image.open(buf)


class _TooLarge(ValueError):
    """An image whose header says it is larger than MAX_PIXELS."""


def _check_pixels(img) -> None:
    """_TooLarge for an image larger than MAX_PIXELS, from its header, before anything is decoded."""
    if img.width * img.height > MAX_PIXELS:
        raise _TooLarge(f"{img.width} x {img.height} pixels, more than the {MAX_PIXELS:,} an image may have; "
                         "refused before decoding")


def _error_text(exc: Exception, buf: io.BytesIO, name: str) -> str:
    """Pillow's message with the file's name where Pillow names only the buffer it was given."""
    from PIL import Image

    text = str(exc).replace(repr(buf), repr(name))
    if isinstance(exc, Image.DecompressionBombError):  # Pillow's check at open: more than twice MAX_PIXELS
        text = text.rstrip(".") + "; refused before decoding"
    return text if isinstance(exc, _TooLarge) else f"{type(exc).__name__}: {text}"


def open_image(data: bytes, channels: int, name: str):
    """A Pillow image of ``channels`` (1: L, 3: RGB), loaded; ValueError naming ``name`` when it does not decode."""
    from PIL import Image

    buf = io.BytesIO(data)
    try:
        with _opened(buf) as img:
            _check_pixels(img)
            if img.mode.startswith("I"):  # 16-bit grey: Pillow's convert would clip at 255, not scale
                img = Image.fromarray((np.asarray(img).astype(np.float64).clip(0, 65535) / 257).round()
                                      .astype(np.uint8), "L")
            out = img.convert(MODES[channels])
            out.load()
            return out
    except Exception as exc:  # noqa: BLE001 - Pillow raises many kinds; all mean "does not decode"
        raise ValueError(f"not a decodable image: {_error_text(exc, buf, name)}") from None


def _array(img) -> np.ndarray:
    a = np.asarray(img, dtype=np.uint8)
    return a[None] if a.ndim == 2 else a.transpose(2, 0, 1).copy()


def decode(data: bytes, size: tuple[int, int], channels: int, name: str = "the file") -> np.ndarray:
    """One encoded image -> uint8 ``[channels, height, width]`` of ``size`` = (height, width), scaled
    (bilinear) as it is; ValueError (naming ``name``) when Pillow cannot decode it or it is larger than MAX_PIXELS."""
    from PIL import Image

    img = open_image(data, channels, name)
    if img.size != (size[1], size[0]):
        img = img.resize((size[1], size[0]), Image.Resampling.BILINEAR)
    return _array(img)


def decode_files(base: Path, paths: list[str], size: tuple[int, int], channels: int) -> np.ndarray:
    """uint8 ``[n, channels, height, width]`` of the files; DataUnavailableError naming a bad one."""
    out = np.empty((len(paths), channels, size[0], size[1]), dtype=np.uint8)
    for i, rel in enumerate(paths):
        try:
            out[i] = decode((base / rel).read_bytes(), size, channels, rel)
        except (OSError, ValueError) as exc:
            raise DataUnavailableError(f"{rel}: {getattr(exc, 'strerror', None) or exc}") from None
    return out


def cached_pixels(cfg: "DatasetConfig", root: Path, split: str, paths: list[str], home: Path) -> np.ndarray:
    """:func:`decode_files` of a split through a ``.npy`` cache under ``home/cache/images``
    (memory-mapped, read-only), keyed by every file's size and mtime and the decoding settings:
    each rank and each later run maps it instead of decoding again."""
    from core.hashing import sha256_json
    from tasks.base import cache_write

    base = Path(root) / cfg.path
    stats = []
    for rel in paths:
        try:
            st = (base / rel).stat()
        except OSError as exc:
            raise DataUnavailableError(f"{rel}: {exc.strerror}") from None
        stats.append([rel, st.st_size, st.st_mtime_ns])
    size, channels = tuple(cfg.images.size), cfg.images.channels
    key = sha256_json({"files": stats, "size": list(size), "channels": channels, "v": 2})[:32]
    path = Path(home) / "cache" / "images" / f"{split}-{key}.npy"
    try:
        x = np.load(path, mmap_mode="r", allow_pickle=False)
        if x.shape == (len(paths), channels, *size) and x.dtype == np.uint8:
            return x
    except (OSError, ValueError):
        pass
    x = decode_files(base, paths, size, channels)
    cache_write(path, lambda fh: np.save(fh, x, allow_pickle=False))
    return x
