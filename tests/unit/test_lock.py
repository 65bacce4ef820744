"""The committed lock files match pyproject.toml, and the check catches every kind of drift."""

from __future__ import annotations

import shutil

import pytest

from core.lock import (
    DEV_EXTRAS, DEV_LOCK, HEADER_KEY, LOCK_FILES, PYTHONS, check_dev_lock, check_lock, closure_problems,
    inputs_sha256, installed_metadata, parse_lock,
)


@pytest.fixture
def project(tmp_path, repo_root):
    """A copy of pyproject.toml and both locks, to edit."""
    shutil.copy(repo_root / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "requirements").mkdir()
    for rel in [*LOCK_FILES.values(), DEV_LOCK]:
        shutil.copy(repo_root / rel, tmp_path / rel)
    return tmp_path


def _edit(path, old, new):
    text = path.read_text()
    assert old in text, f"{old!r} not in {path}"
    path.write_text(text.replace(old, new, 1))


@pytest.mark.parametrize("variant", sorted(LOCK_FILES))
def test_committed_lock_matches_pyproject(repo_root, variant):
    assert check_lock(repo_root / "pyproject.toml", repo_root / LOCK_FILES[variant]) == []


def test_every_pin_is_hashed_and_torch_differs_only_in_build(repo_root):
    cuda = parse_lock(repo_root / LOCK_FILES["cuda"])
    cpu = parse_lock(repo_root / LOCK_FILES["cpu"])
    for lock in (cuda, cpu):
        assert lock.pins and all(lock.hashes[name] for name in lock.pins)
        assert lock.header[HEADER_KEY] == inputs_sha256(repo_root / "pyproject.toml")
    assert cpu.pins["torch"] == cuda.pins["torch"] + "+cpu"
    assert not [n for n in cpu.pins if n.startswith(("nvidia-", "cuda-", "triton"))]
    assert [n for n in cuda.pins if n.startswith("nvidia-")], "the CUDA lock carries torch's nvidia-* wheels"
    # Everything else is the same resolution in both.
    same = {n: v for n, v in cpu.pins.items() if n != "torch"}
    assert {n: cuda.pins[n] for n in same} == same
    assert "psycopg2-binary" in cuda.pins


def test_changed_bound_fails_with_hash_mismatch(project):
    _edit(project / "pyproject.toml", '"rich>=15,<16"', '"rich>=15,<17"')
    problems = check_lock(project / "pyproject.toml", project / LOCK_FILES["cuda"])
    assert any(HEADER_KEY in p and "changed since the lock" in p for p in problems)
    assert any("make lock" in p for p in problems)


def test_new_dependency_is_reported_unpinned(project):
    _edit(project / "pyproject.toml", '"PyYAML>=6,<7",', '"PyYAML>=6,<7",\n    "docopt>=0.6,<1",')
    problems = check_lock(project / "pyproject.toml", project / LOCK_FILES["cpu"])
    assert any("docopt" in p and "not pinned" in p for p in problems)


def test_pin_outside_range_is_reported(project):
    _edit(project / "pyproject.toml", '"torch==2.13.0"', '"torch==2.14.1"')
    problems = check_lock(project / "pyproject.toml", project / LOCK_FILES["cuda"])
    assert any("torch==2.13.0 is outside 'torch==2.14.1'" in p for p in problems)


def test_pin_without_hash_is_reported(project):
    lock = project / LOCK_FILES["cpu"]
    lines = lock.read_text().splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("rich=="))
    lines[i] = lines[i].rstrip(" \\")
    del lines[i + 1]  # its single --hash line
    lock.write_text("\n".join(lines) + "\n")
    problems = check_lock(project / "pyproject.toml", lock)
    assert any(p.endswith("has no --hash") and "rich==" in p for p in problems)


def test_reformatting_a_requirement_keeps_the_lock_in_sync(project):
    # The recorded hash is over normalised requirements, not the file's bytes.
    _edit(project / "pyproject.toml", '"pandas>=3.1,<3.2"', '"pandas <3.2, >=3.1"')
    assert check_lock(project / "pyproject.toml", project / LOCK_FILES["cuda"]) == []


def test_missing_lock_names_the_fix(project):
    (project / LOCK_FILES["cuda"]).unlink()
    assert check_lock(project / "pyproject.toml", project / LOCK_FILES["cuda"]) == [
        f"{project / LOCK_FILES['cuda']}: missing; run `make lock`"]


@pytest.mark.parametrize("variant", sorted(LOCK_FILES))
def test_dev_lock_adds_hashed_test_tools_on_top_of_each_runtime_lock(repo_root, variant):
    base_path = repo_root / LOCK_FILES[variant]
    assert check_dev_lock(repo_root / "pyproject.toml", repo_root / DEV_LOCK, base_path) == []
    dev, base = parse_lock(repo_root / DEV_LOCK), parse_lock(base_path)
    assert dev.header[HEADER_KEY] == inputs_sha256(repo_root / "pyproject.toml", DEV_EXTRAS)
    assert all(dev.hashes[name] for name in dev.pins)
    # The extras' own packages and what only they pull in (MLflow's auth app: Flask-WTF, WTForms).
    assert {"pytest", "kubernetes-validate", "check-jsonschema", "flask-wtf", "wtforms", "iniconfig"} <= set(dev.pins)
    assert not set(dev.pins) & set(base.pins), "the dev lock repins a runtime package"


