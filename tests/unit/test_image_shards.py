"""The sharded image path: WebDataset tar shards written and read, the transforms (seeded by seed,
epoch and sample; the evaluation's equal to the registered model's), the engine's shard stream (each
sample once per epoch over the ranks, a resize mid-epoch included) and validation naming a bad member."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from core.config import DatasetConfig, PipelineConfig, config_from_dict, config_id_of
from tasks.image_options import ImageAugment, ImageExpectations, ImagesConfig
from core.errors import DataUnavailableError
from tasks.image_shards import ShardIndex, index_shard, iter_samples, write_shards
from tasks.image_transforms import CROP_RATIO, eval_pixels, train_pixels
from tests.pyfuncs import pyfunc_module

CLASSES = ["a", "b"]


def _jpeg(size: tuple[int, int], seed: int, fmt: str = "JPEG", mode: str = "RGB") -> bytes:
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0]) if mode == "L" else (size[1], size[0], 3)
    buf = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), mode).save(buf, fmt)
    return buf.getvalue()


def _tar(path: Path, samples: list[tuple[str, bytes, str, str]]) -> None:
    """A WebDataset shard: ``(key, image bytes, image suffix, label member suffix)`` per sample."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with tarfile.open(path, "w") as tar:
        for key, data, suffix, label_kind in samples:
            label = json.dumps({"label": key[0]}).encode() if label_kind == ".json" else key[0].encode()
            for name, body in ((key + suffix, data), (key + label_kind, label)):
                info = tarfile.TarInfo(name)
                info.size = len(body)
                tar.addfile(info, io.BytesIO(body))


def _shard_set(base: Path, per_split: dict[str, int], per_shard: int = 7) -> None:
    """``base/{train,test}/00000N.tar``: samples of class a and b, 24..64 px, JPEG and PNG, .cls and .json."""
    seed = 0
    for split, n in per_split.items():
        samples = []
        for i in range(n):
            seed += 1
            size = (24 + (i * 7) % 41, 24 + (i * 13) % 41)
            fmt, suffix = ("PNG", ".png") if i % 4 == 1 else ("JPEG", ".jpg")
            samples.append((f"{'ab'[i % 2]}{split}{i:04d}", _jpeg(size, seed, fmt), suffix,
                            ".json" if i % 3 == 0 else ".cls"))
        for k in range(0, n, per_shard):
            _tar(base / split / f"{k // per_shard:06d}.tar", samples[k:k + per_shard])


def _cfg(tmp_path: Path, **augment) -> PipelineConfig:
    return config_from_dict({
        "name": "s", "task": "image_classification",
        "dataset": {"path": "data", "images": {"shards": ".", "size": [16, 16], "classes": CLASSES,
                                               "workers": 0, "augment": augment}},
        "model": {"kind": "image_cnn", "channels": [4, 4], "hidden": 8},
        "training": {"batch_size": 4, "epochs": 1}})


# -- shards -------------------------------------------------------------------------------
def test_write_shards_keeps_the_original_bytes_and_classes_in_webdataset_layout(tmp_path):
    base = tmp_path / "folder"
    entries = []
    for i in range(5):
        rel = f"train/{'ab'[i % 2]}/{i}.jpg"
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(_jpeg((20 + i, 30), i))
        entries.append((rel, "ab"[i % 2]))
    shards = write_shards(base, entries, tmp_path / "shards", per_shard=2)
    assert [p.name for p in shards] == ["000000.tar", "000001.tar", "000002.tar"]
    with tarfile.open(shards[0]) as tar:
        assert tar.getnames() == ["00000000.jpg", "00000000.cls", "00000001.jpg", "00000001.cls"]
    got = list(iter_samples(shards, "train"))
    assert [n for n, _, _ in got][:3] == ["train/000000.tar:00000000.jpg", "train/000000.tar:00000001.jpg",
                                         "train/000001.tar:00000002.jpg"]
    assert [d for _, d, _ in got] == [(base / r).read_bytes() for r, _ in entries]
    assert [c for _, _, c in got] == [c for _, c in entries]
    again = write_shards(base, entries, tmp_path / "again", per_shard=2)
    assert [p.read_bytes() for p in again] == [p.read_bytes() for p in shards]  # same files, same md5


