"""A folder of images a user brings, from ``trainflow init`` to a registered champion, through the
real flow (Prefect, DVC, GX, torchrun with 2 CPU processes, MLflow on sqlite), in a fresh git + DVC
project: PNG and JPEG files of three shapes in class folders, of mixed sizes and modes. The
registered model, loaded through ``mlflow.pyfunc`` in a fresh process, scores the raw test files'
bytes and returns the class names. (Bad files named by the image suite: tests/unit/test_image_task.py;
a run stopped by them with nothing trained: the shard set's test in test_image_shards.py.)
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.integration.test_bring_your_own import BOUNDS, _env, commit_all, trainflow
from tests.integration.test_bring_your_own import project, template  # noqa: F401  (fixtures: a fresh git + DVC project)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

CLASSES = ("circle", "square", "triangle")


def draw(shape: str, rng: np.random.Generator, size: int):
    """One picture: a filled shape of a random colour, size and place on a random background."""
    from PIL import Image, ImageDraw

    bg = tuple(int(v) for v in rng.integers(0, 80, 3))
    img = Image.new("RGB", (size, size), bg)
    d = ImageDraw.Draw(img)
    r = int(rng.integers(size // 4, size // 2 - 1))
    cx, cy = (int(v) for v in rng.integers(r, size - r, 2))
    colour = tuple(int(v) for v in rng.integers(150, 256, 3))
    if shape == "circle":
        d.ellipse([cx - r, cy - r, cx + r, cy + r], fill=colour)
    elif shape == "square":
        d.rectangle([cx - r, cy - r, cx + r, cy + r], fill=colour)
    else:
        d.polygon([(cx, cy - r), (cx - r, cy + r), (cx + r, cy + r)], fill=colour)
    return img


def write_shapes(folder: Path, per_class: dict[str, int], seed: int = 0) -> None:
    """``folder/{train,test}/<shape>/NNN.{png,jpg}``: mostly 32 x 32 PNG, every fifth a JPEG, every
    seventh 40 x 40, every ninth saved grey (mode L)."""
    rng = np.random.default_rng(seed)
    for split, n in per_class.items():
        for shape in CLASSES:
            (folder / split / shape).mkdir(parents=True, exist_ok=True)
            for i in range(n):
                img = draw(shape, rng, 40 if i % 7 == 3 else 32)
                if i % 9 == 4:
                    img = img.convert("L")
                suffix = "jpg" if i % 5 == 2 else "png"
                img.save(folder / split / shape / f"{i:03d}.{suffix}", quality=95)


SCORE = """
import json, sys
from pathlib import Path
import mlflow, numpy as np, pandas as pd
from core.paths import default_tracking_uri
proj, model = Path(sys.argv[1]), sys.argv[2]
uri = default_tracking_uri(proj / ".trainflow")
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
files = sorted((proj / "data" / "shapes" / "test").rglob("*.*"))
loaded = mlflow.pyfunc.load_model(f"models:/{model}@champion")
pred = loaded.predict(pd.DataFrame({"image": [f.read_bytes() for f in files]}))
print(json.dumps({"pred": np.asarray(pred).tolist(), "truth": [f.parent.name for f in files],
                  "inputs": [[c.name, c.type.name] for c in loaded.metadata.get_input_schema().inputs]}))
