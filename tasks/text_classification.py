"""The text classification task: a table's free-text column (``pretrained.text_column``) and label
(``dataset.label``) -> a pretrained Hugging Face encoder with a new sequence-classification head
(``tasks.hf_folder``) -> a pyfunc taking raw text and returning the label's own values
(``tasks/pyfunc_text.py``).

The table is read, split and validated as a classification table is (``tasks.tabular``); what
differs is the text. Each split is tokenized once by the model's own tokenizer and packed as int64
``[n, 1 + max_length]``: column 0 the row's token count, then its ids padded with the pad id. The
model (``TextClassifierNet``) cuts every batch to its longest row and builds the attention mask
from the counts (dynamic padding), so the engine feeds it like any other ``(x, y)`` batch. The packed
splits are cached by the data's files and the tokenizer's files (``prepared``): on a first run each
rank tokenizes its share and takes the others' from the cache (``tokenize_share``); later runs, on
any world size, read the whole cache.

The registered model is a folder (``export_files``): the weights as safetensors and the tokenizer
files, each hashed by the registry, loaded by ``tasks/pyfunc_text.py`` with transformers.

The baseline beside the network is TF-IDF over word and character n-grams plus logistic regression
on the same split (``gbdt``: the conventional model a user would try first, where a table's is the
trees).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, ClassVar

import numpy as np

from core.errors import ConfigError, DataUnavailableError
from tasks.base import ModelSpec, cache_write, fit_gbdt, label_key, load_program
from tasks.info import DataInfo
from tasks.tabular import Classification, TableInfo, _mlflow_type

if TYPE_CHECKING:
    import pandas as pd

    from core.config import PipelineConfig

PYFUNC_FILE = Path(__file__).with_name("pyfunc_text.py")
# The registered model folder (``export_files``): safetensors weights, config, tokenizer files; under mean
# pooling the linear head as HEAD_FILE (``weight``, ``bias``), since transformers has no such head.
EXPORT_DIR, HEAD_FILE = "text_model", "head.safetensors"
# Bump when the packing or the tokenization call changes: the cached splits then stop matching.
PACKING_VERSION = 1
# Rows a rank tokenizes at a time (``tokenize_share``); a rank's share is every world-th chunk.
TOKENIZE_CHUNK = 4096
# The TF-IDF baseline fits on at most this many train texts (a seeded sample).
TFIDF_MAX_ROWS = 200_000
# Files of a model folder that make its tokenizer (their bytes key the tokenized cache).
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt",
                   "vocab.json", "merges.txt", "spiece.model", "sentencepiece.bpe.model", "added_tokens.json")


@dataclass(frozen=True)
class TextInfo(TableInfo):
    """A table's ``info`` with the tokenization: tokens per row at most and the pad id."""

    max_length: int = 0
    pad_id: int = 0
    tokenizer_sha256: str = ""


