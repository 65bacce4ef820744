"""The image classification task: a folder of images (``tasks.image_data``) -> a CNN over pixels
0..255 of ``images.size`` (``tasks.image_nets``) -> a pyfunc taking encoded files and returning class
names (``tasks/pyfunc_image.py``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from core.errors import ConfigError, DataUnavailableError
from tasks.base import (Classifier, InitFit, ModelSpec, Task, ValidationPlan, fit_gbdt, init_batch,
                        load_program, write_program_scores)
from tasks.info import DataInfo

if TYPE_CHECKING:
    import pandas as pd

    from core.config import PipelineConfig

METRICS_VERSION = 2
PYFUNC_FILE = Path(__file__).with_name("pyfunc_image.py")
IMAGE_KINDS = (None, "image_cnn", "resnet18", "resnet50")
# The trees beside the network fit on at most this many train images (a seeded sample).
GBDT_MAX_ROWS = 10_000
# The longer side of the input `trainflow init` picks at most (larger images are scaled down).
INIT_MAX_SIDE = 64
# Size bounds are widened by this share of the profiled range; class shares by this factor.
INIT_MARGIN = 0.1


@dataclass(frozen=True)
class ImageInfo(DataInfo):
    """The image task's ``info``: class names in output order, input channels and [height, width], and
    the train split's per-channel mean and std of pixel / 255."""

    classes: list
    channels: int
    size: list
    mean: list
    std: list


