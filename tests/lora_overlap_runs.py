"""Runs of Megatron-LM's ``pretrain`` (``examples/megatron_lm/pretrain_vlm.py``) and of
``examples/pretrain_mllm.py``'s, in the same ranks one after the other
(``megatron_lm_runs``), each recording the trainable parameters every model chunk computed
with: a snapshot at the end of every forward (under ``--overlap-param-gather`` the
all-gather of a bucket finishes in the forward that first uses it, so what a forward used is
what the previous step left, once gathered)."""

from __future__ import annotations

import torch


def _record(model, seen: list):
    def hook(module, args, output):
        seen.append(torch.cat([p.detach().flatten().float().clone()
                               for p in module.parameters() if p.requires_grad]))
    model.register_forward_hook(hook)
    return model


def run_recorded(rank: int, steps: list) -> list:
    """``megatron_lm_runs.run_steps`` with, in each result, ``trained``: the snapshots of
    every forward of this rank's model chunks, in order."""
    import megatron_mm.megatron_lm.model_provider as provider
    import megatron_mm.training.model_setup as setup
    from megatron_lm_runs import run_steps

    seen: list = []
    wrap, build = provider.wrap_language_model, setup.build_model
    provider.wrap_language_model = lambda *a, **k: _record(wrap(*a, **k), seen)
    setup.build_model = lambda *a, **k: _record(build(*a, **k), seen)
    results = []
    try:
        for step in steps:
            seen.clear()
            results.extend(run_steps(rank, [step]))
            results[-1]["trained"] = list(seen)
    finally:
        provider.wrap_language_model, setup.build_model = wrap, build
    return results

