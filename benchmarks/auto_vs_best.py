"""Is ``cpu_workers: auto`` / ``strategy: auto`` as fast as the best fixed layout?

    .venv/bin/python benchmarks/auto_vs_best.py                 # digits CNN + a wide MLP, ~6 min
    .venv/bin/python benchmarks/auto_vs_best.py --shapes digits --repeats 3

Per shape, the scaling sweep (``flows.scale.run_sweep``) measures every fixed CPU layout in a private
``TRAINFLOW_HOME``; ``auto`` is resolved as the launcher resolves it, with no sweep and with the sweep
just saved (the built-in rule is shown only); each pick is re-measured beside the best fixed layout.
The last line is ``auto_ratio=<worst median samples/s ratio, auto / best, over shapes and picks>``.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path

from common import ROOT, median, parser

SHAPES = {
    "digits": ("configs/digits.yaml", []),
    # The "hidden 1024, batch 256" shape, where 2 DDP processes beat 1 x 2 threads there.
    "wide-mlp": ("configs/digits.yaml", ["model.kind=mlp", "model.hidden=1024", "training.batch_size=256",
                                         "training.base_batch=256"]),
}


def layout_of(cfg) -> dict:
    t = cfg.training
    n, th = int(t.cpu_workers), int(t.threads_per_worker)
    return {"name": f"{n}x{th}", "nproc": n, "threads": th, "device": "cpu"}


def median_rate(rows: list[dict], name: str) -> float | None:
    return median(r["samples_per_s"] for r in rows if r["layout"] == name and r.get("samples_per_s"))


def main(argv: list[str] | None = None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--shapes", default=",".join(SHAPES), help=f"comma-separated of {', '.join(SHAPES)}")
    ap.add_argument("--repeats", type=int, default=3, help="alternating rounds of best vs auto (default 3)")
    ap.add_argument("--epochs", type=int, default=3)
    args = ap.parse_args(argv)

    home = Path(tempfile.mkdtemp(prefix="trainflow-auto-"))
    os.environ["TRAINFLOW_HOME"] = str(home)  # the sweep saves its rows here; auto reads them
    from core.config import load_config
    from core.env import apply_offline_env
    from core.manifest import read_dvc_file
    from flows.scale import run_sweep
    from training.plan import host_facts, plan_launch
    from training.probe import default_layouts, measured_plan

    apply_offline_env(home)
    quiet = lambda _m: None  # noqa: E731
    worst: float | None = None
    print(f"machine: {os.cpu_count()} cores; TRAINFLOW_HOME={home}", flush=True)
    for shape in args.shapes.split(","):
        cfg_path, sets = SHAPES[shape]
        cfg_path = str(ROOT / cfg_path)
        auto = load_config(cfg_path, [*sets, "training.strategy=auto", "training.cpu_workers=auto"])
        ruled = plan_launch(auto, host_facts(auto, home))  # nothing measured yet: the rule's plan
        rule_cfg, rule_why, rule = ruled.cfg, ruled.reasons, layout_of(ruled.cfg)
        probe_cfg = measured_plan(ruled, ROOT, read_dvc_file(ROOT, auto.dataset.dvc_file).md5, home, quiet).cfg
        probe = layout_of(probe_cfg)

        sweep = run_sweep(cfg_path, sets, layouts=default_layouts(), epochs=args.epochs,
                          out_dir=home / f"sweep-{shape}", log=quiet)
        best_row = sweep["best"]
        best = {"name": best_row["layout"], "nproc": best_row["nproc"], "threads": best_row["threads"], "device": "cpu"}
        swept = plan_launch(auto, host_facts(auto, home))
        sweep_cfg, sweep_why = swept.cfg, swept.reasons
        picked = layout_of(sweep_cfg)

        print(f"\n== {shape} ==", flush=True)
        for r in sweep["rows"]:
            print(f"  sweep {r['layout']:>5s}: {r['samples_per_s']:9,.0f} samples/s", flush=True)
        print(f"  best fixed: {best['name']}", flush=True)
        print(f"  rule (no probe):  {rule['name']} ({rule_cfg.training.strategy}) -- {rule_why[-1] if rule_why else ''}",
              flush=True)
        print(f"  auto, probe:      {probe['name']} ({probe_cfg.training.strategy})", flush=True)
        print(f"  auto, with sweep: {picked['name']} ({sweep_cfg.training.strategy})", flush=True)

        contenders = {best["name"]: best, rule["name"]: rule, probe["name"]: probe, picked["name"]: picked}
        rows: list[dict] = []
        for i in range(args.repeats):
            # Alternate, starting from a different layout each round (drift hits all alike).
            order = list(contenders.values())
            order = order[i % len(order):] + order[:i % len(order)]
            rows += run_sweep(cfg_path, sets, layouts=order, epochs=args.epochs,
                              out_dir=home / f"rerun-{shape}-{i}", log=quiet)["rows"]
        base = median_rate(rows, best["name"])
        for label, lay in (("rule (no probe)", rule), ("auto, probe", probe), ("auto, with sweep", picked)):
            rate = median_rate(rows, lay["name"])
            ratio = rate / base if rate and base else None
            print(f"  {label:17s} {lay['name']:>5s}: {rate or 0:9,.0f} samples/s vs best {best['name']} "
                  f"{base or 0:9,.0f} -> ratio {ratio if ratio is None else round(ratio, 3)}", flush=True)
            if ratio is not None and lay is not rule:  # the rule is shown, not shipped for auto
                worst = ratio if worst is None else min(worst, ratio)
    print(f"auto_ratio={worst if worst is None else round(worst, 3)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
