"""What ``trainflow init --pretrained`` decides from a model folder and the user's text: the task
(``text_classification`` for a table with a label, ``causal_lm`` for JSON Lines), the text column,
the token lengths measured with the model's own tokenizer, ``pretrained.max_length``, the
fine-tuning settings, and the reviewed expectations (``core.text_expectations``). Each choice
comes with its reason. Torch-free except what the tokenizer imports.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from core.errors import TrainflowError
from core.text_expectations import TextExpectations

# Rows whose every column is profiled to pick the text column; the chosen one is profiled whole.
PICK_SAMPLE = 2000
# The most tokens one optimizer step of fine-tuning takes on a rank (batch x max_length).
TOKENS_PER_STEP = 8192
# A small set's global batch keeps an epoch at least this many optimizer steps long.
STEPS_PER_EPOCH = 64
LENGTH_MARGIN = 0.1
MAX_LABELS = 1000


class TextInitError(TrainflowError):
    """The text or the model folder cannot be set up as asked; the message names the file/column/row."""


@dataclass
class TextProfile:
    """What init learnt from the text: lengths (p50/p99 tokens), the max_length chosen, the rows it
    truncates, the classes and their shares (classification) or the JSONL shape."""

    task: str
    splits: dict[str, int]
    p50: int
    p99: int
    max_length: int
    truncated: int
    lines: list[str] = field(default_factory=list)
    classes: list[Any] | None = None
    shares: dict[str, float] | None = None
    shape: str | None = None
    pretrained: dict = field(default_factory=dict)
    training: dict = field(default_factory=dict)
    expectations: TextExpectations | None = None

    def dataset_keys(self, dataset: dict) -> dict:
        """``dataset`` (init's split keys: ``train_file`` + ``test_file``) as this task reads them: causal_lm
        takes its files from the corpus keys it shares with the lm task (``text.train_file``, ``eval_file``)."""
        if self.task != "causal_lm":
            return dataset
        rest = {k: v for k, v in dataset.items() if k not in ("train_file", "test_file")}
        return {**rest, "text": {"train_file": dataset["train_file"], "eval_file": dataset["test_file"]}}


# -------------------------------------------------------------------------------- reading
def read_jsonl(path: Path) -> list[dict]:
    """The records of a JSON Lines file (blank lines skipped); TextInitError naming the line."""
    records = []
    try:
        raw = Path(path).read_bytes()
    except OSError as exc:
        raise TextInitError(f"{path}: cannot be read ({exc.strerror or exc})") from None
    for number, line in enumerate(raw.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            obj = json.loads(line)
        except ValueError as exc:
            raise TextInitError(f"{path.name} line {number}: not JSON ({exc})") from None
        if not isinstance(obj, dict):
            raise TextInitError(f"{path.name} line {number}: not a JSON object")
        records.append(obj)
    if not records:
        raise TextInitError(f"{path.name}: no records")
    return records


def jsonl_shape(records: list[dict], where: str) -> tuple[list[str], str]:
    """(text columns, why): ``text``, or ``prompt`` + ``completion``; TextInitError naming the first
    record that has neither or a value that is not a string."""
    first = records[0]
    if isinstance(first.get("prompt"), str) and isinstance(first.get("completion"), str):
        columns, why = ["prompt", "completion"], "prompt + completion pairs: the loss is on the completion's tokens"
    elif isinstance(first.get("text"), str):
        columns, why = ["text"], "text records: packed into max_length sequences"
    else:
        raise TextInitError(f"{where} line 1: a record needs a string 'text', or 'prompt' and 'completion'; "
                            f"it has {sorted(first)[:8]}")
    for i, rec in enumerate(records, start=1):
        bad = [c for c in columns if not isinstance(rec.get(c), str)]
        if bad:
            raise TextInitError(f"{where} record {i}: {bad[0]!r} is {type(rec.get(bad[0])).__name__}, not a string "
                                f"(every record has the shape of the first: {' + '.join(columns)})")
    return columns, why


def token_lengths(tokenizer, texts: list[str]) -> list[int]:
    """Each text's length in the tokenizer's tokens, special tokens included, never truncated."""
    out: list[int] = []
    for start in range(0, len(texts), 1024):
        enc = tokenizer(texts[start:start + 1024], add_special_tokens=True, truncation=False)["input_ids"]
        out += [len(ids) for ids in enc]
    return out


def percentile(values: list[int], q: float) -> int:
    import numpy as np

    return int(math.ceil(float(np.percentile(np.asarray(values, dtype=np.float64), q)))) if values else 0


def pick_text_column(frame, label: str | None, tokenizer, given: str | None, where: str) -> tuple[str, str]:
    """(column, why): ``given`` when named, else the string column with the longest mean token length
    (the free text; a short code or category is a few tokens). TextInitError naming what is wrong."""
    import pandas as pd

    names = [str(c) for c in frame.columns]
    if given is not None:
        if given not in names:
            import difflib

            close = difflib.get_close_matches(given, names, n=1)
            raise TextInitError(f"--text-column {given!r} is not a column of {where}"
                                + (f" (did you mean {close[0]!r}?)" if close else "") + f"; its columns are {names}")
        if given == label:
            raise TextInitError(f"--text-column {given!r} is the label column")
        return given, "named with --text-column"
    texts = [c for c in names if c != label and (pd.api.types.is_object_dtype(frame[c].dtype)
                                                 or pd.api.types.is_string_dtype(frame[c].dtype))]
    if not texts:
        raise TextInitError(f"{where}: no text column besides the label {label!r} (columns {names}); "
                            "text_classification learns from one free-text column")
    sample = frame.head(PICK_SAMPLE)
    means = {}
    for c in texts:
        values = [v for v in sample[c].tolist() if isinstance(v, str)]
        means[c] = sum(token_lengths(tokenizer, values)) / len(values) if values else 0.0
    best = max(texts, key=lambda c: means[c])
    if len(texts) == 1:
        return best, "the one text column"
    others = ", ".join(f"{c} {means[c]:.1f}" for c in texts if c != best)
    return best, (f"the longest text: {means[best]:.1f} tokens a row on average (others: {others}); "
                  "--text-column picks another")


# -------------------------------------------------------------------------------- choices
def choose_max_length(lengths: list[int], positions: int | None) -> tuple[int, int, str]:
    """(max_length, rows truncated, why): the p99 token length, rounded up to a multiple of 8 (GPU
    kernels like it), capped by the model's positions."""
    p99 = percentile(lengths, 99)
    length = max(8, int(math.ceil(p99 / 8) * 8))
    why = f"p99 of the token lengths ({p99}) rounded up to a multiple of 8"
    if positions is not None and length > positions:
        length, why = positions, f"the model's {positions} positions (p99 is {p99} tokens)"
    truncated = sum(1 for n in lengths if n > length)
    return length, truncated, why


def pow2_at_most(value: float) -> int:
    return 2 ** int(math.floor(math.log2(max(value, 1.0))))


def ranks_here() -> int:
    """The ranks a run started on this host gets unless told otherwise: one a CUDA device, else
    ``training.cpu_workers``' default."""
    import torch

    from core.config import TrainingConfig

    return torch.cuda.device_count() or int(TrainingConfig.model_fields["cpu_workers"].default)


def fine_tune_choices(task: str, train_rows: int, max_length: int, lora: bool,
                      ranks: int = 1) -> tuple[dict, list[str]]:
    """(``training`` keys, one line each with its reason) for fine-tuning a pretrained model on
    ``ranks`` ranks. The global batch is the usual 16 or more, as large as keeps an epoch
    ``STEPS_PER_EPOCH`` steps long (a set of a few thousand rows gets 32: more rows a step would leave
    too few updates to fine-tune), at most an eighth of a tiny set; a rank takes its share, at most
    about ``TOKENS_PER_STEP`` tokens."""
    cap = int(min(64, max(8, pow2_at_most(TOKENS_PER_STEP / max_length))))
    total = min(max(16, pow2_at_most(train_rows / STEPS_PER_EPOCH)), pow2_at_most(max(train_rows, 1) / 8))
    batch = int(max(1, min(cap, total // ranks)))
    epochs = (5 if task == "text_classification" else 3) if train_rows < 5000 else 2 if train_rows < 50000 else 1
    if lora:
        lr, lr_why = 1e-4, "LoRA's adapters start from zero and are few: a larger rate than full fine-tuning"
    elif task == "causal_lm":
        lr, lr_why = 2e-5, "full fine-tuning of a decoder: a small rate keeps what it learnt in pretraining"
    elif train_rows < 10000:
        lr, lr_why = 5e-5, "full fine-tuning of an encoder on under 10,000 rows: the top of the usual 2e-5..5e-5"
    else:
        lr, lr_why = 3e-5, "full fine-tuning of an encoder: inside the usual 2e-5..5e-5"
    warmup = round(0.1 * epochs, 3)
    training = {"epochs": epochs, "batch_size": batch, "base_batch": batch, "lr": lr, "lr_scaling": "none",
                "warmup_epochs": warmup, "weight_decay": 0.01, "grad_clip": 1.0}
    kept = ""
    if task == "text_classification":  # its validation split picks the epoch kept, so spare epochs cost time only
        training["early_stopping"] = {"metric": "val_loss", "patience": 2, "restore_best": True}
        kept = "; the best validation epoch is kept, stopping after 2 without progress (training.early_stopping)"
    why = (f"at most about {TOKENS_PER_STEP:,} tokens a rank at max_length {max_length}" if cap < total // ranks else
           f"at most an eighth of the {train_rows:,} train rows" if total < 16 else
           "the usual 16 rows a step for a small set" if train_rows < 16 * STEPS_PER_EPOCH else
           f"{STEPS_PER_EPOCH}+ optimizer steps an epoch over {train_rows:,} rows")
    lines = [
        f"batch:        {batch} a rank, {batch * ranks} a step over the {ranks} rank(s) a run here starts: {why} "
        "(training.batch_size; more ranks make the step larger)",
        f"epochs:       {epochs}: a pretrained model needs few passes over {train_rows:,} rows"
        + (", a small set a few more" if epochs == 5 else "; more overfit") + f" (training.epochs){kept}",
        f"lr:           {lr:g}: {lr_why}; not scaled with the batch (training.lr, training.lr_scaling: none)",
        f"warmup:       {warmup} epoch(s), 10% of the steps: the new head's first gradients are large "
        "(training.warmup_epochs)",
    ]
    return training, lines


def _bounds(values: list[int], floor: int) -> tuple[int, int]:
    lo, hi = min(values), max(values)
    pad = int(math.ceil((hi - lo) * LENGTH_MARGIN))
    return max(floor, lo - pad), hi + pad


def _rows(splits: dict) -> dict[str, tuple[int, int]]:
    """Rows per split from half to double the profiled count; one file (``all``) is validated as train."""
    return {("train" if s == "all" else s): (max(1, len(r) // 2), max(1, len(r) * 2)) for s, r in splits.items()}


def choose_pooling(folder) -> tuple[str, str]:
    """(``pretrained.pooling``, why): mean where the folder is a sentence-transformers encoder whose
    pooling module averages the tokens (``modules.json`` names it; its ``config.json`` says the mode),
    since its weights were trained to be read that way and its [CLS] pooler was not; cls otherwise."""
    cls = "cls", "[CLS] through the model's pooler, transformers' sequence-classification head"
    if not folder:
        return cls
    base = Path(folder).resolve()
    try:
        modules = json.loads((base / "modules.json").read_text())
        sub = next(m["path"] for m in modules if str(m.get("type", "")).endswith("models.Pooling"))
        config = (base / sub / "config.json").resolve()
        mean = config.is_relative_to(base) and json.loads(config.read_text()).get("pooling_mode_mean_tokens")
    except (OSError, ValueError, TypeError, KeyError, AttributeError, StopIteration):
        return cls
    if not mean:
        return cls
    return "mean", (f"the mean of the text's token states: the folder is a sentence encoder trained with mean "
                    f"pooling ({sub}/config.json), its [CLS] pooler untrained")


# -------------------------------------------------------------------------------- the profile
def profile_table(frames: dict, label: str, tokenizer, positions: int | None, given_column: str | None,
                  where: str, lora: bool, presplit: bool) -> TextProfile:
    """text_classification of ``frames`` (``{"train", "test"}`` or ``{"all"}``): the text column, token
    lengths, max_length, classes and shares, the fine-tuning choices and the expectations."""
    import pandas as pd

    both = pd.concat(list(frames.values()), ignore_index=True)
    column, column_why = pick_text_column(both, label, tokenizer, given_column, where)
    values = both[column]
    missing = [i for i, v in enumerate(values.tolist()) if not isinstance(v, str) or not v.strip()]
    if len(missing) == len(values):
        raise TextInitError(f"{where}: column {column!r} holds no text")
    texts = [v for v in values.tolist() if isinstance(v, str) and v.strip()]
    lengths = token_lengths(tokenizer, texts)
    max_length, truncated, length_why = choose_max_length(lengths, positions)
    labels = both[label].dropna()
    if labels.empty:
        raise TextInitError(f"label {label!r} has no value in {where}: nothing to learn from")
    from tasks.base import label_key

    counts = labels.map(label_key).value_counts()
    if len(counts) < 2:
        raise TextInitError(f"label {label!r} has a single class {list(counts.index)}: nothing to classify")
    if len(counts) > MAX_LABELS:
        raise TextInitError(f"label {label!r} has {len(counts)} classes, more than {MAX_LABELS}: is it the label?")
    classes = sorted(counts.index, key=str)
    shares = {c: round(float(counts[c]) / len(labels), 4) for c in classes}
    train_rows = len(frames.get("train", both)) if presplit else int(len(both) * 0.8)
    training, choice = fine_tune_choices("text_classification", train_rows, max_length, lora, ranks_here())
    chars = [len(t) for t in texts]
    no_leak, leak_said = leak_line(leaked(*[[v for v in frames[s][column].tolist() if isinstance(v, str)]
                                            for s in ("train", "test")]) if presplit else 0)
    exp = TextExpectations(format="table", columns=[column], label=label, labels=classes,
                           chars={column: _bounds(chars, 1)}, tokens={column: _bounds(lengths, 1)},
                           rows=_rows(frames), no_leak=presplit and no_leak)
    p50, p99 = percentile(lengths, 50), percentile(lengths, 99)
    pooling, pooling_why = choose_pooling(getattr(tokenizer, "name_or_path", None))
    lines = [f"text:         {column}: {column_why} (pretrained.text_column)",
             f"tokens:       p50 {p50}, p99 {p99} with the model's tokenizer",
             f"max_length:   {max_length}: {length_why}; {truncated} row(s) longer are truncated "
             "(pretrained.max_length)",
             f"classes:      {len(classes)}: " + ", ".join(f"{c} {shares[c]:.0%}" for c in classes[:12])
             + (" ..." if len(classes) > 12 else ""), f"pooling:      {pooling}: {pooling_why} (pretrained.pooling)",
             *choice, *leak_said]
    if missing:
        lines.append(f"empty text:   {len(missing)} row(s) with no {column} (first: row {missing[0]}): validation "
                     "refuses them; drop or fill them")
    chosen = {"text_column": column, "max_length": max_length, **({"pooling": pooling} if pooling != "cls" else {})}
    return TextProfile(task="text_classification", splits=_sizes(frames), p50=p50, p99=p99, max_length=max_length,
                       truncated=truncated, lines=lines, classes=classes, shares=shares, pretrained=chosen,
                       training=training, expectations=exp)


def profile_jsonl(splits: dict[str, list[dict]], tokenizer, positions: int | None, where: str, lora: bool,
                  presplit: bool) -> TextProfile:
    """causal_lm of JSON Lines ``splits``: the shape (text, or prompt + completion), token lengths of
    a whole example, max_length, the fine-tuning choices and the expectations."""
    first = next(iter(splits.values()))
    columns, shape_why = jsonl_shape(first, where)
    for name, records in splits.items():
        got, _ = jsonl_shape(records, f"{where} ({name})")
        if got != columns:
            raise TextInitError(f"{where}: the {name} split holds {' + '.join(got)} records, the others "
                                f"{' + '.join(columns)}; give every file the same shape")
    records = [r for recs in splits.values() for r in recs]
    whole = ["".join(r[c] for c in columns) for r in records]
    lengths = token_lengths(tokenizer, whole)
    max_length, truncated, length_why = choose_max_length(lengths, positions)
    n = sum(len(r) for r in splits.values())
    train_rows = len(splits.get("train", records)) if presplit else int(n * 0.9)
    training, choice = fine_tune_choices("causal_lm", train_rows, max_length, lora, ranks_here())
    chars = {c: _bounds([len(r[c]) for r in records], 1) for c in columns}
    toks = {c: _bounds(token_lengths(tokenizer, [r[c] for r in records]), 1) for c in columns}
    key = "\x1f".join  # the suite's leak key: the texts of a record together
    no_leak, leak_said = leak_line(leaked(*[[key(r[c] for c in columns) for r in splits[s]]
                                            for s in ("train", "test")]) if presplit else 0)
    exp = TextExpectations(format="jsonl", columns=columns, chars=chars, tokens=toks,
                           rows=_rows(splits), no_leak=presplit and no_leak)
    p50, p99 = percentile(lengths, 50), percentile(lengths, 99)
    pretrained: dict = {"max_length": max_length}
    if columns == ["prompt", "completion"]:
        pretrained.update(prompt_column="prompt", completion_column="completion")
    what = "sequences" if columns == ["text"] else "pairs"
    lines = [f"records:      {' + '.join(columns)}: {shape_why}",
             f"tokens:       p50 {p50}, p99 {p99} a record with the model's tokenizer",
             f"max_length:   {max_length}: {length_why}; {truncated} record(s) longer are "
             f"{'split across sequences' if what == 'sequences' else 'truncated'} (pretrained.max_length)", *choice,
             *leak_said]
    return TextProfile(task="causal_lm", splits=_sizes(splits), p50=p50, p99=p99, max_length=max_length,
                       truncated=truncated, lines=lines,
                       shape=" + ".join(columns), pretrained=pretrained, training=training, expectations=exp)


def leaked(train: list[str], test: list[str]) -> int:
    """Test texts that are also train texts (what the expectations' ``no_leak`` refuses)."""
    seen = set(train)
    return sum(1 for t in test if t in seen)


def leak_line(count: int) -> tuple[bool, list[str]]:
    """(``no_leak``, the line said): data that leaks already is reported, not refused by the expectations
    init writes from it."""
    if not count:
        return True, []
    return False, [f"duplicates:   {count} test text(s) also in train: no_leak: false written, so validation accepts "
                   "this data; set it true (and remove them) to refuse leaks"]


def _sizes(splits: dict) -> dict[str, int]:
    return {name: len(rows) for name, rows in splits.items()}


def text_validation_plan(cfg, root: Path, files: dict[str, str | None]):
    """The ``ValidationPlan`` a text task fine-tuning ``cfg.pretrained`` returns (``Task.validation_plan``):
    the ``pretrained_text`` suite over the split ``files`` (``{"train", "test"}``: names under
    ``dataset.path``; ``test`` None for one file the task splits), against the reviewed text expectations."""
    import yaml

    from core.errors import ConfigError
    from core.text_expectations import load_text_expectations
    from tasks.base import ValidationPlan

    ds, root = cfg.dataset, Path(root)
    if cfg.pretrained is None or ds.expectations_file is None:
        raise ConfigError("pretrained / dataset.expectations_file: a text task needs both "
                          "(`trainflow init --pretrained` writes them)")
    exp = load_text_expectations(root / ds.expectations_file)
    model_dvc = root / cfg.pretrained.dvc_file
    try:
        model_md5 = yaml.safe_load(model_dvc.read_text())["outs"][0]["md5"]
    except (OSError, KeyError, IndexError, TypeError, yaml.YAMLError):
        model_md5 = None  # an untracked folder: the run's workspace check names it
    paths = [root / ds.path / n for n in files.values() if n is not None] + [root / ds.expectations_file]
    return ValidationPlan("validation.pretrained_suite", paths, {
        "dataset": ds, "root": root, "files": files, "expectations": exp, "model_path": cfg.pretrained.path,
        "model_md5": model_md5})


def expectations_header(rel: str, md5: str, model: str) -> str:
    from core.printable import printable

    pct = f"{LENGTH_MARGIN:.0%}"
    return (f"# Expectations of {printable(rel)} (DVC md5 {md5}), written by `trainflow init --pretrained` from a\n"
            f"# profile of the text with the tokenizer of {printable(model)}. Review every line, then commit this\n"
            "# file: validation checks every later version of the data against it. Every text is non-empty;\n"
            f"# chars/tokens: each text's length, the profiled range widened by {pct}; labels: the class set, in\n"
            "# the model's output order; rows per split from half to double the profiled count; no_leak: no\n"
            "# test text is also a train text.\n")
