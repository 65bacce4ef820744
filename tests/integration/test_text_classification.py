"""A table of short texts and a pretrained encoder folder (both made here: ``tests/text_data.py``,
``tests/hf_models.tiny_encoder``), from a config to a registered champion through the real flow
(Prefect, DVC, GX, torchrun with 2 CPU processes, MLflow on sqlite); the champion, loaded through
``mlflow.pyfunc`` in a fresh process with trainflow's packages blocked and the hub offline, takes
raw text and returns the labels' own values or their probabilities."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.hf_models import tiny_encoder

from tests.integration.test_bring_your_own import BOUNDS, _env, commit_all, trainflow
from tests.integration.test_bring_your_own import project, template  # noqa: F401  (fixtures)
from tests.text_data import tickets

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

# Where the registered model loads: no trainflow package importable, the hub offline.
PREDICT = """
import importlib.abc, json, sys
OURS = {"core", "tasks", "training", "flows", "registry", "evaluation", "validation"}
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in OURS:
            raise ImportError(f"{name}: trainflow is not installed here")
sys.meta_path.insert(0, Block())
import mlflow, numpy as np, pandas as pd
uri, texts = sys.argv[1], json.loads(sys.argv[2])
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
model = mlflow.pyfunc.load_model("models:/tickets@champion")
frame = pd.DataFrame({"text": texts})
labels = [str(v) for v in model.predict(frame)]
proba = model.predict(frame, params={"predict_method": "predict_proba"})
print(json.dumps({"labels": labels, "columns": [str(c) for c in proba.columns],
                  "sums": proba.sum(axis=1).tolist(),
                  "params": [p.name for p in model.metadata.get_params_schema().params],
                  "loaded": sorted(m for m in sys.modules if m.split(".")[0] in OURS),
                  "requirements": open(mlflow.pyfunc.get_model_dependencies("models:/tickets@champion")).read().split()}))
"""


def write_text_project(project, rows: int = 300, pooling: str = "cls", **training) -> None:
    """``data/tickets`` and ``models/enc`` tracked by DVC, the config and reviewed expectations ``trainflow
    init --pretrained`` writes, then edited as a user would for a tiny encoder trained from random weights
    (a higher learning rate, more epochs), committed."""
    from flows.init_pretrained import init_pretrained

    (project / "data" / "tickets").mkdir(parents=True)
    df = tickets(rows)
    df.to_csv(project / "data" / "tickets" / "tickets.csv", index=False)
    tiny_encoder(project / "models" / "enc", df["text"])
    init_pretrained(project, "data/tickets", "models/enc", label="category")
    path = project / "configs" / "tickets.yaml"
    cfg = yaml.safe_load(path.read_text())
    assert cfg["task"] == "text_classification" and cfg["pretrained"]["text_column"] == "text"
    cfg["pretrained"].update(max_length=32, pooling=pooling)
    cfg["training"] = {"epochs": 10, "strategy": "ddp", "batch_size": 16, "base_batch": 16, "lr": 0.005, **training}
    cfg["gates"] = {"baseline_margin": 0.05, "max_gap_to_baseline": 0.5}
    path.write_text(yaml.safe_dump(cfg, sort_keys=False))
    commit_all(project, "tickets and an encoder")


def test_texts_train_register_and_the_champion_takes_raw_text_offline_without_trainflow(project, tmp_path):
    write_text_project(project, pooling="mean")  # the head of its own: its pyfunc path is trainflow's code
    code, s, err = trainflow(project, "run", "--config", "configs/tickets.yaml", *BOUNDS)
    assert code == 0, (s.get("error"), err[-4000:])
    assert s["status"] == "registered" and "champion" in s["aliases"], s
    cache = project / ".trainflow" / "cache" / "text"  # the whole tokenized cache, its ranks' parts gone
    assert len(list(cache.glob("*.npz"))) == 1 and not list(cache.glob("parts/*/*"))
    assert s["metrics"]["accuracy"] >= 0.8 > s["baseline"]["accuracy"]
    g = s["gbdt"]  # the text's baseline model beside the candidate, with its wall time
    assert g["predictor"].startswith("TF-IDF") and g["fit_s"] > 0 and g["accuracy"] >= 0.8
    checks = {c["name"]: c for c in s["gates"]}
    assert checks["accuracy_vs_baseline_model"]["threshold"] == pytest.approx(g["accuracy"] - 0.5)

    texts = ["I was charged twice, please refund the invoice payment", "the app fails with an error and crash",
             "love it, thanks, great work"]
    env = {**{k: v for k, v in _env().items() if k != "PYTHONPATH"}, "HF_HUB_OFFLINE": "1",
           "TRANSFORMERS_OFFLINE": "1"}
    uri = s["tracking_uri"]
    done = subprocess.run([sys.executable, "-I", "-c", PREDICT, uri, json.dumps(texts)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["loaded"] == []
    assert "MISSING" not in done.stderr and "Loading weights" not in done.stderr  # the unused pooler: a quiet load
    assert got["labels"] == ["billing", "bug", "praise"]  # the label's own values
    assert got["columns"] == ["billing", "bug", "praise"] and got["params"] == ["predict_method"]
    assert all(abs(v - 1.0) < 1e-9 for v in got["sums"])
    assert any(r.startswith("tokenizers==") for r in got["requirements"])  # what the pyfunc imports, pinned
    assert "vs TF-IDF + LR" in err and f"accuracy {g['accuracy']:.4f} for TF-IDF + logistic regression" in err
    perf = [r["metrics"] for r in map(json.loads, (Path(s["train_dir"]) / "metrics.jsonl").read_text().splitlines())
            if "perf/samples_per_s" in r.get("metrics", {})]
    assert perf and all(r["perf/tokens_per_s"] > r["perf/samples_per_s"] for r in perf)  # texts of several tokens

    # The registered weights are safetensors and the tokenizer its own files, each hashed; a changed one is
    # refused on load, named.
    import mlflow
    from mlflow import MlflowClient

    from core.errors import IntegrityError
    from registry.models import HASH_TAG, load_predictor

    before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    mlflow.set_tracking_uri(uri), mlflow.set_registry_uri(uri)
    try:
        mv = MlflowClient().get_model_version("tickets", s["model_version"])
        hashed = {k[len(HASH_TAG):] for k in mv.tags if k.startswith(HASH_TAG)}
        assert {"artifacts/text_model/model.safetensors", "artifacts/text_model/tokenizer.json",
                "artifacts/text_model/head.safetensors"} <= hashed
        assert not any(k.endswith(".pt2") for k in hashed)
        stored = Path(MlflowClient().get_logged_model(mv.source.split("/", 1)[1]).artifact_location
                      .removeprefix("file://"))
        assert "tokenizer" not in json.loads((stored / "artifacts" / "meta.json").read_text())
        tokenizer = stored / "artifacts" / "text_model" / "tokenizer.json"
        tokenizer.write_text(tokenizer.read_text().replace('"[UNK]"', '"[UNK2]"', 1))
        with pytest.raises(IntegrityError, match="artifacts/text_model/tokenizer.json in the artifact store has"):
            load_predictor("tickets")
    finally:
        mlflow.set_tracking_uri(before[0]), mlflow.set_registry_uri(before[1])
