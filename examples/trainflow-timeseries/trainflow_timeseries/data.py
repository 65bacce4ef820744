"""The example's own data: deterministic synthetic "hourly load" series (a level, a daily and a slower
cycle, AR(1) noise: persistence is decent but beatable), cut into windows of the last ``window``
values (``t0`` .. ``t{window-1}``, oldest first) and the next value ``y``, as ``train.csv`` and
``test.csv``.

Split by time, never by shuffled rows (overlapping windows are near-copies): each series' last
targets are test; rows are in time order, so the tail of ``train.csv`` is its most recent part.
Values to 4 decimals: the same bytes (DVC md5) on every platform.

    python -m trainflow_timeseries.data --out data/timeseries
"""

from __future__ import annotations

import argparse
import math
from pathlib import Path

import numpy as np

WINDOW = 24
N_SERIES = 6
LENGTH = 420
TEST_FRACTION = 0.2
SEED = 0
LABEL = "y"


def window_columns(window: int = WINDOW) -> list[str]:
    """``["t0", ..., "t{window-1}"]``: the inputs, oldest first."""
    return [f"t{i}" for i in range(window)]


def make_series(n_series: int = N_SERIES, length: int = LENGTH, seed: int = SEED) -> np.ndarray:
    """``[n_series, length]`` float64 values, all positive, deterministic for a seed."""
    rng = np.random.default_rng(seed)
    steps = np.arange(length)
    out = np.empty((n_series, length))
    for s in range(n_series):
        level = rng.uniform(20, 40)
        daily = rng.uniform(2, 5) * np.sin(2 * math.pi * steps / 24 + rng.uniform(0, 2 * math.pi))
        period = rng.uniform(60, 120)
        slow = rng.uniform(1, 3) * np.sin(2 * math.pi * steps / period + rng.uniform(0, 2 * math.pi))
        noise = np.empty(length)
        noise[0] = rng.normal(0, 0.6)
        for t in range(1, length):  # AR(1): errors persist a few steps, as real ones do
            noise[t] = 0.6 * noise[t - 1] + rng.normal(0, 0.6)
        out[s] = level + daily + slow + noise
    return out


def windows(series: np.ndarray, window: int = WINDOW, test_fraction: float = TEST_FRACTION):
    """``(train, test)`` DataFrames of ``t0..t{window-1}, y``, split by time, rows in time order."""
    import pandas as pd

    n_series, length = series.shape
    targets = np.arange(window, length)  # the step each row predicts
    cut = targets[int(len(targets) * (1 - test_fraction))]
    cols = window_columns(window)
    parts = {"train": [], "test": []}
    for t in targets:  # time-major: the file's tail is its most recent part
        for s in range(n_series):
            parts["train" if t < cut else "test"].append(np.append(series[s, t - window:t], series[s, t]))
    return tuple(pd.DataFrame(np.round(np.asarray(parts[k]), 4), columns=[*cols, LABEL]) for k in ("train", "test"))


def generate(out_dir: str | Path, *, n_series: int = N_SERIES, length: int = LENGTH, window: int = WINDOW,
             test_fraction: float = TEST_FRACTION, seed: int = SEED) -> dict[str, Path]:
    """Write ``train.csv`` and ``test.csv`` into ``out_dir`` (created); returns their paths.
    Same arguments, same bytes."""
    if window < 2 or length <= window + 5:
        raise ValueError(f"need window >= 2 and length > window + 5, got window {window}, length {length}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    train, test = windows(make_series(n_series, length, seed), window, test_fraction)
    paths = {"train": out / "train.csv", "test": out / "test.csv"}
    for split, frame in (("train", train), ("test", test)):
        frame.to_csv(paths[split], index=False, float_format="%.4f", lineterminator="\n")
    return paths


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="trainflow-timeseries-data", description=__doc__.splitlines()[0])
    ap.add_argument("--out", required=True, type=Path, help="folder for train.csv and test.csv (e.g. data/timeseries)")
    ap.add_argument("--series", type=int, default=N_SERIES)
    ap.add_argument("--length", type=int, default=LENGTH, help="steps per series")
    ap.add_argument("--window", type=int, default=WINDOW, help="past values per row (t0..t{window-1})")
    ap.add_argument("--test-fraction", type=float, default=TEST_FRACTION)
    ap.add_argument("--seed", type=int, default=SEED)
    a = ap.parse_args(argv)
    paths = generate(a.out, n_series=a.series, length=a.length, window=a.window,
                     test_fraction=a.test_fraction, seed=a.seed)
    for split, path in paths.items():
        print(f"{split}: {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
