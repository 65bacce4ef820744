"""Tables shaped like the ones users hand over, made here (no download): string labels and string
categories with missing cells, an identifier column, integer columns that read as floats, rows
repeated across given splits, and a 50,000-row table with three string categoricals.

Used by ``tests/integration/test_real_tables.py`` (init -> run -> champion on each) and
``benchmarks/tabular_quality.py`` (the candidate beside gradient-boosted trees on each).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd


def penguins(n: int = 344, seed: int = 0, unlabeled: int = 6) -> pd.DataFrame:
    """Penguins as an R export ships them: a ``rownames`` id, string species (the label), string
    island and sex, measurements with missing cells (whole numbers in two of them, so NaN makes
    them floats), an integer year with three values, and ``unlabeled`` rows without a species."""
    rng = np.random.default_rng(seed)
    species = rng.choice(["Adelie", "Chinstrap", "Gentoo"], n, p=[0.44, 0.2, 0.36])
    island = np.where(species == "Gentoo", "Biscoe", rng.choice(["Biscoe", "Dream", "Torgersen"], n))
    bill = np.select([species == "Adelie", species == "Chinstrap"], [38.8, 48.8], 47.5) + rng.normal(0, 2.5, n)
    depth = np.where(species == "Gentoo", 15.0, 18.3) + rng.normal(0, 1.0, n)
    flipper = np.round(np.where(species == "Gentoo", 217, 192) + rng.normal(0, 6, n))
    mass = np.round((np.where(species == "Gentoo", 5076, 3700) + rng.normal(0, 400, n)) / 25) * 25
    df = pd.DataFrame({"rownames": np.arange(1, n + 1), "species": species.astype(object), "island": island,
                       "bill_length_mm": bill.round(1), "bill_depth_mm": depth.round(1),
                       "flipper_length_mm": flipper, "body_mass_g": mass,
                       "sex": rng.choice(["female", "male"], n).astype(object),
                       "year": rng.choice([2007, 2008, 2009], n)})
    for c in ("bill_length_mm", "bill_depth_mm", "flipper_length_mm", "body_mass_g"):
        df.loc[[3, 271 % n], c] = np.nan
    df.loc[rng.choice(n, 11, replace=False), "sex"] = None
    df.loc[rng.choice(n, unlabeled, replace=False), "species"] = None
    return df


def houses(n: int, seed: int) -> pd.DataFrame:
    """A regression table whose integer columns have missing cells (so a CSV reads them as floats
    holding whole numbers), a string neighbourhood, and a price that depends on all of them."""
    rng = np.random.default_rng(seed)
    hood = rng.choice(["north", "south", "east", "west", "centre"], n)
    rooms = rng.integers(1, 8, n).astype("float64")
    floors = rng.integers(1, 4, n).astype("float64")
    built = rng.integers(1900, 2021, n).astype("float64")
    area = rng.uniform(25, 250, n)
    premium = pd.Series(hood).map({"north": 1.1, "south": 0.9, "east": 1.0, "west": 0.95, "centre": 1.4}).to_numpy()
    price = premium * (2500 * area + 15000 * rooms + 8000 * floors + 300 * (built - 1900)) + rng.normal(0, 25000, n)
    df = pd.DataFrame({"neighbourhood": hood.astype(object), "rooms": rooms, "floors": floors, "year_built": built,
                       "area_m2": area.round(1), "price": price.round(0)})
    for c in ("rooms", "floors", "year_built"):
        df.loc[rng.choice(n, max(n // 40, 1), replace=False), c] = np.nan
    return df


def houses_split(train_rows: int = 800, test_rows: int = 200, shared: int = 5, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Given train and test files, ``shared`` test rows also in train (the same listing twice)."""
    train, test = houses(train_rows, seed), houses(test_rows, seed + 1)
    return {"train": train, "test": pd.concat([train.iloc[:shared], test.iloc[shared:]], ignore_index=True)}


