"""Turn `trainflow run --summary-json` output into a CI verdict and a markdown summary.

    python scripts/ci_summary.py out/summary.json [--exit-code N] [--markdown FILE]

Exits with the run's own exit code (0 registered, 1 error, 2 data validation failed, 3 gate
rejected, 4 preempted), or 1 when the summary is missing, lacks what a registered run must report,
or disagrees with ``--exit-code``; writes a short markdown report (GitHub: $GITHUB_STEP_SUMMARY).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

MEANING = {0: "registered", 1: "error", 2: "data validation failed", 3: "gate rejected the model",
           4: "preempted (a checkpoint was saved; rerun resumes)"}
REQUIRED_ON_SUCCESS = ("model_name", "model_version", "aliases", "metrics", "gates", "manifest", "mlflow_run_id")


def verdict(summary: dict, exit_code: int | None = None) -> tuple[int, list[str]]:
    """(exit code for CI, problems). The summary's exit_code wins; a mismatch is a problem."""
    problems = []
    code = summary.get("exit_code")
    if not isinstance(code, int) or code not in MEANING:
        return 1, [f"summary has no valid exit_code (got {code!r})"]
    if exit_code is not None and exit_code != code:
        problems.append(f"trainflow exited {exit_code} but the summary says {code}")
    if code == 0:
        missing = [k for k in REQUIRED_ON_SUCCESS if summary.get(k) in (None, "", [], {})]
        if missing:
            problems.append("a registered run's summary lacks " + ", ".join(missing))
        failed = [g["name"] for g in summary.get("gates", []) if not g.get("passed")]
        if failed:
            problems.append("exit 0 with failed gates: " + ", ".join(failed))
    return (1 if problems and code == 0 else code), problems


def markdown(summary: dict) -> str:
    code = summary.get("exit_code")
    lines = [f"### trainflow run: {summary.get('status')} (exit {code}: {MEANING.get(code, '?')})", ""]
    if summary.get("model_version"):
        lines.append(f"- model `{summary['model_name']}` v{summary['model_version']} "
                     f"@{', @'.join(summary.get('aliases', []))}")
    for k, v in (summary.get("metrics") or {}).items():
        lines.append(f"- test {k}: {v:.4f}")
    for g in summary.get("gates") or []:
        mark = "pass" if g.get("passed") else "FAIL"
        lines.append(f"- gate {g['name']}: {g['value']:.4f} {g['op']} {g['threshold']:.4f} ({mark})")
    manifest = summary.get("manifest") or {}
    if manifest:
        lines.append(f"- data md5 `{manifest['data']['md5']}`, config `{manifest['config_sha256'][:12]}`, "
                     f"image `{manifest['image']['ref']}` ({manifest['image']['digest']})")
    if summary.get("error"):
        lines.append(f"- error: {summary['error']}")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("summary", type=Path)
    ap.add_argument("--exit-code", type=int, help="what `trainflow run` returned, to cross-check")
    ap.add_argument("--markdown", type=Path, help="append the markdown report here")
    args = ap.parse_args(argv)
    try:
        summary = json.loads(args.summary.read_text())
    except (OSError, ValueError) as exc:
        print(f"ci_summary: no readable summary at {args.summary}: {exc}", file=sys.stderr)
        return args.exit_code or 1
    code, problems = verdict(summary, args.exit_code)
    report = markdown(summary)
    print(report, end="")
    if args.markdown:
        with args.markdown.open("a") as fh:
            fh.write(report)
    for p in problems:
        print(f"ci_summary: {p}", file=sys.stderr)
    return code


if __name__ == "__main__":
    sys.exit(main())
