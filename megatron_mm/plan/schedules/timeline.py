"""Timelines of schedules (simulated or measured ``Simulation``s) as files a person reads:
a Chrome trace (Perfetto) and a PNG with ranks as rows."""

from __future__ import annotations

import json
from typing import Sequence

from .simulate import Simulation

COLOURS = {"F": (66, 133, 244), "B": (25, 80, 170), "EF": (251, 188, 5), "EB": (219, 120, 0),
           "BCAST": (150, 90, 200), "ALLREDUCE": (110, 50, 160), "GRAD_SYNC": (40, 160, 80),
           "ENCODER_GRAD_SYNC": (20, 110, 50), "A2A": (220, 60, 60), "A2A_B": (160, 30, 30)}


def write_chrome_trace(runs: Sequence[Simulation], path: str) -> None:
    """One process per schedule, one row per rank."""
    events = []
    for pid, sim in enumerate(runs):
        events += [dict(e, pid=pid) for e in sim.chrome_trace()["traceEvents"]]
        events.append({"name": "process_name", "ph": "M", "pid": pid,
                       "args": {"name": sim.schedule}})
    with open(path, "w") as f:
        json.dump({"traceEvents": events, "displayTimeUnit": "ms"}, f)


# What the PNG's legend calls each kind (the encoder's pieces and stages alike)
NAMES = {"F": "LLM forward", "B": "LLM backward", "EF": "encoder forward",
         "EB": "encoder backward", "BCAST": "encoder replicas' broadcast",
         "ALLREDUCE": "encoder replicas' gradient sum", "GRAD_SYNC": "DP gradient sync",
         "ENCODER_GRAD_SYNC": "encoder DP gradient sync", "A2A": "expert all-to-all",
         "A2A_B": "expert all-to-all (backward)"}


def _font(size: int):
    from PIL import ImageFont

    try:
        return ImageFont.load_default(size=size)  # FreeType's: any size
    except (TypeError, OSError):  # Pillow without FreeType: its bitmap font
        return ImageFont.load_default()


def _ticks(longest: float, count: int = 10) -> list:
    """Round tick values from 0 past ``longest``: steps of 1, 2 or 5 x 10^k."""
    import math

    raw = longest / count
    power = 10 ** math.floor(math.log10(raw))
    step = next(m * power for m in (1, 2, 5, 10) if m * power >= raw)
    return [i * step for i in range(int(longest / step + 1e-9) + 1)]


def write_png(runs, path: str, width: int = 1200, row: int = 28,
              unit: str = "time units") -> None:
    """Ranks as rows per schedule, LLM work blue (forward light, backward dark), encoder work
    orange, encoder collectives purple, the expert all-to-alls red, bubbles white; the
    data-parallel reductions (``GRAD_SYNC``, on the communication stream) a green strip
    under the row; every schedule on the same time scale, with a time axis in ``unit``
    under each and a legend of the kinds drawn. Every block is labelled: its kind and
    micro-batch where they fit, else the micro-batch; the image widens (up to 4x) so the
    narrowest block holds a digit."""
    from PIL import Image, ImageDraw

    font, small = _font(11), _font(9)
    longest = max(sim.iteration_s for sim in runs)
    left, header, axis, legend = 110, 22, 26, 26
    blocks = [t.end_s - t.start_s for sim in runs for t in sim.timeline
              if t.kind not in ("GRAD_SYNC", "ENCODER_GRAD_SYNC") and t.end_s > t.start_s]
    scale = (width - left - 10) / longest
    if blocks and min(blocks) * scale < 9:
        scale = min(9 / min(blocks), 4 * scale)
    width = int(left + longest * scale + 20)
    kinds = [k for k in COLOURS if any(str(t.kind) == k for sim in runs for t in sim.timeline)]
    # a placement with ranks of its own (separate encoders) has more rows
    height = legend + sum(header + len(sim.busy_s) * row + axis + 6 for sim in runs)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    x = 4
    for kind in kinds:  # the legend
        draw.rectangle([x, 6, x + 14, 18], fill=COLOURS[kind])
        text = f"{kind}: {NAMES.get(kind, kind)}"
        draw.text((x + 18, 6), text, fill="black", font=font)
        x += 18 + int(draw.textlength(text, font=font)) + 14
    y = legend
    for sim in runs:
        ranks = len(sim.busy_s)
        draw.text((4, y + 4), f"{sim.schedule}: iteration {sim.iteration_s:.4g} {unit}, "
                              f"bubble {sim.bubble_fraction:.0%}", fill="black", font=font)
        y += header
        for r in range(ranks):
            draw.text((4, y + r * row + 8), f"rank {r}", fill="black", font=font)
            draw.rectangle([left, y + r * row + 2, left + longest * scale,
                            y + (r + 1) * row - 2], outline=(200, 200, 200))
        for t in sim.timeline:
            x0, x1 = left + t.start_s * scale, left + t.end_s * scale
            top = y + t.rank * row + 2
            if t.kind in ("GRAD_SYNC", "ENCODER_GRAD_SYNC"):  # beside the compute: a strip
                draw.rectangle([x0, top + row - 8, max(x0 + 1, x1 - 1), top + row - 4],
                               fill=COLOURS[t.kind])
                continue
            colour = COLOURS[str(t.kind)]
            draw.rectangle([x0, top, max(x0 + 1, x1 - 1), top + row - 4], fill=colour)
            light = 0.299 * colour[0] + 0.587 * colour[1] + 0.114 * colour[2] > 150
            ink = "black" if light else "white"  # dark text on light blocks
            for text, face in ((f"{t.kind}{t.microbatch}", font), (str(t.microbatch), font),
                               (str(t.microbatch), small)):
                if draw.textlength(text, font=face) <= x1 - x0 - 2:
                    draw.text((x0 + 2, top + 6), text, fill=ink, font=face)
                    break
        y += ranks * row
        draw.line([left, y + 2, left + longest * scale, y + 2], fill="black")
        for tick in _ticks(longest):
            tx = left + tick * scale
            draw.line([tx, y + 2, tx, y + 6], fill="black")
            draw.text((tx - 6, y + 7), f"{tick:g}", fill="black", font=small)
        draw.text((4, y + 7), f"time, in {unit}", fill="black", font=small)
        y += axis + 6
    image.save(path)
