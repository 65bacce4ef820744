"""The manifest read from a real git repository."""

import subprocess

import pytest

from core.hashing import sha256_json
from core.manifest import ImageRef, World, build_manifest

pytestmark = pytest.mark.integration

DVC = "outs:\n- md5: abc123.dir\n  size: 10\n  nfiles: 2\n  hash: md5\n  path: data\n"


def test_manifest_records_git_state_and_tags(tmp_path):
    def git(*a):
        subprocess.run(["git", *a], cwd=tmp_path, check=True, capture_output=True)

    git("init", "-q")
    (tmp_path / "data.dvc").write_text(DVC)
    git("add", "data.dvc")
    git("-c", "user.email=t@t", "-c", "user.name=t", "commit", "-qm", "data")
    m = build_manifest(tmp_path, "digits", sha256_json({"a": 1}), "data.dvc", 7, World(1, 2, "gloo"), ImageRef())
    assert len(m.git_sha) == 40 and m.git_dirty is False
    assert m.data.rev == m.git_sha
    tags = m.tags()
    assert tags["data_md5"] == "abc123.dir" and tags["world_size"] == "2" and tags["seed"] == "7"
    assert all(isinstance(v, str) for v in tags.values())
    (tmp_path / "data.dvc").write_text(DVC.replace("abc123", "def456"))
    assert build_manifest(tmp_path, "d", "x", "data.dvc", 0, World(1, 1, "gloo"), ImageRef()).git_dirty is True
