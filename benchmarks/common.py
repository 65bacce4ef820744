"""What the benchmarks share: the repository on sys.path, medians, alternating rounds, tables, servers."""

from __future__ import annotations

import argparse
import socket
import statistics
import sys
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))


def parser(doc: str) -> argparse.ArgumentParser:
    """An argument parser described by the first line of a benchmark's docstring."""
    return argparse.ArgumentParser(description=doc.splitlines()[0])


def median(values) -> float | None:
    """The median of the numbers among ``values``; None when there are none."""
    nums = [v for v in values if isinstance(v, (int, float))]
    return statistics.median(nums) if nums else None


def rounds(items, i: int) -> list:
    """Round ``i``'s order of ``items``, reversed every other round: drift in the shared machine's
    load then hits each item alike."""
    return list(items) if i % 2 == 0 else list(items)[::-1]


def table(header: list[str], rows, align: list[str] | None = None) -> None:
    """Print a markdown table; ``align``: each column's separator (default ``---``)."""
    print("| " + " | ".join(header) + " |")
    print("|" + "|".join(align or ["---"] * len(header)) + "|")
    for row in rows:
        print("| " + " | ".join(map(str, row)) + " |")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def healthy(api_url: str) -> bool:
    """Whether ``<api_url>/health`` answers 200 now."""
    try:
        with urllib.request.urlopen(f"{api_url.rstrip('/')}/health", timeout=5) as resp:
            return resp.status == 200
    except (OSError, ValueError):
        return False


def wait_healthy(api_url: str, proc=None, timeout_s: float = 180.0) -> bool:
    """Poll ``<api_url>/health`` until it answers; False on timeout or when ``proc`` exits first."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            return False
        if healthy(api_url):
            return True
        time.sleep(0.2)
    return False


def parse_rows(text: str) -> int:
    """``"500k"`` -> 500000, ``"1.5M"`` -> 1500000."""
    text = text.strip().upper()
    scale = {"K": 10**3, "M": 10**6}.get(text[-1:], 1)
    return int(float(text.rstrip("KM")) * scale)
