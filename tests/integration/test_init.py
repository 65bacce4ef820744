"""``trainflow init`` on real git + DVC projects: a CSV folder and a single Parquet file become
DVC-tracked data, a loadable config and a reviewed-expectations file; bad input is refused
before anything changes."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from core.config import load_config
from core.expectations import load_expectations
from flows.cli import build_parser, cmd_init
from flows.init import InitError, init_project, slugify
from tests.integration.conftest import DVC_BIN, GIT_ID, run

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    """A git + DVC repository whose default remote is a folder inside it, like the bundled one;
    made once (git and dvc init cost seconds), each test gets its own copy (``project``)."""
    proj = tmp_path_factory.mktemp("init-template") / "proj"
    (proj / "data").mkdir(parents=True)
    run(["git", "init", "-q"], proj)
    run([DVC_BIN, "init", "-q"], proj)
    run([DVC_BIN, "config", "core.analytics", "false"], proj)
    run([DVC_BIN, "remote", "add", "-d", "bundled", "../dvc-store"], proj)
    run(["git", "add", "-A"], proj)
    run(["git", *GIT_ID, "commit", "-qm", "init"], proj)
    return proj


@pytest.fixture
def project(template, tmp_path) -> Path:
    """A fresh copy of the template repository (its .git and .dvc included; nothing in either
    names the folder, so the copy is a repository of its own)."""
    proj = tmp_path / "proj"
    shutil.copytree(template, proj, symlinks=True)
    return proj


def shop_frame(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    return pd.DataFrame({
        "visits": rng.integers(0, 50, n),
        "spend": rng.normal(100, 30, n).round(2),
        "channel": rng.choice(["ads", "mail", "web"], n),
        "segment": rng.choice(["gold", "silver", "bronze"], n),
    })


def write_csv_folder(folder: Path) -> None:
    folder.mkdir(parents=True)
    shop_frame(120, 0).to_csv(folder / "train.csv", index=False)
    shop_frame(40, 1).to_csv(folder / "test.csv", index=False)


def write_parquet(path: Path) -> None:
    rng = np.random.default_rng(2)
    rooms = rng.integers(1, 7, 200)
    pd.DataFrame({"rooms": rooms, "area": rng.uniform(30, 200, 200),
                  "price": rooms * 50_000 + rng.normal(0, 10_000, 200)}).to_parquet(path, index=False)


def cli(proj: Path, monkeypatch, *argv: str) -> int:
    monkeypatch.chdir(proj)
    return cmd_init(build_parser().parse_args(["init", *argv]))


def test_csv_folder_becomes_tracked_data_config_and_expectations(project, monkeypatch, capsys):
    write_csv_folder(project / "data" / "shop")
    assert cli(project, monkeypatch, "--data", "data/shop", "--label", "segment") == 0
    out = capsys.readouterr().out
    assert "classification (inferred: label 'segment' is a string column with 3 distinct values)" in out
    assert "dvc remote add -d myremote" in out and "dvc push" in out
    assert out.rstrip().endswith("trainflow run --config configs/shop.yaml")

    dvc = yaml.safe_load((project / "data" / "shop.dvc").read_text())["outs"][0]
    assert dvc["path"] == "shop" and dvc["md5"].endswith(".dir") and dvc["nfiles"] == 2
    cfg = load_config(project / "configs" / "shop.yaml")
    assert cfg.name == "shop" and cfg.task == "classification"
    ds = cfg.dataset
    assert (ds.dvc_file, ds.path, ds.train_file, ds.test_file, ds.file, ds.label) == \
        ("data/shop.dvc", "data/shop", "train.csv", "test.csv", None, "segment")
    assert ds.expectations_file == "configs/shop.expectations.yaml"
    assert (cfg.model.kind, cfg.model.hidden, cfg.model.layers, cfg.training.epochs) == ("tabular", 256, 3, 30)
    assert cfg.training.strategy == "ddp" and cfg.training.lr == 0.002
    assert cfg.gates.baseline_margin == 0.05 and cfg.gates.thresholds == {"latency_p95_ms": 50}
    assert (cfg.registry.model_name, cfg.registry.experiment) == ("shop", "trainflow-shop")
    # Short: only what init decided is written; the rest keeps the defaults.
    assert set(yaml.safe_load((project / "configs" / "shop.yaml").read_text())) == \
        {"name", "task", "dataset", "model", "training", "gates", "registry"}

    text = (project / "configs" / "shop.expectations.yaml").read_text()
    assert text.startswith("# Expectations of data/shop") and dvc["md5"] in text.splitlines()[0]
    exp = load_expectations(project / "configs" / "shop.expectations.yaml")
    assert exp.names == ["visits", "spend", "channel", "segment"] and exp.label == "segment"
    assert exp.classes == ["bronze", "gold", "silver"]
    assert exp.column("channel").values == ["ads", "mail", "web"]
    assert exp.column("visits").type == "integer" and exp.column("visits").min == 0
    assert exp.rows == {"train": (60, 240), "test": (20, 80)}
    assert exp.class_share is not None

    # git keeps the pointer, DVC's data/.gitignore hides the data; nothing was pushed anywhere.
    ignored = subprocess.run(["git", "check-ignore", "data/shop/train.csv", "data/shop.dvc"], cwd=project,
                             capture_output=True, text=True).stdout.split()
    assert ignored == ["data/shop/train.csv"]
    assert not (project / "dvc-store").exists()
    assert (project / ".dvc" / "cache" / "files" / "md5" / dvc["md5"][:2] / dvc["md5"][2:]).is_file()


def test_single_parquet_file_is_split_by_seed_and_infers_regression(project):
    write_parquet(project / "data" / "houses.parquet")
    r = init_project(project, "data/houses.parquet", "price")
    assert (r["name"], r["task"], r["task_inferred"]) == ("houses", "regression", True)
    assert "fractional" in r["task_reason"]
    assert (project / "data" / "houses.parquet.dvc").is_file()
    cfg = load_config(project / "configs" / "houses.yaml")
    ds = cfg.dataset
    assert (ds.dvc_file, ds.path, ds.file, ds.test_fraction) == \
        ("data/houses.parquet.dvc", "data", "houses.parquet", 0.2)
    assert cfg.task == "regression" and cfg.gates.baseline_margin == 0.1
    exp = load_expectations(project / "configs" / "houses.expectations.yaml")
    assert exp.class_share is None and exp.classes is None
    assert exp.column("price").values is None and exp.column("price").min is not None
    assert sum(r["rows"].values()) == 200 and r["rows"]["test"] == 40


def test_integer_label_with_few_values_is_classification_unless_told(project):
    write_parquet(project / "data" / "houses.parquet")
    r = init_project(project, "data/houses.parquet", "rooms", name="rooms")
    assert r["task"] == "classification" and r["classes"] == [1, 2, 3, 4, 5, 6]
    r = init_project(project, "data/houses.parquet", "rooms", task="regression", name="rooms-reg")
    assert r["task"] == "regression" and not r["task_inferred"]


def test_data_outside_the_repository_is_refused(project, tmp_path, monkeypatch, capsys):
    write_csv_folder(tmp_path / "elsewhere")
    assert cli(project, monkeypatch, "--data", str(tmp_path / "elsewhere"), "--label", "segment") == 1
    err = capsys.readouterr().err
    assert "is outside the repository" in err and "Copy or move it under" in err
    assert not (project / "configs").exists() and not list((tmp_path / "elsewhere").glob("*.dvc"))
    # ../ from inside the repository is outside too
    assert cli(project, monkeypatch, "--data", "../elsewhere", "--label", "segment") == 1


def test_init_again_after_a_schema_change_keeps_the_users_keys_and_shows_the_diff(project, monkeypatch, capsys):
    """The first-hour report: `init --force` after a schema change wiped an `exclude:` the user had
    added. Run again, init updates the data facts and the expectations and keeps every other key."""
    write_csv_folder(project / "data" / "shop")
    assert cli(project, monkeypatch, "--data", "data/shop", "--label", "segment") == 0
    capsys.readouterr()
    path = project / "configs" / "shop.yaml"
    edited = yaml.safe_load(path.read_text())
    edited["dataset"]["exclude"] = ["channel"]
    edited["training"]["epochs"] = 7
    edited["gates"]["thresholds"]["accuracy"] = 0.5
    path.write_text(yaml.safe_dump(edited, sort_keys=False))
    # The schema changes: a new column, with a running id the user never excluded.
    for name, n, seed, first in (("train", 120, 0, 1), ("test", 40, 1, 121)):
        df = shop_frame(n, seed)
        df.insert(0, "row_id", range(first, first + n))
        df["coupon"] = df["spend"].round() % 3 == 0
        df.to_csv(project / "data" / "shop" / f"{name}.csv", index=False)
    assert cli(project, monkeypatch, "--data", "data/shop", "--label", "segment") == 0
    out = capsys.readouterr().out
    cfg = load_config(path)
    assert cfg.dataset.exclude == ["channel", "row_id"]  # theirs kept, the new id column's added
    assert cfg.training.epochs == 7 and cfg.gates.thresholds["accuracy"] == 0.5
    assert "Updated configs/shop.yaml and configs/shop.expectations.yaml" in out
    assert "+  - {name: coupon, type: boolean" in out and "-  - channel" not in out  # the diff
    assert "After a schema change (columns added, removed or retyped), run this same init command again" in out
    exp = load_expectations(project / "configs" / "shop.expectations.yaml")
    assert exp.names[0] == "row_id" and "coupon" in exp.names


def test_a_second_dataset_beside_a_tracked_one_and_not_inside_one(project):
    write_csv_folder(project / "data" / "first")
    run([DVC_BIN, "add", "-q", "data/first"], project)
    write_csv_folder(project / "data" / "second")
    assert init_project(project, "data/second", "segment")["dvc_file"] == "data/second.dvc"
    # data.dvc tracking all of data/ (the old layout) blocks any dataset inside it: said clearly.
    (project / "lake" / "mine").mkdir(parents=True)
    shop_frame(30, 3).to_csv(project / "lake" / "mine" / "all.csv", index=False)
    run([DVC_BIN, "add", "-q", "lake"], project)
    with pytest.raises(InitError, match=r"inside lake/, which lake\.dvc already tracks as a whole"):
        init_project(project, "lake/mine", "segment")


def test_bad_input_is_named(project):
    write_csv_folder(project / "data" / "shop")
    with pytest.raises(InitError, match=r"--label 'segmnt' is not a column .*did you mean 'segment'"):
        init_project(project, "data/shop", "segmnt")
    with pytest.raises(InitError, match="regression needs a numeric label"):
        init_project(project, "data/shop", "segment", task="regression")
    with pytest.raises(InitError, match="--name 'My Shop'"):
        init_project(project, "data/shop", "segment", name="My Shop")
    (project / "data" / "odd").mkdir()
    (project / "data" / "odd" / "train.csv").write_text("a,b\n1,2\n")
    with pytest.raises(InitError, match="has train.csv but no test table"):
        init_project(project, "data/odd", "b")
    shop_frame(10, 4).drop(columns="segment").to_csv(project / "data" / "odd" / "test.csv", index=False)
    (project / "data" / "odd" / "train.csv").unlink()
    shop_frame(10, 5).to_csv(project / "data" / "odd" / "train.csv", index=False)
    with pytest.raises(InitError, match=r"different columns \(only in train: \['segment'\], only in test: \[\]"):
        init_project(project, "data/odd", "segment")
    with pytest.raises(InitError, match="--test-fraction: the data is already split"):
        init_project(project, "data/shop", "segment", test_fraction=0.3)
    with pytest.raises(InitError, match="no such file or folder"):
        init_project(project, "data/missing", "b")
    assert not (project / "configs").exists()


def test_slugify_makes_a_valid_name():
    assert slugify("Sales 2024") == "sales-2024"
    assert slugify("2024_data") == "data-2024_data"
    assert slugify("wine") == "wine"


def test_init_imports_no_heavy_backend():
    code = ("import sys, flows.init, validation.profile; "
            "print(' '.join(sorted({m.split('.')[0] for m in sys.modules})))")
    mods = set(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                              check=True).stdout.split())
    assert not mods & {"torch", "prefect", "mlflow", "great_expectations", "pandas"}
