"""Optimus' published bubble-scheduling runs, as planner inputs beside the paper's figures.

Settings and figures: Optimus (Feng et al., ATC'25, arXiv 2408.03505), Table 5 (strong
scaling: ViT-22B + GPT-175B, global batch 1536, micro-batch 2, sequence 2048, PP 8, TP 8,
DP 24 / 32 / 48; Megatron-LM at plain 1F1B and Megatron-LM balanced at V = 12, Appendix D
Table 12; Hopper, 80 GB, 989 TFLOP/s), Table 7 (share of encoder computation scheduled
inside LLM bubbles, coarse and coarse + fine) and Table 10 / Appendix C (ViT-3B + GPT-11B
on 8 A100, global batch 16, sequence 2048). Transcribed in shared/notes/seed-systems.md
(B.3) and DESIGN.md ("Reference figures").

Assumed here, not published: two 224 px images (256 tokens each, ViT-22B's own
resolution) per 2048-token sample; the simulated Megatron-LM iterations are within 8 % of
Table 5. The two images were chosen when the simulator let the encoder's gradient
reduction overlap its own backward (the coarse schedule then hid 35.7 / 46.7 / 68.6 %
against the paper's Eff_coarse 34.3 / 45.8 / 68.7 %); with the reductions as schedule
actions that start after the last backward that feeds them, coarse hides 27.7 / 35.8 /
52.0 %: the same rise as the micro-batches fall, 6 to 17 points under the paper. Optimus'
interleaved schedule at V = 12 (one GPT-175B layer per chunk, as its balanced baseline); the 8-GPU
run's LLM plan (PP 4, TP 2, V 2; the paper does not give it); H100 / A100 at 50 % of peak
(``hardware``), links of ``Interconnect``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Tuple

from ..plan.costs.hardware import A100, A100_LINKS, H100, H100_LINKS
from ..plan.record import Record
from ..plan.schedules.action_costs import LLMLayout
from ..plan.schedules.encoder_planner import EncoderSchedulePlan, plan_encoder_schedule
from . import model_zoo


@dataclass
class OptimusRun(Record):
    pair: str  # model_zoo pair
    layout: LLMLayout
    hardware: str  # H100 | A100
    micro_batch_sizes: List[int]
    paper_megatron_s: float
    paper_optimus_s: float
    paper_balanced_s: Optional[float] = None
    paper_hidden_coarse: Optional[float] = None  # Table 7, Eff_coarse
    paper_hidden_fine: Optional[float] = None  # Table 7, Eff_fine
    images_per_sample: int = 2  # assumed (see above)

    @property
    def paper_speedup(self) -> float:
        return self.paper_megatron_s / self.paper_optimus_s


def _strong(dp: int, megatron: float, balanced: float, optimus: float, coarse: float,
            fine: float) -> OptimusRun:
    return OptimusRun("Optimus-D-224", LLMLayout(8, 8, dp, 12, 2, 1536, 2048, True), "H100",
                      [2], megatron, optimus, balanced, coarse, fine)


RUNS: List[OptimusRun] = [
    _strong(24, 10.65, 10.43, 9.80, 0.343, 0.575),
    _strong(32, 8.26, 8.06, 7.29, 0.458, 0.693),
    _strong(48, 5.91, 5.87, 4.87, 0.687, 0.850),
    OptimusRun("Optimus-small-224", LLMLayout(4, 2, 1, 2, 2, 16, 2048, True), "A100", [1, 2],
               3.42, 2.78, 3.04),
]


def plan_run(run: OptimusRun, images_per_sample: Optional[int] = None, **search
             ) -> EncoderSchedulePlan:
    """``search``: ``plan_encoder_schedule``'s options (pieces, schedules)."""
    hardware, links = (H100, H100_LINKS) if run.hardware == "H100" else (A100, A100_LINKS)
    # 224 px tiles: an image 224 x (224 n) is n tiles of 256 tokens
    images = images_per_sample or run.images_per_sample
    model = model_zoo.model_pair(run.pair, img_h=224, img_w=224 * images)
    return plan_encoder_schedule(model, run.layout, hardware, links,
                                 micro_batch_sizes=run.micro_batch_sizes, baseline_vpp=1,
                                 **search)


def coarse_hidden(result: EncoderSchedulePlan) -> Optional[float]:
    """The best coarse schedule's hidden share for the chosen encoder plan (Eff_coarse)."""
    b = result.best
    same = [c for c in result.candidates if c.schedule == "coarse"
            and c.encoder_pipeline_model_parallel_size == b.encoder_pipeline_model_parallel_size
            and c.encoder_tensor_model_parallel_size == b.encoder_tensor_model_parallel_size
            and c.micro_batch_size == b.micro_batch_size]
    return min(same, key=lambda c: c.iteration_s).encoder_hidden_fraction if same else None


def table(runs: List[OptimusRun] = RUNS, images_per_sample: Optional[int] = None
          ) -> Tuple[List[str], List[EncoderSchedulePlan]]:
    """Markdown lines and the plans."""
    def pct(x: Optional[float]) -> str:
        return "-" if x is None else f"{100 * x:.1f}%"

    lines = ["| model | GPUs | DP | micro-batches | Megatron-LM s (VPP 1) | Megatron VPP "
             "s | planned s | speed-up | vs VPP | hidden coarse / fine | plan | paper "
             "Megatron-LM / balanced / Optimus s | paper speed-up | paper hidden coarse / "
             "fine |", "| --- " * 14 + "|"]
    plans = []
    for run in runs:
        r = plan_run(run, images_per_sample)
        plans.append(r)
        lay = r.layout
        b = r.best
        lines.append(
            f"| {run.pair} | {r.gpus} | {lay.data_parallel_size} | {b.num_microbatches} x "
            f"{b.micro_batch_size} | {r.baseline_iteration_s:.2f} | "
            f"{r.interleaved_baseline_iteration_s:.2f} (VPP "
            f"{lay.virtual_pipeline_model_parallel_size}) | {r.iteration_s:.2f} | "
            f"{r.speedup:.2f}x | {r.speedup_interleaved:.2f}x | {pct(coarse_hidden(r))} / "
            f"{pct(b.encoder_hidden_fraction)} | {b.schedule}, enc PP "
            f"{b.encoder_pipeline_model_parallel_size} TP "
            f"{b.encoder_tensor_model_parallel_size}, {b.encoder_pieces} "
            f"{'sub-layer ' if b.sublayer else ''}piece(s)"
            f"{', rev' if b.reverse else ''} | {run.paper_megatron_s:.2f} / "
            f"{'-' if run.paper_balanced_s is None else f'{run.paper_balanced_s:.2f}'} / "
            f"{run.paper_optimus_s:.2f} | {run.paper_speedup:.2f}x | "
            f"{pct(run.paper_hidden_coarse)} / {pct(run.paper_hidden_fine)} |")
    return lines, plans
