import pytest

from training.faults import Fault, from_env, parse


def test_parse_fault_specs():
    assert parse("kill@step=30,rank=1") == Fault("kill", 30, 1)
    assert parse("raise@step=5") == Fault("raise", 5, None)


@pytest.mark.parametrize("bad", ["explode@step=1", "kill@rank=1", "kill@step=1,when=now"])
def test_bad_fault_specs_are_rejected(bad):
    with pytest.raises(ValueError, match="TRAINFLOW_FAULT"):
        parse(bad)


def test_fault_fires_only_on_its_step_and_rank():
    f = Fault("raise", 5, 1)
    assert f.due(5, 1) and not f.due(5, 0) and not f.due(4, 1)
    assert Fault("raise", 5).due(5, 0)


def test_fault_is_off_after_a_restart(monkeypatch):
    monkeypatch.setenv("TRAINFLOW_FAULT", "kill@step=3")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    assert from_env() == Fault("kill", 3)
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    assert from_env() is None


def test_preemption_before_launch_starts_nothing(tmp_path):
    from core.errors import PreemptedError
    from training import preemption
    from training.launcher import JobSpec, run_job

    spec = JobSpec(config_path="c.yaml", out_dir=str(tmp_path / "never"), root=str(tmp_path),
                   data_md5="x", nproc_per_node=1)
    preemption.REQUESTED.set()
    with pytest.raises(PreemptedError, match="before training started"):
        run_job(spec)
    assert not preemption.REQUESTED.is_set()
    assert not (tmp_path / "never").exists()
