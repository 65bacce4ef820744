"""The Slurm launcher without a cluster: the batch script its dry run renders from a launch plan and
the ``launcher.slurm`` section, and how Slurm's job states map onto the launcher's few. (Jobs on a
real two-node Slurm: tests/integration/test_slurm.py.)"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from core.config import config_from_dict, config_id_of, load_config
from core.errors import ConfigError
from training import slurm
from training.launcher import plan_spec
from training.plan import HostFacts, plan_launch

OUT, ROOT = Path("/shared/runs/digits"), Path("/shared/src/trainflow")


@pytest.fixture
def plan(repo_root, tmp_path, monkeypatch):
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))

    def make(*overrides: str, nnodes: int | str = 2, nproc: int = 4):
        cfg = load_config(repo_root / "configs" / "digits.yaml", ["training.cpu_workers=1", *overrides])
        return plan_launch(cfg, HostFacts(), nproc=nproc, nnodes=nnodes)
    return make


def sbatch_options(script: str) -> dict[str, str]:
    """{option: value} of the script's ``#SBATCH --option[=value]`` lines."""
    found = re.findall(r"^#SBATCH --([a-z-]+)(?:=(.*))?$", script, re.M)
    assert len(found) == len(dict(found)), "an option given twice"
    return dict(found)


def srun_words(script: str) -> list[str]:
    """The words of the script's srun line, as the shell splits them (variables left unexpanded)."""
    [line] = [line for line in script.splitlines() if line.startswith("srun ")]
    return shlex.split(line)


def test_the_script_asks_for_the_plans_nodes_one_task_each_and_the_typed_settings(plan):
    p = plan("launcher.slurm.partition=gpu", "launcher.slurm.account=ml-team", "launcher.slurm.qos=high",
             "launcher.slurm.time_limit_min=90", "launcher.slurm.gpus_per_node=4",
             "launcher.slurm.signal_before_limit_s=300", "launcher.slurm.signal=USR1", "launcher.slurm.requeue=false")
    request = slurm.dry_run(p, OUT, ROOT, "md5", comment="flow-run=abc,mlflow-run=def")
    assert request.script.startswith("#!/bin/bash\n")
    assert sbatch_options(request.script) == {
        "job-name": "trainflow-digits", "nodes": "2", "ntasks-per-node": "1", "time": "90",
        "output": f"{OUT}/slurm-%j.out", "open-mode": "append", "chdir": str(ROOT), "no-requeue": "",
        "partition": "gpu", "account": "ml-team", "qos": "high", "comment": "flow-run=abc,mlflow-run=def",
        "gpus-per-node": "4", "signal": "USR1@300"}


def test_the_rest_api_gets_the_scripts_options_as_job_properties_and_the_environment_without_the_token(plan):
    p = plan("launcher.slurm.partition=gpu", "launcher.slurm.account=ml-team", "launcher.slurm.qos=high",
             "launcher.slurm.time_limit_min=90", "launcher.slurm.gpus_per_node=4", "launcher.slurm.signal=USR1",
             "launcher.slurm.signal_before_limit_s=300", nnodes="1:2")
    request = slurm.dry_run(p, OUT, ROOT, "md5", comment="flow-run=abc")
    job = slurm.rest_job(request, {"PATH": "/usr/bin", "MY_JWT": "secret", "SLURM_JWT": "secret"}, "MY_JWT")
    assert job == {
        "name": "trainflow-digits", "nodes": [1, 2], "tasks": 1, "tasks_per_node": 1, "time_limit": 90,
        "standard_output": f"{OUT}/slurm-%j.out", "open_mode": "append", "current_working_directory": str(ROOT),
        "requeue": True, "partition": "gpu", "account": "ml-team", "qos": "high", "comment": "flow-run=abc",
        "gpus_per_node": "4", "signal": "USR1@300", "environment": {"PATH": "/usr/bin"}}
    # Every option the script asks for is a property (or one that rest_job sets itself).
    assert set(sbatch_options(request.script)) <= {*slurm._REST_PROPERTIES, "nodes", "ntasks-per-node", "time",
                                                   "requeue", "no-requeue"}


