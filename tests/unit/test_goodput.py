"""The goodput ledger's summary and the Young-Daly checkpoint interval, on fixed event lists."""

import json
import math
import time

import pytest

from core.config import config_from_dict
from core.errors import ConfigError
from training.goodput import (BEAT_S, LEDGER_FILE, Ledger, choose_interval, process_start_time, read_events,
                              summarise, young_daly_seconds, young_daly_steps)


def ev(kind, t, **fields):
    return {"ev": kind, "t": t, **fields}


def start(t, t0, job="job-a", attempt=0):
    return ev("start", t, job=job, attempt=attempt, world=2, t0=t0)


# One job, no failure: started at 100, first step at 103, a 0.1 s checkpoint, done at 110.
CLEAN = [
    start(101, 100), ev("resume", 101.5, step=None), ev("step", 103, step=1), ev("beat", 105, step=8),
    ev("ckpt", 106, step=10, stall_s=0.1), ev("beat", 108, step=16), ev("finish", 110, step=20, status="completed"),
]

# The same job, a worker SIGKILLed after step 14 (last heartbeat at 103.5); torchrun's second
# attempt starts its process at 106, resumes the step-10 checkpoint and steps again at 109.
KILLED = [
    start(101, 100), ev("resume", 101.5, step=None), ev("step", 102, step=1),
    ev("ckpt", 103, step=10, stall_s=0.2), ev("beat", 103.5, step=14),
    start(107, 106, attempt=1), ev("resume", 107.5, step=10), ev("step", 109, step=11),
    ev("beat", 110, step=16), ev("finish", 112, step=20, status="completed"),
]


def test_a_clean_run_loses_only_its_start_up_and_checkpoint_stalls():
    s = summarise(CLEAN)
    assert s["wall_s"] == 10 and s["startup_s"] == 3 and s["restart_s"] == 0
    assert s["lost_steps"] == 0 and s["lost_s"] == 0 and s["checkpoint_stall_s"] == 0.1
    assert s["productive_s"] == pytest.approx(6.9) and s["goodput"] == pytest.approx(0.69)
    assert (s["attempts"], s["jobs"], s["failures"], s["mtbf_s"]) == (1, 1, 0, None)
    assert s["checkpoint_cost_s"] == 0.1 and s["step_time_s"] == pytest.approx((110 - 103) / 19)


def test_a_killed_worker_costs_restart_time_and_the_steps_it_repeats():
    s = summarise(KILLED)
    assert s["wall_s"] == 12  # 100 -> 112: the restart gap is part of the job's wall time
    assert s["startup_s"] == 2
    assert s["restart_s"] == 5.5  # last heartbeat 103.5 -> first step after resume 109
    assert s["lost_steps"] == 4  # reached 14, resumed from 10
    assert s["lost_s"] == 0.5  # the time from the step-10 checkpoint to the last heartbeat
    assert s["productive_s"] == pytest.approx(12 - 2 - 5.5 - 0.5 - 0.2)
    assert s["failures"] == 1 and s["mtbf_s"] == 12 and s["attempts"] == 2 and s["jobs"] == 1
    # torchrun's part (heartbeat -> new worker process) and the worker's (process -> first step).
    assert s["restarts"] == [{"attempt": 1, "restart_s": 5.5, "agent_s": 2.5, "worker_s": 3.0,
                              "resumed_from_step": 10, "lost_steps": 4}]
    assert s["goodput"] < summarise(CLEAN)["goodput"]


def test_the_gap_between_a_preempted_job_and_its_rerun_is_not_wall_time():
    events = [
        start(101, 100), ev("resume", 101, step=None), ev("step", 102, step=1),
        ev("ckpt", 105, step=12, stall_s=0.5), ev("finish", 105.5, step=12, status="preempted"),
        # an hour later, a new job (new torchrun run id) resumes where the first stopped
        start(3701, 3700, job="job-b"), ev("resume", 3702, step=12), ev("step", 3703, step=13),
        ev("finish", 3710, step=20, status="completed"),
    ]
    s = summarise(events)
    assert s["wall_s"] == pytest.approx(5.5 + 10) and s["jobs"] == 2
    assert s["startup_s"] == pytest.approx(2 + 3) and s["restart_s"] == 0
    assert s["lost_steps"] == 0 and s["failures"] == 0  # the checkpoint at the stop kept every step
    assert s["productive_s"] == pytest.approx(15.5 - 5 - 0.5)
    # The launcher's record of its resubmission, between the jobs, is counted and is not wall time.
    resubmitted = summarise([*events[:5], ev("resubmit", 1800, job="job-b", after="PREEMPTED"), *events[5:]])
    assert resubmitted == {**s, "resubmits": 1} and s["resubmits"] == 0


