import torch

from training.checkpoint import CheckpointManager


def test_save_load_latest_and_prune(tmp_path):
    ck = CheckpointManager(tmp_path, is_writer=True)
    for step in (10, 20, 30):
        ck.save(step, {"step": step, "w": torch.full((2,), float(step))})
    assert ck.load_latest()["step"] == 30
    ck.prune(keep=2)
    assert ck.valid_steps() == [20, 30]


def test_folder_without_marker_is_ignored(tmp_path):
    ck = CheckpointManager(tmp_path, is_writer=True)
    ck.save(1, {"step": 1})
    half = tmp_path / "step_00000002"
    half.mkdir()
    torch.save({"step": 2}, half / "state.pt")  # no COMPLETE marker: a crash mid-write
    assert ck.load_latest()["step"] == 1


def test_corrupt_checkpoint_falls_back_to_older(tmp_path, caplog):
    ck = CheckpointManager(tmp_path, is_writer=True)
    ck.save(1, {"step": 1})
    ck.save(2, {"step": 2})
    (tmp_path / "step_00000002" / "state.pt").write_bytes(b"truncated")
    assert ck.load_latest()["step"] == 1
    assert "skipping unreadable checkpoint" in caplog.text


def test_non_writer_rank_writes_nothing(tmp_path):
    ck = CheckpointManager(tmp_path, is_writer=False)
    assert ck.save(5, {"step": 5}) is None
    assert ck.valid_steps() == []
