import os

import pytest

from core.errors import DataUnavailableError
from core.hashing import sha256_json
from core.manifest import ImageRef, World, build_manifest, image_from_env, packages_hash, read_dvc_file

DVC = "outs:\n- md5: abc123.dir\n  size: 10\n  nfiles: 2\n  hash: md5\n  path: data\n"


def test_missing_or_malformed_dvc_file_is_a_clear_error(tmp_path):
    with pytest.raises(DataUnavailableError, match="data.dvc: not found"):
        read_dvc_file(tmp_path, "data.dvc")
    (tmp_path / "data.dvc").write_text("outs: []\n")
    with pytest.raises(DataUnavailableError, match="not a DVC file"):
        read_dvc_file(tmp_path, "data.dvc")


def test_image_ref_digest_sources(monkeypatch):
    monkeypatch.delenv("TRAINFLOW_IMAGE", raising=False)
    monkeypatch.delenv("TRAINFLOW_IMAGE_DIGEST", raising=False)
    assert image_from_env() == ImageRef("local", "local")
    assert image_from_env("ghcr.io/x/y@sha256:beef").digest == "sha256:beef"
    monkeypatch.setenv("TRAINFLOW_IMAGE", "reg/img:1")
    monkeypatch.setenv("TRAINFLOW_IMAGE_DIGEST", "sha256:cafe")
    assert image_from_env() == ImageRef("reg/img:1", "sha256:cafe")
    assert image_from_env("other:2", "sha256:0").ref == "other:2"


def test_packages_hash_is_stable():
    assert packages_hash() == packages_hash()


def test_packages_hash_cache_is_reused_and_invalidated_by_an_install(tmp_path, monkeypatch):
    import json
    import sys

    site = tmp_path / "site"
    site.mkdir()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    fresh = packages_hash()
    assert packages_hash(tmp_path / "cache") == fresh
    cached = tmp_path / "cache" / "packages_sha256.json"
    record = json.loads(cached.read_text())
    cached.write_text(json.dumps({**record, "sha256": "from-the-cache"}))
    import core.manifest

    # In this process the answer is remembered: neither the file nor the metadata is read again.
    import importlib.metadata

    monkeypatch.setattr(importlib.metadata, "distributions", lambda: 1 / 0)
    assert packages_hash(tmp_path / "cache") == fresh and packages_hash() == fresh
    monkeypatch.undo()
    monkeypatch.setattr(sys, "path", [*sys.path, str(site)])
    monkeypatch.setattr(core.manifest, "_PACKAGES_MEMO", {})  # a new process: the file is read
    assert packages_hash(tmp_path / "cache") == "from-the-cache"  # same folders, same mtimes: reused
    # "Installing" a distribution into a folder on the path changes its mtime, so the key.
    dist = site / "newpkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: newpkg\nVersion: 1.0\n")
    os.utime(site, ns=(0, os.stat(site).st_mtime_ns + 10**9))
    after = packages_hash(tmp_path / "cache")
    assert after != "from-the-cache" and after == packages_hash() != fresh


def test_tracking_uri_defaults_to_sqlite_in_home_and_env_wins(tmp_path, monkeypatch):
    from core.paths import tracking_uri, trainflow_home

    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "state"))
    home = trainflow_home()
    assert home == (tmp_path / "state").resolve()
    assert tracking_uri(home) == f"sqlite:///{home}/mlflow.db" and tracking_uri(home).startswith("sqlite:////")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://mlflow:5000")
    assert tracking_uri(home) == "http://mlflow:5000"


def test_a_pretrained_folder_joins_the_tags_and_the_training_identity():
    from core.manifest import DataRef, ImageRef, Manifest, World

    data, model = DataRef("data", "a" * 32 + ".dir", "r1"), DataRef("enc", "b" * 32 + ".dir", "r2")
    plain = Manifest("0" * 40, False, "n", "c", data, ImageRef(), "p", 0, World(1, 1, "gloo"))
    tuned = Manifest("0" * 40, False, "n", "c", data, ImageRef(), "p", 0, World(1, 1, "gloo"), pretrained=model)
    assert plain.inputs_md5 == data.md5 and not any(k.startswith("pretrained") for k in plain.tags())
    assert tuned.inputs_md5 == f"{data.md5}+{model.md5}" != plain.inputs_md5
    assert {k: v for k, v in tuned.tags().items() if k.startswith("pretrained")} == {
        "pretrained_dvc_path": "enc", "pretrained_md5": model.md5, "pretrained_rev": "r2"}


def test_retrain_sees_a_changed_model_folder_as_a_stale_champion():
    from core.manifest import DataRef, ImageRef, Manifest, World
    from flows.retrain import model_folder_change

    data, model = DataRef("data", "a" * 32 + ".dir", "r1"), DataRef("enc", "b" * 32 + ".dir", "r2")
    tuned = Manifest("0" * 40, False, "n", "c", data, ImageRef(), "p", 0, World(1, 1, "gloo"), pretrained=model)
    plain = Manifest("0" * 40, False, "n", "c", data, ImageRef(), "p", 0, World(1, 1, "gloo"))
    assert model_folder_change(tuned.tags(), tuned) is None and model_folder_change(plain.tags(), plain) is None
    assert model_folder_change({"pretrained_md5": "c" * 32 + ".dir"}, tuned) == (
        f"pretrained model folder changed: {'c' * 32}.dir -> {model.md5}")
    assert model_folder_change(plain.tags(), tuned) == f"pretrained model folder changed: none -> {model.md5}"


def test_manifest_diff_names_what_moved_between_a_recorded_manifest_and_now():
    from core.manifest import DataRef, Manifest, flat, manifest_diff

    m = Manifest("a" * 40, False, "digits", "c" * 64, DataRef("data", "abc.dir", "HEAD"), ImageRef(), "p" * 64, 0,
                 World(1, 2, "gloo"))
    recorded = flat(m.to_dict())
    tags = m.tags()
    assert {k: recorded[k] for k in ("data_md5", "image_ref", "image_digest", "config_sha256")} == \
        {k: tags[k] for k in ("data_md5", "image_ref", "image_digest", "config_sha256")}
    now = {**tags, "data_md5": "def.dir", "image_digest": "sha256:1"}
    keys = ("config_sha256", "data_md5", "image_digest", "packages_sha256")
    assert manifest_diff(recorded, now, keys) == {"data_md5": ("abc.dir", "def.dir"),
                                                  "image_digest": ("local", "sha256:1")}
    assert manifest_diff({}, now, ["config_sha256"]) == {"config_sha256": (None, "c" * 64)}  # an older run: unrecorded
