"""What each room loads when imported, checked in a fresh interpreter (pytest's own is polluted).
(What each room may import, read from the source: tests/unit/test_boundaries.py.)"""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = pytest.mark.integration


def loaded_after(imports: str) -> set[str]:
    code = f"import sys; {imports}; print(' '.join(sorted(m.split('.')[0] for m in sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    return set(out.stdout.split())


def test_core_imports_no_torch_mlflow_or_prefect():
    mods = loaded_after("import core.config, core.manifest, core.paths, core.env, core.hashing, core.errors, "
                        "core.lock, core.metrics_file")
    assert not mods & {"torch", "mlflow", "prefect", "great_expectations"}


def test_training_runs_without_prefect_and_mlflow():
    mods = loaded_after("import training.worker, training.launcher, training.trainer")
    assert "torch" in mods
    assert not mods & {"prefect", "mlflow", "great_expectations"}


def test_importing_the_flow_touches_no_backend(tmp_path):
    # Importing the flow module must not create MLflow or Prefect state anywhere.
    code = ("import os; os.chdir(%r); import flows.pipeline, flows.cli, flows.k8s; "
            "print(sorted(os.listdir('.')))") % str(tmp_path)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_validation_and_registry_defer_heavy_imports():
    mods = loaded_after("import validation.suite, validation.report, registry.store, registry.models, "
                        "registry.values, registry.relay")
    assert not mods & {"great_expectations", "pandas", "mlflow", "torch", "numpy"}
