"""The manifest and recorded versions read with real git."""

import subprocess

import pytest

from core.hashing import sha256_json
from core.manifest import ImageRef, World, build_manifest, read_dvc_file
from tests.conftest import ROOT

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


def test_dvc_file_gives_md5_path_and_rev(tmp_path):
    (tmp_path / "data.dvc").write_text(DVC)
    ref = read_dvc_file(tmp_path, "data.dvc")
    assert (ref.md5, ref.dvc_path) == ("abc123.dir", "data")
    assert ref.rev == "uncommitted"  # not a git repository


def test_a_recorded_git_sha_that_is_not_hex_is_refused_before_git_runs_it(tmp_path):
    from core.versions import SourceUnavailableError, checkout_commit, code_changes

    with pytest.raises(SourceUnavailableError, match="git_sha: must be a hex git commit sha"):
        checkout_commit(ROOT, "--upload-pack=touch x", tmp_path / "clone")
    assert code_changes(ROOT, "HEAD~1..") is None
    assert not (tmp_path / "clone").exists()
