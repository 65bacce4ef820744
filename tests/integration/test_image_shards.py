"""Sharded image sets through the real flow (Prefect, DVC, GX, torchrun with 2 CPU processes, each
rank decoding and augmenting in a DataLoader worker process, MLflow on sqlite), in a fresh git + DVC
project: a user's WebDataset tar shards, and a folder of files that ``init`` writes as shards. JPEGs
of mixed sizes (24 to 64 px); random resized crop, flip and colour jitter on. The registered model,
loaded through ``mlflow.pyfunc`` in a fresh process, scores the test samples' encoded bytes. A corrupt
member of a shard is then named by validation, and nothing trains.
"""

from __future__ import annotations

import io
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import numpy as np
import pytest
import yaml

from tests.integration.conftest import DVC_BIN, run
from tests.integration.test_bring_your_own import BOUNDS, _env, commit_all, trainflow
from tests.integration.test_bring_your_own import project, template  # noqa: F401  (fixtures: a fresh git + DVC project)
from tests.integration.test_image_task import CLASSES, draw

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

AUGMENT = {"crop_scale": [0.7, 1.0], "hflip": True, "jitter": 0.1}

SCORE = """
import json, sys, tarfile
from pathlib import Path
import mlflow, numpy as np, pandas as pd
from core.paths import default_tracking_uri
proj, model, shards = Path(sys.argv[1]), sys.argv[2], Path(sys.argv[3])
uri = default_tracking_uri(proj / ".trainflow")
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
images, truth = [], []
for shard in sorted(shards.glob("*.tar")):
    with tarfile.open(shard) as tar:
        members = {m.name: tar.extractfile(m).read() for m in tar if m.isfile()}
    for name in sorted(members):
        if name.endswith(".cls"):
            truth.append(members[name].decode())
            images.append(next(v for k, v in members.items() if k.startswith(name[:-4] + ".") and k != name))
loaded = mlflow.pyfunc.load_model(f"models:/{model}@champion")
proba = loaded.predict(pd.DataFrame({"image": images}), params={"predict_method": "predict_proba"})
pred = loaded.predict(pd.DataFrame({"image": images}))
print(json.dumps({"pred": np.asarray(pred).tolist(), "truth": truth, "columns": list(proba.columns)}))
"""


def _jpeg(shape: str, rng: np.random.Generator) -> bytes:
    buf = io.BytesIO()
    draw(shape, rng, int(rng.integers(24, 65))).save(buf, "JPEG", quality=90)
    return buf.getvalue()


