"""Causal-LM fine-tuning of a pretrained decoder folder, end to end through the real flow (Prefect,
DVC, GX, torchrun with 2 CPU processes, MLflow on sqlite), in a fresh git + DVC project: a tiny
GPT-2-like folder built here (tests/hf_models.py) and JSON Lines of its own text, as ``text`` (packed)
and as ``prompt`` + ``completion`` pairs. The registered champion, loaded through ``mlflow.pyfunc`` in
a fresh process without trainflow on its path, generates text from prompts; its ``score`` method
gives the figures the evaluation measured."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from tests.causal_data import write_project
from tests.integration.conftest import DVC_BIN, run
from tests.integration.test_bring_your_own import BOUNDS, _env, commit_all, trainflow
from tests.integration.test_bring_your_own import project, template  # noqa: F401  (fixtures: a fresh git + DVC project)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

# In a fresh interpreter, isolated (-I: no current folder, no PYTHONPATH, no user site), with the
# editable install's finder taken off: trainflow's packages cannot be imported, only the model's files.
GENERATE = """
import importlib.util, json, sys
sys.meta_path = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
assert not any(importlib.util.find_spec(m) for m in ("tasks", "core", "training", "registry"))
import mlflow, pandas as pd
proj, model, uri = sys.argv[1], sys.argv[2], sys.argv[3]
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
loaded = mlflow.pyfunc.load_model(f"models:/{model}@champion")
prompts = json.loads(sys.argv[4])
out = loaded.predict(pd.DataFrame({"text": prompts}), params={"max_new_tokens": 6})
scored = loaded.predict(pd.DataFrame(json.loads(sys.argv[5])), params={"predict_method": "score"})
print(json.dumps({"generated": [str(t) for t in out], "params": [p.name for p in loaded.metadata.get_params_schema().params],
                  "scored": scored.to_dict(orient="list")}))
"""


def _project(proj: Path, kind: str) -> dict:
    cfg = write_project(proj, kind)
    (proj / "configs").mkdir(exist_ok=True)
    (proj / "configs" / "chat.yaml").write_text(yaml.safe_dump(cfg, sort_keys=False))
    run([DVC_BIN, "add", "-q", "data/chat"], proj)
    run([DVC_BIN, "add", "-q", "models/tiny-gpt"], proj)
    commit_all(proj, f"causal_lm {kind}")
    return cfg


@pytest.mark.parametrize("kind", ["text", "pairs"])
def test_a_decoder_fine_tuned_from_a_folder_registers_a_champion_that_generates_in_a_fresh_process(project, kind):
    _project(project, kind)
    code, s, err = trainflow(project, "run", "--config", "configs/chat.yaml", *BOUNDS)
    assert code == 0, (s.get("error"), err[-4000:])
    assert s["status"] == "registered" and "champion" in s["aliases"], s
    ppl = s["metrics"]["perplexity"]
    [evaluated] = (project / ".trainflow" / "runs").glob("*/evaluation/metrics.json")
    n_tokens = json.loads(evaluated.read_text())["candidate"]["n_tokens"]
    assert 1 < ppl < 1000 and n_tokens > 0
    from core.paths import default_tracking_uri
    from tasks.causal_lm_data import read_records

    keys = ("text",) if kind == "text" else ("prompt", "completion")
    records = read_records(project / "data" / "chat" / "val.jsonl", keys)
    frame = {"text": [r[0] for r in records]}
    if kind == "pairs":
        frame["completion"] = [r[1] for r in records]
    done = subprocess.run([sys.executable, "-I", "-c", GENERATE, str(project), "chat-" + kind,
                           default_tracking_uri(project / ".trainflow"), json.dumps(frame["text"][:2]),
                           json.dumps(frame)], cwd="/", env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(got["generated"]) == 2 and all(isinstance(t, str) for t in got["generated"])
    assert {"max_new_tokens", "temperature", "predict_method"} <= set(got["params"])
    # The pyfunc's score of the eval records is the evaluation's perplexity (token-weighted).
    import numpy as np

    n, loss = np.asarray(got["scored"]["n_tokens"]), np.asarray(got["scored"]["loss"])
    assert int(n.sum()) == n_tokens
    assert abs(float(np.exp((loss * n).sum() / n.sum())) - ppl) < 1e-3 * ppl


def test_records_the_text_suite_rejects_are_named_by_file_and_line(tmp_path):
    from core.config import config_from_dict
    from tasks import task_for
    from validation.gx_run import run_plan

    raw = write_project(tmp_path, "pairs", n_train=20, n_eval=5)
    data = tmp_path / "data" / "chat"
    with open(data / "train.jsonl", "a") as fh:  # lines 21 and 22: an empty pair, a pair without a completion
        fh.write(json.dumps({"prompt": " ", "completion": ""}) + "\n" + json.dumps({"prompt": "q"}) + "\n")
    with open(data / "val.jsonl", "a") as fh:  # a training pair again: a leak
        fh.write((data / "train.jsonl").read_text().splitlines()[0] + "\n")
    raw["dataset"]["text"]["expectations"] = {"train_docs": [1, 100], "eval_docs": [1, 100]}
    cfg = config_from_dict(raw)
    report = run_plan(task_for(cfg).validation_plan(cfg, tmp_path), tmp_path / "report")
    got = {(f["split"], f["check"]): f for f in report["failures"]}
    assert set(got) == {("train", "empty"), ("train", "format"), ("cross", "leak")}, report["failures"]
    assert got[("train", "empty")]["examples"] == [{"line": 21, "path": "train.jsonl:21"}]
    assert got[("train", "format")]["examples"] == [{"line": 22, "path": None}]
    assert "train train.jsonl:1 = eval val.jsonl:6" in got[("cross", "leak")]["detail"]