def churn(n: int = 50_000, seed: int = 0) -> pd.DataFrame:
    """50,000 customers: three string categoricals (plan, region, device), a few-valued integer
    (support calls), numbers with missing cells, and a churn label that depends on interactions."""
    rng = np.random.default_rng(seed)
    plan = rng.choice(["basic", "plus", "pro"], n, p=[0.5, 0.3, 0.2])
    region = rng.choice([f"r{i:02d}" for i in range(12)], n)
    device = rng.choice(["android", "ios", "web", "tv"], n, p=[0.4, 0.3, 0.2, 0.1])
    tenure = rng.integers(0, 73, n)
    monthly = np.where(plan == "basic", 20, np.where(plan == "plus", 45, 80)) + rng.normal(0, 8, n)
    calls = np.minimum(rng.poisson(1.5, n), 9)
    region_effect = {f"r{i:02d}": e for i, e in enumerate(rng.normal(0, 1.2, 12))}
    z = (1.2 + 0.8 * calls - 0.09 * tenure + 0.05 * (monthly - 40)
         + pd.Series(region).map(region_effect).to_numpy()
         + np.where((plan == "pro") & (device == "web"), 3.0, 0.0) + np.where(device == "tv", -1.5, 0.0))
    label = np.where(rng.random(n) < 1 / (1 + np.exp(-z)), "yes", "no")
    df = pd.DataFrame({"plan": plan.astype(object), "region": region.astype(object), "device": device.astype(object),
                       "tenure_months": tenure, "monthly_eur": monthly.round(2), "support_calls": calls,
                       "churned": label.astype(object)})
    df.loc[rng.choice(n, n // 50, replace=False), "monthly_eur"] = np.nan
    df.loc[rng.choice(n, n // 100, replace=False), "device"] = None
    return df


def loans(n: int = 4000, seed: int = 0, bad_share: float = 0.05) -> pd.DataFrame:
    """Loans with a rare outcome: a ``loan_id``, a string purpose and housing, an income with missing
    cells, a debt ratio, an integer count of late payments, and ``status`` "bad" in about
    ``bad_share`` of the rows (a logistic function of them), "good" in the rest."""
    rng = np.random.default_rng(seed)
    purpose = rng.choice(["car", "home", "study", "business", "travel"], n, p=[0.3, 0.3, 0.15, 0.15, 0.1])
    housing = rng.choice(["rent", "own", "mortgage"], n)
    income = rng.lognormal(10.5, 0.5, n)
    debt = rng.beta(2, 5, n)
    late = np.minimum(rng.poisson(0.6, n), 6)
    z = (2.5 * debt + 0.9 * late - 1.2 * (np.log(income) - 10.5) + np.where(purpose == "business", 1.0, 0.0)
         + np.where(purpose == "travel", 0.6, 0.0) - np.where(housing == "own", 0.7, 0.0))
    z = z - np.quantile(z, 1 - bad_share) + 1.5  # about bad_share above the logistic's midpoint region
    p = 1 / (1 + np.exp(-2.0 * z))
    order = np.argsort(-(p + rng.normal(0, 0.02, n)))
    bad = np.zeros(n, dtype=bool)
    bad[order[rng.random(n)[order] < p[order]][: int(round(n * bad_share))]] = True  # exactly the share
    df = pd.DataFrame({"loan_id": np.arange(100_000, 100_000 + n), "purpose": purpose.astype(object),
                       "housing": housing.astype(object), "income": income.round(0), "debt_ratio": debt.round(3),
                       "late_payments": late, "status": np.where(bad, "bad", "good").astype(object)})
    df.loc[rng.choice(n, n // 40, replace=False), "income"] = np.nan
    return df


def loans_split(rows: int = 4000, seed: int = 0) -> dict[str, pd.DataFrame]:
    """Given train and test files (a quarter of the rows), each with the same share of bad loans."""
    df = loans(rows, seed)
    test = df.groupby("status", group_keys=False).sample(frac=0.25, random_state=seed).sort_index()
    return {"train": df.drop(test.index).reset_index(drop=True), "test": test.reset_index(drop=True)}


# name -> (files written into the dataset folder, label): what init is pointed at.
SHAPES = {
    "penguins": ("species", lambda: {"penguins.csv": penguins()}),
    "houses": ("price", lambda: {f"{k}.csv": v for k, v in houses_split().items()}),
    "churn": ("churned", lambda: {"churn.parquet": churn()}),
    "loans": ("status", lambda: {f"{k}.csv": v for k, v in loans_split().items()}),
}


def write_shape(name: str, folder: Path) -> str:
    """Write shape ``name``'s files into ``folder`` (created); returns its label column."""
    label, make = SHAPES[name]
    folder.mkdir(parents=True, exist_ok=True)
    for file, df in make().items():
        (df.to_parquet if file.endswith(".parquet") else df.to_csv)(folder / file, index=False)
    return label


def hotels(n: int = 2000, seed: int = 0) -> pd.DataFrame:
    """Hotel bookings over 2015-2016: a ``booking_id``, an ISO ``arrival_date`` (some missing) and a
    ``booked_at`` timestamp with hours (some missing), a string room type, nights; the price per
    night follows the season (month), the weekday of arrival and the booking hour, not the year,
    so a model that reads the dates' parts prices a later year as well as the years it saw."""
    rng = np.random.default_rng(seed)
    arrival = pd.Timestamp("2015-01-01") + pd.to_timedelta(rng.integers(0, 730, n), unit="D")
    booked = arrival - pd.to_timedelta(rng.integers(1, 120 * 24, n), unit="h")
    room = rng.choice(["single", "double", "suite"], n, p=[0.3, 0.5, 0.2])
    nights = rng.integers(1, 10, n)
    season = 40 * np.sin(2 * np.pi * (arrival.month.to_numpy() - 4) / 12)
    weekend = np.where(arrival.dayofweek.to_numpy() >= 4, 35.0, 0.0)
    late = np.where(booked.hour.to_numpy() >= 20, 25.0, 0.0)
    base = pd.Series(room).map({"single": 80.0, "double": 120.0, "suite": 250.0}).to_numpy()
    price = base + season + weekend + late - 2.0 * nights + rng.normal(0, 8, n)
    df = pd.DataFrame({"booking_id": [f"B{i:05d}" for i in range(n)],
                       "arrival_date": arrival.strftime("%Y-%m-%d").astype(object),
                       "booked_at": booked.strftime("%Y-%m-%d %H:%M").astype(object),
                       "room": room.astype(object), "nights": nights, "price": price.round(2)})
    df.loc[rng.choice(n, n // 50, replace=False), "arrival_date"] = None
    df.loc[rng.choice(n, n // 40, replace=False), "booked_at"] = None
    return df


def shift_dates(df: pd.DataFrame, days: int) -> pd.DataFrame:
    """``df`` with its date columns moved ``days`` later (a multiple of 7 keeps the weekdays)."""
    out = df.copy()
    for col, fmt in (("arrival_date", "%Y-%m-%d"), ("booked_at", "%Y-%m-%d %H:%M")):
        moved = pd.to_datetime(out[col], format=fmt) + pd.Timedelta(days=days)
        out[col] = moved.dt.strftime(fmt).where(out[col].notna(), None).astype(object)
    return out


SHAPES["hotels"] = ("price", lambda: {"hotels.csv": hotels()})


def validate_table(exp, features: list[str], label: str, splits: dict[str, pd.DataFrame], report_dir: Path,
                   class_label: bool, dates: dict | None = None) -> dict:
    """The table suite (``validation.suite``) on frames in memory (``{"train", "test"}`` as read, or
    changed by a test), against the expectations ``exp`` and ``dates`` (``{column: strftime format}``)."""
    from validation.suite import _frame_source, _validate

    params = {"expectations": exp, "features": list(features), "label": label, "class_label": class_label,
              "dates": dates or {}}
    return _validate(params, _frame_source(splits), Path(report_dir))
