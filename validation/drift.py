"""Per-feature drift between a reference sample (the champion's training data) and new data.

Two measures per feature, thresholds from the config's ``retrain`` section:

* **PSI** (population stability index) over bins cut at the reference's quantiles:
  ``sum((q - p) * ln(q / p))`` with ``p``/``q`` the reference/new share of each bin, both
  floored at ``PSI_FLOOR`` so an empty bin counts as a large, finite shift. Digit pixels take
  only 17 integer values and many are almost always 0, so quantile edges repeat: repeated
  edges are merged, so each value of the reference gets one bin at most, and values below or
  above the reference's range get a bin of their own. A feature that is constant in the
  reference has three bins: below, that value, above.
* **KS**: scipy's two-sample Kolmogorov-Smirnov test; a small p-value says the two samples
  are unlikely to come from one distribution.

A feature drifts when PSI > ``psi_threshold`` or the KS p-value < ``ks_pvalue``; the data
drifts when the drifted share of features exceeds ``max_drifted_fraction``.

numpy and scipy are imported inside the functions.
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
    low, high = reference.min(), reference.max()
    return np.unique(np.concatenate([[np.nextafter(low, -np.inf)], qs, [high]]))


def psi(reference: np.ndarray, current: np.ndarray, n_bins: int = 10) -> float:
    """Population stability index of ``current`` against ``reference`` (0: same shape)."""
    import numpy as np

    edges = bin_edges(reference, n_bins)
    # Right-closed bins: (-inf, e0], (e0, e1], ..., (ek, inf)
    ref_counts = np.bincount(np.searchsorted(edges, reference, side="left"), minlength=edges.size + 1)
    cur_counts = np.bincount(np.searchsorted(edges, current, side="left"), minlength=edges.size + 1)
    p = np.maximum(ref_counts / max(len(reference), 1), PSI_FLOOR)
    q = np.maximum(cur_counts / max(len(current), 1), PSI_FLOOR)
    return float(np.sum((q - p) * np.log(q / p)))


def drift_report(reference: pd.DataFrame, current: pd.DataFrame, features: list[str],
                 cfg: RetrainConfig) -> dict:
    """Compare every feature; returns a JSON-ready dict::

        {"drifted": bool, "n_features": int, "n_drifted": int, "drifted_fraction": float,
         "thresholds": {...}, "rows": {"reference": n, "current": n},
         "features": [{"feature", "psi", "ks_statistic", "ks_pvalue", "drifted", "by"}]}

    ``features`` missing from either frame are a ValueError naming them.
    """
    import numpy as np
    from scipy.stats import ks_2samp

    missing = [f for f in features if f not in reference.columns or f not in current.columns]
    if missing:
        raise ValueError(f"drift check: feature columns missing: {missing[:5]}"
                         + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))
    rows = []
    for name in features:
        ref = reference[name].to_numpy(dtype=np.float64)
        cur = current[name].to_numpy(dtype=np.float64)
        ref, cur = ref[np.isfinite(ref)], cur[np.isfinite(cur)]
        value = psi(ref, cur, cfg.psi_bins)
        ks = ks_2samp(ref, cur)
        pvalue = float(ks.pvalue) if not math.isnan(ks.pvalue) else 1.0
        by = [m for m, hit in (("psi", value > cfg.psi_threshold), ("ks", pvalue < cfg.ks_pvalue)) if hit]
        rows.append({"feature": name, "psi": round(value, 6), "ks_statistic": round(float(ks.statistic), 6),
                     "ks_pvalue": pvalue, "drifted": bool(by), "by": by})
    n_drifted = sum(r["drifted"] for r in rows)
    fraction = n_drifted / len(rows) if rows else 0.0
    return {
        "drifted": fraction > cfg.max_drifted_fraction,
        "n_features": len(rows),
        "n_drifted": n_drifted,
        "drifted_fraction": round(fraction, 6),
        "thresholds": {"psi_threshold": cfg.psi_threshold, "ks_pvalue": cfg.ks_pvalue,
                       "max_drifted_fraction": cfg.max_drifted_fraction, "psi_bins": cfg.psi_bins},
        "rows": {"reference": int(len(reference)), "current": int(len(current))},
        "features": rows,
    }


def drift_markdown(report: dict, title: str = "Data drift") -> str:
    """The report as markdown: a verdict line, then one row per feature, most shifted first."""
    t = report["thresholds"]
    verdict = "DRIFT" if report["drifted"] else "no drift"
    lines = [
        f"# {title}: {verdict}",
        "",
        f"{report['n_drifted']} of {report['n_features']} features drifted "
        f"({report['drifted_fraction']:.1%}; the data drifts above {t['max_drifted_fraction']:.1%}). "
        f"A feature drifts when PSI > {t['psi_threshold']:g} or KS p-value < {t['ks_pvalue']:g}. "
        f"Rows: reference {report['rows']['reference']}, new {report['rows']['current']}.",
        "",
        "| feature | PSI | KS statistic | KS p-value | drifted |",
        "|---|---:|---:|---:|---|",
    ]
    for r in sorted(report["features"], key=lambda r: (-r["psi"], r["ks_pvalue"], r["feature"])):
        mark = ("yes (" + ", ".join(r["by"]) + ")") if r["drifted"] else "no"
        lines.append(f"| {r['feature']} | {r['psi']:.4f} | {r['ks_statistic']:.4f} | {r['ks_pvalue']:.3g} | {mark} |")
    return "\n".join(lines) + "\n"