def test_a_users_shards_are_read_with_cls_or_json_classes_and_a_member_without_class_is_named(tmp_path):
    _shard_set(tmp_path, {"train": 10})
    index = ShardIndex(sorted((tmp_path / "train").glob("*.tar")))
    assert len(index) == 10 and index.rows.tolist() == [7, 3]
    data, label, name = index.read(8)
    assert label == "a" and name == "000001.tar:atrain0008.jpg" and Image.open(io.BytesIO(data)).size == (24 + 56 % 41, 24 + 104 % 41)
    _tar(tmp_path / "bad.tar", [("a1", _jpeg((8, 8), 0), ".jpg", ".cls")])
    with tarfile.open(tmp_path / "bad.tar", "a") as tar:
        info = tarfile.TarInfo("b2.png")
        body = _jpeg((8, 8), 1, "PNG")
        info.size = len(body)
        tar.addfile(info, io.BytesIO(body))
    with pytest.raises(DataUnavailableError, match=r"bad.tar:b2.png: no class member \(.cls or .json\)"):
        index_shard(tmp_path / "bad.tar")


# -- transforms ---------------------------------------------------------------------------
def test_training_draws_depend_on_seed_epoch_and_sample_alone():
    data = _jpeg((48, 32), 3)
    aug = ImageAugment(crop_scale=(0.3, 1.0), hflip=True, jitter=0.3)
    one = train_pixels(data, (16, 16), 3, aug, 7, 2, 11)
    assert one.shape == (3, 16, 16) and one.dtype == np.uint8
    assert np.array_equal(one, train_pixels(data, (16, 16), 3, aug, 7, 2, 11))
    others = [train_pixels(data, (16, 16), 3, aug, *k) for k in ((7, 3, 11), (7, 2, 12), (8, 2, 11))]
    assert all(not np.array_equal(one, o) for o in others)
    plain = train_pixels(data, (16, 16), 3, ImageAugment(), 7, 2, 11)
    assert np.array_equal(plain, eval_pixels(data, (16, 16), 3))  # no augmentation: the evaluation transform


def test_evaluation_crop_keeps_the_centre():
    img = np.zeros((40, 80, 3), dtype=np.uint8)
    img[:, 30:50] = 255  # a white band in the middle of a wide image
    buf = io.BytesIO()
    Image.fromarray(img).save(buf, "PNG")
    out = eval_pixels(buf.getvalue(), (8, 8), 3)
    assert out.shape == (3, 8, 8) and out[:, :, 3:5].min() == 255 and out[:, :, 0].max() == 0


@pytest.mark.parametrize("size,mode,fmt", [((40, 24), "RGB", "JPEG"), ((17, 63), "L", "PNG"), ((64, 64), "RGB", "PNG")])
def test_the_registered_model_crops_as_the_evaluation_does(size, mode, fmt):
    module = pyfunc_module("pyfunc_image.py")
    assert module.CROP_RATIO == CROP_RATIO
    data = _jpeg(size, 5, fmt, mode)
    for channels in (1, 3):
        for target in ((16, 16), (12, 20)):
            obj = module.ExportedImageClassifier()
            obj.size, obj.mode, obj.centre_crop = target, {1: "L", 3: "RGB"}[channels], True
            assert np.array_equal(obj._pixels(data, 0), eval_pixels(data, target, channels)), (channels, target)


def test_new_image_keys_keep_existing_config_ids():
    raw = {"name": "s", "task": "image_classification",
           "dataset": {"path": "data", "images": {"size": [8, 8], "classes": CLASSES}}}
    cfg = config_from_dict(raw)
    dumped = cfg.model_dump(mode="json")
    images = dumped["dataset"]["images"]
    assert images["shards"] is None and images["augment"]["crop_scale"] is None
    for key in ("shards", "workers"):
        del images[key]
    del images["augment"]["crop_scale"], images["augment"]["jitter"]
    assert config_id_of(dumped) == cfg.config_id()
    changed = config_from_dict({**raw, "dataset": {**raw["dataset"], "images": {**raw["dataset"]["images"],
                                                                                  "augment": {"jitter": 0.2}}}})
    assert changed.config_id() != cfg.config_id()
    with pytest.raises(Exception, match="crop_scale"):
        ImageAugment(crop_scale=(0.8, 0.2))


