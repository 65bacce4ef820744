"""Training curves as one PNG, drawn with Pillow (matplotlib's import alone costs more): loss
(train and validation) and validation accuracy per epoch."""

from __future__ import annotations

import math
from pathlib import Path

# Series colours: matplotlib's tab:blue and tab:orange, so the plots read like the others.
TRAIN, VAL = (31, 119, 180), (255, 127, 14)
PANEL_W, PANEL_H, LEFT, TOP, BOTTOM = 340, 240, 52, 46, 40


def curves_png(history: list[dict], path: Path, title: str) -> Path:
    """Render ``history`` (per-epoch ``epoch``, ``train_loss``, ``val_loss``, ``val_accuracy`` or None)
    as a PNG at ``path``: a loss panel and, when there is an accuracy, an accuracy panel. ValueError
    for an empty history."""
    from PIL import Image, ImageDraw, ImageFont

    if not history:
        raise ValueError("no epochs in the training history: nothing to plot")
    epochs = [int(h["epoch"]) for h in history]
    panels = [("loss", [("train", TRAIN, [h["train_loss"] for h in history]),
                        ("validation", VAL, [h["val_loss"] for h in history])])]
    acc = [h.get("val_accuracy") for h in history]
    if any(a is not None for a in acc):
        panels.append(("validation accuracy", [("validation", VAL, acc)]))
    img = Image.new("RGB", (len(panels) * (LEFT + PANEL_W + 16), TOP + PANEL_H + BOTTOM), "white")
    draw = ImageDraw.Draw(img)
    font, big = ImageFont.load_default(size=11), ImageFont.load_default(size=13)
    draw.text((img.width / 2, 6), title, anchor="ma", font=big, fill="black")
    for i, (name, series) in enumerate(panels):
        _panel(draw, font, i * (LEFT + PANEL_W + 16) + LEFT, name, epochs, series)
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    img.save(path, format="PNG", optimize=True)
    return path


def _ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About ``n`` round values spanning [lo, hi]."""
    step = (hi - lo) / max(n - 1, 1) or 1.0
    mag = 10 ** math.floor(math.log10(step))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= step)
    first = math.floor(lo / step) * step
    return [first + k * step for k in range(int(math.ceil((hi - first) / step)) + 1)]


def _panel(draw, font, x0: int, name: str, epochs: list[int], series: list) -> None:
    """One framed plot at ``x0``: y ticks from the series' range, one x tick per epoch (thinned)."""
    values = [v for _, _, vs in series for v in vs if v is not None and math.isfinite(v)]
    lo, hi = (min(values), max(values)) if values else (0.0, 1.0)
    if hi - lo < 1e-9:  # one epoch, or a flat series: a small band around it
        pad = max(abs(lo) * 0.1, 1e-3)
        lo, hi = lo - pad, hi + pad
    ticks = _ticks(lo, hi)
    lo, hi = ticks[0], ticks[-1]
    e0, e1 = epochs[0], max(epochs[-1], epochs[0] + 1)
    y_top, y_bot = TOP, TOP + PANEL_H

    def xy(e: float, v: float) -> tuple[float, float]:
        return x0 + (e - e0) / (e1 - e0) * PANEL_W, y_bot - (v - lo) / (hi - lo) * PANEL_H

    for t in ticks:
        _, y = xy(e0, t)
        draw.line([(x0, y), (x0 + PANEL_W, y)], fill=(232, 232, 232))
        draw.text((x0 - 4, y), f"{t:.4g}", anchor="rm", font=font, fill="black")
    every = max(1, math.ceil(len(epochs) / 10))
    for e in epochs[::every]:
        x, _ = xy(e, lo)
        draw.line([(x, y_bot), (x, y_bot + 3)], fill="black")
        draw.text((x, y_bot + 5), str(e), anchor="ma", font=font, fill="black")
    draw.rectangle([x0, y_top, x0 + PANEL_W, y_bot], outline="black")
    draw.text((x0 + PANEL_W / 2, y_bot + 22), "epoch", anchor="ma", font=font, fill="black")
    draw.text((x0, y_top - 4), name, anchor="ld", font=font, fill="black")
    for k, (label, colour, vs) in enumerate(series):
        points = [xy(e, v) for e, v in zip(epochs, vs) if v is not None and math.isfinite(v)]
        if len(points) > 1:
            draw.line(points, fill=colour, width=2)
        for px, py in points:
            draw.ellipse([px - 2.5, py - 2.5, px + 2.5, py + 2.5], fill=colour)
        lx = x0 + PANEL_W - 90 * (len(series) - k)  # the legend, above the frame on the right
        draw.line([(lx, y_top - 9), (lx + 16, y_top - 9)], fill=colour, width=2)
        draw.text((lx + 20, y_top - 4), label, anchor="ld", font=font, fill="black")
