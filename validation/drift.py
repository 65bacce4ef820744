"""Per-feature drift between a reference sample (the champion's training data) and new data.

Two measures per feature, thresholds from the config's ``retrain`` section:

* **PSI** (population stability index) over bins cut at the reference's quantiles:
  ``sum((q - p) * ln(q / p))`` with ``p``/``q`` the reference/new share of each bin, both floored
  at ``PSI_FLOOR`` so an empty bin counts as a large, finite shift. Repeated quantile edges (digit
  pixels take 17 values, mostly 0) are merged, and values below or above the reference's range
  get a bin of their own.
* **KS**: scipy's two-sample Kolmogorov-Smirnov test. A categorical feature (text or booleans)
  gets PSI over the reference's categories (missing and unseen values a bin each) and a
  chi-square test of the category counts instead (``test: chi2``).

A feature drifts when PSI > ``psi_threshold`` or the test's p-value < ``ks_pvalue``; the data
drifts when the drifted share of features exceeds ``max_drifted_fraction``.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from core.config import RetrainConfig

if TYPE_CHECKING:
    import numpy as np
    import pandas as pd

PSI_FLOOR = 1e-4


def bin_edges(reference: np.ndarray, n_bins: int) -> np.ndarray:
    """Right-closed bin edges: the reference's interior quantiles, de-duplicated, plus a bin for
    anything below its minimum and one for anything above its maximum."""
    import numpy as np

    qs = np.quantile(reference, np.linspace(0, 1, n_bins + 1)[1:-1], method="higher")
    return np.unique(np.concatenate([[np.nextafter(reference.min(), -np.inf)], qs, [reference.max()]]))


def _psi_of_counts(a: np.ndarray, b: np.ndarray) -> float:
    import numpy as np

    p = np.maximum(a / max(a.sum(), 1), PSI_FLOOR)
    q = np.maximum(b / max(b.sum(), 1), PSI_FLOOR)
    return float(np.sum((q - p) * np.log(q / p)))


def psi(reference: np.ndarray, current: np.ndarray, n_bins: int = 10) -> float:
    """Population stability index of ``current`` against ``reference`` (0: same shape)."""
    import numpy as np

    edges = bin_edges(reference, n_bins)
    # Right-closed bins: (-inf, e0], (e0, e1], ..., (ek, inf)
    return _psi_of_counts(*(np.bincount(np.searchsorted(edges, x, side="left"), minlength=edges.size + 1)
                            for x in (reference, current)))


def drift_report(reference: pd.DataFrame, current: pd.DataFrame, features: list[str],
                 cfg: RetrainConfig) -> dict:
    """Compare every feature; returns a JSON-ready dict::

        {"drifted": bool, "n_features": int, "n_drifted": int, "drifted_fraction": float,
         "thresholds": {...}, "rows": {"reference": n, "current": n},
         "features": [{"feature", "psi", "ks_statistic", "ks_pvalue", "drifted", "by", "test"}]}

    ``features`` missing from either frame are a ValueError naming them.
    """
    import numpy as np
    from scipy.stats import ks_2samp

    from tasks.encoding import numeric_dtype

    missing = [f for f in features if f not in reference.columns or f not in current.columns]
    if missing:
        raise ValueError(f"drift check: feature columns missing: {missing[:5]}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    rows = []
    for name in features:
        if not numeric_dtype(reference[name].dtype) or not numeric_dtype(current[name].dtype):
            rows.append(_categorical_row(name, reference[name], current[name], cfg))
            continue
        ref, cur = (frame[name].to_numpy(dtype=np.float64) for frame in (reference, current))
        ref, cur = ref[np.isfinite(ref)], cur[np.isfinite(cur)]
        ks = ks_2samp(ref, cur)
        rows.append(_row(name, psi(ref, cur, cfg.psi_bins), float(ks.statistic),
                         float(ks.pvalue) if not math.isnan(ks.pvalue) else 1.0, "ks", cfg))
    n_drifted = sum(r["drifted"] for r in rows)
    fraction = n_drifted / len(rows) if rows else 0.0
    return {
        "drifted": fraction > cfg.max_drifted_fraction, "n_features": len(rows), "n_drifted": n_drifted,
        "drifted_fraction": round(fraction, 6),
        "thresholds": {"psi_threshold": cfg.psi_threshold, "ks_pvalue": cfg.ks_pvalue,
                       "max_drifted_fraction": cfg.max_drifted_fraction, "psi_bins": cfg.psi_bins},
        "rows": {"reference": int(len(reference)), "current": int(len(current))},
        "features": rows,
    }


def _row(name: str, value: float, stat: float, pvalue: float, test: str, cfg: RetrainConfig) -> dict:
    by = [m for m, hit in (("psi", value > cfg.psi_threshold), (test, pvalue < cfg.ks_pvalue)) if hit]
    return {"feature": name, "psi": round(value, 6), "ks_statistic": round(stat, 6), "ks_pvalue": pvalue,
            "drifted": bool(by), "by": by, "test": test}


def _categorical_row(name: str, reference: pd.Series, current: pd.Series, cfg: RetrainConfig) -> dict:
    """PSI over the reference's categories (missing, and values the reference lacks, a bin each)
    and a chi-square test of the two samples' counts; ``ks_*`` hold the test's statistic and p-value."""
    import numpy as np
    from scipy.stats import chi2_contingency

    from tasks.encoding import category_keys

    ref, cur = category_keys(reference), category_keys(current)
    index = {c: i for i, c in enumerate(sorted({k for k in ref.tolist() if k is not None}))}
    other, missing = len(index), len(index) + 1

    def counts(keys: np.ndarray) -> np.ndarray:
        codes = [missing if k is None else index.get(k, other) for k in keys.tolist()]
        return np.bincount(np.asarray(codes, dtype=np.int64), minlength=len(index) + 2).astype(np.float64)

    a, b = counts(ref), counts(cur)
    used = (a + b) > 0
    stat, pvalue = 0.0, 1.0
    if used.sum() > 1:
        stat, pvalue = (float(x) for x in chi2_contingency(np.vstack([a[used], b[used]]))[:2])
    return _row(name, _psi_of_counts(a, b), stat, pvalue, "chi2", cfg)


def drift_markdown(report: dict) -> str:
    """The report as markdown: a verdict line, then one row per feature, most shifted first."""
    t = report["thresholds"]
    lines = [
        f"# Data drift: {'DRIFT' if report['drifted'] else 'no drift'}",
        "",
        f"{report['n_drifted']} of {report['n_features']} features drifted "
        f"({report['drifted_fraction']:.1%}; the data drifts above {t['max_drifted_fraction']:.1%}). "
        f"A feature drifts when PSI > {t['psi_threshold']:g} or its test's p-value < {t['ks_pvalue']:g} "
        f"(KS for numbers, chi-square for categories). "
        f"Rows: reference {report['rows']['reference']}, new {report['rows']['current']}.",
        "",
        "| feature | PSI | test | statistic | p-value | drifted |",
        "|---|---:|---|---:|---:|---|",
    ]
    for r in sorted(report["features"], key=lambda r: (-r["psi"], r["ks_pvalue"], r["feature"])):
        mark = ("yes (" + ", ".join(r["by"]) + ")") if r["drifted"] else "no"
        test = {"chi2": "chi-square"}.get(r.get("test"), "KS")
        lines.append(f"| {r['feature']} | {r['psi']:.4f} | {test} | {r['ks_statistic']:.4f} | {r['ks_pvalue']:.3g} "
                     f"| {mark} |")
    return "\n".join(lines) + "\n"