def test_changed_dev_extra_fails_the_dev_lock_only(project):
    _edit(project / "pyproject.toml", '"pytest>=9.2,<9.3"', '"pytest>=9.2,<9.4"')
    base = project / LOCK_FILES["cpu"]
    assert check_lock(project / "pyproject.toml", base) == []  # runtime locks hash runtime inputs only
    problems = check_dev_lock(project / "pyproject.toml", project / DEV_LOCK, base)
    assert any(HEADER_KEY in p and "extras dev, team" in p for p in problems)


def test_dev_lock_problems_are_named(project):
    _edit(project / "pyproject.toml", '"pytest>=9.2,<9.3"', '"pytest>=9.3,<9.4"')
    _edit(project / "pyproject.toml", '"dockerfile-parse>=2.0,<2.1",', '"dockerfile-parse>=2.0,<2.1",\n    "hypothesis>=6",')
    dev = project / DEV_LOCK
    dev.write_text(dev.read_text() + f"rich==15.0.0 \\\n    --hash=sha256:{'0' * 64}\n")
    problems = check_dev_lock(project / "pyproject.toml", dev, project / LOCK_FILES["cpu"])
    assert any("pytest==9.2.0 is outside 'pytest>=9.3,<9.4'" in p for p in problems)
    assert any("hypothesis" in p and "not pinned" in p for p in problems)
    assert any("rich==15.0.0 repins" in p for p in problems)
    assert problems[-1].startswith("regenerate with `make lock`")


@pytest.fixture(scope="module")
def metadata():
    return installed_metadata()


@pytest.mark.parametrize("variant", sorted(LOCK_FILES))
def test_locks_hold_on_every_cpython_311_release(repo_root, metadata, variant):
    locks = [parse_lock(repo_root / LOCK_FILES[variant]), parse_lock(repo_root / DEV_LOCK)]
    assert "3.11.2" in PYTHONS  # Debian bookworm's: the registry-free image's Python
    problems, checked = closure_problems(locks, PYTHONS, metadata)
    assert problems == []
    # The installed environment is the locked one: nearly every pin is checked on every release.
    assert checked > 200 * len(PYTHONS)


def test_bookworm_python_takes_the_conditional_pin_and_later_releases_skip_it(repo_root):
    cpu = parse_lock(repo_root / LOCK_FILES["cpu"])
    assert "python_full_version" in cpu.markers["async-timeout"]
    assert "async-timeout" in cpu.pins_for("3.11.2")
    assert "async-timeout" not in cpu.pins_for("3.11.7")
    # Unconditional pins are the same for every release.
    assert set(cpu.pins_for("3.11.7")) == set(cpu.pins) - set(cpu.markers)


def test_a_lock_resolved_on_one_release_only_fails_for_the_others(project, metadata):
    """The lock as first resolved on 3.11.7 (no async-timeout) failed `pip check` on bookworm's 3.11.2."""
    path = project / LOCK_FILES["cpu"]
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("async-timeout=="))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    path.write_text("\n".join(lines[:start] + lines[end:]) + "\n")
    locks = [parse_lock(path), parse_lock(project / DEV_LOCK)]
    problems, _ = closure_problems(locks, ("3.11.2",), metadata)
    assert len(problems) == 1 and "redis==" in problems[0] and "async-timeout" in problems[0], problems
    assert "3.11.2" in problems[0]
    assert closure_problems(locks, ("3.11.7",), metadata)[0] == []


def test_a_pin_outside_a_requirers_range_is_named(project, metadata):
    path = project / LOCK_FILES["cpu"]
    lock = parse_lock(path)
    _edit(path, f"async-timeout=={lock.pins['async-timeout']} ", "async-timeout==3.0.0 ")
    problems, _ = closure_problems([parse_lock(path), parse_lock(project / DEV_LOCK)], ("3.11.2",), metadata)
    # redis (installed at its pin, so checked) requires async-timeout>=4.0.3 below 3.11.3.
    assert any("async-timeout" in p and "pinned 3.0.0" in p for p in problems), problems


def test_lock_script_writes_markers_that_parse_back(tmp_path, repo_root):
    from tests.conftest import load_script

    lock = load_script("lock")
    packages = [{"name": "redis", "version": "8.1.0", "marker": None, "hashes": ["a" * 64]},
                {"name": "async-timeout", "version": "5.0.1", "marker": 'python_full_version < "3.11.3"',
                 "hashes": ["b" * 64, "c" * 64]}]
    path = tmp_path / "lock.txt"
    path.write_text(lock.to_requirements(packages, "cpu", "0" * 64))
    parsed = parse_lock(path)
    assert parsed.pins == {"redis": "8.1.0", "async-timeout": "5.0.1"}
    assert parsed.markers == {"async-timeout": 'python_full_version < "3.11.3"'}
    assert parsed.hashes["async-timeout"] == ["sha256:" + "b" * 64, "sha256:" + "c" * 64]
    assert parsed.pins_for("3.11.2") == parsed.pins and parsed.pins_for("3.11.9") == {"redis": "8.1.0"}
    # --keep-pins reads the unconditional pins back in the same shape.
    assert lock.lock_packages(path) == packages[:1]
