"""The second dataset and model: the stdlib corpus (real DVC, real GX) and the byte-level LM
through the whole flow (real Prefect, MLflow sqlite, torchrun with 2 CPU processes)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest
import yaml

from core.config import load_config
from flows.cli import main
from tests.conftest import VENV_BIN
from validation import text_suite
from validation.gx_run import validate
from validation.text_suite import document_frame, load_splits

pytestmark = pytest.mark.integration

LM_CONFIG = "configs/stdlib-lm.yaml"
# The bundled LM, bounded (a hung job fails the test in minutes, not after the config's 10) and
# trained data-parallel, 3x faster here than its tp 2.
FAST = ["--config", "tests/configs/stdlib-lm.yaml"]


@pytest.fixture(scope="module")
def stdlib_data(repo_root):
    """The exported stdlib corpus, pulled with real DVC when the workspace lacks it."""
    folder = repo_root / "data-stdlib"
    if not (folder / "train.jsonl").is_file():
        subprocess.run([str(VENV_BIN / "dvc"), "pull", "-q", "data-stdlib.dvc"], cwd=repo_root, check=True)
    return folder


@pytest.fixture(scope="module")
def cfg(repo_root):
    return load_config(repo_root / LM_CONFIG)


# -- data: DVC and the export -------------------------------------------------------------
def test_export_script_reproduces_the_dvc_hash(repo_root):
    out = subprocess.run([sys.executable, "scripts/export_stdlib.py", "--check"], cwd=repo_root,
                         capture_output=True, text=True)
    recorded = json.loads((repo_root / "data-stdlib" / "manifest.json").read_text())["python"] \
        if (repo_root / "data-stdlib" / "manifest.json").is_file() else None
    if out.returncode == 2:
        pytest.skip(f"the corpus was exported from {recorded}; the stdlib of this Python differs")
    assert out.returncode == 0, out.stderr
    md5 = yaml.safe_load((repo_root / "data-stdlib.dvc").read_text())["outs"][0]["md5"]
    assert md5 in out.stdout


def test_fresh_clone_pulls_the_text_corpus_from_the_in_repo_remote(repo_root, stdlib_data, tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout with commits")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo_root), str(clone)], check=True)
    assert not (clone / "data-stdlib").exists()
    subprocess.run([str(VENV_BIN / "dvc"), "pull", "-q", "data-stdlib.dvc"], cwd=clone, check=True, timeout=120)
    for name in ("train.jsonl", "val.jsonl", "manifest.json"):
        assert (clone / "data-stdlib" / name).read_bytes() == (stdlib_data / name).read_bytes()
    assert not (clone / "data" / "digits").exists()  # only the named dataset was pulled


# -- GX text suite --------------------------------------------------------------------------
def test_exported_corpus_passes_the_text_suite(cfg, repo_root, stdlib_data, tmp_path):
    report = validate(text_suite, {"dataset": cfg.dataset}, load_splits(cfg.dataset, repo_root), tmp_path)
    assert report["success"], report["failures"]
    assert report["n_failed"] == 0 and report["n_expectations"] == 14
    manifest = json.loads((stdlib_data / "manifest.json").read_text())
    assert report["rows"] == {"train": manifest["documents"]["train"], "eval": manifest["documents"]["val"]}
    assert (tmp_path / "gx_result.json").is_file() and "PASSED" in (tmp_path / "summary.md").read_text()


def _line(path: str, text: str) -> bytes:
    return json.dumps({"path": path, "text": text}).encode()


def test_text_suite_names_every_broken_document(cfg, tmp_path):
    ds = cfg.dataset.model_copy(update={"text": cfg.dataset.text.model_copy(update={
        "expectations": cfg.dataset.text.expectations.model_copy(update={"doc_bytes": (1, 50)})})})
    train = [_line("a.py", "print(1)"), _line("b.py", " \n "), b'{"path": "c.py", "text": "caf\xff"}',
             _line("d.py", "x" * 60), _line("e.py", "ok = 1"), b"not json"]
    evals = [_line("a.py", "other = 2"), _line("f.py", "print(1)")]
    splits = {"train": document_frame(train), "eval": document_frame(evals)}
    report = validate(text_suite, {"dataset": ds}, splits, tmp_path)
    assert not report["success"]
    got = {(f["split"], f["check"], f["column"]): f for f in report["failures"]}
    assert set(got) == {
        ("train", "row_count", None),  # 6 documents, the config wants 40..80
        ("train", "format", "parsed"), ("train", "utf8", "utf8"), ("train", "empty", "nonblank"),
        ("train", "length", "n_bytes"), ("eval", "row_count", None),
        ("cross", "leak", "path"), ("cross", "leak", "sha256"),
    }
    assert got[("train", "utf8", "utf8")]["examples"] == [{"line": 3, "path": "c.py"}]
    assert got[("train", "empty", "nonblank")]["rows"] == [1]
    assert got[("train", "length", "n_bytes")]["examples"] == [{"line": 4, "path": "d.py", "n_bytes": 60}]
    assert got[("train", "format", "parsed")]["examples"] == [{"line": 6, "path": None}]
    assert "train a.py = eval a.py" in got[("cross", "leak", "path")]["detail"]
    assert "train a.py = eval f.py" in got[("cross", "leak", "sha256")]["detail"]
    assert report["n_failed"] == len(report["failures"]) == 8
    assert "| train | utf8 |" in (tmp_path / "summary.md").read_text()


# -- the whole flow -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def home(tmp_path_factory):
    return tmp_path_factory.mktemp("trainflow-home-lm")


def _run(args, out_dir, home, repo_root) -> tuple[int, dict]:
    mp = pytest.MonkeyPatch()
    mp.setenv("TRAINFLOW_HOME", str(home))
    mp.delenv("MLFLOW_TRACKING_URI", raising=False)
    mp.chdir(repo_root)
    try:
        out = out_dir / "summary.json"
        code = main(["run", *args, "--summary-json", str(out)])
        return code, json.loads(out.read_text())
    finally:
        mp.undo()


@pytest.fixture(scope="module")
def first_run(prefect_api, repo_root, stdlib_data, home, tmp_path_factory):
    return _run(FAST, tmp_path_factory.mktemp("lm-first"), home, repo_root)


@pytest.fixture
def lm_state(home, monkeypatch, clean_env):
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    from core.env import apply_offline_env
    from core.paths import tracking_uri

    apply_offline_env(home)
    import mlflow

    mlflow.set_tracking_uri(tracking_uri(home))
    return home


def test_whole_flow_trains_gates_and_registers_the_lm(first_run, cfg, lm_state, repo_root):
    code, s = first_run
    assert code == 0, s.get("error")
    assert s["status"] == "registered" and s["model_name"] == "stdlib-lm" and s["model_version"] == "1"
    assert set(s["aliases"]) == {"challenger", "champion"}
    docs = s["validation"].pop("data_docs")
    report = s["validation"].pop("report")
    assert s["validation"] == {"success": True, "n_expectations": 14, "cached": False, "warnings": []}
    assert report.endswith("validation/summary.md") and Path(report).is_file()
    assert docs.endswith("validation/data_docs/index.html") and Path(docs).is_file()
    # The test config trains it data-parallel (tests/configs/stdlib-lm.yaml says why); the rest is the bundled's.
    assert s["training"]["strategy"] == load_config(repo_root / FAST[1]).training.strategy == "ddp"
    assert s["training"]["world_size"] == 2
    m = s["metrics"]
    assert m["perplexity"] <= cfg.gates.thresholds["perplexity"]
    assert m["bits_per_byte"] == pytest.approx(m["loss"] / 0.6931471805599453)
    assert [g["name"] for g in s["gates"]] == ["perplexity", "latency_p95_ms"] and all(g["passed"] for g in s["gates"])
    from mlflow.tracking import MlflowClient

    mv = MlflowClient().get_model_version_by_alias("stdlib-lm", "champion")
    dvc_md5 = yaml.safe_load((repo_root / "data-stdlib.dvc").read_text())["outs"][0]["md5"]
    assert mv.tags["data_md5"] == s["manifest"]["data"]["md5"] == dvc_md5
    assert float(mv.tags["test_perplexity"]) == pytest.approx(m["perplexity"], rel=1e-5)
    run = MlflowClient().get_run(s["mlflow_run_id"])
    assert run.data.metrics["test/perplexity"] == pytest.approx(m["perplexity"])
    assert len(MlflowClient().get_metric_history(run.info.run_id, "train/val_loss")) == cfg.training.epochs


def test_registered_pyfunc_scores_text_like_the_evaluation(first_run, lm_state, repo_root, stdlib_data):
    import mlflow
    import numpy as np

    code, s = first_run
    assert code == 0, s.get("error")
    model = mlflow.pyfunc.load_model("models:/stdlib-lm@champion")
    docs = [json.loads(x) for x in (stdlib_data / "val.jsonl").read_text().splitlines()]
    out = model.predict(pd.DataFrame({"text": [d["text"] for d in docs] + ["", "x"]}))
    assert list(out.columns) == ["loss", "perplexity", "n_tokens"] and len(out) == len(docs) + 2
    # The pyfunc's windows equal the evaluation's: same per-document losses as the gate saw.
    metrics = json.loads((lm_state / "runs" / s["mlflow_run_id"] / "evaluation" / "metrics.json").read_text())
    per_doc = metrics["per_document"]
    assert [d["path"] for d in per_doc] == [d["path"] for d in docs]
    np.testing.assert_allclose(out["loss"][: len(docs)], [d["loss"] for d in per_doc], rtol=1e-5)
    np.testing.assert_array_equal(out["n_tokens"][: len(docs)], [d["n_tokens"] for d in per_doc])
    np.testing.assert_allclose(out["perplexity"], np.exp(out["loss"]))
    assert np.isnan(out["loss"].iloc[-2]) and out["n_tokens"].iloc[-2] == 0  # empty text: nothing to score
    # Rescoring the champion through the registry gives its recorded figures (what a later run reuses).
    from tasks.lm_eval import summarise
    from evaluation.recorded import recorded_metrics
    from registry.models import champion_version, load_predictor
    from tasks import get_task

    tags = champion_version("stdlib-lm")["tags"]
    lm = get_task("lm")
    rec = recorded_metrics(tags, lm.scoring_key(load_config(repo_root / LM_CONFIG), repo_root), lm.recorded_keys())
    loss, n_tok = load_predictor("stdlib-lm")([d["text"] for d in docs])
    again = summarise(np.nan_to_num(loss) * n_tok, n_tok)
    assert rec["n_tokens"] == again["n_tokens"] and rec["perplexity"] == pytest.approx(again["perplexity"], rel=1e-5)
    # Python source scores far better than shuffled bytes of the same text.
    text = docs[0]["text"]
    noise = "".join(np.random.default_rng(0).permutation(list(text)))
    pair = model.predict(pd.DataFrame({"text": [text, noise]}))
    assert pair["perplexity"][0] < pair["perplexity"][1] / 2


def test_a_worse_lm_is_rejected_against_the_champion_with_every_reason(first_run, prefect_api, repo_root,
                                                                       home, lm_state, tmp_path):
    code, s = first_run
    assert code == 0, s.get("error")
    # Worse by design and cheap: one epoch at a tenth of the learning rate over every 8th training
    # window (stride 1024, not 128). The eval documents, and so the recorded scores' key, are the same.
    code, s2 = _run([*FAST, "--set", "training.epochs=1", "--set", "training.lr=0.0005",
                     "--set", "dataset.text.stride=1024"], tmp_path, home, repo_root)
    assert s2["status"] == "rejected" and code != 0
    assert s2["champion"]["version"] == "1"
    # Same eval documents, same metric code: the champion's recorded figures, not a reload.
    assert s2["champion"]["scores"] == "recorded"
    assert s2["champion"]["perplexity"] == s["metrics"]["perplexity"]
    failed = {g["name"] for g in s2["gates"] if not g["passed"]}
    assert failed == {"perplexity", "perplexity_vs_champion"}
    vs = next(g for g in s2["gates"] if g["name"] == "perplexity_vs_champion")
    assert vs["threshold"] == pytest.approx(s["metrics"]["perplexity"] * 1.05, rel=1e-6)
    from mlflow.tracking import MlflowClient

    assert str(MlflowClient().get_model_version_by_alias("stdlib-lm", "champion").version) == "1"