def test_a_restart_before_the_first_checkpoint_repeats_every_step_done():
    events = [
        start(101, 100), ev("resume", 101, step=None), ev("step", 102, step=1), ev("beat", 104, step=9),
        start(108, 107, attempt=1), ev("resume", 108, step=None), ev("step", 110, step=1),
        ev("finish", 120, step=30, status="completed"),
    ]
    s = summarise(events)
    assert s["attempts"] == 2 and s["failures"] == 1  # still one training: a restart within its job
    assert s["lost_steps"] == 9 and s["lost_s"] == 2  # steps 1..9, from 102 to 104
    assert s["restart_s"] == 6 and s["restarts"][0]["resumed_from_step"] is None


def test_a_fresh_start_in_a_new_job_begins_a_new_training():
    old = [start(1, 0, job="old"), ev("resume", 1, step=None), ev("step", 2, step=1), ev("beat", 50, step=400)]
    s = summarise(old + CLEAN)
    assert s == summarise(CLEAN)  # the earlier training's events (and its death) are not this one's


def test_a_death_during_start_up_is_a_failure_with_nothing_lost():
    events = [start(101, 100), ev("resume", 101, step=None),
              start(106, 105, attempt=1), ev("resume", 106, step=None), ev("step", 108, step=1),
              ev("finish", 110, step=5, status="completed")]
    s = summarise(events)
    assert s["failures"] == 1 and s["lost_steps"] == 0 and s["restart_s"] == 7 and s["startup_s"] == 1
    assert s["restarts"][0]["worker_s"] == 3


def test_no_events_is_no_wall_time():
    s = summarise([])
    assert s["wall_s"] == 0 and s["goodput"] is None and s["attempts"] == 0


def test_torn_and_foreign_lines_are_skipped(tmp_path):
    path = tmp_path / LEDGER_FILE
    path.write_text('{"ev": "start", "t": 1, "job": "j", "attempt": 0, "t0": 0}\n'
                    'not json\n[1, 2]\n{"ev": "beat", "t": "soon", "step": 3}\n{"ev": "beat", "t": 2, "st')
    assert [e["ev"] for e in read_events(path)] == ["start"]
    assert read_events(tmp_path / "missing.jsonl") == []


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def test_ledger_records_the_first_step_then_throttles_its_heartbeat(tmp_path):
    clock = Clock()
    ledger = Ledger(tmp_path / LEDGER_FILE, clock=clock)
    ledger.start(world_size=2)
    ledger.resumed(None)
    for step in range(1, 101):  # 100 steps of 0.01 s: 1 s, so two heartbeats after the first step
        clock.now += 0.01
        ledger.step(step)
    ledger.checkpoint(100, 0.25)
    ledger.finish("completed", 100)
    kinds = [(e["ev"], e.get("step")) for e in ledger.events()]
    assert kinds[:3] == [("start", None), ("resume", None), ("step", 1)]
    beats = [s for k, s in kinds if k == "beat"]
    assert 1 <= len(beats) <= 1.0 / BEAT_S  # 100 calls, at most one append per BEAT_S
    assert beats == sorted(beats) and all(b > 1 for b in beats)
    assert kinds[-2:] == [("ckpt", 100), ("finish", 100)]


def test_ledger_of_another_rank_writes_nothing(tmp_path):
    ledger = Ledger.for_rank(False, tmp_path)
    ledger.start(2)
    ledger.step(1)
    ledger.finish("completed", 1)
    assert not ledger.enabled and ledger.events() == [] and not (tmp_path / LEDGER_FILE).exists()


def test_a_new_attempt_starts_on_its_own_line_after_a_torn_tail(tmp_path, monkeypatch):
    path = tmp_path / LEDGER_FILE
    path.write_text('{"ev": "start", "t": 1, "job": "j", "attempt": 0, "t0": 0}\n{"ev": "beat", "t": 2, "st')
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "j")
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    Ledger(path).start(world_size=2)
    events = read_events(path)
    assert [(e["ev"], e.get("attempt")) for e in events] == [("start", 0), ("start", 1)]
    assert events[1]["job"] == "j"


def test_process_start_time_is_before_now():
    t0 = process_start_time()
    assert t0 is None or 0 < t0 <= time.time() + 0.01


