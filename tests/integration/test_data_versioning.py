"""The bundled dataset: a fresh clone pulls it offline from the in-repo DVC remote,
and a fresh export hashes to the version recorded in data/digits.dvc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import yaml

from core.hashing import dvc_dir_md5
from tests.conftest import VENV_BIN

pytestmark = pytest.mark.integration


def test_export_script_reproduces_the_dvc_hash(repo_root):
    out = subprocess.run([sys.executable, "scripts/export_digits.py", "--check"], cwd=repo_root,
                         capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    md5 = yaml.safe_load((repo_root / "data" / "digits.dvc").read_text())["outs"][0]["md5"]
    assert md5 in out.stdout


def test_wine_export_reproduces_the_dvc_hash(repo_root):
    out = subprocess.run([sys.executable, "scripts/export_wine.py", "--check"], cwd=repo_root,
                         capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(repo_root)})
    assert out.returncode == 0, out.stderr
    assert yaml.safe_load((repo_root / "data" / "wine.dvc").read_text())["outs"][0]["md5"] in out.stdout


def test_fresh_clone_pulls_the_data_offline(repo_root, tmp_path):
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo_root, capture_output=True, text=True)
    if head.returncode != 0:
        pytest.skip("not a git checkout with commits")
    clone = tmp_path / "clone"
    subprocess.run(["git", "clone", "-q", str(repo_root), str(clone)], check=True)
    assert not (clone / "data" / "digits").exists()  # data is not in git, only its hash and the DVC remote
    assert (clone / "data" / "digits.dvc").is_file()
    subprocess.run([str(VENV_BIN / "dvc"), "pull", "-q"], cwd=clone, check=True, timeout=120)
    for name in ("train.csv", "test.csv"):
        assert (clone / "data" / "digits" / name).read_bytes() == (repo_root / "data" / "digits" / name).read_bytes()
    wine_md5 = yaml.safe_load((clone / "data" / "wine.dvc").read_text())["outs"][0]["md5"]
    assert dvc_dir_md5(clone / "data" / "wine") == wine_md5  # the shipped wine example too
    status = subprocess.run([str(VENV_BIN / "dvc"), "status", "data/digits.dvc"], cwd=clone,
                            capture_output=True, text=True, check=True)
    assert "up to date" in status.stdout.lower()
    # The pulled data is git-ignored (data/.gitignore), so the clone stays clean.
    porcelain = subprocess.run(["git", "status", "--porcelain"], cwd=clone, capture_output=True, text=True,
                               check=True)
    assert porcelain.stdout == ""
    # A user's own dataset never lands in the bundled remote: the shipped examples name it in
    # their .dvc files, and there is no default remote, so a plain `dvc push` of theirs refuses.
    (clone / "data" / "mine").mkdir()
    (clone / "data" / "mine" / "t.csv").write_text("a,b\n1,2\n")
    subprocess.run([str(VENV_BIN / "dvc"), "add", "-q", "data/mine"], cwd=clone, check=True, timeout=120)
    before = sorted(p.name for p in (clone / "dvc-store").rglob("*"))
    push = subprocess.run([str(VENV_BIN / "dvc"), "push"], cwd=clone, capture_output=True, text=True, timeout=120)
    assert push.returncode != 0 and "no remote specified" in (push.stdout + push.stderr).lower()
    assert sorted(p.name for p in (clone / "dvc-store").rglob("*")) == before
