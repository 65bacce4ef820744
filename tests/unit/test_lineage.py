"""What a pipeline run records as MLflow lineage, from the config alone: each split of the data as a
dataset (``Task.data_splits``, source ``dvc://<file>@<rev>``) and the stage tag a run ends with."""

from __future__ import annotations

import pytest

from core.config import load_config
from flows.pipeline import stage_tag
from registry.values import dataset_source
from tasks import get_task
from tasks.base import Task


def test_dataset_source_names_the_file_and_the_git_rev_of_its_dvc_file():
    assert dataset_source("data/digits/train.csv", "a" * 40) == f"dvc://data/digits/train.csv@{'a' * 40}"
    assert dataset_source("/data/x/", "uncommitted") == "dvc://data/x@uncommitted"


def test_a_pre_split_table_has_a_training_and_a_testing_split(repo_root):
    cfg = load_config(repo_root / "configs" / "digits.yaml")
    assert get_task(cfg.task).data_splits(cfg) == {"train": ("data/digits/train.csv", "training"),
                                                   "test": ("data/digits/test.csv", "testing")}


def test_a_table_split_by_seed_names_its_one_file_for_both_splits(repo_root):
    cfg = load_config(repo_root / "configs" / "wine.yaml")  # file: wine.csv, split with test_fraction
    assert get_task(cfg.task).data_splits(cfg) == {"train": ("data/wine/wine.csv", "training"),
                                                   "test": ("data/wine/wine.csv", "testing")}


def test_a_text_corpus_tests_on_its_eval_file(repo_root):
    cfg = load_config(repo_root / "configs" / "stdlib-lm.yaml")
    assert get_task(cfg.task).data_splits(cfg) == {"train": ("data-stdlib/train.jsonl", "training"),
                                                   "eval": ("data-stdlib/val.jsonl", "testing")}


def test_a_task_that_names_no_splits_logs_the_whole_dataset_for_training(repo_root):
    cfg = load_config(repo_root / "configs" / "digits.yaml")
    assert Task().data_splits(cfg) == {"data": ("data/digits", "training")}


@pytest.mark.parametrize("status, stage, tag", [
    ("registered", "register", "done"),
    ("rejected", "gate", "rejected"),
    ("validation_failed", "validate", "validation_failed"),
    ("preempted", "train", "preempted: train"),
    ("failed", "evaluate", "failed: evaluate"),
])
def test_the_stage_tag_says_how_a_run_ended(status, stage, tag):
    assert stage_tag(status, stage) == tag
