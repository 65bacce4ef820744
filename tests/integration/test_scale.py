"""One small real sweep (2 layouts x 1 batch size x 2 epochs, torchrun, no Prefect) and its reports, and
the probe ``cpu_workers: auto`` runs without one. Both train the digits data with a small MLP
(tests/configs/digits-mlp.yaml): what is tested is the measuring, not the model."""

import json

import pytest

pytestmark = pytest.mark.integration

CONFIG = "tests/configs/digits-mlp.yaml"
ROW_FIELDS = {"layout", "nproc", "threads", "cores", "batch_size", "samples_per_s", "scaling_efficiency",
              "time_to_target_s", "cost_core_s", "status"}


def test_small_sweep_writes_json_markdown_and_png(tmp_path, monkeypatch, repo_root, bundled_data):
    from flows.scale import run_sweep
    from training import plan as advisor

    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    monkeypatch.delenv("TRAINFLOW_MLFLOW_RUN_ID", raising=False)
    layouts = [{"name": "1x2", "nproc": 1, "threads": 2, "device": "cpu"},
               {"name": "2x1", "nproc": 2, "threads": 1, "device": "cpu"}]
    out = tmp_path / "report"
    report = run_sweep(repo_root / CONFIG, ["training.metrics=false"], layouts, [32],
                       epochs=2, target_accuracy=0.5, out_dir=out)

    for name in ("scale.json", "scale.md", "scale.png"):
        assert (out / name).is_file(), name
    data = json.loads((out / "scale.json").read_text())
    rows = data["rows"]
    assert [(r["nproc"], r["threads"]) for r in rows] == [(1, 2), (2, 1)]
    for r in rows:
        assert ROW_FIELDS <= r.keys()
        assert r["status"] == "completed" and r["samples_per_s"] > 0 and r["epochs_run"] == 2
        assert r["cores"] == 2
        if r["time_to_target_s"] is not None:
            assert r["cost_core_s"] == pytest.approx(r["time_to_target_s"] * 2)
    assert data["best"]["layout"] in ("1x2", "2x1") and data["recommendation"]

    md = (out / "scale.md").read_text()
    assert "| layout | procs | threads | batch | samples/s |" in md
    assert "**Recommendation:**" in md and "use it" in md
    assert (out / "scale.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    # The rows are where `cpu_workers: auto` looks for them.
    from core.config import load_config

    auto = load_config(repo_root / CONFIG, ["training.cpu_workers=auto", "training.metrics=false"])
    assert advisor.load_sweep(tmp_path / "home", auto) == rows
    print(json.dumps([{k: r[k] for k in ("layout", "samples_per_s", "time_to_target_s", "final_val_accuracy")}
                      for r in rows]), report["recommendation"])


def test_auto_without_a_sweep_probes_the_layouts_once(tmp_path, monkeypatch, repo_root, bundled_data):
    """cpu_workers: auto with no sweep plans by rule and asks to measure; the probe measures 1x2, 1x1
    and 2x1, and the plan made again picks the fastest it measured."""
    from core.config import load_config
    from training import plan as advisor
    from training.plan import host_facts, plan_launch
    from training.probe import measured_plan

    home = tmp_path / "home"
    monkeypatch.setenv("TRAINFLOW_HOME", str(home))
    monkeypatch.delenv("TRAINFLOW_MLFLOW_RUN_ID", raising=False)
    auto = load_config(repo_root / CONFIG,
                       ["training.strategy=auto", "training.cpu_workers=auto", "training.backend=gloo"])
    assert advisor.load_sweep(home, auto) is None
    first = plan_launch(auto, host_facts(auto, home))
    assert first.unmeasured and not (home / "scale").exists()  # planning measured nothing

    plan = measured_plan(first, repo_root, "md5", home, log=lambda _m: None)
    cfg, reasons = plan.cfg, plan.reasons

    saved = json.loads(advisor.sweep_path(home, auto).read_text())
    rows = saved["rows"]
    assert saved["source"] == "probe"
    assert sorted((r["nproc"], r["threads"]) for r in rows) == [(1, 1), (1, 2), (2, 1)]
    assert all(r["status"] == "completed" and r["samples_per_s"] > 0 for r in rows)
    best = advisor.choose_layout(rows)
    assert (cfg.training.cpu_workers, cfg.training.threads_per_worker) == (best["nproc"], best["threads"])
    assert plan.nproc_per_node == best["nproc"] and not plan.unmeasured
    assert cfg.training.strategy == ("single" if best["nproc"] == 1 else "ddp")
    assert "from the probe" in reasons[0]

    # The next plan reuses the saved rows: nothing to measure.
    again = plan_launch(auto, host_facts(auto, home))
    assert again.cfg == cfg and not again.unmeasured and "from the probe" in again.reasons[0]