def _add(tar: tarfile.TarFile, name: str, body: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(body)
    tar.addfile(info, io.BytesIO(body))


def write_webdataset(folder: Path, per_class: dict[str, int], per_shard: int = 40, seed: int = 0) -> None:
    """``folder/{train,test}/00000N.tar``: ``key.jpg`` + ``key.cls`` (the class name) per sample."""
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        samples = [(f"{shape}-{i:04d}", _jpeg(shape, rng), shape) for i in range(n) for shape in CLASSES]
        order = rng.permutation(len(samples))
        (folder / split).mkdir(parents=True, exist_ok=True)
        for k in range(0, len(samples), per_shard):
            with tarfile.open(folder / split / f"{k // per_shard:06d}.tar", "w") as tar:
                for j in order[k:k + per_shard]:
                    key, data, label = samples[j]
                    _add(tar, f"{key}.jpg", data)
                    _add(tar, f"{key}.cls", label.encode())


def write_folder(folder: Path, per_class: dict[str, int], seed: int = 1) -> None:
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        for shape in CLASSES:
            (folder / split / shape).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                (folder / split / shape / f"{i:03d}.jpg").write_bytes(_jpeg(shape, rng))


def _augmented(project: Path, name: str) -> None:
    """The config init wrote, with augmentation and one DataLoader worker per rank."""
    path = project / "configs" / f"{name}.yaml"
    raw = yaml.safe_load(path.read_text())
    raw["dataset"]["images"].update(augment=AUGMENT, workers=1)
    raw["training"]["epochs"] = 8
    path.write_text(yaml.safe_dump(raw, sort_keys=False))


def _run_and_score(project: Path, name: str, test_shards: Path) -> dict:
    code, s, err = trainflow(project, "run", "--config", f"configs/{name}.yaml", *BOUNDS)
    assert code == 0, (s.get("error"), err[-4000:])
    assert s["status"] == "registered" and "champion" in s["aliases"], s
    assert s["metrics"]["accuracy"] >= 0.7, s["metrics"]
    scored = subprocess.run([sys.executable, "-c", SCORE, str(project), name, str(test_shards)], cwd=project,
                            env=_env(), capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-3000:]
    got = json.loads(scored.stdout.strip().splitlines()[-1])
    assert got["columns"] == list(CLASSES) and set(got["pred"]) <= set(CLASSES)
    accuracy = float(np.mean(np.asarray(got["pred"]) == np.asarray(got["truth"])))
    assert abs(accuracy - s["metrics"]["accuracy"]) < 1e-9, (accuracy, s["metrics"])  # the same crop as evaluation
    return s


def test_webdataset_shards_from_init_to_a_champion_then_a_corrupt_member_is_named(project):
    data = project / "data" / "wds"
    write_webdataset(data, {"train": 50, "test": 12})
    done = subprocess.run([str(Path(sys.executable).parent / "trainflow"), "init", "--data", "data/wds"],
                          cwd=project, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "train/ and test/ hold 4 and 1 WebDataset tar shards" in done.stdout, done.stdout
    from core.config import load_config

    images = load_config(project / "configs" / "wds.yaml").dataset.images
    assert images.shards == "." and images.classes == list(CLASSES)
    _augmented(project, "wds")
    commit_all(project, "trainflow init: wds")
    _run_and_score(project, "wds", data / "test")

    trained_before = sorted((project / ".trainflow").glob("train/*/result.json"))
    good = _jpeg("circle", np.random.default_rng(5))
    with tarfile.open(data / "train" / "000004.tar", "w") as tar:
        _add(tar, "circle-9999.jpg", good[: len(good) // 3])
        _add(tar, "circle-9999.cls", b"circle")
    run([DVC_BIN, "add", "-q", "data/wds"], project)
    commit_all(project, "a corrupt shard member")
    code, s, err = trainflow(project, "run", "--config", "configs/wds.yaml", *BOUNDS)
    assert code == 2 and s["status"] == "validation_failed", err[-2000:]
    messages = [f["message"] for f in s["validation"]["failures"]]
    assert any("train/000004.tar:circle-9999.jpg" in m and "cannot decode" in m for m in messages), messages
    assert "training" not in s and "Traceback" not in err
    assert sorted((project / ".trainflow").glob("train/*/result.json")) == trained_before


def test_an_image_folder_init_writes_as_shards_trains_and_scores(project, monkeypatch):
    from flows.init import init_project
    import tasks.images

    write_folder(project / "data" / "photos", {"train": 40, "test": 10})
    monkeypatch.setattr(tasks.images, "SHARD_ABOVE_BYTES", 0)  # the line a set of photos would pass
    done = init_project(project, "data/photos", None)
    assert done["data"] == "data/photos-shards" and done["dvc_file"] == "data/photos-shards.dvc"
    assert (project / "data" / "photos-shards.dvc").is_file()
    assert sorted(p.name for p in (project / "data" / "photos-shards" / "train").iterdir()) == ["000000.tar"]
    with tarfile.open(project / "data" / "photos-shards" / "test" / "000000.tar") as tar:
        first = tar.extractfile(tar.getmembers()[0]).read()
    assert first == (project / "data" / "photos" / "test" / "circle" / "000.jpg").read_bytes()  # bytes, not pixels
    _augmented(project, "photos")
    commit_all(project, "trainflow init: photos as shards")
    _run_and_score(project, "photos", project / "data" / "photos-shards" / "test")
