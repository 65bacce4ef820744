"""Causal-LM fine-tuning of a pretrained decoder folder, end to end through the real flow (Prefect,
DVC, GX, torchrun with 2 CPU processes, MLflow on sqlite), in a fresh git + DVC project: a tiny
GPT-2-like folder built here (tests/hf_models.py) and JSON Lines of ``prompt`` + ``completion`` pairs.
The registered champion, loaded through ``mlflow.pyfunc`` in a fresh process without trainflow on its
path, generates text from prompts; its ``score`` method gives the figures the evaluation measured, for
pairs and for plain ``text`` records alike. (The other data shape, ``text`` packed into full windows,
trains through the same engine: its data path is tests/unit/test_causal_lm.py's.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from tests.causal_data import write_project
from tests.integration.conftest import DVC_BIN, run
from tests.integration.test_bring_your_own import BOUNDS, _env, commit_all, trainflow
from tests.integration.test_bring_your_own import project, template  # noqa: F401  (fixtures: a fresh git + DVC project)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

# In a fresh interpreter, isolated (-I: no current folder, no PYTHONPATH, no user site), with the
# editable install's finder taken off: trainflow's packages cannot be imported, only the model's files.
# Generated text for two prompts, and the score of every eval record and of every plain text.
GENERATE = """
import importlib.util, json, sys
sys.meta_path = [f for f in sys.meta_path if "__editable__" not in getattr(f, "__module__", "")]
assert not any(importlib.util.find_spec(m) for m in ("tasks", "core", "training", "registry"))
import mlflow, pandas as pd
uri, frame, texts = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
loaded = mlflow.pyfunc.load_model("models:/chat-pairs@champion")
out = loaded.predict(pd.DataFrame({"text": frame["text"][:2]}), params={"max_new_tokens": 6})
score = {"predict_method": "score"}
print(json.dumps({"generated": [str(t) for t in out],
                  "scored": loaded.predict(pd.DataFrame(frame), params=score).to_dict(orient="list"),
                  "texts": loaded.predict(pd.DataFrame({"text": texts}), params=score).to_dict(orient="list"),
                  "params": [p.name for p in loaded.metadata.get_params_schema().params]}))
"""


def _config(proj: Path, kind: str) -> str:
    """The data and model folder of ``tests.causal_data``, with the config and the reviewed expectations
    ``trainflow init --pretrained`` writes for them."""
    from flows.init_pretrained import init_pretrained

    write_project(proj, kind, folder=f"chat-{kind}")
    data = proj / "data" / f"chat-{kind}"
    (data / "val.jsonl").rename(data / "test.jsonl")
    init_pretrained(proj, f"data/chat-{kind}", "models/tiny-gpt")
    return f"configs/chat-{kind}.yaml"


def test_a_decoder_fine_tuned_from_a_folder_registers_a_champion_that_generates_in_a_fresh_process(project, monkeypatch,
                                                                                              clean_env):
    from core.config import load_config
    from core.paths import default_tracking_uri
    from tasks.causal_lm_data import read_records
    from tasks.causal_lm_eval import EXPORT_DIR, score_records
    from tasks.hf_folder import load_model, load_tokenizer
    from tests.causal_data import lines

    config = _config(project, "pairs")
    for folder in ("data/chat-pairs", "models/tiny-gpt"):
        run([DVC_BIN, "add", "-q", folder], project)
    commit_all(project, "causal_lm: pairs")
    assert load_config(project / config).dataset.expectations_file == "configs/chat-pairs.expectations.yaml"
    code, s, err = trainflow(project, "run", "--config", config, "--set", "training.epochs=1",
                             "--set", "pretrained.max_length=32", *BOUNDS)
    assert code == 0, (s.get("error"), err[-4000:])
    assert s["status"] == "registered" and "champion" in s["aliases"], s
    metrics = json.loads((project / ".trainflow" / "runs" / s["mlflow_run_id"] / "evaluation" /
                          "metrics.json").read_text())["candidate"]
    assert 1 < metrics["perplexity"] == s["metrics"]["perplexity"] < 1000 and metrics["n_tokens"] > 0
    records = read_records(project / "data" / "chat-pairs" / "test.jsonl", ("prompt", "completion"))
    frame = {"text": [r[0] for r in records], "completion": [r[1] for r in records]}
    # Plain texts longer than one 32-token window: scored window by window, as packed text trains.
    texts = [t + " " + t for t in lines(6, 7)]
    done = subprocess.run([sys.executable, "-I", "-c", GENERATE, default_tracking_uri(project / ".trainflow"),
                           json.dumps(frame), json.dumps(texts)], cwd="/", env=_env(), capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert len(got["generated"]) == 2 and all(isinstance(t, str) for t in got["generated"])
    assert {"max_new_tokens", "temperature", "predict_method"} <= set(got["params"])
    # The pyfunc's score of the eval records is the evaluation's: the same tokens, the same perplexity.
    n, loss = np.asarray(got["scored"]["n_tokens"]), np.asarray(got["scored"]["loss"])
    assert int(n.sum()) == metrics["n_tokens"]
    assert abs(float(np.exp((loss * n).sum() / n.sum())) - metrics["perplexity"]) < 1e-3 * metrics["perplexity"]
    # Its score of plain texts is the evaluator's too, text by text (the windows of causal_lm_data).
    [folder] = (project / ".trainflow" / "train").glob(f"*/{EXPORT_DIR}")
    tok, model = load_tokenizer(folder), load_model(folder, "causal_lm").eval()
    loss_sum, n_tok = score_records(model, tok, [(t,) for t in texts], 32)
    assert got["texts"]["n_tokens"] == n_tok.tolist() and max(n_tok) > 32
    assert np.allclose(got["texts"]["loss"], loss_sum / n_tok, rtol=1e-4)
    # The registry's own load (every file of the model folder checked against its recorded sha256) and the
    # gate's rescoring of a champion through it give the evaluation's figures too.
    import mlflow

    from evaluation.evaluate import score_champion
    from registry.models import load_predictor
    from tasks import task_for

    home = project / ".trainflow"
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    before = mlflow.get_tracking_uri(), mlflow.get_registry_uri()
    mlflow.set_tracking_uri(default_tracking_uri(home))
    mlflow.set_registry_uri(default_tracking_uri(home))
    try:
        cfg = load_config(project / config)
        rescored = score_champion(task_for(cfg), cfg, project, load_predictor("chat-pairs"))
    finally:
        mlflow.set_tracking_uri(before[0])
        mlflow.set_registry_uri(before[1])
    assert rescored["n_tokens"] == metrics["n_tokens"]
    assert abs(rescored["perplexity"] - metrics["perplexity"]) < 1e-3 * rescored["perplexity"]


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