class ImageClassification(Classifier, Task):
    name = "image_classification"
    info_type: ClassVar[type[DataInfo]] = ImageInfo

    # -- config ---------------------------------------------------------------------------------
    def check_config(self, cfg: "PipelineConfig") -> None:
        super().check_config(cfg)
        images = cfg.dataset.images
        if images is None:
            raise ConfigError("dataset.images: required for the image_classification task (`trainflow init --data "
                              "data/<name>` writes it for a folder of train/<class>/ and test/<class>/ images)")
        if cfg.dataset.text is not None:
            raise ConfigError("dataset.text: only for the lm task, but task is 'image_classification'")
        if images.shards is not None and images.manifest is not None:
            raise ConfigError("dataset.images.shards: tar shards carry their own classes; leave out dataset.images.manifest")
        if len(images.classes) < 2:
            raise ConfigError(f"dataset.images.classes: at least two classes, got {images.classes}")
        if cfg.model.factory is None and cfg.model.kind not in IMAGE_KINDS:
            raise ConfigError(f"model.kind: {cfg.model.kind!r} is not an image network; use image_cnn, resnet18 "
                              "or resnet50 (or model.factory)")
        from core.paths import project_root

        if cfg.model.weights is not None:
            if cfg.model.factory is not None:
                raise ConfigError("model.weights: for image_cnn, resnet18 and resnet50; a model.factory loads its own")
            root = project_root().resolve()
            path = (root / cfg.model.weights).resolve()
            if root not in path.parents or not path.is_file():
                raise ConfigError(f"model.weights: {cfg.model.weights} is not a file inside the repository {root}")
        if cfg.model.factory is not None and (cfg.model.backbone_lr_scale != 1.0 or cfg.model.freeze_backbone_epochs):
            raise ConfigError("model.backbone_lr_scale, model.freeze_backbone_epochs: for image_cnn, resnet18 and "
                              "resnet50 (a model.factory's network has no head trainflow knows)")
        if cfg.model.factory is not None:
            from tasks.factory import check_factory

            check_factory(cfg.model.factory, project_root())

    def init_reads(self, target: Path) -> InitFit:
        from tasks.image_data import SUFFIXES

        if not target.is_dir():
            return InitFit(False, False, f"{target.name} is a file, not an image folder")
        from tasks.image_shards import shard_files

        tars = {s: len(shard_files(target / s)) for s in ("train", "test")}
        if tars["train"] and tars["test"]:
            return InitFit(True, True, f"train/ and test/ hold {tars['train']} and {tars['test']} WebDataset tar shards")
        found = {}
        for split in ("train", "test"):
            top = target / split
            classes = [p for p in top.iterdir() if p.is_dir() and not p.name.startswith(".")] if top.is_dir() else []
            found[split] = sum(1 for c in classes for f in c.rglob("*") if f.suffix.lower() in SUFFIXES)
        if found["train"] and found["test"]:
            return InitFit(True, True, f"train/<class>/ and test/<class>/ hold {found['train']} and {found['test']} "
                                       "images")
        manifests = _manifests(target)
        if manifests:
            return InitFit(True, True, f"{manifests[0].name} lists the images (path, label)")
        return InitFit(False, False, "no train/<class>/ and test/<class>/ image folders and no manifest.csv")

    def init_defaults(self) -> dict:
        return {"model": {"kind": "image_cnn", "channels": [32, 64], "hidden": 128, "dropout": 0.1},
                "gates": {"baseline_margin": 0.05, "thresholds": {"latency_p95_ms": 50}}}

    def init_folder(self, root: Path, target: Path, rel: str) -> dict:
        import pandas as pd

        from core.config import DatasetConfig
        from tasks.bounds import check_classes
        from tasks.image_data import hidden_paths, list_images, profile
        from tasks.image_options import ImagesConfig
        from tasks.image_shards import shard_files

        manifests = _manifests(target)
        layout = {"manifest": manifests[0].name} if not (target / "train").is_dir() and manifests else {}
        data_rel = rel
        if shard_files(target / "train"):  # WebDataset shards as the user has them
            from tasks.image_sharded import profile_shards

            layout = {"shards": "."}
            frames = profile_shards(DatasetConfig(path=rel, images=ImagesConfig(**layout)), root)
        else:
            entries = list_images(DatasetConfig(path=rel, images=ImagesConfig(**layout)), root, 0)
            frames = {s: profile(target, entries[s]) for s in ("train", "test")}
        both = pd.concat(frames.values(), ignore_index=True)
        if frames["train"].empty or frames["test"].empty:
            empty = [s for s in frames if frames[s].empty]
            raise DataUnavailableError(f"{rel}: no images in {' and '.join(empty)} (.png, .jpg, .jpeg, .webp)")
        classes = _class_order(set(both["label"]))
        if len(classes) < 2:
            raise DataUnavailableError(f"{rel}: one class {classes}: nothing to classify")
        check_classes(len(classes), len(both), "label", rel)
        ok, bad = both[both["decodes"]], both[~both["decodes"]]
        problems = [f"{p}: {e}" for p, e in zip(bad["path"], bad["error"])]
        if ok.empty:
            raise DataUnavailableError(f"{rel}: none of the {len(both)} files decodes as an image ({problems[0]})")
        size, size_why = _init_size(pd.Series(list(zip(ok["height"].astype(int), ok["width"].astype(int)))))
        modes = sorted(set(ok["mode"]))
        channels = 1 if set(modes) <= {"1", "L", "LA", "I", "I;16", "F"} else 3
        shares = [frames[s]["label"].value_counts(normalize=True).reindex(classes, fill_value=0.0) for s in frames]
        lo_share, hi_share = min(float(s.min()) for s in shares), max(float(s.max()) for s in shares)
        n = {s: len(f) for s, f in frames.items()}
        w, h = (int(ok["width"].min()), int(ok["width"].max())), (int(ok["height"].min()), int(ok["height"].max()))
        expectations = {
            "width": list(_widened(*w, INIT_MARGIN)), "height": list(_widened(*h, INIT_MARGIN)), "modes": modes,
            "train_images": [n["train"] // 2, n["train"] * 2], "test_images": [n["test"] // 2, n["test"] * 2],
            "class_share": [round(max(0.0, lo_share - INIT_MARGIN * lo_share), 4),
                            round(min(1.0, hi_share * (1 + INIT_MARGIN)), 4)],
            "file_bytes": [max(1, int(both["n_bytes"].min()) // 2), int(both["n_bytes"].max()) * 2],
        }
        counts = both["label"].value_counts()
        lines = [
            f"classes:      {len(classes)}: " + ", ".join(f"{c} ({int(counts.get(c, 0))})" for c in classes[:12])
            + (" ..." if len(classes) > 12 else ""),
            f"images:       {n['train']} train, {n['test']} test; sizes {w[0]}..{w[1]} x {h[0]}..{h[1]} (w x h); "
            f"modes {', '.join(modes)}",
            f"input:        {size[0]} x {size[1]} (h x w): {size_why}; {channels} channel(s) "
            f"({'grey' if channels == 1 else 'RGB'}) (dataset.images.size, .channels)",
            "augment:      none (dataset.images.augment: hflip for photos, shift for small offsets)",
        ]
        hidden = hidden_paths(DatasetConfig(path=rel, images=ImagesConfig(**layout)), root)
        lines += [f"skipped:      {p}: hidden (its name starts with '.'); rename it to use it" for p in hidden[:10]]
        if len(hidden) > 10:
            lines.append(f"skipped:      ... and {len(hidden) - 10} more hidden folder(s) or file(s)")
        if problems:
            lines.append(f"undecodable:  {len(problems)} file(s) Pillow cannot decode; validation refuses them until "
                         f"they are fixed or removed: {'; '.join(problems[:3])}{' ...' if len(problems) > 3 else ''}")
        if "shards" not in layout and _shards_pay(n, size, channels):
            from tasks.image_shards import write_shards

            data_rel = f"{rel}-shards"
            for split in ("train", "test"):  # one streaming pass, one file's bytes in memory at a time
                write_shards(target, entries[split], root / data_rel / split)
            layout = {"shards": "."}
            lines.append(f"shards:       {n['train']} + {n['test']} images written as WebDataset tar shards to "
                         f"{data_rel}/ (DVC tracks them; {rel}/ is left as it is)")
        batch = init_batch(n["train"], 16, 256)
        return {**({"data": data_rel} if data_rel != rel else {}), "dataset": {"images": {**layout, "size": size, "channels": channels, "classes": classes,
                                       "expectations": expectations}},
                "training": {"epochs": 15, "batch_size": batch, "base_batch": batch}, "rows": n, "classes": classes,
                "lines": lines, "problems": problems, "review": "dataset.images.classes and .expectations",
                "choices": [("dataset", "images", key) for key in ("size", "channels", "augment")]}

    # -- data -------------------------------------------------------------------------------------
    def entries(self, cfg: "PipelineConfig", root: Path) -> dict[str, list[tuple[str, str]]]:
        from tasks.image_data import list_images

        return list_images(cfg.dataset, root, cfg.seed)

    def validation_plan(self, cfg: "PipelineConfig", root: Path) -> ValidationPlan:
        base = Path(root) / cfg.dataset.path
        if cfg.dataset.images.shards is not None:
            from tasks.image_shards import split_shards

            files = [p for s in split_shards(cfg.dataset, root).values() for p in s]
        else:
            entries = self.entries(cfg, root)
            files = [base / p for s in ("train", "test") for p, _ in entries[s]]
            if cfg.dataset.images.manifest is not None:
                files.append(base / cfg.dataset.images.manifest)
        return ValidationPlan("validation.image_suite", files,
                              {"dataset": cfg.dataset, "root": Path(root), "seed": cfg.seed})

    def data_splits(self, cfg: "PipelineConfig") -> dict[str, tuple[str, str]]:
        base, images = cfg.dataset.path.rstrip("/"), cfg.dataset.images
        if images.manifest is not None:
            return {"images": (f"{base}/{images.manifest}", "training")}
        if images.shards not in (None, "."):
            base = f"{base}/{images.shards.strip('/')}"
        return {"train": (f"{base}/{images.train_dir}", "training"), "test": (f"{base}/{images.test_dir}", "testing")}

    def _pixels(self, cfg: "PipelineConfig", root: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
        """(uint8 [n, c, h, w], class indices int64) of a split, through the decoded-pixel cache."""
        from core.paths import trainflow_home
        from tasks.image_data import cached_pixels

        if cfg.dataset.images.shards is not None:
            from tasks.image_sharded import split_pixels

            if split == "train":  # a sharded train split is streamed; its held-out rows stand in here
                _, vx, vy = self._sharded_train(cfg, root, cfg.seed)
                return vx, vy
            return split_pixels(cfg, root, split, trainflow_home(Path(root)))[:2]
        rows = self.entries(cfg, root)[split]
        index = {c: i for i, c in enumerate(cfg.dataset.images.classes)}
        unknown = sorted({label for _, label in rows if label not in index})
        if unknown:
            raise DataUnavailableError(f"{split} split: class(es) {unknown[:5]} are not in dataset.images.classes "
                                       f"{cfg.dataset.images.classes}")
        if not rows:
            raise DataUnavailableError(f"{split} split has no images")
        x = cached_pixels(cfg.dataset, root, split, [p for p, _ in rows], trainflow_home(Path(root)))
        return x, np.asarray([index[label] for _, label in rows], dtype=np.int64)

    def _info(self, cfg: "PipelineConfig", mean: list, std: list) -> ImageInfo:
        images = cfg.dataset.images
        return ImageInfo(classes=list(images.classes), channels=images.channels, size=list(images.size),
                         mean=mean, std=std)

    def info(self, cfg: "PipelineConfig", root: Path) -> ImageInfo:
        images = cfg.dataset.images
        x, _ = self._pixels(cfg, root, "train")
        total, squares, n = np.zeros(images.channels), np.zeros(images.channels), 0
        for start in range(0, len(x), 32):  # in chunks: a float copy of every image would be 8x the pixels
            part = np.asarray(x[start:start + 32], dtype=np.float64).reshape(-1, images.channels,
                                                                                images.size[0] * images.size[1]) / 255.0
            total += part.sum(axis=(0, 2))
            squares += (part ** 2).sum(axis=(0, 2))
            n += part.shape[0] * part.shape[2]
        mean = total / max(n, 1)
        std = np.sqrt(np.maximum(squares / max(n, 1) - mean ** 2, 0.0))
        return self._info(cfg, mean.tolist(), std.tolist())

    def _sharded_train(self, cfg: "PipelineConfig", root: Path, seed: int):
        """(train samples, held-out pixels, their classes) of a shard set, once per task object."""
        from tasks.image_sharded import train_split

        cache = self.__dict__.setdefault("_sharded", {})
        key = (str(root), cfg.dataset.model_dump_json(), cfg.training.loader.val_rows, seed)
        if key not in cache:
            cache[key] = train_split(cfg, root, seed)
        return cache[key]

    def load_data(self, cfg: "PipelineConfig", root: Path, seed: int):
        from tasks.splits import Splits, stratified_holdout, tensors

        if cfg.dataset.images.shards is not None:  # the engine streams the train split (training/image_stream.py)
            train, vx, vy = self._sharded_train(cfg, root, seed)
            xt, yt = self._pixels(cfg, root, "test")  # a copy-on-write memory map: no copy in memory
            return Splits(train=train, val=tensors(vx, vy), test=tensors(xt, yt), info=self.info(cfg, root))

        x, y = self._pixels(cfg, root, "train")
        xt, yt = self._pixels(cfg, root, "test")
        keep, hold = stratified_holdout(y, cfg.dataset.val_fraction, seed)
        return Splits(train=tensors(x[keep], y[keep]), val=tensors(x[hold], y[hold]), test=tensors(np.array(xt), yt),
                      info=self.info(cfg, root))

    # -- model ----------------------------------------------------------------------------------
    def build_model(self, cfg: "PipelineConfig", info: ImageInfo):
        from core.paths import project_root
        from tasks.image_nets import image_network

        images = cfg.dataset.images
        if images.shards is not None:  # the DataLoader workers flip (tasks/image_transforms.py), not the network
            images = images.model_copy(update={"augment": images.augment.model_copy(update={"hflip": False})})
        return image_network(cfg.model, images, len(info.classes), info.mean, info.std, project_root())

    def to_device(self, cfg: "PipelineConfig", model, device):
        """channels_last convolutions on CUDA (where cuDNN runs them fastest, with bf16 most of all),
        for a replicated model (single, ddp): FSDP's shards are flat. CPU: as built."""
        from tasks.image_nets import channels_last

        model = model.to(device)
        return channels_last(model) if device.type == "cuda" and cfg.training.strategy in ("single", "ddp") else model

    def param_groups(self, cfg: "PipelineConfig", model) -> tuple:
        """The backbone (every parameter of the network but its head, ``image_nets.head_names``) at
        ``model.backbone_lr_scale`` times the LR, frozen for ``model.freeze_backbone_epochs``."""
        from tasks.base import ParamGroup
        from tasks.image_nets import head_names

        m = cfg.model
        if m.backbone_lr_scale == 1.0 and m.freeze_backbone_epochs == 0:
            return ()
        core = model[-1]  # Sequential(ImageInput, Augment, core)
        head = {f"{len(model) - 1}.{n}" for n in head_names(core)}
        backbone = frozenset(n for n, _ in model.named_parameters() if n not in head)
        return (ParamGroup("backbone", backbone, m.backbone_lr_scale, m.freeze_backbone_epochs),)

    def example_input(self, cfg: "PipelineConfig", info: ImageInfo, batch: int = 2):
        import torch

        return torch.full((batch, info.channels, *info.size), 128.0)

    def write_test_scores(self, cfg: "PipelineConfig", root: Path, out: Path) -> None:
        from tasks.image_sharded import FloatPixels

        x, _ = self._pixels(cfg, root, "test")
        val = self.validation_split(cfg, root)
        write_program_scores(out, FloatPixels(x), self.decode,
                             self.scoring_key(cfg, root)["split_sha256"], None if val is None else val[0])

    def validation_split(self, cfg: "PipelineConfig", root: Path) -> tuple | None:
        """Two classes: the train images held out for per-epoch validation (``load_data``'s seeded rows),
        where the decision threshold is tuned; more classes: None (the argmax, nothing to tune)."""
        from tasks.splits import stratified_holdout

        if len(cfg.dataset.images.classes) != 2:
            return None
        x, y = self._pixels(cfg, root, "train")
        if cfg.dataset.images.shards is not None:  # already the held-out rows
            return np.asarray(x, dtype=np.float32), y
        _, hold = stratified_holdout(y, cfg.dataset.val_fraction, cfg.seed)
        return np.asarray(x[hold], dtype=np.float32), y[hold]

    # -- evaluation hooks (the "predictions" evaluator) -------------------------------------------
    def eval_data(self, cfg: "PipelineConfig", root: Path) -> tuple["pd.DataFrame", np.ndarray, np.ndarray, ImageInfo]:
        """(the test split's ``path, label`` frame, pixels float32 [n, c, h, w] read a slice at a time from
        the decoded cache's memory map, class indices, info)."""
        import pandas as pd

        from tasks.image_sharded import FloatPixels

        if cfg.dataset.images.shards is not None:
            from core.paths import trainflow_home
            from tasks.image_sharded import split_pixels

            x, y, names = split_pixels(cfg, root, "test", trainflow_home(Path(root)))
            labels = [cfg.dataset.images.classes[i] for i in y]
        else:
            rows = self.entries(cfg, root)["test"]
            x, y = self._pixels(cfg, root, "test")
            names, labels = [p for p, _ in rows], [c for _, c in rows]
        return pd.DataFrame({"path": names, "label": labels}), FloatPixels(x), y, self._info(cfg, [], [])

    def check_program_output(self, out: np.ndarray, info: ImageInfo) -> None:
        if out.ndim != 2 or out.shape[1] != len(info.classes):
            raise ValueError(f"the program gives outputs of shape {list(out.shape)}, expected [images, "
                             f"{len(info.classes)}]")

    def baseline(self, cfg, root, info: ImageInfo, n: int) -> tuple[str, np.ndarray]:
        return self.majority(self._pixels(cfg, root, "train")[1], info, n)

    def _files_key(self, cfg: "PipelineConfig", root: Path, split: str) -> list:
        """``[path, class, sha256]`` of a split's files, the hashes remembered by size and mtime."""
        from core.hashing import file_sha256

        base, known, out = Path(root) / cfg.dataset.path, self.__dict__.setdefault("_hashes", {}), []
        if cfg.dataset.images.shards is not None:  # the shards' hashes: the samples and classes they hold
            from tasks.image_shards import split_shards

            listed = [(p.relative_to(base).as_posix(), "") for p in split_shards(cfg.dataset, root)[split]]
        else:
            listed = self.entries(cfg, root)[split]
        for p, c in listed:
            st = (base / p).stat()
            key = (str(base / p), st.st_size, st.st_mtime_ns)
            if key not in known:
                known[key] = file_sha256(base / p)
            out.append([p, c, known[key]])
        return out

    def scoring_key(self, cfg: "PipelineConfig", root: Path) -> dict:
        from core.hashing import sha256_json

        split = sha256_json({"files": self._files_key(cfg, root, "test")})
        images = cfg.dataset.images
        parts = {"task": self.name, "split_sha256": split, "metrics_version": METRICS_VERSION,
                 "classes": list(images.classes), "size": list(images.size), "channels": images.channels}
        return {"key": sha256_json(parts), "split_sha256": split, "metrics_version": METRICS_VERSION}

    def gbdt(self, cfg: "PipelineConfig", root: Path) -> dict | None:
        """scikit-learn's HistGradientBoostingClassifier (default settings) on the flattened pixels."""
        from core.hashing import sha256_json

        if cfg.dataset.images.shards is not None:  # trees need the train pixels in memory: not for a streamed set
            return None

        def arrays():
            from sklearn.ensemble import HistGradientBoostingClassifier

            x, y = self._pixels(cfg, root, "train")
            xt, _ = self._pixels(cfg, root, "test")
            return (HistGradientBoostingClassifier(random_state=cfg.seed), x, y, xt,
                    lambda a: np.asarray(a).reshape(len(a), -1))

        key = {"task": self.name, "split": self.scoring_key(cfg, root)["key"],
               "train": sha256_json(self._files_key(cfg, root, "train")), "seed": cfg.seed}
        return fit_gbdt(root, key, arrays, cfg.seed, GBDT_MAX_ROWS, "images")

    def score_champion(self, cfg: "PipelineConfig", root: Path, predictor) -> dict:
        """The predictor gets the test files' bytes, as a serving client sends them."""
        import pandas as pd

        from itertools import islice

        from tasks.base import PROGRAM_ROWS

        frame, _, y, info = self.eval_data(cfg, root)
        if cfg.dataset.images.shards is not None:  # in the shards' order, as eval_data lists them
            from tasks.image_shards import iter_samples, split_shards

            data = (b for _, b, _ in iter_samples(split_shards(cfg.dataset, root)["test"], "test"))
        else:
            data = (self._encoded(cfg, root, p) for p in frame["path"])
        proba_of = getattr(predictor, "proba", None)  # a model without predict_proba: a hard classifier
        labels, probas = [], []
        while chunk := list(islice(data, PROGRAM_ROWS)):  # the encoded bytes of PROGRAM_ROWS images at a time
            images = pd.DataFrame({"image": chunk})
            labels.append(self.encode(predictor(images), info))
            probas += [] if proba_of is None else [self.encode_proba(proba_of(images), info)]
        labels = np.concatenate(labels)
        proba = None if proba_of is None or any(p is None for p in probas) else np.concatenate(probas)
        return self.score(y, labels, info) if proba is None else self.score(y, proba, info, labels=labels)

    # -- registry ---------------------------------------------------------------------------------
    def model_spec(self, cfg: "PipelineConfig", root: Path, train_dir: Path, report: dict) -> ModelSpec:
        import pandas as pd

        images = cfg.dataset.images
        rows = list(self.eval_data(cfg, root)[0]["path"]) if images.shards is not None else [
            p for p, _ in self.entries(cfg, root)["test"]]
        picked = [rows[i] for i in np.linspace(0, len(rows) - 1, min(3, len(rows))).astype(int)]
        example = pd.DataFrame({"image": [self._encoded(cfg, root, p) for p in picked]})
        meta = {"format": "torch.export", "input_dtype": "float32", "input": "pixels 0..255 [n, c, h, w]",
                "size": list(images.size), "channels": images.channels, "output": "label",
                "class_labels": [str(c) for c in images.classes],
                **({"transform": "centre_crop"} if images.shards is not None else {}),
                **({"threshold": report["candidate"]["threshold"]}
                   if report.get("candidate", {}).get("threshold") is not None else {})}
        return ModelSpec(PYFUNC_FILE, meta, [("image", "binary")], [(None, "string")], example,
                         metadata={"trainflow_kind": self.name}, checked=report.get("candidate_scored_in") == "worker",
                         params=list(self.predict_params))

    def _encoded(self, cfg: "PipelineConfig", root: Path, path: str) -> bytes:
        """The encoded bytes of a test image: a file, or a sample ``<split>/<shard>:<member>`` of a shard set."""
        if cfg.dataset.images.shards is not None:
            from tasks.image_sharded import read_sample

            return read_sample(cfg, root, path)
        return (Path(root) / cfg.dataset.path / path).read_bytes()

    def check_program(self, model_pt2: Path, spec: ModelSpec) -> None:
        import torch

        from tasks.image_data import decode
        from tasks.image_transforms import eval_pixels

        size, channels = spec.meta["size"], spec.meta["channels"]
        pixels = eval_pixels if spec.meta.get("transform") == "centre_crop" else decode
        x = torch.tensor(np.stack([pixels(b, size, channels) for b in spec.example["image"]]).astype(np.float32))
        with torch.inference_mode():
            out = load_program(model_pt2)(x).numpy()
        n = len(spec.meta["class_labels"])
        if out.shape != (len(x), n):
            raise ValueError(f"{model_pt2}: maps {list(x.shape)} images to {list(out.shape)}, expected [{len(x)}, {n}]")


# `trainflow init` writes a folder as tar shards when its decoded pixels at the chosen input size would
# pass this many bytes: below it the decoded cache (every image decoded once, memory-mapped by every
# rank) is the faster path and the folder is used as it is (docs/images.md, "Large sets").
SHARD_ABOVE_BYTES = 2 * 2**30


def _shards_pay(n: dict, size: list, channels: int) -> bool:
    return (n["train"] + n["test"]) * channels * size[0] * size[1] > SHARD_ABOVE_BYTES


def _manifests(target: Path) -> list[Path]:
    return sorted(p for p in target.iterdir() if p.name.lower().startswith("manifest")
                  and p.suffix.lower() in (".csv", ".parquet", ".pq"))


def _init_size(sizes: "pd.Series") -> tuple[list[int], str]:
    """The model's input [height, width]: the most common size, its longer side cut to
    ``INIT_MAX_SIDE`` (aspect kept), and why."""
    (h, w), n = sizes.value_counts().index[0], int(sizes.value_counts().iloc[0])
    why = f"the most common size ({n} of {len(sizes)} images)"
    if max(h, w) > INIT_MAX_SIDE:
        k = INIT_MAX_SIDE / max(h, w)
        h, w = max(4, round(h * k)), max(4, round(w * k))
        why += f", scaled down to {INIT_MAX_SIDE} pixels on its longer side"
    return [max(4, int(h)), max(4, int(w))], why


def _class_order(classes: set[str]) -> list[str]:
    """Class folders in their natural order: numbers by value (2 before 10), else by name."""
    if all(c.isdigit() for c in classes):
        return sorted(classes, key=lambda c: (int(c), c))
    return sorted(classes)


def _widened(lo: float, hi: float, margin: float) -> tuple[int, int]:
    pad = (hi - lo) * margin
    return max(0, math.floor(lo - pad)), math.ceil(hi + pad)
