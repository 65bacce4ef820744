"""Write docs/configuration.md, the configuration reference, from the pydantic models.

    python scripts/config_reference.py            # rewrite docs/configuration.md
    python scripts/config_reference.py --check    # exit 1 when it differs from what the models say

Every key of ``core.config.PipelineConfig`` becomes one row: key path, type, default, constraints
and description. The description is the comment above the field in ``core/config.py`` (read from
the source; a task's keys from its options model's, e.g. ``tasks/lm_options.py``: a
``Field(description=...)`` would change what a reviewer reads), else a line from
``NOTES``; each section opens with its class docstring. ``tests/unit/test_docs.py`` compares the
page with a fresh render.
"""

from __future__ import annotations

import argparse
import ast
import inspect
import io
import json
import sys
import tokenize
import types
import typing
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pydantic import BaseModel  # noqa: E402
from pydantic.fields import FieldInfo  # noqa: E402

import tasks  # noqa: E402,F401 - the tasks' options join the schema
from core import config as cfg  # noqa: E402

OUT = ROOT / "docs" / "configuration.md"

# Defaults computed from other keys (a default_factory): what they come to, in words.
DERIVED = {
    "dataset.dvc_file": "`<dataset.path>.dvc`",
    "pretrained.dvc_file": "`<pretrained.path>.dvc`",
    "registry": "from `name`",
    "registry.model_name": "`<name>`",
    "registry.experiment": "`trainflow-<name>`",
}

# A line for keys that have no comment in core/config.py (their section's docstring may say more).
NOTES = {
    "seed": "Seeds the split of one `dataset.file`, the initial weights, the epochs' sample order and dropout.",
    "dataset.test_file": "Test split file inside `dataset.path` (null: `test.csv`).",
    "dataset.file": "One file split into train and test with `test_fraction` and the seed.",
    "dataset.label": "The label (target) column.",
    "dataset.features": "The feature columns (null: every column but the label and `exclude`).",
    "dataset.exclude": "Columns left out of the features (with `features: null`).",
    "dataset.text": "A text corpus for the `lm` task (null for a table).",
    "dataset.text.train_file": "JSON Lines file of training documents inside `dataset.path`.",
    "dataset.text.eval_file": "JSON Lines file of the documents the evaluation gate scores.",
    "dataset.text.holdout_fraction": "Share of the train documents (whole files) held out for per-epoch validation.",
    "dataset.text.expectations.train_docs": "Number of train documents must lie in this range.",
    "dataset.text.expectations.eval_docs": "Number of eval documents must lie in this range.",
    "model.kind": "The built-in network (null: the task's own).",
    "model.factory": "`module:function` of your own network, called as `function(n_in, n_out, **kwargs)`.",
    "model.kwargs": "Keyword arguments passed to `model.factory` after `(n_in, n_out)`.",
    "model.channels": "cnn: channels of its two convolutions.",
    "model.hidden": "Width of the hidden layers (tabular, mlp, cnn head).",
    "model.dropout": "Dropout probability.",
    "model.frequencies": "Frequencies per numeric column of the periodic embeddings.",
    "model.d_model": "lm: width of the transformer.",
    "model.n_layers": "lm: transformer blocks.",
    "model.n_heads": "lm: attention heads (must divide `d_model`).",
    "model.d_ff": "lm: width of each block's MLP.",
    "training.parallel": "Model-parallel degrees (tp, pp, hybrid).",
    "training.epochs": "Passes over the train split.",
    "training.grad_accum": "Micro-batches accumulated per optimizer step.",
    "training.optimizer": "The optimizer.",
    "training.lr": "Learning rate at `base_batch` (scaled by `lr_scaling`).",
    "training.weight_decay": "The optimizer's weight decay.",
    "training.base_batch": "The global batch the LR is tuned for.",
    "training.warmup_epochs": "Linear LR warm-up, in epochs, before the cosine decay.",
    "training.grad_clip": "Gradient-norm clipping (null: none).",
    "training.threads_per_worker": "Torch threads per CPU worker process.",
    "training.backend": "The process-group backend (auto: nccl on CUDA, gloo on CPU).",
    "training.rendezvous": "c10d rendezvous timings (several nodes, elastic `--nnodes MIN:MAX`).",
    "training.collective_timeout_s": "A collective that waits longer fails the job (a rank raised or hangs).",
    "training.checkpoint_every_epochs": "Checkpoint at the end of every N epochs.",
    "training.loader": "How batches reach the model (`loader: auto` is short for `{kind: auto}`).",
    "training.loader.kind": "memory, dataloader, stream or auto (see the section's text).",
    "training.loader.num_workers": "dataloader: worker processes.",
    "training.loader.pin_memory": "dataloader: pinned host memory.",
    "training.deterministic": "Deterministic algorithms: a resumed run ends bitwise equal to an uninterrupted one.",
    "training.early_stopping": "Early stopping (off while `patience` is null).",
    "training.early_stopping.metric": "The per-epoch validation metric watched, in its direction (loss and log "
                                      "loss: lower is better; the others higher). Beyond loss and accuracy, the "
                                      "task scores the whole validation split's outputs (a classifier's).",
    "training.early_stopping.patience": "Epochs without improvement before stopping (null: off).",
    "training.early_stopping.min_delta": "The least change that counts as an improvement.",
    "training.log_every_steps": "Step metrics (perf/*) are gathered and logged every N steps.",
    "training.parallel.tp": "Tensor-parallel degree.",
    "training.parallel.pp": "Pipeline stages.",
    "training.parallel.microbatches": "Pipeline micro-batches per batch.",
    "training.parallel.schedule": "Pipeline schedule.",
    "training.compile.enabled": "Compile the model for training and evaluation.",
    "training.compile.mode": "`torch.compile`'s mode.",
    "training.compile.backend": "`torch.compile`'s backend.",
    "gates.thresholds": "Metric name -> bound, each in the metric's direction.",
    "gates.baseline_margin": "Beat the trivial baseline on the primary metric by at least this (null: no baseline gate).",
    "gates.max_regression": "Most the candidate may trail the champion in each compared metric.",
    "registry.promotion": "auto: move `@champion` to a candidate that beats it; manual: `@challenger` only.",
    "retrain.policy": "any_change: train on every new data version; drift: only on drifted data.",
    "retrain.psi_threshold": "A feature drifts when its PSI is above this.",
    "retrain.ks_pvalue": "… or its two-sample KS p-value is below this.",
    "retrain.max_drifted_fraction": "The dataset drifts when more than this share of features drift.",
}