def tokenizer_sha256(folder: Path) -> str:
    """sha256 over the folder's tokenizer files (names and bytes): what the tokenized cache is keyed by."""
    import hashlib

    h = hashlib.sha256()
    for name in TOKENIZER_FILES:
        path = Path(folder) / name
        if path.is_file():
            h.update(name.encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def backend_tokenizer(folder: Path, max_length: int):
    """The folder's fast tokenizer (``tokenizers.Tokenizer``) truncating to ``max_length`` tokens, special
    tokens included, and not padding: the same object, serialised, tokenizes in the registered model."""
    from tasks.hf_folder import load_tokenizer

    tok = load_tokenizer(folder)
    backend = tok.backend_tokenizer
    backend.no_padding()
    backend.enable_truncation(max_length)
    return backend, int(tok.pad_token_id if tok.pad_token_id is not None else 0)


def pack(encodings, max_length: int, pad_id: int) -> np.ndarray:
    """int64 ``[n, 1 + max_length]``: each row's token count, then its ids padded with ``pad_id``."""
    out = np.full((len(encodings), 1 + max_length), pad_id, dtype=np.int64)
    for i, ids in enumerate(encodings):
        ids = ids[:max_length]
        out[i, 0] = len(ids)
        out[i, 1:1 + len(ids)] = ids
    return out


def tokenize_share(texts: list[str], encode, part, rank: int, world: int) -> np.ndarray:
    """``encode(texts)`` (packed rows) for the whole split, in chunks, each rank tokenizing its own share:
    chunk ``i`` is rank ``i % world``'s. A rank does its chunks first, writing each to the cache file
    ``part(start, stop)``, then takes the other ranks' from there; one not written (its rank slower, dead,
    or on another node with its own cache) it tokenizes itself, so the answer never waits on a peer."""
    size = max(1, min(TOKENIZE_CHUNK, -(-len(texts) // max(world, 1))))
    chunks = [(s, min(s + size, len(texts))) for s in range(0, len(texts), size)]
    got = {}
    for i in sorted(range(len(chunks)), key=lambda i: ((i - rank) % world, i)):  # own chunks, then the next rank's
        start, stop = chunks[i]
        path = part(start, stop)
        if i % world != rank:
            try:
                got[i] = np.load(path, allow_pickle=False)
                if got[i].shape[0] == stop - start:
                    continue
            except (OSError, ValueError):
                pass
        got[i] = encode(texts[start:stop])
        cache_write(path, lambda fh, rows=got[i]: np.save(fh, rows))
    return np.concatenate([got[i] for i in range(len(chunks))]) if chunks else encode([])


def texts_of(frame: "pd.DataFrame", column: str, where: str) -> list[str]:
    """The column's values as text; DataUnavailableError naming the first missing one's row."""
    if column not in frame.columns:
        raise DataUnavailableError(f"{where}: no text column {column!r} (pretrained.text_column); found "
                                   f"{[str(c) for c in frame.columns][:10]}")
    s = frame[column]
    missing = s.isna().to_numpy()
    if missing.any():
        raise DataUnavailableError(f"{where}: column {column!r} row {int(np.flatnonzero(missing)[0])} has no text")
    return [str(v) for v in s.tolist()]


def text_network(folder: Path, classes: list, pad_id: int, activation_checkpointing: bool = False,
                 pooling: str = "cls"):
    """``TextClassifierNet`` over the folder's encoder with a new head for ``classes``: transformers'
    sequence-classification head (``pooling`` cls) or a linear head on the mean of the text's last
    hidden states (mean)."""
    import torch

    from tasks.hf_folder import load_model

    class TextClassifierNet(torch.nn.Module):
        """Packed rows (``pack``) -> logits ``[n, classes]``. ``trim``: cut the batch to its longest row
        (dynamic padding); off in the exported program, whose caller packs to the longest row itself."""

        def __init__(self, model, head=None):
            super().__init__()
            self.model, self.head, self.trim, self.pad_id = model, head, True, pad_id

        def forward(self, x):
            if x.shape[0] == 0:  # an epoch's empty last micro-batch: a 1-row pass keeps every rank's collectives
                one = torch.tensor([[1, self.pad_id]], dtype=x.dtype, device=x.device)  # one unmasked token
                return self.forward(one)[:0]
            lengths = x[:, 0]
            if self.trim and x.shape[0]:
                x = x[:, :1 + max(int(lengths.max()), 1)]
            if not self.trim:  # two pad columns: the program's rows may then hold 0 or 1 token
                x = torch.nn.functional.pad(x, (0, 2), value=self.pad_id)
            ids = x[:, 1:]
            mask = (torch.arange(ids.shape[1], device=x.device)[None, :] < lengths[:, None]).long()
            out = self.model(input_ids=ids, attention_mask=mask)
            if self.head is None:
                return out.logits
            weights = mask.unsqueeze(-1).to(out.last_hidden_state.dtype)
            return self.head((out.last_hidden_state * weights).sum(1) / weights.sum(1).clamp(min=1.0))

    labels = [label_key(c) for c in classes]
    head = None
    if pooling == "mean":
        hf = load_model(folder, "encoder")
        if getattr(hf, "pooler", None) is not None:
            hf.pooler = None  # reads [CLS] only: untrained by the loss here, an unused parameter for DDP
        c = hf.config
        drop = getattr(c, "classifier_dropout", None) or getattr(c, "hidden_dropout_prob", None) or 0.1
        linear = torch.nn.Linear(c.hidden_size, len(classes))
        torch.nn.init.normal_(linear.weight, std=getattr(c, "initializer_range", 0.02))
        torch.nn.init.zeros_(linear.bias)
        head = torch.nn.Sequential(torch.nn.Dropout(drop), linear)
    else:
        hf = load_model(folder, "sequence_classification", len(classes), labels)
    if activation_checkpointing:
        hf.activation_checkpointing_enable()
    hf.config.pad_token_id = pad_id
    return TextClassifierNet(hf, head)


class TextClassification(Classification):
    name = "text_classification"
    info_type: ClassVar[type[DataInfo]] = TextInfo
    gbdt_names = ("TF-IDF + LR", "TF-IDF + logistic regression")

    def init_defaults(self) -> dict:
        """The table classifier's gates; no ``model`` keys: the network is the pretrained folder's."""
        return {"gates": super().init_defaults()["gates"]}

    def loader_kind(self, cfg: "PipelineConfig", root: Path) -> tuple[str, str]:
        """In memory: the tokenized splits are small beside the table they come from."""
        from tasks.base import Task

        return Task.loader_kind(self, cfg, root)

    def validation_plan(self, cfg: "PipelineConfig", root: Path):
        """The reviewed text expectations ``init --pretrained`` writes, over the table's split files."""
        from tasks.text_init import text_validation_plan

        ds = cfg.dataset
        files = {"train": ds.file, "test": None} if ds.file is not None else {"train": ds.train_file,
                                                                             "test": ds.test_file}
        return text_validation_plan(cfg, root, files)

    def expectations(self, cfg: "PipelineConfig", root: Path):
        """The reviewed text expectations as the table task reads its own: the text column (a string)
        and the label with its class set, in the model's output order."""
        from core.expectations import ColumnExpectation, TableExpectations
        from core.hashing import file_id
        from core.text_expectations import load_text_expectations

        if cfg.dataset.expectations_file is None:
            return None
        path = Path(root) / cfg.dataset.expectations_file

        def as_table():
            exp = load_text_expectations(path)
            ints = all(isinstance(v, int) and not isinstance(v, bool) for v in exp.labels or [])
            return TableExpectations(label=exp.label, rows=exp.rows, columns=[
                *(ColumnExpectation(name=c, type="string") for c in exp.columns),
                ColumnExpectation(name=exp.label, type="integer" if ints else "string", values=exp.labels)])
        return self._cached(("expectations", file_id(path)), as_table)

    def init_fit(self, label: str, labels, ctype: str):
        """Not picked for a table's label by itself: a model folder (``init --pretrained``) makes it this task."""
        from tasks.base import InitFit

        return InitFit(False, False, "task 'text_classification' fine-tunes a pretrained model folder (pretrained.path)")

    # -- config ---------------------------------------------------------------------------------
    def check_config(self, cfg: "PipelineConfig") -> None:
        super().check_config(cfg)
        if cfg.pretrained is None:
            raise ConfigError("pretrained: required for the text_classification task (pretrained.path: a Hugging "
                              "Face model folder inside the repository, pretrained.text_column: the text)")
        if cfg.model.factory is not None:
            raise ConfigError("model.factory: the text_classification task fine-tunes pretrained.path; leave "
                              "model.factory out")
        if cfg.pretrained.prompt_column or cfg.pretrained.completion_column:
            raise ConfigError("pretrained.prompt_column: prompt/completion pairs are the causal_lm task's; a "
                              "text_classification task reads pretrained.text_column and dataset.label")
        if cfg.dataset.features is not None and list(cfg.dataset.features) != [cfg.pretrained.text_column]:
            raise ConfigError(f"dataset.features: the text_classification task reads one text column, "
                              f"pretrained.text_column ({cfg.pretrained.text_column!r})")
        self.folder(cfg)

    def folder(self, cfg: "PipelineConfig", root: Path | None = None) -> Path:
        """``pretrained.path`` inside the repository (ConfigError naming the key otherwise), checked."""
        from core.paths import project_root
        from tasks.hf_folder import check_folder

        base = Path(root or project_root()).resolve()
        path = (base / cfg.pretrained.path).resolve()
        if base not in path.parents:
            raise ConfigError(f"pretrained.path: {cfg.pretrained.path} is not a folder inside the repository {base}")
        if not path.is_dir():
            raise DataUnavailableError.not_pulled(path, cfg.pretrained.dvc_file)
        check_folder(path)
        return path

    # -- data -----------------------------------------------------------------------------------
    def info(self, cfg: "PipelineConfig", root: Path, frames: dict | None = None) -> TextInfo:
        if frames is None:
            return self.prepared(cfg, root)["info"]
        train, column = frames["train"], cfg.pretrained.text_column
        texts_of(train, column, "train split")
        _, pad = backend_tokenizer(self.folder(cfg, root), cfg.pretrained.max_length)
        return TextInfo(features=[column], columns=[], dtypes={column: _mlflow_type(train[column].dtype)},
                        mean=[], std=[], **self._target_info(cfg, root, train[cfg.dataset.label]),
                        max_length=cfg.pretrained.max_length, pad_id=pad,
                        tokenizer_sha256=tokenizer_sha256(self.folder(cfg, root)))

    def prepared_key(self, cfg: "PipelineConfig", root: Path) -> str:
        """The table's key (its files, the dataset section, the seed, the code) with the tokenizer's files,
        the text column and ``max_length``."""
        from core.hashing import sha256_json

        folder = self.folder(cfg, root)
        return sha256_json({"table": super().prepared_key(cfg, root), "tokenizer": tokenizer_sha256(folder),
                            "pretrained": {"text_column": cfg.pretrained.text_column,
                                           "max_length": cfg.pretrained.max_length}, "v": PACKING_VERSION})

    def prepared(self, cfg: "PipelineConfig", root: Path) -> dict:
        """``{"x", "y", "xt", "yt", "info"}``: both splits tokenized and packed (``pack``), cached in
        ``TRAINFLOW_HOME/cache/text`` as ``.npz`` + JSON (no pickle), keyed by ``prepared_key``; the ranks'
        parts (``tokenize_share``) are removed once that whole cache is in place."""
        from core.paths import trainflow_home

        key = self.prepared_key(cfg, root)
        remembered = self.__dict__.get("_prepared")
        if remembered is not None and remembered[0] == key:
            return remembered[1]
        folder = trainflow_home(Path(root)) / "cache" / "text"
        npz, meta, parts = folder / f"{key[:32]}.npz", folder / f"{key[:32]}.json", folder / "parts" / key[:32]
        try:
            with np.load(npz, allow_pickle=False) as arrays:
                out = {k: arrays[k] for k in ("x", "y", "xt", "yt")}
            out["info"] = TextInfo.from_json(json.loads(meta.read_text()))
        except (OSError, ValueError, KeyError, TypeError):
            out = self._tokenized(cfg, root, parts)
            info = out["info"]
            cache_write(meta, lambda fh: fh.write(json.dumps(info.to_json()).encode()))
            cache_write(npz, lambda fh: np.savez(fh, **{k: out[k] for k in ("x", "y", "xt", "yt")}))
            if os.environ.get("WORLD_SIZE", "1") != "1":
                parts = None  # kept for a peer still reading them; the next read of the whole cache removes them
        if parts is not None and npz.is_file():  # the whole cache is in place (renamed whole): its parts are spare
            shutil.rmtree(parts, ignore_errors=True)
        self.__dict__["_prepared"] = (key, out)
        return out

    def _tokenized(self, cfg: "PipelineConfig", root: Path, parts: Path) -> dict:
        """Both splits packed, this rank (torchrun's ``RANK`` of ``WORLD_SIZE``) tokenizing its share
        (``tokenize_share``; the parts in ``parts``)."""
        frames = self.frames(cfg, root)
        info = self.info(cfg, root, frames)
        backend, _ = backend_tokenizer(self.folder(cfg, root), info.max_length)
        rank, world = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

        def encode(texts: list[str]) -> np.ndarray:
            return pack([e.ids for e in backend.encode_batch(texts)], info.max_length, info.pad_id)

        out = {"info": info}
        for split, (xk, yk) in (("train", ("x", "y")), ("test", ("xt", "yt"))):
            frame = frames[split]
            texts = texts_of(frame, cfg.pretrained.text_column, f"{split} split")
            out[xk] = tokenize_share(texts, encode, lambda a, b, s=split: parts / f"{s}.{a}-{b}.npy", rank, world)
            out[yk] = self.targets(frame[cfg.dataset.label], info)
        return out

    # -- model ----------------------------------------------------------------------------------
    def build_model(self, cfg: "PipelineConfig", info: TextInfo):
        from core.paths import project_root

        return text_network(self.folder(cfg, project_root()), info.classes, info.pad_id,
                            cfg.pretrained.activation_checkpointing, cfg.pretrained.pooling)

    def fsdp_units(self, model) -> list:
        """FSDP2 shards each transformer block, then the root (as torchtitan does for HF models)."""
        from tasks.hf_folder import transformer_blocks

        return transformer_blocks(getattr(model, "model", model))

    def batch_tokens(self, x):
        return x[:, 0].sum()  # each packed row's token count

    def example_input(self, cfg: "PipelineConfig", info: TextInfo, batch: int = 2):
        """Rows of every length up to ``max_length`` tokens (the exported program's sequence is dynamic)."""
        import torch

        x = torch.full((batch, 1 + info.max_length), info.pad_id, dtype=torch.long)
        x[:, 0] = info.max_length
        x[:, 1:] = 5
        return x

    def export_module(self, model, info: TextInfo):
        model.trim = False  # the program takes the batch as packed; the pyfunc packs to its longest row
        return model

    def export_files(self, cfg: "PipelineConfig", model, info: TextInfo, out: Path) -> str:
        """Rank 0: ``model.pt2``, the program the worker and the evaluation score (a dynamic batch and
        sequence), and ``out/EXPORT_DIR``, the same weights as safetensors (``save_pretrained``, the head
        as ``HEAD_FILE`` under mean pooling) with the tokenizer files: what the registry logs, each file
        hashed, and the pyfunc loads."""
        import shutil

        import torch
        from safetensors.torch import save_file
        from transformers.utils import logging as hf_logging

        from core.paths import project_root
        from tasks.hf_folder import load_tokenizer

        net, example = self.export_module(model.to("cpu").eval(), info), self.example_input(cfg, info)
        dims = {0: torch.export.Dim("batch", min=1), 1: torch.export.Dim("seq", min=1, max=example.shape[1])}
        torch.export.save(torch.export.export(net, (example,), dynamic_shapes=(dims,)), str(Path(out) / "model.pt2"))
        hf_logging.disable_progress_bar()  # a bar per shard written: noise in a job's log
        target = Path(out) / EXPORT_DIR
        shutil.rmtree(target, ignore_errors=True)
        net.model.save_pretrained(target, safe_serialization=True)
        if net.head is not None:
            save_file({k: v.contiguous() for k, v in net.head[1].state_dict().items()}, str(target / HEAD_FILE))
        load_tokenizer(self.folder(cfg, project_root())).save_pretrained(target)
        return EXPORT_DIR

    # -- evaluation -----------------------------------------------------------------------------
    def score_champion(self, cfg: "PipelineConfig", root: Path, predictor) -> dict:
        """The champion gets the test split's texts as a column ``text``, as a serving client sends them."""
        import pandas as pd

        frame, _, y, info = self.eval_data(cfg, root)
        texts = pd.DataFrame({"text": texts_of(frame, cfg.pretrained.text_column, "test split")})
        labels = self.encode(predictor(texts), info)
        proba_of = getattr(predictor, "proba", None)
        proba = None if proba_of is None else self.encode_proba(proba_of(texts), info)
        return self.score(y, labels, info) if proba is None else self.score(y, proba, info, labels=labels)

    def gbdt(self, cfg: "PipelineConfig", root: Path) -> dict | None:
        """TF-IDF over word (1-2) and character (2-4, within word bounds) n-grams plus logistic regression
        (scikit-learn), fitted on the same train split: the text's conventional baseline."""
        def arrays():
            from sklearn.linear_model import LogisticRegression

            frames, info = self.frames(cfg, root), self.prepared(cfg, root)["info"]
            column = cfg.pretrained.text_column
            x = np.asarray(texts_of(frames["train"], column, "train split"), dtype=object)
            xt = np.asarray(texts_of(frames["test"], column, "test split"), dtype=object)
            return (LogisticRegression(max_iter=1000, C=10.0), x, self.targets(frames["train"][cfg.dataset.label],
                                                                               info), xt)

        return fit_tfidf(root, {"prepared": self.prepared_key(cfg, root), "seed": cfg.seed}, arrays, cfg.seed,
                         TFIDF_MAX_ROWS)

    # -- registry -------------------------------------------------------------------------------
    def model_spec(self, cfg: "PipelineConfig", root: Path, train_dir: Path, report: dict) -> ModelSpec:
        import pandas as pd

        frame, _, _, info = self.eval_data(cfg, root)
        example = pd.DataFrame({"text": texts_of(frame.head(5), cfg.pretrained.text_column, "test split")})
        output, output_type = self._output(info)
        meta = {"format": "transformers", "pooling": cfg.pretrained.pooling, "head_file": HEAD_FILE,
                "max_length": info.max_length, "pad_id": info.pad_id, "tokenizer_sha256": info.tokenizer_sha256,
                **output,
                **({"threshold": report["candidate"]["threshold"]}
                   if report.get("candidate", {}).get("threshold") is not None else {})}
        return ModelSpec(PYFUNC_FILE, meta, [("text", "string")], [(None, output_type)], example,
                         metadata={"trainflow_kind": self.name},
                         checked=report.get("candidate_scored_in") == "worker", params=list(self.predict_params),
                         requirements=["transformers", "tokenizers", "safetensors"])

    def check_program(self, model_pt2: Path, spec: ModelSpec) -> None:
        """The exported folder (``export_files``), loaded from its own files, gives the evaluated
        program's logits on the example texts: the registered weights are the ones scored."""
        import torch
        from safetensors.torch import load_file

        folder, meta = Path(model_pt2), spec.meta
        net = text_network(folder, meta["class_labels"], meta["pad_id"], pooling=meta["pooling"]).eval()
        if net.head is not None:
            net.head[1].load_state_dict(load_file(str(folder / HEAD_FILE)))
        backend, _ = backend_tokenizer(folder, meta["max_length"])
        ids = [e.ids for e in backend.encode_batch([str(t) for t in spec.example["text"]])]
        x = torch.from_numpy(pack(ids, max(len(i) for i in ids), meta["pad_id"]))
        with torch.inference_mode():
            got, want = net(x), load_program(folder.parent / "model.pt2")(x)
        if got.shape != want.shape or not torch.allclose(got, want, rtol=1e-4, atol=1e-4):
            raise ValueError(f"{folder}: its weights give other outputs than the evaluated program "
                             f"{folder.parent / 'model.pt2'} on {len(x)} example texts")


def fit_tfidf(root: Path, key: dict, arrays, seed: int, max_rows: int) -> dict:
    """TF-IDF (word 1-2-grams and character 2-4-grams, sublinear tf) + ``arrays()``'s logistic regression
    ``(estimator, x, y, xt)`` over texts, fitted and cached as ``tasks.base.fit_gbdt`` fits the trees,
    with its answer: ``{"predictor", "pred", "proba", "fit_s", "predict_s", "cached"}``."""
    from sklearn.feature_extraction.text import TfidfVectorizer
    from sklearn.pipeline import make_pipeline, make_union

    features = make_union(TfidfVectorizer(ngram_range=(1, 2), sublinear_tf=True, min_df=1),
                          TfidfVectorizer(analyzer="char_wb", ngram_range=(2, 4), sublinear_tf=True, min_df=1))

    def pipeline():
        est, x, y, xt = arrays()
        return make_pipeline(features, est), x, y, xt, list

    return fit_gbdt(root, {**key, "baseline": "tfidf"}, pipeline, seed, max_rows, "texts",
                    lambda pipe: ("TF-IDF word 1-2-grams + char 2-4-grams, LogisticRegression",
                                  f"C {pipe[-1].C:g}"))