# -- Young-Daly -------------------------------------------------------------------------------
def test_young_daly_is_sqrt_of_twice_cost_times_mtbf_in_whole_steps():
    assert young_daly_seconds(2.0, 400.0) == 40.0
    assert young_daly_steps(2.0, 400.0, 0.5) == 80
    assert young_daly_steps(0.001, 1.0, 10.0) == 1  # never below one step


@pytest.mark.parametrize("args, key", [
    ((0.0, 10.0, 0.1), "checkpoint_cost_s"), ((-1.0, 10.0, 0.1), "checkpoint_cost_s"),
    ((math.nan, 10.0, 0.1), "checkpoint_cost_s"), ((1.0, 0.0, 0.1), "mtbf_s"), ((1.0, math.inf, 0.1), "mtbf_s"),
    ((1.0, 10.0, 0.0), "step_time_s"), ((1.0, 10.0, None), "step_time_s"), ((True, 10.0, 0.1), "checkpoint_cost_s"),
])
def test_young_daly_refuses_inputs_that_are_not_positive_numbers(args, key):
    with pytest.raises(ValueError, match=key):
        young_daly_steps(*args)


def test_fixed_mode_keeps_the_configured_interval_whatever_the_ledger_says():
    choice = choose_interval("fixed", 10, KILLED)
    assert (choice["rule"], choice["steps"]) == ("fixed", 10)


def test_auto_without_a_failure_falls_back_to_the_fixed_interval():
    choice = choose_interval("auto", 10, CLEAN)
    assert (choice["mode"], choice["rule"], choice["steps"]) == ("auto", "fixed", 10)
    assert "no failure" in choice["reason"] and choice["failures"] == 0
    assert choose_interval("auto", None, [])["steps"] is None  # epoch ends only, as configured


def test_auto_after_a_failure_uses_young_daly_on_the_measured_cost_mtbf_and_step_time():
    s = summarise(KILLED)
    choice = choose_interval("auto", None, KILLED)
    expected = round(math.sqrt(2 * s["checkpoint_cost_s"] * s["mtbf_s"]) / s["step_time_s"])
    assert choice["rule"] == "young_daly" and choice["steps"] == expected > 0
    assert choice["checkpoint_cost_s"] == 0.2 and choice["mtbf_s"] == 12 and "sqrt(2 x" in choice["reason"]


def test_auto_after_a_failure_but_before_any_checkpoint_keeps_the_fixed_interval():
    events = [start(101, 100), ev("resume", 101, step=None), ev("step", 102, step=1), ev("beat", 104, step=9),
              start(108, 107, attempt=1), ev("resume", 108, step=None)]
    choice = choose_interval("auto", 7, events)
    assert (choice["rule"], choice["steps"]) == ("fixed", 7) and "checkpoint_cost_s" in choice["reason"]


@pytest.mark.parametrize("mode, steps, match", [
    ("sometimes", 10, "training.checkpoint_every"), ("auto", 0, "training.checkpoint_every_steps"),
    ("auto", -3, "training.checkpoint_every_steps"), ("auto", 2.5, "training.checkpoint_every_steps"),
])
def test_choose_interval_refuses_bad_values_naming_the_key(mode, steps, match):
    with pytest.raises(ValueError, match=match):
        choose_interval(mode, steps, [])


# -- the config key -----------------------------------------------------------------------------
def _cfg(**training):
    return config_from_dict({"name": "x", "dataset": {"path": "d"}, "training": training})


def test_checkpoint_every_is_fixed_by_default_and_auto_loads():
    assert _cfg().training.checkpoint_every == "fixed"
    assert _cfg(checkpoint_every="auto").training.checkpoint_every == "auto"


def test_checkpoint_every_at_its_default_leaves_the_config_id_unchanged():
    assert _cfg(checkpoint_every="fixed").config_id() == _cfg().config_id()
    assert _cfg(checkpoint_every="auto").config_id() != _cfg().config_id()


def test_bad_checkpoint_every_names_the_key():
    with pytest.raises(ConfigError, match=r"training\.checkpoint_every: must be one of .*'sometimes'"):
        _cfg(checkpoint_every="sometimes")
    with pytest.raises(ConfigError, match=r"training\.checkpoint_every: 'auto' picks when to checkpoint, but "
                                          r"training\.checkpoints is false"):
        _cfg(checkpoint_every="auto", checkpoints=False)


def test_describe_and_headline_say_the_ledger_in_one_line():
    from training.goodput import describe, headline

    s = summarise(KILLED)
    assert set(headline(s)) == {"goodput", "productive_s", "wall_s", "startup_s", "restart_s", "lost_steps",
                                "lost_s", "checkpoint_stall_s", "failures"}
    line = describe(s)
    assert line.startswith(f"goodput {s['goodput']:.3f}: 3.8 s productive of 12.0 s wall")
    assert "1 failure(s) costing 5.5 s of restart and 4 repeated step(s)" in line
    assert describe(None) == "" and headline(None) == {} and describe(summarise([])) == ""


