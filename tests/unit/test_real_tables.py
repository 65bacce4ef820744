"""Tables as users hand them over, without a pipeline: what ``trainflow init`` decides from the data
(identifier columns, integer categories, missing values, duplicates) and says; duplicate rows kept
on one side of trainflow's split; a re-run of init keeping the user's keys; the one-line error
and the summary lines of a failed validation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from flows.init import _updated, choice_lines
from tasks import get_task
from tasks.table import row_hashes, seeded_split

CLS = get_task("classification")


def people(n: int = 200, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "rownames": np.arange(1, n + 1),
        "customer_id": [f"c{rng.integers(10**9)}-{i}" for i in range(n)],
        "age": rng.integers(18, 90, n).astype("float64"),
        "children": rng.integers(0, 4, n),
        "flag": rng.integers(0, 2, n),
        "city": rng.choice(["a", "b", "c"], n).astype(object),
        "label": rng.choice(["yes", "no"], n),
    })
    df.loc[[1, 4], "age"] = np.nan
    df.loc[[2], "city"] = None
    return df


def test_init_leaves_out_identifiers_and_says_why():
    choices = CLS.init_choices({"train": people()}, "label", presplit=False)
    assert set(choices["exclude"]) == {"rownames", "customer_id"}
    assert "running number 1..200" in choices["exclude"]["rownames"]
    assert "different text in every row" in choices["exclude"]["customer_id"]
    # A unique float (a measurement) or a repeated integer is no identifier.
    df = pd.DataFrame({"x": np.random.default_rng(0).normal(size=50), "label": ["a", "b"] * 25})
    assert CLS.init_choices({"train": df}, "label", presplit=False)["exclude"] == {}


def test_few_valued_integers_are_categories_binary_ones_and_quantities_stay_numbers():
    choices = CLS.init_choices({"train": people()}, "label", presplit=False)
    assert list(choices["categorical"]) == ["children"]  # 0..3; flag is 0/1; age has 70 values
    assert "4 distinct values" in choices["categorical"]["children"]


def test_missing_values_are_said_imputed_for_numbers_and_a_category_for_text():
    choices = CLS.init_choices({"train": people()}, "label", presplit=False)
    assert choices["imputed"] == {"age": 2} and choices["missing_category"] == {"city": 1}
    lines = choice_lines(choices)
    assert any(line.startswith("missing:      age (2): the model fills in the train median") for line in lines)
    assert any('city (1): "missing" is a category of its own' in line for line in lines)
    assert any(line.startswith("excluded:     rownames:") for line in lines)


def test_duplicates_are_counted_and_given_splits_that_share_rows_get_leak_policy_warn():
    df = people().drop(columns=["rownames", "customer_id"])
    train = pd.concat([df.iloc[:100], df.iloc[:5]], ignore_index=True)
    test = pd.concat([df.iloc[:3], df.iloc[150:170]], ignore_index=True)
    choices = CLS.init_choices({"train": train, "test": test}, "label", presplit=True)
    both = pd.concat([train, test], ignore_index=True)
    assert choices["duplicates"] == {"within": int(both.duplicated().sum()), "test_in_train": 3}
    assert choices["duplicates"]["within"] >= 5 + 3
    assert choices["leak_policy"] == "warn"
    assert any("3 test row(s) also in train" in line for line in choice_lines(choices))
    df = df.drop_duplicates()
    clean = CLS.init_choices({"train": df.iloc[:100], "test": df.iloc[100:]}, "label", presplit=True)
    assert clean["duplicates"] == {"within": 0, "test_in_train": 0} and clean["leak_policy"] is None


def test_trainflows_own_split_keeps_exact_duplicates_on_one_side():
    """The first-hour report: a table with legitimate duplicate rows failed trainflow's own split on
    its leak check ("581 rows of test also in train")."""
    rng = np.random.default_rng(0)
    base = pd.DataFrame({"x": rng.integers(0, 4, 300), "y": rng.choice(["a", "b"], 300)})  # 8 distinct rows
    keep, held = seeded_split(base["y"], len(base), 0.2, 0, True, groups=row_hashes(base))
    h = row_hashes(base)
    assert not set(h[keep]) & set(h[held]) and keep and held
    # No duplicates: the very split trainflow always made (recorded champions keep their test split).
    df = people()
    assert seeded_split(df["label"], len(df), 0.2, 0, True, groups=row_hashes(df)) == \
        seeded_split(df["label"], len(df), 0.2, 0, True)


def test_row_hashes_are_equal_for_equal_values_whatever_the_dtype():
    a = pd.DataFrame({"n": [3, 4], "s": ["x", None]})
    b = pd.DataFrame({"n": [3.0, 4.0], "s": pd.Series(["x", None], dtype="str")})
    assert row_hashes(a).tolist() == row_hashes(b).tolist()
    assert row_hashes(pd.DataFrame({"n": [3.0, np.nan]}))[1] != row_hashes(pd.DataFrame({"n": [3.0, 0.0]}))[1]


def test_a_rerun_of_init_keeps_the_users_keys_and_takes_the_data_facts_anew():
    """The first-hour report: `init --force` after a schema change lost an `exclude:` the user added."""
    old = {"name": "shop", "task": "classification",
           "dataset": {"dvc_file": "data/shop.dvc", "path": "data/shop", "file": "old.csv", "test_fraction": 0.3,
                       "label": "segment", "expectations_file": "configs/shop.expectations.yaml",
                       "exclude": ["notes", "gone"], "max_categories": 50},
           "model": {"kind": "mlp", "hidden": 32}, "training": {"epochs": 3, "lr": 0.01},
           "gates": {"thresholds": {"accuracy": 0.7}}}
    fresh = {"name": "shop", "task": "classification",
             "dataset": {"dvc_file": "data/shop.dvc", "path": "data/shop", "train_file": "train.csv",
                         "test_file": "test.csv", "label": "segment",
                         "expectations_file": "configs/shop.expectations.yaml",
                         "exclude": ["row_id", "notes"], "categorical": ["stars"]},
             "model": {"kind": "tabular", "hidden": 256, "layers": 3}, "training": {"epochs": 30, "batch_size": 32},
             "gates": {"baseline_margin": 0.05}, "registry": {"model_name": "shop", "experiment": "trainflow-shop"}}
    columns = ["notes", "row_id", "stars", "visits", "segment"]
    got = _updated(old, fresh, old_columns={"notes", "gone", "visits", "segment"}, columns=columns)
    ds = got["dataset"]
    assert (ds["train_file"], ds["test_file"], "file" in ds, "test_fraction" in ds) == ("train.csv", "test.csv",
                                                                                         False, False)
    # The user's exclusion kept (its column is still there, "gone" is not); the new columns' choices added.
    assert ds["exclude"] == ["notes", "row_id"] and ds["categorical"] == ["stars"]
    assert ds["max_categories"] == 50
    assert got["model"] == {"kind": "mlp", "hidden": 32, "layers": 3}  # theirs, plus a key they never set
    assert got["training"] == {"epochs": 3, "batch_size": 32, "lr": 0.01}
    assert got["gates"] == {"baseline_margin": 0.05, "thresholds": {"accuracy": 0.7}}


def test_a_failed_validation_is_one_line_naming_the_first_failure_and_the_report():
    from flows.pipeline import validation_error

    report = {"n_failed": 3, "report_md": "/x/validation/summary.md",
              "failures": [{"message": "train.sex: 11 values not in {female, male}: F ×9, unknown ×2"},
                           {"message": "test.sex: ..."}, {"message": "test.age: ..."}]}
    line = validation_error(report)
    assert "\n" not in line
    assert line == ("data validation failed (3 check(s)): train.sex: 11 values not in {female, male}: F ×9, "
                    "unknown ×2; and 2 more; report: /x/validation/summary.md")


def test_the_run_summary_lists_each_validation_failure_and_the_report_and_no_traceback(capsys):
    from flows.cli import _print_summary

    _print_summary({"status": "validation_failed", "validation": {
        "success": False, "report": "/x/validation/summary.md",
        "failures": [{"message": "train.sex: 11 values not in {female, male}: F ×9, unknown ×2"}],
        "warnings": [{"message": "train/test: 2 rows of test also in train (dataset.leak_policy: warn)"}]},
        "ui": {"prefect": "http://p", "mlflow": "http://m"}})
    err = capsys.readouterr().err
    assert "  FAILED  train.sex: 11 values not in {female, male}: F ×9, unknown ×2\n" in err
    assert "  warning train/test: 2 rows of test also in train" in err
    assert "report        /x/validation/summary.md" in err
    assert "Traceback" not in err


def test_the_summary_puts_the_candidate_beside_the_trees():
    from flows.cli import gbdt_text

    text = gbdt_text({"accuracy": 0.9714}, {"primary": "accuracy", "accuracy": 0.9857, "fit_s": 0.31,
                                            "candidate_train_s": 8.6, "higher_is_better": True})
    assert text == ("accuracy 0.9857 for gradient-boosted trees vs 0.9714 here (-0.0143 worse); fitted in 0.3 s on "
                    "1 thread, this model trained in 8.6 s")
    text = gbdt_text({"accuracy": 0.9}, {"primary": "accuracy", "accuracy": 0.8, "fit_s": 1, "higher_is_better": True,
                                         "names": ["TF-IDF + LR", "TF-IDF + logistic regression"]})
    assert text.startswith("accuracy 0.8000 for TF-IDF + logistic regression vs 0.9000 here (+0.1000 better)")
    assert "(+0.5000 better)" in gbdt_text({"rmse": 1.0}, {"primary": "rmse", "rmse": 1.5, "fit_s": 1,
                                                           "higher_is_better": False})


@pytest.mark.parametrize("policy,file,expected", [(None, "all.csv", "warn"), (None, None, "fail"),
                                                  ("fail", "all.csv", "fail"), ("warn", None, "warn")])
def test_the_leak_policy_defaults_to_warn_only_for_a_split_trainflow_makes(policy, file, expected):
    from core.config import DatasetConfig
    from tasks.table_options import leak_policy

    ds = DatasetConfig(path="d", file=file, **({"leak_policy": policy} if policy else {}))
    assert leak_policy(ds) == expected


def test_drift_of_a_categorical_feature_is_measured_on_its_categories():
    """The retrain flow's drift check used to refuse a table with a text feature (it cast every
    feature to float); a category's shares are compared instead (PSI, chi-square)."""
    from core.config import RetrainConfig
    from validation.drift import drift_markdown, drift_report

    rng = np.random.default_rng(0)
    ref = pd.DataFrame({"city": rng.choice(["a", "b", "c"], 2000, p=[0.5, 0.3, 0.2]), "x": rng.normal(size=2000)})
    same = pd.DataFrame({"city": rng.choice(["a", "b", "c"], 2000, p=[0.5, 0.3, 0.2]), "x": rng.normal(size=2000)})
    moved = pd.DataFrame({"city": rng.choice(["a", "b", "d", None], 2000, p=[0.2, 0.3, 0.3, 0.2]),
                          "x": rng.normal(size=2000)})
    calm = {r["feature"]: r for r in drift_report(ref, same, ["city", "x"], RetrainConfig())["features"]}
    assert calm["city"]["test"] == "chi2" and not calm["city"]["drifted"] and calm["x"]["test"] == "ks"
    shifted = drift_report(ref, moved, ["city", "x"], RetrainConfig())
    city = {r["feature"]: r for r in shifted["features"]}["city"]
    assert city["drifted"] and set(city["by"]) == {"psi", "chi2"} and city["ks_pvalue"] < 1e-6
    assert "| city |" in drift_markdown(shifted) and "chi-square" in drift_markdown(shifted)