# -- the engine's stream ------------------------------------------------------------------
def _source(tmp_path: Path, **augment):
    from training.data import load_splits

    _shard_set(tmp_path / "data", {"train": 45, "test": 6})
    cfg = _cfg(tmp_path, **augment)
    splits = load_splits(cfg, tmp_path, cfg.seed)
    return cfg, splits, splits.train


def _ids(source, epoch: int, cursor: int, plan, steps: int | None = None) -> list[int]:
    out = []
    for i, step in enumerate(source.epoch_steps(epoch, cursor, plan)):
        if steps is not None and i == steps:
            break
        for (x, y), ids in zip(step.micro, step.ids):
            assert len(x) == len(y) == len(ids)
            out += ids.tolist()
    return out


def test_a_sharded_epoch_gives_each_sample_once_over_ranks_and_after_a_resize(tmp_path):
    from training.batches import BatchPlan

    cfg, splits, source = _source(tmp_path, crop_scale=(0.5, 1.0), hflip=True, jitter=0.2)
    held = splits.train.samples.held.tolist()
    assert len(held) == len(splits.val.tensors[1]) > 0 and len(source) == 45 - len(held)
    train = sorted(set(range(45)) - set(held))
    two = [BatchPlan.of(4, 1, 2, r) for r in (0, 1)]
    both = _ids(source, 0, 0, two[0]) + _ids(source, 0, 0, two[1])
    assert sorted(both) == train
    # preempted after 2 steps at 2 ranks (cursor 16), resumed on 1 rank keeping the global batch
    first = _ids(source, 1, 0, two[0], 2) + _ids(source, 1, 0, two[1], 2)
    rest = _ids(source, 1, 16, BatchPlan.of(8, 1, 1, 0))
    assert len(first) == 16 and sorted(first + rest) == train
    assert _ids(source, 2, 0, BatchPlan.of(4, 1, 1))[:8] != _ids(source, 1, 0, BatchPlan.of(4, 1, 1))[:8]


def test_a_resumed_sharded_step_has_the_same_pixels(tmp_path):
    from training.batches import BatchPlan

    _, _, source = _source(tmp_path, crop_scale=(0.3, 1.0), jitter=0.4)
    plan = BatchPlan.of(4, 2, 1)
    full = list(source.epoch_steps(0, 0, plan))
    resumed = list(source.epoch_steps(0, 3 * plan.global_batch, plan))
    assert len(resumed) == len(full) - 3
    for a, b in zip(full[3:], resumed):
        assert all(np.array_equal(xa, xb) and np.array_equal(ya, yb) for (xa, ya), (xb, yb) in zip(a.micro, b.micro))


