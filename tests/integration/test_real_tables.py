"""Tables as users hand them over, from ``trainflow init`` to a registered champion with no edit,
through the real flow (Prefect, DVC, GX, torchrun with 2 CPU processes, MLflow on sqlite), each in
a fresh git + DVC project (``tests/tables.py`` makes them):

* penguins: an R export with a ``rownames`` id, a string label with rows that have none, string
  categories and measurements with missing cells, an integer year with three values;
* houses: given train and test files whose integer columns read as floats (missing cells), a
  string neighbourhood, rows of test also in train (a warning, not a refusal), a regression;
* churn: 50,000 rows in Parquet with three string categoricals, missing cells and a few-valued
  integer.

Each run's summary puts the candidate beside gradient-boosted trees fitted on the same split, and
the registered model, loaded through ``mlflow.pyfunc`` in a fresh process, scores the raw table
(strings, NaN) and returns the label's own values.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pandas as pd
import pytest

from tests.integration.test_bring_your_own import BOUNDS, _env, commit_all, trainflow
from tests.integration.test_bring_your_own import project, template  # noqa: F401  (fixtures: a fresh git + DVC project)
from tests.tables import write_shape

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("prefect_api")]

SCORE_RAW = """
import json, sys
import mlflow, numpy as np, pandas as pd
from core.paths import default_tracking_uri
from pathlib import Path
proj, table, label, model = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4]
uri = default_tracking_uri(proj / ".trainflow")
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
raw = pd.read_parquet(table) if table.suffix == ".parquet" else pd.read_csv(table)
raw = raw[raw[label].notna()]
loaded = mlflow.pyfunc.load_model(f"models:/{model}@champion")
pred = np.asarray(loaded.predict(raw.drop(columns=[label])))
truth = raw[label].to_numpy()
if pred.dtype.kind in "fc":
    score = float(1 - ((pred - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum())
else:
    score = float(np.mean(pred == truth))
inputs = loaded.metadata.get_input_schema().inputs
print(json.dumps({"score": score, "values": sorted(map(str, set(pred.tolist())))[:10],
                  "inputs": {c.name: c.type.name for c in inputs if c.required},
                  "optional": {c.name: str(c.type) for c in inputs if not c.required}}))
"""


def score_raw(project, table: str, label: str, model: str) -> dict:
    """The champion, through mlflow.pyfunc in a fresh process, on the raw table (label dropped)."""
    done = subprocess.run([sys.executable, "-c", SCORE_RAW, str(project), str(project / table), label, model],
                          cwd=project, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def init_and_run(project, name: str, *sets: str) -> tuple[dict, dict, str]:
    from flows.init import init_project

    label = write_shape(name, project / "data" / name)
    report = init_project(project, f"data/{name}", label)
    commit_all(project, f"trainflow init: {name}")
    code, s, err = trainflow(project, "run", "--config", f"configs/{name}.yaml", *BOUNDS, *sets)
    assert code == 0, (s.get("error"), err[-4000:])
    assert s["status"] == "registered" and "champion" in s["aliases"], s
    return report, s, err


def check_beside_the_trees(s: dict, err: str, primary: str) -> None:
    g = s["gbdt"]
    assert g["primary"] == primary and "HistGradientBoosting" in g["predictor"] and g["fit_s"] > 0
    assert np.isfinite(g[primary]) and np.isfinite(s["metrics"][primary])
    assert "vs GBDT" in err and f"{primary} {g[primary]:.4f} for gradient-boosted trees" in err


def test_penguins_with_an_id_missing_labels_string_categories_and_gaps(project):
    report, s, err = init_and_run(project, "penguins")
    ch = report["choices"]
    assert list(ch["exclude"]) == ["rownames"] and list(ch["categorical"]) == ["year"]
    assert report["unlabeled"] == 6 and ch["missing_category"] == {"sex": 11}
    assert set(ch["imputed"]) == {"bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"}
    check_beside_the_trees(s, err, "accuracy")
    assert s["metrics"]["accuracy"] >= 0.9
    got = score_raw(project, "data/penguins/penguins.csv", "species", "penguins")
    assert got["values"] == ["Adelie", "Chinstrap", "Gentoo"] and got["score"] >= 0.9
    assert got["inputs"]["island"] == "string" and got["inputs"]["flipper_length_mm"] == "double"
    assert "rownames" not in got["inputs"]
    assert got["optional"] == {"rownames": "Any"}  # sent along, it is taken without a warning and ignored


def test_houses_given_splits_with_integer_floats_and_shared_rows_then_broken_data(project):
    report, s, err = init_and_run(project, "houses")
    assert report["task"] == "regression" and report["task_inferred"]
    assert report["choices"]["duplicates"]["test_in_train"] == 5 and report["choices"]["leak_policy"] == "warn"
    assert set(report["choices"]["categorical"]) == {"floors", "rooms"}  # 3 and 7 values: integers as categories
    warnings = s["validation"]["warnings"]
    assert [w["check"] for w in warnings] == ["leak"] and "5 rows of test also in train" in warnings[0]["message"]
    assert "warning train/test: 5 rows of test also in train" in err
    check_beside_the_trees(s, err, "r2")
    assert set(s["metrics"]) == {"r2", "rmse", "mae", "latency_p95_ms"} and s["metrics"]["r2"] >= 0.8
    assert s["baseline"]["r2"] < 0.05  # the train mean explains (about) nothing of the test split
    gates = {g["name"]: g for g in s["gates"]}
    assert gates["r2_vs_baseline"]["passed"] and gates["r2_vs_baseline"]["op"] == ">="
    assert gates["latency_p95_ms"]["op"] == "<="
    got = score_raw(project, "data/houses/test.csv", "price", "houses")
    assert got["score"] >= 0.8 and got["inputs"]["year_built"] == "double"
    assert got["inputs"]["neighbourhood"] == "string" and got["inputs"]["area_m2"] == "double"

    # The same table with a renamed column and text in a numeric feature breaks its reviewed
    # expectations: the run stops at validation, naming each failure, and nothing trains.
    from tests.integration.conftest import DVC_BIN, run

    trained_before = sorted((project / ".trainflow").glob("train/*/result.json"))
    for name in ("train", "test"):
        path = project / "data" / "houses" / f"{name}.csv"
        bad = pd.read_csv(path).rename(columns={"area_m2": "area"})
        bad["rooms"] = bad["rooms"].astype(str) + " rooms"
        bad.to_csv(path, index=False)
    run([DVC_BIN, "add", "-q", "data/houses"], project)
    commit_all(project, "broken houses")
    code, s, err = trainflow(project, "run", "--config", "configs/houses.yaml", *BOUNDS)
    assert code == 2 and s["status"] == "validation_failed", err[-2000:]
    messages = [f["message"] for f in s["validation"]["failures"]]
    assert any("missing area_m2; unexpected area" in m for m in messages), messages  # expected vs found
    assert "train.rooms: 1 column of the wrong type: rooms holds string (str), expected integer" in messages
    assert "training" not in s and "Traceback" not in err
    assert sorted((project / ".trainflow").glob("train/*/result.json")) == trained_before


def test_fifty_thousand_rows_with_three_string_categoricals(project):
    # A third of init's 30 epochs: enough to stand beside the trees on this table, and the suite's
    # slowest test otherwise.
    report, s, err = init_and_run(project, "churn", "--set", "training.epochs=10")
    assert report["rows"]["train"] + report["rows"]["test"] == 50_000
    assert report["choices"]["categorical"] == {
        "support_calls": "an integer column with 10 distinct values: learned as categories"}
    check_beside_the_trees(s, err, "accuracy")
    # The trees are the bar a user would set: within 0.02 of their accuracy.
    assert s["metrics"]["accuracy"] >= s["gbdt"]["accuracy"] - 0.02, (s["metrics"], s["gbdt"])
    got = score_raw(project, "data/churn/churn.parquet", "churned", "churn")
    assert got["values"] == ["no", "yes"] and got["score"] >= s["gbdt"]["accuracy"] - 0.03


SCORE_DATES = """
import json, sys, logging, io
import mlflow, numpy as np, pandas as pd
from core.paths import default_tracking_uri
from pathlib import Path
proj, table, model = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3]
uri = default_tracking_uri(proj / ".trainflow")
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
warned = io.StringIO()
logging.getLogger("mlflow").addHandler(logging.StreamHandler(warned))
raw = pd.read_csv(table)
loaded = mlflow.pyfunc.load_model(f"models:/{model}@champion")
def r2(frame):
    pred = np.asarray(loaded.predict(frame.drop(columns=["price"])), dtype=float)  # booking_id stays in
    truth = frame["price"].to_numpy()
    return float(1 - ((pred - truth) ** 2).sum() / ((truth - truth.mean()) ** 2).sum())
later = raw.copy()
for col, fmt in (("arrival_date", "%Y-%m-%d"), ("booked_at", "%Y-%m-%d %H:%M")):
    moved = pd.to_datetime(later[col], format=fmt) + pd.Timedelta(days=735)  # 105 weeks: the same weekdays
    later[col] = moved.dt.strftime(fmt).where(later[col].notna(), None)
schema = loaded.metadata.get_input_schema()
print(json.dumps({"seen": r2(raw), "unseen": r2(later), "latest_seen": str(raw["arrival_date"].max()),
                  "earliest_unseen": str(later["arrival_date"].min()), "warnings": warned.getvalue(),
                  "inputs": {c.name: [getattr(c.type, "name", str(c.type)), c.required] for c in schema.inputs}}))
"""


def test_hotels_dates_become_parts_and_later_dates_score_as_well(project):
    """ISO dates and timestamps with hours (some missing): init finds both, the registered model takes
    the raw text, and the same rows with their dates moved two years past the training range score
    as well; an excluded id sent along raises no warning."""
    from flows.init import choice_lines

    # 12 of init's 30 epochs: enough for this table's parts (the suite's time is short).
    report, s, err = init_and_run(project, "hotels", "--set", "training.epochs=12")
    dates = report["choices"]["dates"]
    assert {c: d["format"] for c, d in dates.items()} == {"arrival_date": "%Y-%m-%d",
                                                           "booked_at": "%Y-%m-%d %H:%M"}
    said = "\n".join(choice_lines(report["choices"]))
    assert "arrival_date: 681 distinct values in format %Y-%m-%d, 40 missing: becomes year, month" in said
    assert "booked_at:" in said and ", hour, days since 1970-01-01, a missing flag" in said
    assert "early stop:   patience 10 of 30 epochs" in said
    assert list(report["choices"]["exclude"]) == ["booking_id"]
    kept = s["training"]["kept_epoch"]
    assert 1 <= kept["epoch"] <= kept["of"] and kept["metric"] == "val_loss" and "kept epoch" in err
    check_beside_the_trees(s, err, "r2")
    done = subprocess.run([sys.executable, "-c", SCORE_DATES, str(project), str(project / "data/hotels/hotels.csv"),
                           "hotels"], cwd=project, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    print("hotels, seen and later dates:", {k: got[k] for k in ("seen", "unseen")})
    assert got["earliest_unseen"] > got["latest_seen"]
    assert got["seen"] >= 0.8 and abs(got["seen"] - got["unseen"]) <= 0.03, got
    assert got["inputs"]["arrival_date"] == ["string", True] and got["inputs"]["booking_id"] == ["Any", False]
    assert "Found extra inputs" not in got["warnings"] + done.stderr
    # Values of a date column that are not dates: tests/integration/test_validation_gx.py names them.


SCORE_PROBA = """
import json, sys
import mlflow, numpy as np, pandas as pd
from sklearn.metrics import roc_auc_score
from core.paths import default_tracking_uri
from pathlib import Path
proj, table, label, model, run_id = Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3], sys.argv[4], sys.argv[5]
uri = default_tracking_uri(proj / ".trainflow")
mlflow.set_tracking_uri(uri); mlflow.set_registry_uri(uri)
logged = sorted(mlflow.tracking.MlflowClient().get_run(run_id).data.metrics)
raw = pd.read_csv(table)
loaded = mlflow.pyfunc.load_model(f"models:/{model}@champion")
proba = loaded.predict(raw.drop(columns=[label]), params={"predict_method": "predict_proba"})
labels = np.asarray(loaded.predict(raw.drop(columns=[label])))
truth = raw[label].to_numpy()
from mlflow.models import validate_serving_input  # the scoring server's own parsing and predict call
rows = raw.drop(columns=[label]).dropna().head(3).to_json(orient="split", index=False)
served = validate_serving_input(f"models:/{model}@champion",
                                '{"dataframe_split": ' + rows + ', "params": {"predict_method": "predict_proba"}}')
