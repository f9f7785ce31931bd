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
    import megatron_mm.training.assembly.model_setup as setup
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



LLM_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")


def _count_collectives(counts: dict):
    """Count every collective this process issues from now on, by name, into ``counts``
    (Megatron-Core's mappings and layers call their all-gather / reduce-scatter through
    names bound at import: those too)."""
    import torch.distributed as dist
    from megatron.core.tensor_parallel import layers, mappings

    def counted(name, fn):
        def call(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return fn(*args, **kwargs)
        return call

    for name in ("all_reduce", "all_gather", "all_gather_into_tensor", "reduce_scatter",
                 "reduce_scatter_tensor", "broadcast", "_all_gather_base",
                 "_reduce_scatter_base"):
        setattr(dist, name, counted(name, getattr(dist, name)))
    for module in (mappings, layers):
        for name in ("dist_all_gather_func", "dist_reduce_scatter_func"):
            if hasattr(module, name):
                setattr(module, name, counted(name, getattr(module, name)))


def lora_collectives(rank: int, llm_layers: int) -> dict:
    """TP=2: the collectives of one forward and backward of the tiny model (tests/
    tiny_multimodal.py), its LLM frozen, without and with LoRA on every LLM linear, SP off
    and on: {(sequence_parallel, lora): {name: count}}."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
    from tiny_multimodal import MEDIA_ID, tiny_config

    from megatron_mm.config import FreezeConfig, LoraConfig
    from megatron_mm.models import BuildSettings, build_model

    torch.distributed.init_process_group("gloo")
    parallel_state.initialize_model_parallel(2, 1)
    model_parallel_cuda_manual_seed(1234)
    tokens = torch.randint(0, 200, (2, 32), generator=torch.Generator().manual_seed(0))
    tokens[:, 2:18] = MEDIA_ID
    batch = dict(tokens=tokens, position_ids=torch.arange(32).expand(2, -1), labels=tokens,
                 media={"image": torch.randn(2, 3, 16, 16,
                                             generator=torch.Generator().manual_seed(1))})
    out, counts = {}, {}
    _count_collectives(counts)
    for sp in (False, True):
        for lora in (False, True):
            config = tiny_config(llm_layers=llm_layers)
            config.freeze = FreezeConfig(language_model=not lora)  # LoRA freezes it too
            if lora:
                config.lora = LoraConfig(targets=(("language_model", LLM_TARGETS),), rank=2,
                                         alpha=4.0)
            model = build_model(config, BuildSettings(tensor_model_parallel_size=2,
                                                      sequence_parallel=sp),
                                {"image": MEDIA_ID})
            counts.clear()
            model(**batch).sum().backward()
            out[(sp, lora)] = dict(counts)
    return out