def test_the_rest_api_needs_its_token_variable_and_names_it_not_the_token(plan, monkeypatch):
    from core.config import SlurmRestConfig

    rest = SlurmRestConfig(url="http://127.0.0.1:1", token_env="MY_JWT")
    monkeypatch.delenv("MY_JWT", raising=False)
    with pytest.raises(ConfigError, match=r"^launcher.slurm.rest.token_env: \$MY_JWT is not set; "):
        slurm.describe("12", rest=rest)
    with pytest.raises(ConfigError, match=r"launcher.slurm.rest.url: must match"):
        load_config(Path(__file__).parents[2] / "configs" / "digits.yaml", ["launcher.slurm.rest.url=http://h/slurm?x"])


def test_defaults_leave_partition_account_qos_and_gpus_to_the_cluster(plan):
    options = sbatch_options(slurm.dry_run(plan(), OUT, ROOT, "md5").script)
    assert not {"partition", "account", "qos", "comment", "gpus-per-node", "no-requeue"} & set(options)
    assert options["requeue"] == "" and options["signal"] == "TERM@120" and options["time"] == "60"
    no_signal = slurm.dry_run(plan("launcher.slurm.signal_before_limit_s=0"), OUT, ROOT, "md5").script
    assert "signal" not in sbatch_options(no_signal)


def test_every_node_runs_the_local_launchers_torchrun_meeting_at_the_first_node_under_the_job_id(plan):
    p = plan("launcher.slurm.rdzv_port=29555")
    request = slurm.dry_run(p, OUT, ROOT, "md5", rdzv_token="feedbeef")
    words = srun_words(request.script)
    at = words.index("-m")  # srun's options end where the Python command's first "-m" is
    srun, command = words[:at - 1], words[at - 1:]
    assert srun == ["srun", "--nodes=2", "--ntasks-per-node=1", "--kill-on-bad-exit=1",
                    f"--output={OUT}/slurm-%j-%t.out", "--open-mode=append"]  # a log per node
    local = plan_spec(p, OUT, ROOT, "md5", rdzv_endpoint="$addr:29555",
                      rdzv_id="$SLURM_JOB_ID-$TRAINFLOW_SLURM_RDZV_TOKEN").command(OUT / "torchrun")
    assert command == local
    assert "--nnodes=2" in command and "--nproc-per-node=4" in command and "--rdzv-backend=c10d" in command
    assert command[command.index("training.worker") - 1:][:3] == ["-m", "training.worker", "--config"]
    # The variables the srun line expands are set on the allocation, the first node's address included.
    assert "export TRAINFLOW_SLURM_RDZV_TOKEN=feedbeef" in request.script
    assert re.search(r'^head=\$\(scontrol show hostnames "\$SLURM_JOB_NODELIST" \| head -n 1\)$', request.script, re.M)
    assert re.search(r"^addr=\$\(scontrol -o show node \"\$head\" ", request.script, re.M)
    assert "export TRAINFLOW_NNODES=2" in request.script and "export OMP_NUM_THREADS=" in request.script
    # What submit writes beside the script: the config the workers read, where the command says.
    assert request.files["config.yaml"] == p.cfg.to_yaml()
    assert command[command.index("--config") + 1] == str(OUT / "config.yaml")


def test_dry_run_draws_an_unguessable_rendezvous_token_and_writes_nothing(plan, tmp_path):
    out = tmp_path / "out"
    first, second = (slurm.dry_run(plan(), out, ROOT, "md5") for _ in range(2))
    tokens = [re.search(r"TRAINFLOW_SLURM_RDZV_TOKEN=(\w+)", r.script).group(1) for r in (first, second)]
    assert tokens[0] != tokens[1] and all(len(t) >= 16 for t in tokens)
    assert not out.exists()


def test_an_elastic_plan_asks_slurm_for_a_node_range(plan):
    p = plan("training.max_restarts=2", nnodes="2:4")
    script = slurm.dry_run(p, OUT, ROOT, "md5").script
    assert sbatch_options(script)["nodes"] == "2-4"
    assert srun_words(script)[1] == "--nodes=2-4" and "--nnodes=2:4" in srun_words(script)


