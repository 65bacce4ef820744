import torch

from training.checkpoint import CheckpointManager
from training.distributed import DistContext
from training.parallel import build_strategy

CTX = DistContext(0, 0, 1, None, torch.device("cpu"))


def setup(tmp_path):
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    return CheckpointManager(tmp_path, CTX, build_strategy("single", CTX)), model, opt


def test_save_load_latest_restores_model_optimizer_and_extra(tmp_path):
    ck, model, opt = setup(tmp_path)
    model(torch.ones(3, 4)).sum().backward()
    opt.step()
    ck.save(7, model, opt, {"step": 7, "pos": 3})
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    _, fresh, fresh_opt = setup(tmp_path / "other")
    extra = ck.load_latest(fresh, fresh_opt)
    assert extra == {"step": 7, "pos": 3}
    assert all(torch.equal(saved[k], v) for k, v in fresh.state_dict().items())
    assert fresh_opt.state_dict()["state"][0]["step"] == 1


def test_prune_keeps_the_newest(tmp_path):
    ck, model, opt = setup(tmp_path)
    for step in (10, 20, 30):
        ck.save(step, model, opt, {"step": step})
    ck.wait()
    ck.prune(keep=2)
    assert ck.valid_steps() == [20, 30]
    assert ck.load_latest(model, opt)["step"] == 30


def test_folder_without_marker_is_ignored(tmp_path):
    ck, model, opt = setup(tmp_path)
    ck.save(1, model, opt, {"step": 1})
    ck.save(2, model, opt, {"step": 2})
    ck.wait()
    (tmp_path / "step_00000002" / "COMPLETE").unlink()  # a crash between write and marker
    assert ck.valid_steps() == [1]
    assert ck.load_latest(model, opt)["step"] == 1


def test_corrupt_checkpoint_falls_back_to_older(tmp_path, caplog):
    ck, model, opt = setup(tmp_path)
    ck.save(1, model, opt, {"step": 1})
    ck.save(2, model, opt, {"step": 2})
    ck.wait()
    (tmp_path / "step_00000002" / "__0_0.distcp").write_bytes(b"truncated")
    assert ck.load_latest(model, opt)["step"] == 1
    assert "skipping unreadable checkpoint" in caplog.text


def test_no_checkpoint_means_fresh_start(tmp_path):
    ck, model, opt = setup(tmp_path)
    assert ck.load_latest(model, opt) is None


def test_background_write_is_complete_after_wait_and_records_identity(tmp_path):
    from training.checkpoint import latest_identity

    ck, model, opt = setup(tmp_path)
    ck.save(3, model, opt, {"step": 3, "config_id": "c1", "data_md5": "d1"})
    ck.wait()
    assert latest_identity(tmp_path) == {"step": 3, "config_id": "c1", "data_md5": "d1"}


def test_keep_prunes_after_each_background_write(tmp_path):
    ck, model, opt = setup(tmp_path)
    ck.keep = 1
    for step in (1, 2, 3):
        ck.save(step, model, opt, {"step": step})
    ck.wait()
    assert ck.valid_steps() == [3]


def test_state_and_its_folder_are_on_disk_before_the_marker_and_the_marker_after(tmp_path, monkeypatch):
    # A marker that survives a power loss must never vouch for a state file that did not.
    import os
    from pathlib import Path

    root = tmp_path.resolve()
    tmp, final = root / ".tmp_step_00000001", root / "step_00000001"
    real_fsync, synced = os.fsync, []

    def fsync(fd):
        marked = (tmp / "COMPLETE").exists() or final.exists()
        synced.append((Path(os.readlink(f"/proc/self/fd/{fd}")), marked))
        real_fsync(fd)

    monkeypatch.setattr(os, "fsync", fsync)
    ck, model, opt = setup(root)
    ck.save(1, model, opt, {"step": 1})
    ck.wait()
    before = {path for path, marked in synced if not marked}
    after = {path for path, marked in synced if marked}
    assert {tmp / "__0_0.distcp", tmp / "extra.pt", tmp} <= before
    assert {tmp / "COMPLETE", tmp, root} <= after  # the marker, its folder, then the rename
