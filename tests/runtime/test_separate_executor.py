"""The separate placement's iteration in real processes: encoder ranks run the ViT's
``EF`` / ``EB`` and the LLM's two pipeline ranks their ``F`` / ``B`` by the program
(``SeparateExecutor``, the schedule executor at each rank of the whole world), the encoder
output crossing to the LLM's first stage and its gradient back; losses and gradients equal
the colocated model's in one process (trainable and frozen ViT; two encoder replicas next
to one LLM replica, one encoder replica serving two LLM replicas, and one encoder rank next
to the LLM whole on one rank, PP=1: the bench's 2-rank separate row)."""

import pytest
import torch

from dist_harness import run_distributed
from tiny_multimodal import MEDIA_ID, tiny_config

M = 4  # micro-batches


def _config(frozen):
    from megatron_mm.config import FreezeConfig

    cfg = tiny_config()
    # untied: the last stage's output layer is no copy of the first stage's embedding
    cfg.language.untie_embeddings_and_output_weights = True
    if frozen:
        cfg.freeze = FreezeConfig(encoders=["vision"])
    return cfg


def _batches():
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(M):
        tokens = torch.randint(0, 200, (2, 48), generator=gen)
        tokens[0, 3:19] = MEDIA_ID  # one 16-token image per sample
        tokens[1, 10:26] = MEDIA_ID
        loss_mask = torch.ones(2, 48)
        loss_mask[:, :5] = 0
        out.append(dict(tokens=tokens, labels=torch.randint(0, 200, (2, 48), generator=gen),
                        loss_mask=loss_mask, position_ids=torch.arange(48).expand(2, -1),
                        media={"image": torch.randn(2, 3, 16, 16, generator=gen)}))
    return out


CLIP = 1e-3  # below the gradient norm: every rank must clip by the same, global norm


def _stepped(chunk):
    """``chunk`` in Megatron-Core's DDP with its optimizer, as the training run has them."""
    from megatron.core.distributed import DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from megatron_mm.models.wrappers import DistributedDataParallel

    ddp = DistributedDataParallel(config=chunk.config, module=chunk,
                                  ddp_config=DistributedDataParallelConfig(
                                      grad_reduce_in_fp32=True))
    optimizer = get_megatron_optimizer(OptimizerConfig(
        optimizer="adam", lr=1e-2, clip_grad=CLIP, params_dtype=torch.float32), [ddp])
    chunk.config.finalize_model_grads_func = finalize_model_grads
    chunk.config.grad_scale_func = optimizer.scale_loss
    return ddp, optimizer


def _state(chunk) -> tuple:
    """(gradients after finalisation and clipping, parameters after the step), by name."""
    from train_workers import global_names

    names = global_names(chunk)
    return ({names[n]: p.main_grad.clone() for n, p in chunk.named_parameters()
             if getattr(p, "main_grad", None) is not None},
            {names[n]: p.detach().clone() for n, p in chunk.named_parameters()})