def test_a_container_image_runs_through_pyxis_with_the_shared_folder_mounted(plan):
    p = plan("launcher.slurm.container_image=ghcr.io/acme/trainflow@sha256:" + "0" * 64,
             "launcher.slurm.shared_dir=/shared")
    words = srun_words(slurm.dry_run(p, OUT, ROOT, "md5").script)
    assert f"--container-image=ghcr.io/acme/trainflow@sha256:{'0' * 64}" in words
    assert "--container-mounts=/shared:/shared" in words and f"--container-workdir={ROOT}" in words
    assert words[words.index("-m") - 1] == "python"  # the image's interpreter, not this host's
    venv = plan("launcher.slurm.python=/shared/venv/bin/python")
    words = srun_words(slurm.dry_run(venv, OUT, ROOT, "md5").script)
    assert words[words.index("-m") - 1] == "/shared/venv/bin/python"


def test_a_training_folder_outside_the_shared_folder_is_refused_naming_both(plan):
    with pytest.raises(ConfigError, match=r"^launcher\.slurm\.shared_dir: the training folder /home/u/run is not "
                                          r"inside /shared"):
        slurm.dry_run(plan("launcher.slurm.shared_dir=/shared"), Path("/home/u/run"), ROOT, "md5")
    with pytest.raises(ConfigError, match="absolute"):
        slurm.dry_run(plan(), Path("runs/x"), ROOT, "md5")


@pytest.mark.parametrize("key, value", [
    ("partition", "gpu\n#SBATCH --wrap=rm"), ("account", "a b"), ("qos", "--exclusive"),
    ("container_image", "img --container-mounts=/:/host"), ("shared_dir", "relative/dir"),
    ("shared_dir", "/a b"), ("python", "python; rm -rf /"), ("time_limit_min", 0), ("gpus_per_node", -1),
    ("signal", "KILL"), ("rdzv_port", 70000), ("sbatch_extra", "--exclusive"),
])
def test_settings_that_could_become_script_text_are_refused_naming_the_key(key, value):
    data = {"name": "x", "dataset": {"path": "d"}, "launcher": {"slurm": {key: value}}}
    with pytest.raises(ConfigError, match=rf"launcher\.slurm\.{key}: "):
        config_from_dict(data)


def test_a_comment_or_job_name_that_is_not_one_word_is_refused(plan):
    with pytest.raises(ConfigError, match="comment"):
        slurm.dry_run(plan(), OUT, ROOT, "md5", comment="a b\n#SBATCH --wrap=x")
    with pytest.raises(ConfigError, match="job name"):
        slurm.dry_run(plan(), OUT, ROOT, "md5", job_name="x y")


def test_the_launcher_section_is_not_part_of_the_config_id():
    base = config_from_dict({"name": "x", "dataset": {"path": "d"}})
    old = base.model_dump(mode="json")
    del old["launcher"]  # a config.json written before the section existed
    assert config_id_of(old) == base.config_id()
    elsewhere = config_from_dict({"name": "x", "dataset": {"path": "d"},
                                  "launcher": {"slurm": {"partition": "gpu", "time_limit_min": 5}}})
    assert elsewhere.config_id() == base.config_id() and elsewhere.resume_id() == base.resume_id()


def line(state: str, reason: str = "None", nodes: str = "(null)", exit_code: str = "0:0") -> str:
    """A ``scontrol show job -o`` line as Slurm 22.05 prints it (shortened)."""
    return (f"JobId=17 JobName=trainflow-digits UserId=root(0) Priority=1 JobState={state} Reason={reason} "
            f"Dependency=(null) Requeue=1 Restarts=0 ExitCode={exit_code} RunTime=00:00:03 NodeList={nodes} "
            f"BatchHost=n1 NumNodes=2 Comment=flow-run=abc")