_OPS = {"gt": ">", "ge": "≥", "lt": "<", "le": "≤"}


def type_text(annotation: Any) -> str:
    """A field's type in the words of YAML: ``int | null``, ``"fp32" | "bf16"``, ``[int, int]``."""
    if annotation is type(None):
        return "null"
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return "section"
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is Literal:
        return " | ".join(f'"{a}"' if isinstance(a, str) else str(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        parts = [type_text(a) for a in args if a is not type(None)]
        return " | ".join([*parts, "null"] if type(None) in args else parts)
    if origin is tuple:
        return "[" + ", ".join(type_text(a) for a in args) + "]"
    if origin is list:
        return f"list of {type_text(args[0])}"
    if origin is dict:
        return f"mapping {type_text(args[0])} → {type_text(args[1])}"
    if annotation is Any:
        return "any"
    return {str: "str", int: "int", float: "float", bool: "bool"}.get(annotation, getattr(annotation, "__name__", str(annotation)))


def default_text(key: str, field: FieldInfo) -> str:
    if key in DERIVED:
        return DERIVED[key]
    if field.default_factory is not None:
        raise SystemExit(f"scripts/config_reference.py: {key} has a computed default; say what it is in DERIVED")
    if field.is_required():
        return "**required**"
    value = field.default
    if isinstance(value, BaseModel):
        return "(the keys below)"
    if value is None or isinstance(value, (bool, list, tuple, dict)):
        return f"`{json.dumps(value)}`"  # YAML's null, true, [..]
    return f"`{value}`"


def constraints_text(field: FieldInfo) -> str:
    parts = []
    for meta in field.metadata:
        for attr, op in _OPS.items():
            if getattr(meta, attr, None) is not None:
                v = getattr(meta, attr)
                parts.append(f"{op} {int(v) if isinstance(v, float) and v.is_integer() else v}")
        if getattr(meta, "min_length", None):
            parts.append("not empty")
        if getattr(meta, "pattern", None):
            parts.append(f"matches `{meta.pattern}`")
    return ", ".join(parts)


def field_comments(model: type[BaseModel]) -> dict[str, str]:
    """Field name -> the ``#`` comment lines written right above it in the class body, joined."""
    source = inspect.getsource(model)
    comments = {tok.start[0]: tok.string.lstrip("#").strip()
                for tok in tokenize.generate_tokens(io.StringIO(source).readline) if tok.type == tokenize.COMMENT}
    lines = source.splitlines()
    out = {}
    for stmt in ast.parse(source).body[0].body:
        if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
            above, n = [], stmt.lineno - 1
            while n in comments and lines[n - 1].lstrip().startswith("#"):
                above.insert(0, comments[n])
                n -= 1
            if above:
                out[stmt.target.id] = " ".join(above)
    return out


def _md(text: str) -> str:
    """reST's ``code`` as markdown's `code`."""
    return text.replace("``", "`")


def walk(model: type[BaseModel], prefix: str = "") -> list[dict]:
    """Every key below ``model`` in order: {key, type, default, constraints, description, model}."""
    rows, comments = [], field_comments(model)
    for options in cfg.options_of(model):  # a task's keys: commented in its own module
        comments.update(field_comments(options))
    for name, field in model.model_fields.items():
        key = f"{prefix}{name}"
        sub = cfg._models_in(field.annotation)
        rows.append({"key": key, "type": type_text(field.annotation), "default": default_text(key, field),
                     "constraints": constraints_text(field), "description": comments.get(name) or NOTES.get(key, ""),
                     "model": sub[0] if sub else None})
        if sub:
            rows += walk(sub[0], key + ".")
    return rows


def _layout_note(key: str) -> str:
    parts = key.split(".")
    if parts[0] in cfg.NOT_IN_CONFIG_ID:
        return " *Not in the config id.*"
    if len(parts) >= 2 and parts[0] == "training" and parts[1] in cfg.LAYOUT_KEYS:
        return " *Layout key: may change when a checkpoint resumes.*" if len(parts) == 2 else ""
    return ""


def render() -> str:
    """The whole page as markdown."""
    rows = walk(cfg.PipelineConfig)
    out = [
        "# Configuration reference",
        "",
        "<!-- generated by scripts/config_reference.py from core/config.py; do not edit -->",
        "",
        "One YAML file in `configs/` is one runnable pipeline; it is read into the typed models of",
        "`core/config.py`, which refuse an unknown key or a bad value at load with the key path",
        "(`training.lr: must be > 0, got -1`). Only `name` and `dataset.path` are required. A task's own",
        "keys (`dataset.images`, `model.d_model`, `pretrained` ...) come from its options model in `tasks/`.",
        "A config may start from another (`extends: base.yaml`, relative to its folder: mappings",
        "merge key by key, other values replace), and `--set KEY.PATH=VALUE` applies on top.",
        "The canonical JSON of the merged config hashes to the config id (the `retrain` section is",
        "left out of it); the *layout keys* of `training` are also left out of the resume id, so a",
        "checkpoint resumes with them changed.",
        "",
        "Types are written as in YAML: `null` is YAML's null, `\"a\" | \"b\"` one of those strings,",
        "`[int, int]` a list of two.",
        "",
    ]
    sections = [("", cfg.PipelineConfig, [r for r in rows if "." not in r["key"]])]
    for r in rows:
        if r["model"] is not None:
            depth = r["key"].count(".") + 1
            sections.append((r["key"], r["model"], [x for x in rows if x["key"].startswith(r["key"] + ".")
                                                    and x["key"].count(".") == depth]))
    for key, model, members in sections:
        out += [f"## `{key}`" if key else "## Top level", ""]
        doc = inspect.getdoc(model) if model.__doc__ else ""
        out += [line for paragraph in doc.split("\n\n") if paragraph.strip()
                for line in (_md(" ".join(paragraph.split())), "")]
        out += ["| key | type | default | constraint | description |", "|---|---|---|---|---|"]
        for r in members:
            shown = f"[`{r['key']}`](#{r['key'].replace('.', '')})" if r["model"] is not None else f"`{r['key']}`"
            cells = [r["type"], r["default"], r["constraints"], r["description"] + _layout_note(r["key"])]
            out.append(f"| {shown} | " + " | ".join(_md(c).replace("|", "\\|") for c in cells) + " |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--check", action="store_true", help="exit 1 when docs/configuration.md is out of date")
    args = ap.parse_args(argv)
    text = render()
    if args.check:
        if not OUT.is_file() or OUT.read_text() != text:
            print(f"{OUT.relative_to(ROOT)} is out of date: run python scripts/config_reference.py", file=sys.stderr)
            return 1
        return 0
    OUT.write_text(text)
    print(f"wrote {OUT.relative_to(ROOT)}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
