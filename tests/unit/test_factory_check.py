"""``model.factory`` as docs/data.md documents it: a module in the repository root imports in every
process (``core.paths.importable_root``), and a factory that is not there fails at config load, in
the CLI, in one line (``tasks.factory.check_factory``), without importing the module."""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest
import yaml

from core.errors import ConfigError
from core.paths import importable_root, python_path_with
from flows.cli import main
from tasks.factory import check_factory

ROOT = Path(__file__).resolve().parents[2]
RESMLP = '''"""A residual MLP (imports torch: must not be imported by the check)."""
import torch.nn as nn
raise RuntimeError("imported by the check")


def make_resmlp(n_in, n_out, width=32):
    return nn.Linear(n_in, n_out)


class ResMLP:
    pass


make_alias = make_resmlp
first, (second, third) = 1, (2, 3)
try:
    from fast_kernels import make_fast
except ImportError:
    def make_fast(n_in, n_out):
        return None
if True:
    from functools import partial as make_partial
'''


@pytest.fixture
def project(tmp_path) -> Path:
    """A repository root holding ``mymodels/resmlp.py`` (a package whose __init__ must not run either)."""
    (tmp_path / ".dvc").mkdir()
    (tmp_path / "mymodels").mkdir()
    (tmp_path / "mymodels" / "__init__.py").write_text("raise RuntimeError('package imported by the check')\n")
    (tmp_path / "mymodels" / "resmlp.py").write_text(RESMLP)
    (tmp_path / "flat.py").write_text("async def make(n_in, n_out):\n    pass\n")
    return tmp_path


@pytest.fixture
def clean_path(monkeypatch):
    """sys.path and PYTHONPATH as they were, whatever a test prepends."""
    monkeypatch.setattr(sys, "path", list(sys.path))
    monkeypatch.delenv("PYTHONPATH", raising=False)


def test_importable_root_puts_the_root_first_once_and_returns_the_childrens_pythonpath(tmp_path, clean_path,
                                                                                      monkeypatch):
    monkeypatch.setenv("PYTHONPATH", f"/opt/extra{os.pathsep}{os.pathsep}{tmp_path}")
    env_before = dict(os.environ)
    value = importable_root(tmp_path)
    assert sys.path[0] == str(tmp_path.resolve())
    assert value == os.pathsep.join([str(tmp_path.resolve()), "/opt/extra"])  # root first, once; no empty entry
    assert importable_root(tmp_path) == value and sys.path.count(str(tmp_path.resolve())) == 1
    assert dict(os.environ) == env_before  # the caller passes the value on; nothing set here
    assert python_path_with(tmp_path, None) == str(tmp_path.resolve())


def test_a_factory_bound_at_the_modules_top_level_passes_without_importing_it(project):
    before = set(sys.modules)
    for name in ("make_resmlp", "ResMLP", "make_alias", "second", "make_fast", "make_partial"):
        check_factory(f"mymodels.resmlp:{name}", project)
    check_factory("flat:make", project)  # async def, a module directly in the root
    assert not {m for m in set(sys.modules) - before if m.startswith(("mymodels", "flat"))}
    assert "mymodels" not in sys.modules


def test_a_folder_without_init_py_in_the_root_is_found_too(project):
    (project / "nets").mkdir()
    (project / "nets" / "deep.py").write_text("def make(n_in, n_out):\n    pass\n")
    check_factory("nets.deep:make", project)
    with pytest.raises(ConfigError) as err:
        check_factory("nets.deep:maek", project)
    assert str(err.value) == "model.factory: nets.deep has no function 'maek' (did you mean make?)"
    with pytest.raises(ConfigError, match=r"^model\.factory: module 'nets\.shallow' not found in the repository root"):
        check_factory("nets.shallow:make", project)


def test_a_misspelt_function_fails_in_one_line_with_did_you_mean(project):
    with pytest.raises(ConfigError) as err:
        check_factory("mymodels.resmlp:make_resmpl", project)
    assert str(err.value) == "model.factory: mymodels.resmlp has no function 'make_resmpl' (did you mean make_resmlp?)"
    with pytest.raises(ConfigError) as err:  # nothing close: what there is
        check_factory("mymodels.resmlp:build", project)
    assert str(err.value) == ("model.factory: mymodels.resmlp has no function 'build' "
                              "(its functions and classes: ResMLP, make_fast, make_resmlp)")