@pytest.mark.parametrize("raw, reason, nodes, state, want_reason, want_nodes", [
    ("PENDING", "Resources", "(null)", "PENDING", "Resources", ()),
    ("PENDING", "PartitionNodeLimit", "(null)", "PENDING", "PartitionNodeLimit", ()),
    ("CONFIGURING", "None", "n[1-2]", "PENDING", "", ("n1", "n2")),
    ("RUNNING", "None", "n[1-2]", "RUNNING", "", ("n1", "n2")),
    ("COMPLETING", "None", "n1", "RUNNING", "", ("n1",)),
    ("COMPLETED", "None", "n[1-2]", "COMPLETED", "", ("n1", "n2")),
    ("FAILED", "NonZeroExitCode", "n[1-2]", "FAILED", "NonZeroExitCode", ("n1", "n2")),
    ("OUT_OF_MEMORY", "OutOfMemory", "n2", "FAILED", "OutOfMemory", ("n2",)),
    ("NODE_FAIL", "NodeDown", "n[1-2]", "NODE_FAIL", "NodeDown", ("n1", "n2")),
    ("BOOT_FAIL", "None", "n1", "NODE_FAIL", "", ("n1",)),
    ("TIMEOUT", "TimeLimit", "n[1-2]", "TIMEOUT", "TimeLimit", ("n1", "n2")),
    ("DEADLINE", "None", "n1", "TIMEOUT", "", ("n1",)),
    ("PREEMPTED", "None", "n[1-2]", "PREEMPTED", "", ("n1", "n2")),
    ("REQUEUED", "BeginTime", "(null)", "PENDING", "BeginTime", ()),
    ("CANCELLED", "None", "n[1-2]", "CANCELLED", "", ("n1", "n2")),
])
def test_slurm_states_map_onto_the_launchers_few(raw, reason, nodes, state, want_reason, want_nodes):
    status = slurm.parse_job(line(raw, reason, nodes))
    assert (status.job_id, status.state, status.slurm_state) == ("17", state, raw)
    assert (status.reason, status.nodes, status.exit_code) == (want_reason, want_nodes, "0:0")
    assert status.ended == (state not in ("PENDING", "RUNNING"))


def test_every_slurm_state_maps_and_an_unknown_one_counts_as_failed():
    assert set(slurm.SLURM_STATES.values()) == set(slurm.STATES)
    status = slurm.parse_job(line("SOMETHING_NEW"))
    assert (status.state, status.slurm_state, status.ended) == ("FAILED", "SOMETHING_NEW", True)
    with pytest.raises(ValueError, match="not a `scontrol show job -o` line"):
        slurm.parse_job("slurm_load_jobs error: Invalid job id specified")


@pytest.mark.parametrize("text, names", [
    ("n1", ("n1",)), ("n[1-2]", ("n1", "n2")), ("gpu[01-03,7],cpu1", ("gpu01", "gpu02", "gpu03", "gpu7", "cpu1")),
    ("a[9-10]", ("a9", "a10")), ("x[1,3],y[2-3]", ("x1", "x3", "y2", "y3")),
])
def test_compact_node_lists_expand_to_names(text, names):
    assert slurm.expand_hostlist(text) == names


def test_every_node_first_proves_it_sees_the_training_folder_and_a_preempted_job_requeues_itself(plan):
    script = slurm.dry_run(plan("training.max_restarts=2"), OUT, ROOT, "md5").script
    lines = script.splitlines()
    check = next(i for i, line in enumerate(lines) if line.startswith("if ! srun "))
    train = next(i for i, line in enumerate(lines) if line.startswith("srun "))
    assert check < train  # the short step on every node comes before training
    assert f"sh {OUT}; then" in lines[check] and "exit 3" in lines[check + 2]
    requeue = next(i for i, line in enumerate(lines) if "SLURM_RESTART_COUNT" in line)
    assert train < requeue and '-lt 2 ]' in lines[requeue] and "result.json" in lines[requeue]
    assert lines[requeue + 2] == '  scontrol requeue "$SLURM_JOB_ID"'
    assert lines[-1] == 'exit "$rc"'


