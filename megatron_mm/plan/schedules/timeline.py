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


def write_png(runs, path: str, width: int = 1200, row: int = 28) -> None:
    """Ranks as rows per schedule, LLM work blue (forward light, backward dark), encoder work
    orange, encoder collectives purple, the expert all-to-alls red, bubbles white; the
    data-parallel reductions (``GRAD_SYNC``, on the communication stream) a green strip
    under the row; every schedule on the same time scale."""
    from PIL import Image, ImageDraw

    longest = max(sim.iteration_s for sim in runs)
    left, header = 110, 22
    # a placement with ranks of its own (separate encoders) has more rows
    height = sum(header + len(sim.busy_s) * row + 10 for sim in runs)
    image = Image.new("RGB", (width, height), "white")
    draw = ImageDraw.Draw(image)
    scale = (width - left - 10) / longest
    y = 0
    for sim in runs:
        ranks = len(sim.busy_s)
        draw.text((4, y + 4), f"{sim.schedule}: {sim.iteration_s:.2f}, bubble "
                              f"{sim.bubble_fraction:.0%}", fill="black")
        y += header
        for r in range(ranks):
            draw.text((4, y + r * row + 8), f"rank {r}", fill="black")
            draw.rectangle([left, y + r * row + 2, left + longest * scale,
                            y + (r + 1) * row - 2], outline=(200, 200, 200))
        for t in sim.timeline:
            x0, x1 = left + t.start_s * scale, left + t.end_s * scale
            top = y + t.rank * row + 2
            if t.kind in ("GRAD_SYNC", "ENCODER_GRAD_SYNC"):  # beside the compute: a strip
                draw.rectangle([x0, top + row - 8, max(x0 + 1, x1 - 1), top + row - 4],
                               fill=COLOURS[t.kind])
                continue
            draw.rectangle([x0, top, max(x0 + 1, x1 - 1), top + row - 4],
                           fill=COLOURS[str(t.kind)])
            if x1 - x0 > 18:
                draw.text((x0 + 3, top + 6), f"{t.kind}{t.microbatch}", fill="white")
        y += ranks * row + 10
    image.save(path)