def test_a_missing_module_names_the_root_and_the_installed_packages(project):
    for ref in ("mymodels.resmpl:make_resmlp", "nomodels.resmlp:make_resmlp", "flat.inner:make"):
        with pytest.raises(ConfigError) as err:
            check_factory(ref, project)
        msg = str(err.value)
        module = ref.partition(":")[0]
        assert msg == (f"model.factory: module {module!r} not found in the repository root ({project.resolve()}) "
                       "or the installed packages")
    with pytest.raises(ConfigError, match=r"or the installed packages \(a module name: without \.py\)$"):
        check_factory("mymodels.resmlp.py:make_resmlp", project)


def test_an_installed_module_is_read_and_an_extension_module_is_accepted_once_found(project):
    check_factory("json:loads", project)
    with pytest.raises(ConfigError, match=r"^model\.factory: json has no function 'laods' \(did you mean loads\?\)$"):
        check_factory("json:laods", project)
    ext = next((m for m in ("_ctypes", "_decimal", "_sqlite3", "_json")
                if (s := importlib.util.find_spec(m)) and s.origin and s.origin.endswith(".so")), None)
    if ext is None:
        pytest.skip("no extension module found in this interpreter")
    check_factory(f"{ext}:anything", project)  # no source: found is all that can be checked


def test_a_module_with_a_syntax_error_is_named_with_its_line(project):
    (project / "broken.py").write_text("def make(n_in, n_out)\n    pass\n")
    with pytest.raises(ConfigError, match=r"^model\.factory: .*broken\.py line 1: "):
        check_factory("broken:make", project)


def _project_config(project: Path, factory: str) -> Path:
    """configs/my.yaml in ``project``: the bundled digits config with ``model.factory``."""
    raw = yaml.safe_load((ROOT / "configs" / "digits.yaml").read_text())
    raw["model"] = {"factory": factory, "kwargs": {"width": 16}}
    (project / "configs").mkdir(exist_ok=True)
    path = project / "configs" / "my.yaml"
    path.write_text(yaml.safe_dump(raw, sort_keys=False))
    return path


@pytest.fixture
def no_prefect_no_torchrun(monkeypatch, tmp_path, clean_path):
    """The CLI must fail before Prefect's server or torchrun start; its env changes are given back."""
    import flows.api_server
    import training.launcher

    def started(*a, **k):
        raise AssertionError("started past the config check")

    monkeypatch.setattr(flows.api_server, "start_api", started)
    monkeypatch.setattr(training.launcher, "make_spec", started)
    saved = dict(os.environ)
    monkeypatch.setenv("TRAINFLOW_HOME", str(tmp_path / "home"))
    yield
    os.environ.clear()
    os.environ.update(saved)


@pytest.mark.parametrize("command", ["run", "train"])
def test_a_misspelt_factory_fails_in_the_cli_before_prefect_or_torchrun(command, project, no_prefect_no_torchrun,
                                                                       capsys):
    cfg = _project_config(project, "mymodels.resmlp:make_resmpl")
    argv = [command, "--config", str(cfg)] + (["--out", str(project / "out")] if command == "train" else [])
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err == ("trainflow: error: model.factory: mymodels.resmlp has no function 'make_resmpl' "
                   "(did you mean make_resmlp?)\n")


def test_the_cli_makes_the_configs_repository_root_importable(project, no_prefect_no_torchrun, monkeypatch):
    """A good factory passes the check, and the root is on sys.path for the task's own import check."""
    cfg = _project_config(project, "mymodels.resmlp:make_resmlp")
    monkeypatch.chdir(project.parent)  # the cwd is not the root: the config's repository is
    with pytest.raises(AssertionError, match="started past the config check"):
        main(["run", "--config", str(cfg)])
    assert sys.path[0] == str(project.resolve())


def test_torchruns_workers_get_the_repository_root_first_on_their_path(tmp_path, monkeypatch):
    import subprocess

    from training import launcher

    seen = {}

    class FakePopen:
        def __init__(self, cmd, cwd, env, **kw):
            seen.update(cwd=cwd, env=env)
            self.pid = 0

    monkeypatch.setattr(subprocess, "Popen", FakePopen)
    monkeypatch.setenv("PYTHONPATH", "/opt/extra")
    spec = launcher.JobSpec(config_path=str(tmp_path / "c.yaml"), out_dir=str(tmp_path / "out"), root=str(tmp_path),
                            data_md5="x", nproc_per_node=1, env={"A": "1"})
    (tmp_path / "out").mkdir()
    launcher.start_job(spec)
    assert seen["env"]["PYTHONPATH"] == os.pathsep.join([str(tmp_path.resolve()), "/opt/extra"])
    assert seen["env"]["A"] == "1" and "PYTHONPATH" not in spec.env  # job.json names no host path