def test_trainflow_run_prints_the_goodput_of_its_training(capsys):
    from flows.cli import _print_summary
    from training.goodput import headline

    training = {"world_size": 2, "backend": "gloo", "samples_per_s": 1000.0, "wall_s": 12.0,
                "goodput": headline(summarise(KILLED))}
    _print_summary({"status": "registered", "training": training, "ui": {"prefect": None, "mlflow": None}})
    (row,) = [line for line in capsys.readouterr().err.splitlines() if "goodput" in line]
    # One line of the table, in words a user acts on; the seconds stay in the summary JSON.
    assert "goodput 32 %: 50 % restarts, 17 % start-up, 2 % checkpoint stalls" in row
    assert "productive" not in row and "failure(s)" not in row


def test_brief_names_where_the_lost_share_went_largest_first_only_the_nonzero_parts():
    from training.goodput import brief, headline

    assert brief(headline(summarise(KILLED))) == "goodput 32 %: 50 % restarts, 17 % start-up, 2 % checkpoint stalls"
    assert brief(summarise(CLEAN)) == "goodput 69 %: 30 % start-up, 1 % checkpoint stalls"
    g = {"goodput": 0.91, "wall_s": 100.0, "productive_s": 91.0, "startup_s": 9.0, "restart_s": 0.0, "lost_s": 0.0,
         "checkpoint_stall_s": 0.2, "lost_steps": 0, "failures": 0}
    assert brief(g) == "goodput 91 %: 9 % start-up, <1 % checkpoint stalls"
    assert brief({**g, "goodput": 1.0, "startup_s": 0.0, "checkpoint_stall_s": 0.0}) == "goodput 100 %"
    assert brief(None) == "" and brief({}) == "" and brief(summarise([])) == ""


def test_agree_interval_records_the_choice_in_the_ledger(tmp_path):
    from types import SimpleNamespace

    from training.goodput import agree_interval

    path = tmp_path / LEDGER_FILE
    path.write_text("".join(json.dumps(e) + "\n" for e in KILLED[:5]))  # a death, then this attempt
    ledger = Ledger(path)
    ledger.start(world_size=1)
    ledger.resumed(10)
    one_process = SimpleNamespace(is_main=True, distributed=False)
    choice = agree_interval(one_process, ledger, "auto", 10)
    assert choice["rule"] == "young_daly" and choice["failures"] == 1
    assert ledger.events()[-1] == {"ev": "interval", "t": ledger.events()[-1]["t"], **choice}
    assert agree_interval(one_process, ledger, "fixed", 10)["steps"] == 10


def test_a_rerun_under_the_same_rendezvous_id_is_a_new_job_not_a_restart():
    events = [
        start(101, 100, job="rdzv-1"), ev("resume", 101, step=None), ev("step", 102, step=1),
        ev("finish", 105, step=12, status="preempted"),
        start(3701, 3700, job="rdzv-1"), ev("resume", 3702, step=12), ev("step", 3703, step=13),
        ev("finish", 3710, step=20, status="completed"),
    ]
    s = summarise(events)
    assert s["jobs"] == 2 and s["restart_s"] == 0 and s["wall_s"] == 15


def test_a_checkpoint_whose_write_a_death_cut_short_is_not_counted_twice():
    # The step-20 checkpoint's stall was recorded, but its background write never completed:
    # the restart resumes from step 10; the 0.3 s stall is a stall, not repeated work too.
    events = [
        start(101, 100), ev("resume", 101, step=None), ev("step", 102, step=1),
        ev("ckpt", 103, step=10, stall_s=0.1), ev("ckpt", 104.3, step=20, stall_s=0.3), ev("beat", 104.5, step=22),
        start(108, 107, attempt=1), ev("resume", 108, step=10), ev("step", 110, step=11),
        ev("finish", 115, step=40, status="completed"),
    ]
    s = summarise(events)
    assert s["lost_steps"] == 12 and s["lost_s"] == pytest.approx(1.5 - 0.3)
    assert s["checkpoint_stall_s"] == pytest.approx(0.4)
    parts = s["productive_s"] + s["startup_s"] + s["restart_s"] + s["lost_s"] + s["checkpoint_stall_s"]
    assert parts == pytest.approx(s["wall_s"])