"""


def test_an_image_folder_from_init_to_a_champion_scoring_raw_bytes(project):
    write_shapes(project / "data" / "shapes", {"train": 60, "test": 20})
    done = subprocess.run([str(Path(sys.executable).parent / "trainflow"), "init", "--data", "data/shapes"],
                          cwd=project, env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "task:         image_classification (inferred: train/<class>/ and test/<class>/ hold 180 and 60" \
        in done.stdout
    assert "input:        32 x 32 (h x w)" in done.stdout and "3 channel(s)" in done.stdout
    from core.config import load_config

    cfg = load_config(project / "configs" / "shapes.yaml")
    images = cfg.dataset.images
    assert images.classes == list(CLASSES) and images.expectations.width == (31, 41)
    assert set(images.expectations.modes) == {"L", "RGB"}
    commit_all(project, "trainflow init: shapes")

    # About half of init's 15 epochs: these shapes are learnt by the fifth (the suite's time is short).
    code, s, err = trainflow(project, "run", "--config", "configs/shapes.yaml", "--set", "training.epochs=8", *BOUNDS)
    assert code == 0, (s.get("error"), err[-4000:])
    assert s["status"] == "registered" and "champion" in s["aliases"], s
    assert s["metrics"]["accuracy"] >= 0.9 and s["metrics"]["min_class_recall"] >= 0.8
    assert "HistGradientBoosting" in s["gbdt"]["predictor"] and "vs GBDT" in err
    assert Path(s["plots"]["confusion_matrix"]).is_file()
    scored = subprocess.run([sys.executable, "-c", SCORE, str(project), "shapes"], cwd=project, env=_env(),
                            capture_output=True, text=True, timeout=300)
    assert scored.returncode == 0, scored.stderr[-3000:]
    got = json.loads(scored.stdout.strip().splitlines()[-1])
    assert got["inputs"] == [["image", "binary"]] and set(got["pred"]) <= set(CLASSES)
    assert float(np.mean(np.asarray(got["pred"]) == np.asarray(got["truth"]))) >= 0.9


@pytest.mark.parametrize("sets", [["training.strategy=fsdp", "training.epochs=2"],
                                  ["model.kind=resnet18", "training.epochs=1", "model.backbone_lr_scale=0.1",
                                   "model.freeze_backbone_epochs=1"]], ids=["fsdp", "resnet18"])
def test_the_image_task_trains_sharded_and_with_resnet18(tmp_path, bundled_data, sets):
    from tests.engine_helpers import IMAGE_ENGINE_CONFIG, train

    r = train(tmp_path / "out", sets, config=IMAGE_ENGINE_CONFIG)
    assert r["status"] == "completed" and r["world_size"] == 2
    assert r["strategy"] == ("fsdp" if "fsdp" in sets[0] else "ddp")
    assert (tmp_path / "out" / "model.pt2").is_file() and r["final"]["val_loss"] < r["history"][0]["train_loss"] + 1


def test_init_run_again_takes_the_new_classes_and_keeps_the_users_choices(project):
    import yaml

    from flows.init import format_report, init_project

    write_shapes(project / "data" / "shapes", {"train": 6, "test": 3})
    first = init_project(project, "data/shapes", None)
    assert first["task"] == "image_classification" and first["task_inferred"] and not first["updated"]
    config = project / "configs" / "shapes.yaml"
    raw = yaml.safe_load(config.read_text())
    raw["dataset"]["images"]["size"] = [24, 24]
    raw["dataset"]["images"]["augment"] = {"hflip": True}
    raw["training"]["epochs"] = 3
    config.write_text(yaml.safe_dump(raw))
    for split, n in (("train", 6), ("test", 3)):  # a fourth class arrives
        folder = project / "data" / "shapes" / split / "diamond"
        folder.mkdir()
        for i in range(n):
            draw("square", np.random.default_rng(100 + i), 32).rotate(45).save(folder / f"{i}.png")
    again = init_project(project, "data/shapes", None)
    cfg = yaml.safe_load(config.read_text())
    images = cfg["dataset"]["images"]
    assert images["classes"] == ["circle", "diamond", "square", "triangle"]  # the data's facts are new
    assert images["size"] == [24, 24] and images["augment"] == {"hflip": True} and cfg["training"]["epochs"] == 3
    assert again["updated"] == ["configs/shapes.yaml"] and "+    - diamond" in again["diff"]["configs/shapes.yaml"]
    assert "Updated configs/shapes.yaml: the data facts are new" in format_report(again)