def test_slurms_compact_node_lists_and_state_lines():
    assert slurm.expand_hostlist("n[1-2],gpu[08-10],login") == ("n1", "n2", "gpu08", "gpu09", "gpu10", "login")
    status = slurm.parse_job("JobId=7 JobName=x JobState=PENDING Reason=Resources NodeList=(null) ExitCode=0:0")
    assert (status.state, status.reason, status.nodes) == ("PENDING", "Resources", ())
    assert slurm._state_line(status) == "Slurm job 7: PENDING (Resources)"
    running = slurm.parse_job("JobId=7 JobState=RUNNING Reason=None NodeList=n[1-2] ExitCode=0:0")
    assert slurm._state_line(running) == "Slurm job 7: RUNNING on n1, n2"


# -- endings, read from what the job left in its training folder (no cluster) -----------------------

def ended_job(tmp_path, **files: str) -> slurm.SlurmJob:
    for name, text in files.items():
        (tmp_path / name.replace("_", "-").replace("-out", ".out")).write_text(text)
    job = slurm.SlurmJob(slurm.SlurmRequest("", str(tmp_path), {}, None), 60, 2, slurm.Hooks(log=lambda m: None))
    job.job_ids.append("5")
    return job


def status(state: str, reason: str = "NonZeroExitCode") -> slurm.SlurmStatus:
    return slurm.SlurmStatus("5", slurm.SLURM_STATES[state], state, reason, ("n1", "n2"), "1:0")


def test_a_failed_job_names_the_node_and_the_rank_that_failed(tmp_path):
    job = ended_job(tmp_path, slurm_5_0_out="[rank0]: epoch 1\n",
                    slurm_5_1_out="Root Cause (first observed failure):\n[0]:\n  host      : h\n"
                                   "  rank      : 1 (local_rank: 0)\n  exitcode  : 1 (pid: 9)\n  error_file: <N/A>\n")
    with pytest.raises(slurm.TrainingFailedError, match=r"^Slurm job 5 FAILED on node n2 rank 1 \(exit code 1:0"):
        job._ending(status("FAILED"))


def test_a_job_cancelled_by_someone_else_is_one_line(tmp_path):
    with pytest.raises(slurm.TrainingFailedError) as err:
        ended_job(tmp_path)._ending(status("CANCELLED", "None"))
    assert str(err.value) == "Slurm job 5 was cancelled outside this run (CANCELLED, None)"


def test_a_node_that_does_not_see_the_training_folder_is_named(tmp_path):
    job = ended_job(tmp_path, slurm_5_out=f"{slurm.SHARED_MARK} /shared/run is not visible on node n2\n")
    with pytest.raises(ConfigError, match=r"^launcher\.slurm\.shared_dir: /shared/run is not visible on node n2$"):
        job._ending(status("FAILED"))


def test_a_completed_job_returns_its_result_with_where_it_ran(tmp_path):
    job = ended_job(tmp_path, **{"result.json": '{"status": "completed", "world_size": 2}'})
    result = job._ending(status("COMPLETED", "None"))
    assert result["launcher"] == {"name": "slurm", "job_id": "5", "job_ids": ["5"], "nodes": ["n1", "n2"],
                                  "state": "COMPLETED", "requeues": 0}
    assert result["world_size"] == 2 and result["out_dir"] == str(tmp_path)


def test_a_job_out_of_restarts_after_its_checkpoint_is_preempted(tmp_path):
    job = ended_job(tmp_path, **{"result.json": '{"status": "preempted", "steps": 40}'})
    with pytest.raises(slurm.PreemptedError, match="with no restart left"):
        job._ending(status("TIMEOUT", "TimeLimit"))


def test_a_shared_folder_missing_here_is_refused_before_anything_is_submitted(repo_root, tmp_path):
    cfg = load_config(repo_root / "configs" / "digits.yaml", [f"launcher.slurm.shared_dir={tmp_path}/nosuch"])
    with pytest.raises(ConfigError, match=rf"^launcher\.slurm\.shared_dir: {tmp_path}/nosuch does not exist here"):
        slurm.check_shared_dir(cfg)
    slurm.check_shared_dir(load_config(repo_root / "configs" / "digits.yaml", [f"launcher.slurm.shared_dir={tmp_path}"]))