# -- validation ---------------------------------------------------------------------------
def test_the_image_suite_reads_shards_and_names_a_corrupt_member_by_shard_and_member(tmp_path):
    from validation import image_suite
    from validation.gx_run import validate
    from validation.image_suite import load_splits

    def validate_images(cfg, splits, report_dir):
        return validate(image_suite, {"dataset": cfg}, splits, report_dir)

    base = tmp_path / "data"
    _shard_set(base, {"train": 12, "test": 6})
    bounds = ImageExpectations(width=(20, 70), height=(20, 70), modes=["RGB"])
    cfg = DatasetConfig(path="data", images=ImagesConfig(shards=".", classes=CLASSES, expectations=bounds))
    report = validate_images(cfg, load_splits(cfg, tmp_path, 0), tmp_path / "ok")
    assert report["success"], report["failures"]
    good = _jpeg((30, 30), 77)
    _tar(base / "train" / "000002.tar", [("a9", good[: len(good) // 2], ".jpg", ".cls"), ("b9", good, ".jpg", ".cls")])
    _tar(base / "test" / "000001.tar", [("a8", good, ".jpg", ".cls")])  # the same image in both splits
    report = validate_images(cfg, load_splits(cfg, tmp_path, 0), tmp_path / "bad")
    checks = {(f["split"], f["check"]): f for f in report["failures"]}
    assert set(checks) == {("train", "decode"), ("cross", "leak")}, report["failures"]
    assert checks["train", "decode"]["examples"][0]["path"] == "train/000002.tar:a9.jpg"
    assert "train/000002.tar:a9.jpg" in checks["train", "decode"]["detail"]
    assert "train/000002.tar:b9.jpg" in checks["cross", "leak"]["detail"]


@pytest.mark.parametrize("width,height", [(200, 10), (10, 200), (50, 50), (1, 1)])
def test_the_crop_box_stays_inside_the_image_whatever_its_shape(width, height):
    from tasks.image_transforms import _crop_box

    rng = np.random.default_rng(0)
    for scale in ((0.99, 1.0), (0.08, 1.0)):
        for _ in range(20):
            left, top, right, bottom = _crop_box(rng, width, height, scale)
            assert 0 <= left < right <= width and 0 <= top < bottom <= height


def test_init_writes_a_manifests_images_as_shards_and_a_second_write_is_byte_identical(tmp_path, monkeypatch):
    import tasks.images
    from tasks.images import ImageClassification

    photos = tmp_path / "photos"
    rows = []
    for i in range(12):
        rel = f"img/{i:02d}.{'png' if i % 3 == 0 else 'jpg'}"
        (photos / rel).parent.mkdir(parents=True, exist_ok=True)
        (photos / rel).write_bytes(_jpeg((20 + i, 24), i, "PNG" if i % 3 == 0 else "JPEG"))
        rows.append((rel, "ab"[i % 2], "test" if i >= 9 else "train"))
    (photos / "manifest.csv").write_text("path,label,split\n" + "".join(f"{p},{c},{s}\n" for p, c, s in rows))
    monkeypatch.setattr(tasks.images, "SHARD_ABOVE_BYTES", 0)  # the line a set of photos would pass
    done = ImageClassification().init_folder(tmp_path, photos, "photos")
    assert done["data"] == "photos-shards" and done["dataset"]["images"]["shards"] == "."
    out = tmp_path / "photos-shards"
    for split in ("train", "test"):
        want = sorted(((p, c) for p, c, s in rows if s == split), key=lambda r: (r[1], r[0]))
        got = list(iter_samples(sorted((out / split).glob("*.tar")), split))
        assert [d for _, d, _ in got] == [(photos / p).read_bytes() for p, _ in want]  # the files' bytes, in order
        assert [c for _, _, c in got] == [c for _, c in want]
        assert [n.rsplit(".", 1)[1] for n, _, _ in got] == [p.rsplit(".", 1)[1] for p, _ in want]
    first = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*.tar"))}
    out.rename(tmp_path / "first")
    ImageClassification().init_folder(tmp_path, photos, "photos")
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*.tar"))} == first  # same md5 for DVC


def test_the_streamed_image_suite_holds_one_batch_of_profile_rows_and_reports_as_the_whole_frame_does(
        tmp_path, monkeypatch):
    """Validation of a shard set is flat by construction: at most ``BATCH_ROWS`` profile rows exist at a
    time, and beside them a split keeps its count, a count per class and 8 bytes per image (the leak
    check's hash); the report equals the one GX gives on the whole profile."""
    import tasks.image_data
    from validation import image_suite
    from validation.gx_run import validate

    base = tmp_path / "data"
    _shard_set(base, {"train": 23, "test": 9}, per_shard=5)
    good = _jpeg((30, 30), 77)
    _tar(base / "train" / "000009.tar", [("a9", good[: len(good) // 2], ".jpg", ".cls"), ("b9", good, ".jpg", ".cls")])
    _tar(base / "test" / "000009.tar", [("a8", good, ".jpg", ".cls"), ("c8", _jpeg((30, 30), 78), ".jpg", ".cls")])
    bounds = ImageExpectations(width=(20, 70), height=(20, 70), modes=["RGB"], train_images=(1, 20))
    params = {"dataset": DatasetConfig(path="data", images=ImagesConfig(shards=".", classes=CLASSES,
                                                                       expectations=bounds)),
              "root": tmp_path, "seed": 0}
    whole = validate(image_suite, params, image_suite.load(params), tmp_path / "whole")
    seen, frame = [], tasks.image_data.profile_frame
    monkeypatch.setattr(tasks.image_data, "profile_frame", lambda rows: seen.append(len(rows)) or frame(rows))
    monkeypatch.setattr(image_suite, "BATCH_ROWS", 10)
    streamed = image_suite.run(params, tmp_path / "streamed")
    assert max(seen) == 10 and sum(seen) == 25 + 11  # every sample, ten rows at a time
    assert streamed["rows"] == whole["rows"] == {"train": 25, "test": 11}
    key = lambda r: [(f["split"], f["check"], f["column"], f["unexpected_count"], f["message"]) for f in r["failures"]]
    assert key(streamed) == key(whole)
    assert {(s, c) for s, c, *_ in key(streamed)} == {("train", "row_count"), ("train", "decode"),
                                                      ("test", "label_set"), ("cross", "leak")}
    assert "train/000009.tar:a9.jpg" in streamed["failures"][1]["message"]
    assert "train train/000009.tar:b9.jpg = test test/000009.tar:a8.jpg" in streamed["failures"][-1]["message"]


def test_a_split_tally_keeps_counts_and_eight_bytes_an_image_whatever_the_count():
    import sys

    import pandas as pd

    from validation.image_suite import SplitTally

    def state(n: int) -> tuple:
        tally = SplitTally()
        for start in range(0, n, 500):
            k = min(500, n - start)
            tally.add(pd.DataFrame({"label": ["ab"[i % 2] for i in range(k)],
                                    "sha256": [f"{start + i:064x}" for i in range(k)]}))
        return tally.rows, len(tally.classes), sum(h.nbytes for h in tally.hashes), sys.getsizeof(tally.classes)

    small, large = state(1_000), state(20_000)
    assert (small[0], large[0]) == (1_000, 20_000)
    assert small[1] == large[1] == 2 and small[3] == large[3]  # the class counts do not grow
    assert (small[2], large[2]) == (8 * 1_000, 8 * 20_000)  # the leak check's hash: 8 bytes an image, nothing more


def test_the_test_split_is_decoded_as_a_stream_into_a_memory_map_and_scored_a_slice_at_a_time(tmp_path, monkeypatch):
    """The test split's pixels: written to the cache one image at a time (the peak is far below the
    split's decoded size, where a list and a stack would hold it twice), equal to decoding it in memory;
    the program, scored ``PROGRAM_ROWS`` rows at a time on float32 slices, gives the same accuracy."""
    import tracemalloc

    import torch

    import tasks.base
    from tasks.base import program_outputs
    from tasks.image_sharded import FloatPixels, split_pixels

    _shard_set(tmp_path / "data", {"train": 4, "test": 100}, per_shard=30)
    cfg = config_from_dict({
        "name": "s", "task": "image_classification",
        "dataset": {"path": "data", "images": {"shards": ".", "size": [48, 48], "classes": CLASSES}},
        "model": {"kind": "image_cnn", "channels": [4, 4], "hidden": 8}})
    split_pixels(cfg, tmp_path, "test", tmp_path / "warm")  # imports and Pillow's plugins: not the split's memory
    tracemalloc.start()
    x, y, names = split_pixels(cfg, tmp_path, "test", tmp_path / "home")
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert x.shape == (100, 3, 48, 48) and isinstance(x, np.memmap) and peak < x.nbytes / 2
    samples = list(iter_samples(sorted((tmp_path / "data" / "test").glob("*.tar")), "test"))
    whole = np.stack([eval_pixels(d, (48, 48), 3, n) for n, d, _ in samples])
    assert np.array_equal(x, whole) and names == [n for n, _, _ in samples]
    assert y.tolist() == [CLASSES.index(c) for _, _, c in samples]
    again = split_pixels(cfg, tmp_path, "test", tmp_path / "home")[0]  # the cache, mapped copy-on-write
    assert np.array_equal(again, whole) and again.flags.writeable and not list((tmp_path / "home").rglob("*.tmp"))

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 5, stride=4), torch.nn.Flatten(), torch.nn.LazyLinear(2)).eval()
    with torch.no_grad():
        in_memory = net(torch.from_numpy(whole.astype(np.float32))).numpy().argmax(1)
    monkeypatch.setattr(tasks.base, "PROGRAM_ROWS", 7)
    streamed = program_outputs(net, FloatPixels(x)).argmax(1)
    assert np.array_equal(streamed, in_memory) and (streamed == y).mean() == (in_memory == y).mean()
