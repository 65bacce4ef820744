"""A pretrained model folder is data: its DVC md5 joins the run manifest and the model version's
tags, a byte changed in it stops a run until it is tracked again (a changed folder, a changed
manifest), and ``reproduce`` restores the recorded folder or refuses, naming it."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from core.errors import DataUnavailableError, WorkspaceChangedError
from core.manifest import ImageRef, World, build_manifest
from core.versions import cache_dir, checkout_commit
from core.workspace import check_tracked
from flows.init import _dvc_add
from flows.reproduce import restore_inputs
from tests.hf_models import tiny_encoder
from tests.integration.conftest import DVC_BIN, GIT_ID, run
from tests.integration.test_init import project, template  # noqa: F401 - fixtures

pytestmark = pytest.mark.integration

TEXTS = [f"ticket {i} about billing and login and crash number {i % 13}" for i in range(120)]


def commit(proj: Path, message: str) -> str:
    run(["git", "add", "-A"], proj)
    run(["git", *GIT_ID, "commit", "-qm", message], proj)
    return run(["git", "rev-parse", "HEAD"], proj).stdout.strip()


def manifest(proj: Path):
    return build_manifest(proj, "tickets", "cid", "data/tickets.dvc", 0, World(1, 1, "gloo"), ImageRef(),
                          pretrained_dvc_file="models/enc.dvc")


def flip_last_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))


def test_changed_model_folder_changes_the_manifest_and_reproduce_names_it(project, tmp_path):
    (project / "data" / "tickets").mkdir()
    (project / "data" / "tickets" / "all.csv").write_text("body,category\n" + "".join(
        f"{t},{'a' if i % 2 else 'b'}\n" for i, t in enumerate(TEXTS)))
    tiny_encoder(project / "models" / "enc", TEXTS)
    _dvc_add(project, "data/tickets")
    first_md5 = _dvc_add(project, "models/enc")
    first = commit(project, "v1")
    before = manifest(project)
    assert before.pretrained.md5 == first_md5 and before.pretrained.rev == first
    tags = before.tags()
    assert tags["pretrained_md5"] == first_md5 and tags["pretrained_dvc_path"] == "enc"
    assert "pretrained" in before.to_dict()  # logged as manifest.json, read back by reproduce
    check_tracked(project, ["data/tickets.dvc", "models/enc.dvc"])

    weights = project / "models" / "enc" / "model.safetensors"
    original = weights.read_bytes()
    flip_last_byte(weights)
    with pytest.raises(WorkspaceChangedError, match="models/enc"):
        check_tracked(project, ["data/tickets.dvc", "models/enc.dvc"])
    second_md5 = _dvc_add(project, "models/enc")
    commit(project, "v2")
    assert second_md5 != first_md5 and manifest(project).pretrained.md5 == second_md5

    config = {"dataset": {"dvc_file": "data/tickets.dvc"}, "pretrained": {"path": "models/enc"}}
    src = checkout_commit(project, first, tmp_path / "src")
    restore_inputs(src, config, before.to_dict(), cache_dir(project))
    assert (src / "models" / "enc" / "model.safetensors").read_bytes() == original

    # The recorded folder gone from the cache (only the changed one is in use): refused, named.
    run([DVC_BIN, "gc", "-w", "-f", "-q"], project)
    shutil.rmtree(tmp_path / "src")
    src = checkout_commit(project, first, tmp_path / "src")
    with pytest.raises(DataUnavailableError, match=f"pretrained model folder models/enc .*{first_md5}"):
        restore_inputs(src, config, before.to_dict(), cache_dir(project))
