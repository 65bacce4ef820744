"""A table's columns as the model's input: category vocabularies and numeric statistics fitted in
one bounded pass, the codes for missing and unseen values, the input layer's transforms, and the
registered pyfunc encoding a raw DataFrame exactly as training did."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
import torch

from core.config import ModelConfig
from tasks import encoding
from tasks.encoding import (FIRST_CODE, MISSING_CODE, OTHER_CODE, TableFit, category_codes, category_keys,
                            column_kinds, encode, fit_columns)
from tasks.table_nets import TableInput, resolved, table_network
from tests.pyfuncs import pyfunc_module


def frame(n: int = 400, seed: int = 0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({
        "size": rng.lognormal(3, 1, n),                       # skewed: the quantile transform's case
        "rooms": rng.integers(1, 6, n).astype("float64"),     # whole numbers with a gap below
        "city": rng.choice(["oslo", "rome", "lima"], n).astype(object),
        "new": rng.choice([True, False], n),
    })
    df.loc[[3, 7], "size"] = np.nan
    df.loc[5, "rooms"] = np.nan
    df.loc[[2, 9], "city"] = None
    return df


KINDS = {"size": "numeric", "rooms": "categorical", "city": "categorical", "new": "categorical"}


def test_categories_compare_by_text_so_3_and_3_0_and_the_string_3_are_one():
    keys = category_keys(pd.Series([3, 3.0, "3", None, True, "abc", 2.5, np.nan], dtype=object))
    assert keys.tolist() == ["3", "3", "3", None, "True", "abc", "2.5", None]
    assert category_keys(pd.Series([1.0, np.nan, 2.0])).tolist() == ["1", None, "2"]  # an int column with a null
    assert category_keys(pd.Series([True, False])).tolist() == ["True", "False"]
    assert category_keys(pd.Series(["a", None], dtype="str")).tolist() == ["a", None]


def test_missing_and_unseen_values_get_codes_of_their_own():
    codes = category_codes(pd.Series(["rome", None, "paris", "oslo"], dtype=object), ["oslo", "rome"])
    assert codes.tolist() == [FIRST_CODE + 1, MISSING_CODE, OTHER_CODE, FIRST_CODE]
    assert category_codes(pd.Series(["x", None]), []).tolist() == [OTHER_CODE, MISSING_CODE]


def test_the_fit_keeps_the_most_frequent_categories_in_text_order_and_counts_nulls():
    df = frame()
    cols = {c["name"]: c for c in fit_columns([df], KINDS, max_categories=2)}
    city = cols["city"]
    counts = df["city"].value_counts()
    assert city["values"] == sorted(counts.index[:2])  # the two most frequent, sorted
    assert city["nulls"] == 2 and city["count"] == len(df) - 2
    assert city["other"] == int(counts.iloc[2:].sum())  # train rows the vocabulary leaves out
    rooms = df["rooms"].value_counts()
    assert cols["rooms"]["values"] == sorted(str(int(v)) for v in rooms.index[:2])  # "3", not "3.0"
    size = cols["size"]
    assert size["kind"] == "numeric" and size["nulls"] == 2 and size["count"] == len(df) - 2
    assert size["mean"] == pytest.approx(df["size"].mean()) and size["median"] == pytest.approx(df["size"].median())
    assert size["std"] == pytest.approx(df["size"].std(ddof=0))
    assert size["knots"] == sorted(size["knots"]) and len(size["knots"]) == encoding.QUANTILE_KNOTS


def test_a_fit_in_batches_equals_the_fit_of_the_whole_split():
    df = frame(900)
    whole = fit_columns([df], KINDS, 1000, seed=3)
    parts = fit_columns([df.iloc[i:i + 128] for i in range(0, len(df), 128)], KINDS, 1000, seed=3)
    for a, b in zip(whole, parts, strict=True):
        for key in a:
            assert b[key] == (pytest.approx(a[key], rel=1e-12) if key in ("mean", "std", "iqr") else a[key]), key


def test_memory_is_bounded_a_reservoir_per_number_and_a_cap_on_distinct_values(monkeypatch):
    monkeypatch.setattr(encoding, "SAMPLE_ROWS", 1000)
    fit = TableFit({"x": "numeric", "c": "categorical"}, max_categories=5)
    rng = np.random.default_rng(1)
    for i in range(20):
        fit.update(pd.DataFrame({"x": rng.uniform(0, 1, 5000),
                                 "c": [f"v{j}" for j in rng.integers(0, 100_000, 5000)]}))
        assert len(fit.parts["x"].sample) <= 1000
        assert len(fit.parts["c"].counts) <= encoding.tracked(5)
    x, c = fit.columns()
    assert x["count"] == 100_000 and abs(x["median"] - 0.5) < 0.05  # the reservoir is a fair sample
    assert c["approximate"] and len(c["values"]) == 5


def test_quantile_knots_merge_a_spike_into_one_knot_at_the_middle_of_its_share():
    sample = np.concatenate([np.zeros(900), np.linspace(1, 10, 100)])
    knots, scores = encoding.quantile_knots(sample)
    assert knots[0] == 0 and knots == sorted(set(knots))
    assert -1.5 < scores[0] < 0  # zeros are 90 % of the mass: centred in it, not at its lower edge
    assert encoding.quantile_knots(np.full(10, 4.0)) == ([4.0], [0.0])
    assert encoding.quantile_knots(np.zeros(0)) == ([0.0], [0.0])


def test_column_kinds_follow_the_reviewed_types_and_dataset_categorical():
    kinds = column_kinds(["a", "b", "c", "d"], {"a": "float", "b": "integer", "c": "string", "d": "boolean"}, ["b"])
    assert kinds == {"a": "numeric", "b": "categorical", "c": "categorical", "d": "categorical"}


def test_the_input_layer_maps_quantiles_imputes_and_flags_missing_values_and_embeds_categories():
    df = frame()
    cols = fit_columns([df], KINDS, 1000)
    layer = TableInput(cols, "quantile", periodic=None, embedding_dim=4)
    x = torch.tensor(encode(df, cols))
    z = layer(x)
    # size -> 1 value + its missing indicator; 3 categories x 4: 1 + 1 + 12.
    assert z.shape == (len(df), 14) == (len(df), layer.out_features)
    size = z[:, 0].detach().numpy()
    finite = ~np.isnan(df["size"].to_numpy())
    assert abs(size[finite].mean()) < 0.1 and 0.8 < size[finite].std() < 1.2  # a lognormal made ~N(0, 1)
    assert np.all(size[~finite] == 0) and z[:, 1].tolist() == (~finite).astype(float).tolist()
    assert np.corrcoef(size[finite], df["size"].to_numpy()[finite])[0, 1] > 0.7  # monotone
    # The same row gives the same embedding; a code past the vocabulary is clamped, never an error.
    wild = x[:2].clone()
    wild[:, 2] = 1e6
    assert torch.isfinite(layer(wild)).all()


def test_robust_and_standard_transforms_centre_the_column():
    df = frame()
    cols = fit_columns([df], KINDS, 1000)
    for numeric, centre in (("robust", df["size"].median()), ("standard", df["size"].mean())):
        layer = TableInput(cols, numeric, indicators=False, embedding_dim=2)
        row = torch.tensor([[centre, FIRST_CODE, FIRST_CODE, FIRST_CODE]], dtype=torch.float32)
        assert layer(row)[0, 0].item() == pytest.approx(0.0, abs=1e-5)


def test_model_kinds_resolve_to_their_transform_and_embeddings():
    assert resolved(ModelConfig()) == ("tabular", "quantile", True)
    assert resolved(ModelConfig(kind="mlp")) == ("mlp", "standard", False)
    assert resolved(ModelConfig(kind="mlp", numeric="quantile", periodic=True)) == ("mlp", "quantile", True)
    assert resolved(ModelConfig(factory="m:f")) == ("factory", "standard", False)


def test_the_tabular_network_exports_with_a_dynamic_batch_and_refuses_categories_in_a_cnn(tmp_path):
    df = frame()
    cols = fit_columns([df], KINDS, 1000)
    net = table_network(ModelConfig(kind="tabular", hidden=16, layers=2), cols, 3).eval()
    x = torch.tensor(encode(df, cols))
    program = torch.export.export(net, (x[:2],), dynamic_shapes=({0: torch.export.Dim("batch", min=1)},))
    with torch.no_grad():
        assert torch.allclose(program.module()(x[:7]), net(x[:7]), atol=1e-6)
    with pytest.raises(ValueError, match="cnn takes numeric pixels"):
        table_network(ModelConfig(kind="cnn"), cols, 3)


def test_the_pyfunc_encodes_a_raw_frame_exactly_as_training_did(tmp_path):
    """The registered model's own encoder (it may import no project code) and tasks/encoding.py agree
    on every value kind: strings, None/NaN, unseen categories, ints read as floats, booleans."""
    df = frame()
    cols = fit_columns([df], KINDS, 1000)
    seen = []

    def program(x):
        seen.append(x.numpy().copy())
        return torch.zeros(len(x), 2)

    module = pyfunc_module("pyfunc_table.py")
    meta = {"feature_columns": [c["name"] for c in cols], "class_labels": ["a", "b"],
            "columns": [{"name": c["name"], "kind": c["kind"], **({"values": c["values"]}
                                                                  if c["kind"] == "categorical" else {})}
                        for c in cols],
            "codes": {"missing": MISSING_CODE, "other": OTHER_CODE, "first": FIRST_CODE}}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    model = module.ExportedTable()
    original = torch.export.load
    torch.export.load = lambda path: SimpleNamespace(module=lambda: program)
    try:
        model.load_context(SimpleNamespace(artifacts={"meta": str(tmp_path / "meta.json"), "model": "unused"}))
    finally:
        torch.export.load = original
    # A serving client's frame: other dtypes than the training file's, an unseen city, NaN and None.
    raw = df.copy()
    raw.loc[0, "city"] = "paris"
    raw["rooms"] = raw["rooms"].astype(object)
    raw.loc[1, "rooms"] = "3"  # text "3" is category 3
    out = model.predict(None, raw)
    assert list(out) == ["a"] * len(raw)
    np.testing.assert_array_equal(seen[0], encode(raw, cols))
    assert seen[0][0, 2] == OTHER_CODE and seen[0][2, 2] == MISSING_CODE
    assert seen[0][1, 1] == seen[0][np.flatnonzero(df["rooms"] == 3)[0], 1]