def _one_process(rank, frozen):
    """The colocated model's step on Megatron-Core's schedule; its initial weights."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from dist_harness import one_rank_world
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.training.loop.step import forward_step

    with one_rank_world("gloo"):
        torch.manual_seed(0)
        model = build_model(_config(frozen), BuildSettings(), {"image": MEDIA_ID})
        weights = {n: p.detach().clone() for n, p in model.named_parameters()}
        ddp, optimizer = _stepped(model)
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(_batches()), model=[ddp],
            num_microbatches=M, seq_length=48, micro_batch_size=2)
        _, norm, _ = optimizer.step()
        return weights, [x["lm loss"] for x in losses], norm, _state(model)


def _separate(rank, world, edp, frozen, weights, pp):
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.models.build import model_chain
    from megatron_mm.plan import StagePartition
    from megatron_mm.plan.schedules.problem import ScheduleProblem
    from megatron_mm.plan.schedules.separate import placement_sizes, separate
    from megatron_mm.plan.schedules.separate_placements import separate_model_placements
    from megatron_mm.runtime.separate_executor import SeparateExecutor, global_grad_norm
    from megatron_mm.runtime.separate_placement import (SeparateRanks,
                                                         initialize_separate_parallel)
    from megatron_mm.training.assembly.initialize import batch_to_device
    from megatron_mm.training.loop.step import forward_step
    from train_workers import global_names

    dist.init_process_group("gloo")
    ranks = SeparateRanks(placement_sizes(world, 1, pp, 1, 1, edp), 1, pp, 1)
    dp = ranks.sizes.llm_data_parallel_size  # each LLM replica runs M / dp micro-batches
    initialize_separate_parallel(ranks)
    model_parallel_cuda_manual_seed(0)
    cfg = _config(frozen)
    places = separate_model_placements(model_chain(cfg),
                                       StagePartition(pp, 1, [2, 2] if pp == 2 else [4]))
    if ranks.is_encoder(rank):
        settings, place = BuildSettings(placements=[places.encoder]), places.encoder
    else:
        settings = BuildSettings(pipeline_model_parallel_size=pp, placements=places.llm)
        place = places.llm[parallel_state.get_pipeline_model_parallel_rank()]
    chunk = build_model(cfg, settings, {"image": MEDIA_ID}, placement=place)
    names = global_names(chunk)
    with torch.no_grad():
        for n, p in chunk.named_parameters():
            p.copy_(weights[names[n]])
    ddp, optimizer = _stepped(chunk)
    global_grad_norm(optimizer)
    executor = SeparateExecutor(
        ranks, lambda n: separate(ScheduleProblem(pp, n // dp, llm_data_parallel_size=dp,
                                                  encoder_data_parallel_size=edp,
                                                  encoder_trainable=not frozen)), places.pieces,
        batch_to_device, placements=places.llm)
    losses = executor(forward_step_func=forward_step, data_iterator=iter(_batches()),
                      model=[ddp], num_microbatches=M)
    _, norm, _ = optimizer.step()
    return [x["lm loss"] for x in losses], norm, _state(chunk)


@pytest.mark.processes
@pytest.mark.parametrize("edp, llm_dp, frozen, pp", [
    (1, 1, False, 2), (1, 1, True, 2), (2, 1, False, 2), (1, 2, False, 2),
    # the LLM whole on one rank (PP=1: its only stage is first and last)
    (1, 1, False, 1)], ids=["1-encoder-rank", "1-encoder-rank-frozen-vit", "2-encoder-ranks",
                            "1-encoder-rank-llm-dp2", "1-encoder-rank-llm-pp1"])
def test_encoder_ranks_and_llm_pipeline_step_as_one_process(edp, llm_dp, frozen, pp):
    weights, ref_losses, ref_norm, (ref_grads, ref_params) = run_distributed(
        _one_process, 1, frozen)[0]
    assert ref_norm > CLIP  # the step clips
    world = edp + pp * llm_dp
    out = run_distributed(_separate, world, world, edp, frozen, weights, pp)
    last = range(world - llm_dp, world)  # LLM replica d's last stage, its micro-batches
    assert not any(out[r][0] for r in range(world) if r not in last)
    losses = [loss for r in last for loss in out[r][0]]
    for ours, theirs in zip(losses, ref_losses, strict=True):
        torch.testing.assert_close(ours, theirs)
    for _, norm, _ in out:  # every rank clipped by the one-process norm
        assert norm == pytest.approx(ref_norm, rel=1e-5)
    for what, ref in (("grads", ref_grads), ("params", ref_params)):
        merged = {}
        for _, _, state in out:  # replicas (either side's) hold the same reduced state
            for name, value in state[0 if what == "grads" else 1].items():
                if name in merged:
                    torch.testing.assert_close(value, merged[name], msg=name)
                merged.setdefault(name, value)
        assert merged.keys() == ref.keys(), what
        assert any(n.startswith("vision_model.") for n in merged) != (frozen and what == "grads")
        for name, value in ref.items():
            torch.testing.assert_close(merged[name], value, rtol=1e-4, atol=1e-6,
                                       msg=f"{what} {name}")
