"""The image_classification task: folder and manifest listing, profiling, decoding (and its parity
with the registered model's), the pixel cache, the image suite, the networks, init's choices and
the config checks."""

from __future__ import annotations

import base64
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from core.config import DatasetConfig, PipelineConfig, config_from_dict
from tasks.image_options import ImageExpectations, ImagesConfig
from core.errors import ConfigError, DataUnavailableError
from tasks import get_task, image_data, task_for
from tasks.image_data import cached_pixels, decode, list_images, profile
from tasks.image_nets import Augment, ImageInput, ResNet18, image_cnn, load_weights
from tasks.images import _class_order, _init_size
from tests.pyfuncs import pyfunc_module


def _png(path: Path, size=(8, 8), mode="L", seed=0, fmt="PNG") -> bytes:
    """A noisy image of ``size`` = (width, height) saved at ``path``; returns its bytes."""
    rng = np.random.default_rng(seed)
    shape = (size[1], size[0]) if mode in ("L", "P") else (size[1], size[0], len(mode))
    img = Image.fromarray(rng.integers(0, 256, shape, dtype=np.uint8), "L" if mode == "P" else mode)
    if mode == "P":
        img = img.convert("RGB").convert("P", palette=Image.Palette.ADAPTIVE, colors=16)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, fmt)
    return path.read_bytes()


def _cfg(**images) -> DatasetConfig:
    return DatasetConfig(path="data", images=ImagesConfig(**images))


# -- listing --------------------------------------------------------------------------------
def test_folder_listing_is_sorted_counts_nested_files_and_skips_other_files(tmp_path):
    base = tmp_path / "data"
    for rel in ("train/b/2.png", "train/b/1.jpg", "train/a/deep/er/z.PNG", "train/a/y.webp", "test/a/t.png",
                "test/b/u.jpeg"):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(b"x")
    for rel in ("train/a/notes.txt", "train/a/.hidden.png", "train/.cache/c.png", "train/a/x.png.bak"):
        (base / rel).parent.mkdir(parents=True, exist_ok=True)
        (base / rel).write_bytes(b"x")
    (base / "train" / "loose.png").write_bytes(b"x")  # not in a class folder
    out = list_images(_cfg(), tmp_path, 0)
    assert out["train"] == [("train/a/deep/er/z.PNG", "a"), ("train/a/y.webp", "a"), ("train/b/1.jpg", "b"),
                            ("train/b/2.png", "b")]
    assert out["test"] == [("test/a/t.png", "a"), ("test/b/u.jpeg", "b")]


def test_a_missing_test_folder_is_named(tmp_path):
    (tmp_path / "data" / "train" / "a").mkdir(parents=True)
    with pytest.raises(DataUnavailableError, match=r"test split not found: .*data/test"):
        list_images(_cfg(), tmp_path, 0)


def test_a_symlink_leading_out_of_the_dataset_is_refused(tmp_path):
    outside = tmp_path / "secret.png"
    _png(outside)
    _png(tmp_path / "data" / "test" / "a" / "t.png")
    (tmp_path / "data" / "train" / "a").mkdir(parents=True)
    (tmp_path / "data" / "train" / "a" / "link.png").symlink_to(outside)
    with pytest.raises(DataUnavailableError, match=r"train/a: path 'train/a/link.png' leads outside"):
        list_images(_cfg(), tmp_path, 0)


# -- manifest -------------------------------------------------------------------------------
def _manifest(tmp_path: Path, text: str) -> DatasetConfig:
    (tmp_path / "data").mkdir(exist_ok=True)
    (tmp_path / "data" / "manifest.csv").write_text(text)
    return _cfg(manifest="manifest.csv")


def test_a_manifest_split_column_is_followed(tmp_path):
    cfg = _manifest(tmp_path, "path,label,split\nimg/3.png,b,train\nimg/1.png,a,TEST\nimg/2.png,a,train\n"
                              "img/4.png,7,test\n")
    out = list_images(cfg, tmp_path, 0)
    assert out == {"train": [("img/2.png", "a"), ("img/3.png", "b")], "test": [("img/4.png", "7"), ("img/1.png", "a")]}


