"""Screenshots of `trainflow ui` in headless Chromium: the Prefect flow run page (with its graph)
and the MLflow registered model version page of the latest finished run in a TRAINFLOW_HOME.

    TRAINFLOW_HOME=/tmp/ui-home python scripts/ui_screenshots.py --out /tmp/ui-shots

Starts `trainflow ui` on free ports, renders each page (virtual time lets the apps fetch their
data first), checks each PNG is not blank and shows that run, and stops `trainflow ui`. Needs
Chromium. Prints one line per PNG; exit 1 with one line of cause.
"""

from __future__ import annotations

import argparse
import json
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from core.procs import parent_death_signal  # noqa: E402

BIN = Path(sys.executable).parent
WINDOW = "1400,900"


def _chromium(chromium: str, url: str, budget_ms: int, *flags: str) -> subprocess.CompletedProcess:
    """Headless Chromium at 1400x900 on ``url``, given ``budget_ms`` of virtual time to render."""
    return subprocess.run([chromium, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                           "--disable-background-networking", "--no-first-run", f"--window-size={WINDOW}",
                           f"--virtual-time-budget={budget_ms}", *flags, url],
                          capture_output=True, text=True, timeout=120)


def screenshot(chromium: str, url: str, png: Path, budget_ms: int = 15000) -> Path:
    """Render ``url`` into ``png``; raise RuntimeError if no picture came out."""
    png.parent.mkdir(parents=True, exist_ok=True)
    png.unlink(missing_ok=True)
    proc = _chromium(chromium, url, budget_ms, "--hide-scrollbars", f"--screenshot={png}")
    if not png.is_file():
        raise RuntimeError(f"chromium wrote no {png} (exit {proc.returncode}): {proc.stderr.strip()[-300:]}")
    return png


def distinct_colours(png: Path) -> int:
    """How many colours the picture has: a blank or plain error page has a handful."""
    from PIL import Image

    with Image.open(png) as img:
        return len(img.convert("RGB").getcolors(maxcolors=1 << 20) or [])


def _get(url: str, data: dict | None = None) -> dict:
    req = urllib.request.Request(url, data=None if data is None else json.dumps(data).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        return json.load(r)


def latest_flow_run(prefect_url: str) -> tuple[str, str]:
    """``(id, name)`` of the newest completed flow run."""
    runs = _get(f"{prefect_url}/api/flow_runs/filter", {
        "flow_runs": {"state": {"type": {"any_": ["COMPLETED"]}}}, "sort": "EXPECTED_START_TIME_DESC", "limit": 1})
    if not runs:
        raise RuntimeError("no completed flow run in this Prefect history (run `trainflow run` first)")
    return runs[0]["id"], runs[0]["name"]


def latest_model_version(mlflow_url: str) -> tuple[str, str]:
    found = _get(f"{mlflow_url}/api/2.0/mlflow/model-versions/search?order_by=creation_timestamp%20DESC"
                 "&max_results=1").get("model_versions") or []
    if not found:
        raise RuntimeError("no registered model version in this MLflow database")
    return found[0]["name"], found[0]["version"]


class UI:
    """`trainflow ui` on free ports, as a subprocess; ``urls`` once both servers answer."""

    def __init__(self, env: dict[str, str], timeout_s: float = 180):
        self.proc = subprocess.Popen([str(BIN / "trainflow"), "ui", "--prefect-port", "0", "--mlflow-port", "0"],
                                     cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                     preexec_fn=parent_death_signal(signal.SIGTERM))  # it stops its servers
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()
        self.urls = self._wait_urls(timeout_s)

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put(None)

    def _wait_urls(self, timeout_s: float) -> dict[str, str]:
        urls, deadline = {}, time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                break
            if line is None:
                break
            self.output.append(line)
            if m := re.match(r"(Prefect|MLflow) UI: (http://\S+)", line):
                urls[m.group(1)] = m.group(2)
            if line.startswith("Ctrl-C"):
                return urls
        self.stop()
        raise RuntimeError("`trainflow ui` did not start: " + "".join(self.output)[-500:].strip())

    def stop(self, timeout_s: float = 60) -> int:
        """SIGINT (a Ctrl-C), then the exit code; what it printed meanwhile is in ``output``."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
        try:
            code = self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            code = self.proc.wait()
        while (line := self.lines.get(timeout=5)) is not None:
            self.output.append(line)
        return code


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="folder for the PNGs (keep it out of the repository)")
    ap.add_argument("--chromium", default=next(filter(None, map(shutil.which, ("chromium", "chromium-browser",
                                                                              "google-chrome"))), None),
                    help="browser binary (default: chromium on PATH)")
    ap.add_argument("--budget-ms", type=int, default=15000, help="virtual time each page gets to render")
    args = ap.parse_args(argv)
    if not args.chromium:
        print("ui_screenshots: error: no chromium on PATH (apt-get install chromium, or --chromium PATH)",
              file=sys.stderr)
        return 1
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    ui = UI(env)
    try:
        prefect, mlflow = ui.urls["Prefect"], ui.urls["MLflow"]
        run_id, run_name = latest_flow_run(prefect)
        name, version = latest_model_version(mlflow)
        # file: (url, text the rendered page must hold: the page is that run / that version, not an error)
        pages = {"prefect-flow-run.png": (f"{prefect}/runs/flow-run/{run_id}", [run_name, "Task runs"]),
                 "mlflow-model-version.png": (f"{mlflow}/#/models/{name}/versions/{version}",
                                              [f"Version {version}", name])}
        for file, (url, expected) in pages.items():
            png = screenshot(args.chromium, url, args.out / file, args.budget_ms)
            colours = distinct_colours(png)
            if colours < 64:
                raise RuntimeError(f"{png}: looks blank ({colours} colours) for {url}")
            dom = _chromium(args.chromium, url, args.budget_ms, "--dump-dom").stdout  # what the picture shows
            missing = [text for text in expected if text not in dom]
            if missing:
                raise RuntimeError(f"{url}: the rendered page lacks {missing}")
            print(f"{png}  {url}  ({colours} colours; shows {', '.join(expected)})")
    except (RuntimeError, OSError, KeyError, subprocess.TimeoutExpired) as exc:
        print(f"ui_screenshots: error: {exc}", file=sys.stderr)
        return 1
    finally:
        ui.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
