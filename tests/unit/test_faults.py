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


def test_the_first_failure_is_the_rank_that_failed_first_within_one_second(tmp_path):
    # torchrun stamps error files in whole seconds; a crashed rank and the peer that lost its
    # connection to it often share one. The file written first names the rank that crashed.
    import json
    import os

    from training.launcher import _first_failure

    def error(rank: int, message: str, mtime_ns: int) -> None:
        path = tmp_path / "run_x" / "attempt_0" / str(rank) / "error.json"
        path.parent.mkdir(parents=True)
        info = {"timestamp": "1796005474", "py_callstack": f"Traceback of rank {rank}"}
        path.write_text(json.dumps({"message": {"message": message, "extraInfo": info}}))
        os.utime(path, ns=(mtime_ns, mtime_ns))

    error(1, "InjectedFault: injected fault on rank 1 at step 5", 1_796_005_474_100_000_000)
    error(0, "RuntimeError: Connection closed by peer", 1_796_005_474_300_000_000)
    assert _first_failure(tmp_path) == (1, "InjectedFault: injected fault on rank 1 at step 5",
                                           "Traceback of rank 1")


def test_slow_fault_sleeps_on_every_step_from_its_step_on_and_only_on_its_rank(monkeypatch):
    f = parse("slow@step=5,rank=1,ms=0")
    assert f == Fault("slow", 5, 1, 0.0)
    assert f.due(5, 1) and f.due(500, 1) and not f.due(4, 1) and not f.due(5, 0)
    assert parse("slow@step=2").ms == 50.0  # the default sleep
    import training.faults

    slept = []
    monkeypatch.setattr(training.faults.time, "sleep", slept.append)
    Fault("slow", 1, None, 20.0).fire(0)
    assert slept == [0.02]


@pytest.mark.parametrize("bad", ["kill@step=1,ms=5", "slow@step=1,ms=-1", "slow@step=1,ms=nan", "slow@step"])
def test_bad_slow_specs_are_rejected(bad):
    with pytest.raises(ValueError, match="TRAINFLOW_FAULT"):
        parse(bad)