def test_a_manifest_without_split_is_split_by_seed_within_each_class(tmp_path):
    rows = [f"img/{c}{i}.png,{c}" for c in "ab" for i in range(10)]
    cfg = _manifest(tmp_path, "path,label\n" + "\n".join(rows) + "\n")  # test_fraction 0.2
    first = list_images(cfg, tmp_path, 3)
    assert first == list_images(cfg, tmp_path, 3)
    assert len(first["train"]) == 16 and len(first["test"]) == 4
    assert sorted(label for _, label in first["test"]) == ["a", "a", "b", "b"]
    assert {p for p, _ in first["train"]} | {p for p, _ in first["test"]} == {r.split(",")[0] for r in rows}
    others = [list_images(cfg, tmp_path, s)["test"] for s in range(4, 10)]
    assert any(o != first["test"] for o in others)  # the seed decides


@pytest.mark.parametrize("bad", ["../outside.png", "/etc/passwd", "img/../../x.png"])
def test_a_manifest_row_leading_out_is_refused_and_named(tmp_path, bad):
    cfg = _manifest(tmp_path, f"path,label\nimg/ok.png,a\n{bad},b\n")
    with pytest.raises(DataUnavailableError, match=rf"manifest.csv row 3: path '{bad}'"):
        list_images(cfg, tmp_path, 0)