print(json.dumps({"columns": [str(c) for c in proba.columns], "served": [str(c) for c in served.columns],
                  "logged": logged, "row_sums": proba.sum(axis=1).round(9).unique().tolist(),
                  "roc_auc": float(roc_auc_score(truth == "bad", proba["bad"])),
                  "accuracy": float(np.mean(labels == truth)), "predicted": sorted(set(labels.tolist())),
                  "params": [p.name for p in loaded.metadata.get_params_schema().params]}))
"""


def test_loans_with_five_percent_bad_go_from_init_to_a_champion_judged_by_average_precision(project):
    """A rare class: init picks average precision and balanced loss weights and says why; the run passes
    the baseline gate on that metric, reports the ranking metrics for the candidate, the trees and the
    baseline, and the champion's probabilities, through the pyfunc in a fresh process, give the ROC AUC
    the summary reported (its labels, cut at the registered threshold, the accuracy)."""
    report, s, err = init_and_run(project, "loans")
    ch = report["choices"]
    assert ch["metric"][0] == "average_precision" and "5.0% of the rows" in ch["metric"][1]
    assert ch["class_weight"][0] == "balanced" and list(ch["exclude"]) == ["loan_id"]
    config = (project / "configs" / "loans.yaml").read_text()
    assert "primary_metric: average_precision" in config and "class_weight: balanced" in config
    assert "#   metric:       average_precision: the rarest class 'bad' is 5.0% of the rows" in config
    ranking = ("roc_auc", "average_precision", "log_loss", "balanced_accuracy")
    for who in ("metrics", "gbdt", "baseline"):
        assert all(np.isfinite(s[who][k]) for k in ranking), (who, s[who])
    assert s["baseline"]["roc_auc"] == 0.5 and abs(s["baseline"]["average_precision"] - 0.05) < 1e-9
    check_beside_the_trees(s, err, "average_precision")
    gates = {g["name"]: g for g in s["gates"]}
    assert gates["average_precision_vs_baseline"]["passed"] and gates["predicted_classes"]["value"] == 2
    assert s["metrics"]["roc_auc"] >= 0.85 and s["metrics"]["balanced_accuracy"] >= 0.7
    assert "baseline" in err and "roc_auc 0.5000" in err
    assert 0 < s["threshold"]["value"] < 1 and s["threshold"]["tuned_for"] == "macro_f1"
    done = subprocess.run([sys.executable, "-c", SCORE_PROBA, str(project), str(project / "data/loans/test.csv"),
                           "status", "loans", s["mlflow_run_id"]], cwd=project, env=_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    got = json.loads(done.stdout.strip().splitlines()[-1])
    assert got["columns"] == got["served"] == ["bad", "good"] and got["row_sums"] == [1.0]
    assert got["params"] == ["predict_method"]
    assert {f"{who}/{k}" for who in ("test", "gbdt", "baseline") for k in ranking} <= set(got["logged"])
    assert abs(got["roc_auc"] - s["metrics"]["roc_auc"]) < 1e-6
    assert abs(got["accuracy"] - s["metrics"]["accuracy"]) < 1e-9 and got["predicted"] == ["bad", "good"]
    assert "no params schema" not in done.stderr
    gate_md = next((project / ".trainflow").glob("runs/*/evaluation/gate.md")).read_text()
    assert "| bad |" in gate_md and "| good |" in gate_md and "Judged by average_precision" in gate_md
