"""Pure parts of retraining and concurrency: drift measures, the promotion rule, the config id
without the retrain policy, and training-folder slots under flock."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest

from core.config import PipelineConfig, RetrainConfig, config_id_of
from evaluation.gates import beats
from validation.drift import bin_edges, drift_markdown, drift_report, psi


def test_psi_is_zero_for_the_same_sample_and_grows_with_the_shift():
    rng = np.random.default_rng(0)
    ref = rng.integers(0, 17, 2000).astype(float)
    assert psi(ref, ref) == 0
    shifted = [psi(ref, np.minimum(ref + k, 16)) for k in (1, 3, 6)]
    assert 0 < shifted[0] < shifted[1] < shifted[2]


def test_a_constant_reference_feature_gets_bins_below_at_and_above_its_value():
    ref = np.zeros(500)
    assert list(bin_edges(ref, 10)) == [np.nextafter(0, -np.inf), 0.0]
    assert psi(ref, np.zeros(300)) == 0
    assert psi(ref, np.full(300, 3.0)) > 1  # every new value left the reference's only bin
    assert psi(ref, np.full(300, -1.0)) > 1


def test_drift_report_flags_shifted_features_and_counts_the_fraction():
    rng = np.random.default_rng(1)
    ref = pd.DataFrame({f"f{i}": rng.integers(0, 17, 800) for i in range(10)})
    cur = ref.sample(frac=0.9, random_state=2).copy()
    cfg = RetrainConfig()
    calm = drift_report(ref, cur, list(ref.columns), cfg)
    assert calm["drifted"] is False and calm["n_drifted"] == 0 and calm["n_features"] == 10
    cur[["f0", "f1"]] = np.minimum(cur[["f0", "f1"]] + 5, 16)
    moved = drift_report(ref, cur, list(ref.columns), cfg)
    assert moved["n_drifted"] == 2 and moved["drifted_fraction"] == 0.2 and moved["drifted"] is True
    flagged = {f["feature"]: f for f in moved["features"] if f["drifted"]}
    assert set(flagged) == {"f0", "f1"} and all(set(f["by"]) == {"psi", "ks"} for f in flagged.values())
    # At most 20 % drifting features allowed: the same data no longer counts as drifted.
    assert drift_report(ref, cur, list(ref.columns), RetrainConfig(max_drifted_fraction=0.2))["drifted"] is False
    md = drift_markdown(moved)
    assert md.startswith("# Data drift: DRIFT") and md.index("| f0 |") < md.index("| f5 |")


def test_drift_report_names_missing_feature_columns():
    df = pd.DataFrame({"a": [1, 2]})
    with pytest.raises(ValueError, match=r"missing: \['b'\]"):
        drift_report(df, df, ["a", "b"], RetrainConfig())


def test_promotion_rule_needs_at_least_the_champions_accuracy():
    from tasks import get_task

    cls = get_task("classification")
    assert beats(cls, {"accuracy": 0.9, "macro_f1": 0.8}, None)[0]
    assert beats(cls, {"accuracy": 0.96, "macro_f1": 0.90}, {"accuracy": 0.95, "macro_f1": 0.99})[0]
    assert not beats(cls, {"accuracy": 0.94, "macro_f1": 0.99}, {"accuracy": 0.95, "macro_f1": 0.90})[0]
    assert not beats(cls, {"accuracy": 0.95, "macro_f1": 0.90}, {"accuracy": 0.95, "macro_f1": 0.90})[0]  # a tie
    ok, reason = beats(cls, {"accuracy": 0.95, "macro_f1": 0.89}, {"accuracy": 0.95, "macro_f1": 0.90})
    assert not ok and "does not beat" in reason


def test_retrain_section_is_left_out_of_the_config_id():
    base = PipelineConfig(name="x", dataset={"path": "d"})
    tuned = PipelineConfig(name="x", dataset={"path": "d"}, retrain=RetrainConfig(policy="drift", psi_threshold=0.5))
    assert base.config_id() == tuned.config_id()
    # An older config.json, written before the section existed, keeps its id.
    old = base.model_dump(mode="json")
    old.pop("retrain")
    assert config_id_of(old) == base.config_id()
    assert PipelineConfig(name="x", dataset={"path": "d"}, seed=1).config_id() != base.config_id()


def _ctx(home):
    cfg = PipelineConfig(name="digits", dataset={"path": "d"})
    return SimpleNamespace(cfg=cfg, home=home, manifest=SimpleNamespace(inputs_md5="m.dir"),
                           plan=SimpleNamespace(nproc_per_node=2))


def _claim_train_dir(ctx):
    """The pipeline's claim of a training folder: ``(folder, lock fd)``."""
    from flows.pipeline import TrainFolder

    slot = TrainFolder.claim(ctx)
    return slot.folder, slot.lock_fd


def test_concurrent_claims_get_separate_training_folders(tmp_path):
    from core.locks import release

    ctx = _ctx(tmp_path)
    first, fd1 = _claim_train_dir(ctx)
    second, fd2 = _claim_train_dir(ctx)
    assert second == first.with_name(first.name + ".1")
    release(fd1)
    again, fd3 = _claim_train_dir(ctx)  # released: the inputs' own folder is free again
    assert again == first
    release(fd2), release(fd3)


def test_a_free_slot_with_an_interrupted_job_is_preferred_for_resume(tmp_path):
    from core.locks import release

    ctx = _ctx(tmp_path)
    base, fd = _claim_train_dir(ctx)
    release(fd)
    (base / "result.json").parent.mkdir(parents=True, exist_ok=True)
    (base / "result.json").write_text(json.dumps({"status": "completed"}))
    slot1 = base.with_name(base.name + ".1")
    (slot1 / "checkpoints" / "step_00000030").mkdir(parents=True)  # a run preempted in slot .1
    folder, fd = _claim_train_dir(ctx)
    assert folder == slot1
    release(fd)
    (slot1 / "result.json").write_text(json.dumps({"status": "completed"}))
    folder, fd = _claim_train_dir(ctx)  # nothing to resume: the first slot, cleared
    assert folder == base and not base.exists()
    release(fd)