# -- profile --------------------------------------------------------------------------------
def test_profile_reports_size_mode_hash_and_undecodable_files(tmp_path):
    import hashlib

    good = _png(tmp_path / "good.png", size=(12, 7), mode="RGB")
    full = _png(tmp_path / "full.png", size=(64, 64), mode="RGB", seed=1)
    (tmp_path / "cut.png").write_bytes(full[: len(full) // 2])
    (tmp_path / "x.png").write_text("not an image at all")
    df = profile(tmp_path, [("good.png", "a"), ("cut.png", "a"), ("x.png", "b"), ("gone.png", "b")])
    assert list(df.columns) == image_data.COLUMNS and list(df["file"]) == [0, 1, 2, 3]
    g = df.iloc[0]
    assert (g["decodes"], g["width"], g["height"], g["mode"]) == (True, 12, 7, "RGB")
    assert g["sha256"] == hashlib.sha256(good).hexdigest() and g["n_bytes"] == len(good) and pd.isna(g["error"])
    assert list(df["decodes"]) == [True, False, False, False]
    assert "truncated" in df.iloc[1]["error"] and "UnidentifiedImageError" in df.iloc[2]["error"]
    assert df.iloc[3]["error"].startswith("unreadable") and pd.isna(df.iloc[3]["n_bytes"])
    assert df.iloc[1:]["width"].isna().all()


# -- decode and its parity with the registered model ------------------------------------------
def test_decode_converts_channels_and_resizes_to_height_by_width(tmp_path):
    grey = _png(tmp_path / "g.png", size=(10, 6), mode="L")
    rgb = _png(tmp_path / "c.png", size=(10, 6), mode="RGB")
    assert decode(grey, (6, 10), 3).shape == (3, 6, 10)
    assert decode(rgb, (6, 10), 1).shape == (1, 6, 10)
    a = decode(grey, (6, 10), 3)
    assert (a[0] == a[1]).all() and (a[1] == a[2]).all()  # grey copied to every channel
    assert np.array_equal(decode(grey, (6, 10), 1)[0], np.asarray(Image.open(io.BytesIO(grey))))  # no resize
    out = decode(rgb, (4, 12), 3)
    assert out.shape == (3, 4, 12) and out.dtype == np.uint8
    with pytest.raises(ValueError, match="not a decodable image"):
        decode(b"nope", (4, 4), 1)


@pytest.fixture(scope="module")
def exported():
    """The pyfunc's class, loaded from its file as MLflow would (without a model context)."""
    return pyfunc_module("pyfunc_image.py").ExportedImageClassifier


@pytest.mark.parametrize("mode,size,fmt", [("RGBA", (9, 5), "PNG"), ("P", (7, 11), "PNG"), ("L", (16, 16), "PNG"),
                                           ("RGB", (13, 6), "JPEG"), ("RGB", (8, 8), "WEBP")])
def test_training_and_the_registered_model_decode_alike(tmp_path, exported, mode, size, fmt):
    data = _png(tmp_path / f"x.{fmt.lower()}", size=size, mode=mode, fmt=fmt)
    for channels in (1, 3):
        for target in ((8, 8), (5, 12), size[::-1]):
            obj = exported()
            obj.size, obj.mode = target, {1: "L", 3: "RGB"}[channels]
            want = decode(data, target, channels)
            assert want.shape == (channels, *target)
            assert np.array_equal(obj._pixels(data, 0), want), (channels, target)
            assert np.array_equal(obj._pixels(base64.b64encode(data).decode(), 0), want)
    with pytest.raises(ValueError, match="row 4: column 'image' is not a decodable image"):
        obj._pixels(b"junk", 4)


# -- the decoded-pixel cache ----------------------------------------------------------------
def test_cached_pixels_maps_the_cache_and_decodes_a_changed_file_again(tmp_path, monkeypatch):
    base = tmp_path / "data"
    _png(base / "train/a/0.png", seed=0)
    _png(base / "train/b/1.png", size=(20, 10), seed=1)
    cfg, home, paths = _cfg(size=(8, 8), channels=1), tmp_path / "home", ["train/a/0.png", "train/b/1.png"]
    calls = []
    real = image_data.decode_files
    monkeypatch.setattr(image_data, "decode_files", lambda *a: calls.append(a[1]) or real(*a))
    first = cached_pixels(cfg, tmp_path, "train", paths, home)
    assert calls == [paths] and first.shape == (2, 1, 8, 8)
    assert np.array_equal(first[1], decode((base / paths[1]).read_bytes(), (8, 8), 1))
    assert len(list((home / "cache" / "images").glob("train-*.npy"))) == 1
    again = cached_pixels(cfg, tmp_path, "train", paths, home)
    assert len(calls) == 1 and np.array_equal(again, first) and not again.flags.writeable
    _png(base / paths[0], size=(30, 30), seed=5)  # other pixels, other byte size
    changed = cached_pixels(cfg, tmp_path, "train", paths, home)
    assert len(calls) == 2 and not np.array_equal(changed[0], first[0])
    assert np.array_equal(changed[0], decode((base / paths[0]).read_bytes(), (8, 8), 1))
    st = (base / paths[1]).stat()
    os.utime(base / paths[1], ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))  # same bytes, a new mtime
    cached_pixels(cfg, tmp_path, "train", paths, home)
    assert len(calls) == 3
    cached_pixels(_cfg(size=(8, 8), channels=3), tmp_path, "train", paths, home)  # other settings
    assert len(calls) == 4


# -- the image suite (GX) -------------------------------------------------------------------
def _suite_cfg() -> DatasetConfig:
    bounds = ImageExpectations(width=(8, 8), height=(8, 8), modes=["L"], class_share=(0.2, 0.8))
    return _cfg(classes=["a", "b"], size=(8, 8), channels=1, expectations=bounds)


def _run_suite(tmp_path: Path, cfg: DatasetConfig) -> dict:
    from validation import image_suite
    from validation.gx_run import validate
    from validation.image_suite import load_splits

    return validate(image_suite, {"dataset": cfg}, load_splits(cfg, tmp_path, 0), tmp_path / "report")


def _clean_folder(base: Path) -> None:
    seed = 0
    for split, counts in (("train", {"a": 3, "b": 3}), ("test", {"a": 2, "b": 2})):
        for cls, n in counts.items():
            for i in range(n):
                seed += 1
                _png(base / split / cls / f"{i}.png", seed=seed)


def test_the_image_suite_passes_a_clean_folder(tmp_path):
    _clean_folder(tmp_path / "data")
    report = _run_suite(tmp_path, _suite_cfg())
    assert report["success"] and report["failures"] == [], report["failures"]
    assert report["rows"] == {"train": 6, "test": 4} and report["n_expectations"] > 0


def test_the_image_suite_names_each_bad_file(tmp_path):
    base = tmp_path / "data"
    _clean_folder(base)
    full = _png(tmp_path / "full.png", size=(64, 64), seed=99)
    (base / "train/a/cut.png").write_bytes(full[: len(full) // 2])  # decode
    _png(base / "train/a/big.png", size=(12, 12), seed=100)  # size (width and height)
    _png(base / "train/c/0.png", seed=101)  # label_set: c is not reviewed
    same = _png(base / "train/b/same.png", seed=102)  # leak
    (base / "test/b/copy.png").write_bytes(same)
    for i in range(3):  # class_balance: test holds 1 a and 6 b, shares 0.143 and 0.857 outside [0.2, 0.8]
        _png(base / f"test/b/x{i}.png", seed=200 + i)
    (base / "test/a/1.png").unlink()
    report = _run_suite(tmp_path, _suite_cfg())
    assert not report["success"]
    by = {}
    for f in report["failures"]:
        by.setdefault((f["split"], f["check"]), []).append(f)
    assert set(by) == {("train", "decode"), ("train", "size"), ("train", "label_set"), ("test", "class_balance"),
                       ("cross", "leak")}, report["failures"]
    (dec,) = by["train", "decode"]
    assert dec["unexpected_count"] == 1 and "train/a/cut.png" in dec["detail"] and "truncated" in dec["detail"]
    assert [e["path"] for e in dec["examples"]] == ["train/a/cut.png"]
    sizes = by["train", "size"]
    assert sorted(f["column"] for f in sizes) == ["height", "width"]
    assert all(f["unexpected_count"] == 1 and "train/a/big.png (12 x 12)" in f["detail"] for f in sizes)
    (label,) = by["train", "label_set"]
    assert "train/c/0.png" in label["detail"] and "'c'" in label["detail"]
    (leak,) = by["cross", "leak"]
    assert leak["examples"] == [{"train_path": "train/b/same.png", "test_path": "test/b/copy.png"}]
    assert "train train/b/same.png = test test/b/copy.png" in leak["detail"]
    (bal,) = by["test", "class_balance"]
    assert {e["class"] for e in bal["examples"]} == {"a", "b"} and "a 0.143 (1 images)" in bal["detail"]


# -- networks -------------------------------------------------------------------------------
def test_augment_is_the_identity_when_off_or_in_eval_mode():
    x = torch.rand(4, 3, 6, 7) * 255
    assert torch.equal(Augment(False, 0).train()(x), x)
    assert torch.equal(Augment(True, 2).eval()(x), x)


def test_augment_shift_crops_the_zero_padded_image_and_repeats_under_a_seed():
    torch.manual_seed(1)
    x = torch.rand(32, 2, 5, 6) + 1  # no zeros: the padding shows
    aug = Augment(False, 1).train()
    out = aug(x)
    padded = torch.nn.functional.pad(x, (1, 1, 1, 1))
    offsets = set()
    for i in range(len(x)):
        crops = {(dy, dx): padded[i, :, dy:dy + 5, dx:dx + 6] for dy in range(3) for dx in range(3)}
        hits = [at for at, crop in crops.items() if torch.equal(out[i], crop)]
        assert len(hits) == 1, i
        offsets.add(hits[0])
    assert len(offsets) > 1  # drawn per image
    both = Augment(True, 1).train()
    torch.manual_seed(7)
    a = both(x)
    torch.manual_seed(7)
    assert torch.equal(both(x), a)  # a resumed run (same generator state) draws the same
    assert not torch.equal(both(x), a)


def test_augment_hflip_mirrors_some_images_left_right():
    torch.manual_seed(2)
    x = torch.rand(32, 1, 4, 5)
    out = Augment(True, 0).train()(x)
    flipped = [bool(torch.equal(o, i.flip(-1))) for o, i in zip(out, x)]
    assert all(f or torch.equal(o, i) for f, o, i in zip(flipped, out, x))
    assert 0 < sum(flipped) < len(x)


def test_image_input_normalises_with_the_train_statistics():
    layer = ImageInput([0.5, 0.2], [0.25, 0.1])
    x = torch.tensor([255 * 0.5, 255 * 0.2]).reshape(1, 2, 1, 1).expand(1, 2, 2, 2)
    assert torch.allclose(layer(x), torch.zeros(1, 2, 2, 2), atol=1e-6)
    up = torch.tensor([255 * 0.75, 255 * 0.3]).reshape(1, 2, 1, 1)
    assert torch.allclose(layer(up), torch.ones(1, 2, 1, 1), atol=1e-5)
    assert layer(torch.full((1, 2, 1, 1), 128, dtype=torch.uint8)).dtype == torch.float32


@pytest.mark.parametrize("channels,h,w", [(1, 8, 8), (3, 12, 20)])
def test_image_cnn_gives_one_logit_per_class(channels, h, w):
    net = image_cnn(channels, 5, (8, 16), 32, 0.1).eval()
    assert net(torch.rand(3, channels, h, w)).shape == (3, 5)


def test_resnet18_has_torchvisions_names_and_parameter_count():
    keys = set(ResNet18(3, 10).state_dict())
    assert {"conv1.weight", "bn1.running_mean", "bn1.num_batches_tracked", "layer1.0.conv1.weight",
            "layer1.1.bn2.bias", "layer2.0.downsample.0.weight", "layer2.0.downsample.1.running_var",
            "layer4.1.conv2.weight", "fc.weight", "fc.bias"} <= keys
    assert "layer1.0.downsample.0.weight" not in keys
    assert sum(p.numel() for p in ResNet18(3, 1000).parameters()) == 11_689_512
    assert sum(p.numel() for p in ResNet18(3, 10).parameters()) == 11_181_642
    assert ResNet18(1, 4).eval()(torch.rand(2, 1, 32, 32)).shape == (2, 4)


def test_load_weights_takes_a_colour_state_dict_into_a_grey_model(tmp_path):
    torch.manual_seed(0)
    src = ResNet18(3, 1000).state_dict()
    path = tmp_path / "r18.pt"
    torch.save({f"module.{k}": v for k, v in src.items()}, path)  # a DDP-saved file
    grey = ResNet18(1, 10)
    head = grey.fc.weight.detach().clone()
    skipped = load_weights(grey, path)
    assert sorted(skipped) == ["fc.bias", "fc.weight"]
    got = grey.state_dict()
    assert torch.equal(got["conv1.weight"], src["conv1.weight"].sum(1, keepdim=True))
    assert all(torch.equal(got[k], v) for k, v in src.items() if k != "conv1.weight" and not k.startswith("fc."))
    assert torch.equal(got["fc.weight"], head)
    torch.save([1, 2, 3], tmp_path / "list.pt")
    with pytest.raises(ValueError, match=r"model.weights: .*list.pt holds a list, not a state dict"):
        load_weights(grey, tmp_path / "list.pt")
    (tmp_path / "junk.pt").write_bytes(b"junk")
    with pytest.raises(ValueError, match="model.weights: .*not a loadable state dict"):
        load_weights(grey, tmp_path / "junk.pt")
    torch.save({"other.weight": torch.zeros(2)}, tmp_path / "other.pt")
    with pytest.raises(ValueError, match="none of its 1 keys fit"):
        load_weights(grey, tmp_path / "other.pt")


# -- init's choices -------------------------------------------------------------------------
def test_init_orders_numeric_classes_by_value_and_scales_large_images():
    assert _class_order({"10", "2", "1", "0"}) == ["0", "1", "2", "10"]
    assert _class_order({"cat", "10", "2"}) == ["10", "2", "cat"]
    size, why = _init_size(pd.Series([(256, 128)] * 3 + [(32, 32)]))
    assert size == [64, 32] and "3 of 4" in why and "scaled down to 64" in why
    size, why = _init_size(pd.Series([(20, 28), (20, 28), (64, 64)]))
    assert size == [20, 28] and "scaled" not in why


# -- config checks --------------------------------------------------------------------------
@pytest.mark.parametrize("dataset,model,match", [
    ({"path": "data/x"}, {}, r"dataset\.images: required"),
    ({"path": "data/x", "images": {"classes": ["a"]}}, {}, r"dataset\.images\.classes: at least two"),
    ({"path": "data/x", "images": {"classes": ["a", "b"]}}, {"kind": "tabular"}, r"model\.kind: 'tabular'"),
    ({"path": "data/x", "images": {"classes": ["a", "b"]}}, {"weights": "../../etc/passwd"}, r"model\.weights"),
])
def test_the_task_refuses_configs_that_do_not_fit(dataset, model, match):
    cfg = config_from_dict({"name": "img", "task": "image_classification", "dataset": dataset, "model": model})
    with pytest.raises(ConfigError, match=match):
        task_for(cfg)


def test_the_task_takes_a_fitting_config():
    cfg = config_from_dict({"name": "img", "task": "image_classification",
                            "dataset": {"path": "data/x", "images": {"classes": ["a", "b"]}},
                            "model": {"kind": "resnet18"}})
    assert task_for(cfg).name == "image_classification"


def test_init_reads_a_manifest_folder_and_profiles_it(tmp_path):
    from tasks.images import ImageClassification

    base = tmp_path / "data" / "pets"
    (base / "img").mkdir(parents=True)
    rows = ["path,label,split"]
    for i in range(12):
        label, split = ("cat", "dog")[i % 2], "test" if i % 4 >= 2 else "train"
        _png(base / "img" / f"{i}.png", size=(16, 10) if i else (20, 10), mode="RGB", seed=i)
        rows.append(f"img/{i}.png,{label},{split}")
    (base / "manifest.csv").write_text("\n".join(rows) + "\n")
    (base / "img" / "broken.png").write_bytes(b"not an image")
    (base / "manifest.csv").write_text("\n".join([*rows, "img/broken.png,cat,train"]) + "\n")
    task = ImageClassification()
    fit = task.init_reads(base)
    assert fit.fits and fit.preferred and "manifest.csv" in fit.why
    assert not task.init_reads(tmp_path).fits  # neither class folders nor a manifest
    facts = task.init_folder(tmp_path, base, "data/pets")
    images = facts["dataset"]["images"]
    assert images["manifest"] == "manifest.csv" and images["classes"] == ["cat", "dog"]
    assert images["size"] == [10, 16] and images["channels"] == 3  # the most common h x w; RGB
    assert facts["rows"] == {"train": 7, "test": 6}
    assert facts["problems"] == [f"img/broken.png: {facts['problems'][0].split(': ', 1)[1]}"]
    assert any(line.startswith("undecodable:  1 file(s)") for line in facts["lines"])
    # What init writes is a config the task takes.
    cfg = config_from_dict({"name": "pets", "task": "image_classification",
                            "dataset": {"path": "data/pets", **facts["dataset"]}})
    assert cfg.dataset.images.expectations.width == (15, 21)


def test_retrain_policy_drift_has_no_check_for_images_and_says_so():
    from tasks.images import ImageClassification

    with pytest.raises(DataUnavailableError, match="task 'image_classification' has no drift check"):
        ImageClassification().drift_frames(None, Path("."), None, lambda p: b"")


def test_sixteen_bit_grey_is_scaled_to_eight_bits_not_clipped(tmp_path, exported):
    values = (np.arange(64, dtype=np.uint16).reshape(8, 8) * 1000)
    Image.fromarray(values).save(tmp_path / "deep.png")
    data = (tmp_path / "deep.png").read_bytes()
    got = decode(data, (8, 8), 1)[0]
    assert np.array_equal(got, np.round(values / 257).astype(np.uint8))  # 64,000 -> 249, not 255
    obj = exported()
    obj.size, obj.mode = (8, 8), "L"
    assert np.array_equal(obj._pixels(data, 0), decode(data, (8, 8), 1))
    assert np.array_equal(decode(data, (4, 4), 3)[0], decode(data, (4, 4), 3)[2])  # grey into RGB: equal channels


def test_a_missing_image_folder_names_it_and_its_dvc_file_and_says_dvc_pull(tmp_path):
    cfg = DatasetConfig(path="data/gone", images=ImagesConfig())
    with pytest.raises(DataUnavailableError) as err:
        list_images(cfg, tmp_path, seed=0)
    assert str(err.value) == (f"{tmp_path / 'data/gone'} does not exist. The DVC-tracked data (data/gone.dvc) is "
                              "missing from the workspace; run `dvc pull` (or check dataset.path)")


def test_a_two_class_image_task_tunes_its_threshold_on_the_rows_training_validates_on(tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    _clean_folder(tmp_path / "data")
    task = get_task("image_classification")
    cfg = PipelineConfig(name="t", task="image_classification", dataset=_suite_cfg().model_dump())
    x, y = task.validation_split(cfg, tmp_path)
    val = task.load_data(cfg, tmp_path, cfg.seed).val.tensors
    assert np.array_equal(x, val[0].numpy()) and np.array_equal(y, val[1].numpy()) and x.dtype == np.float32
    three = _suite_cfg().model_dump()
    three["images"]["classes"] = ["a", "b", "c"]
    assert task.validation_split(PipelineConfig(name="t", task="image_classification", dataset=three), tmp_path) is None
