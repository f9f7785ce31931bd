"""The separate placement's iteration in real processes: encoder ranks run the ViT's
``EF`` / ``EB`` and the LLM's two pipeline ranks their ``F`` / ``B`` by the program
(``SeparateExecutor``, the schedule executor at each rank of the whole world), the encoder
output crossing to the LLM's first stage and its gradient back; losses and gradients equal
the colocated model's in one process (trainable and frozen ViT; with two encoder replicas,
each holds the gradient of its micro-batches: their sum is the one process's, what the
encoder's data-parallel reduction makes of it)."""

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


def _grads(chunks) -> dict:
    from train_workers import global_names

    return {global_names(c)[n]: p.grad.clone() for c in chunks
            for n, p in c.named_parameters() if p.grad is not None}


def _one_process(rank, frozen):
    """The colocated model's iteration on Megatron-Core's schedule; its weights."""
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from dist_harness import one_rank_world
    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.training.step import forward_step

    with one_rank_world("gloo"):
        torch.manual_seed(0)
        model = build_model(_config(frozen), BuildSettings(), {"image": MEDIA_ID})
        losses = get_forward_backward_func()(
            forward_step_func=forward_step, data_iterator=iter(_batches()), model=[model],
            num_microbatches=M, seq_length=48, micro_batch_size=2)
        return ({n: p.detach().clone() for n, p in model.named_parameters()},
                [x["lm loss"] for x in losses], _grads([model]))


def _separate(rank, world, edp, frozen, weights):
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from megatron_mm.models import BuildSettings, build_model
    from megatron_mm.models.build import model_chain
    from megatron_mm.plan import StagePartition
    from megatron_mm.plan.schedules.separate import placement_sizes, separate
    from megatron_mm.plan.schedules.separate_placements import separate_model_placements
    from megatron_mm.runtime.separate_executor import SeparateExecutor
    from megatron_mm.runtime.separate_placement import (SeparateRanks,
                                                         initialize_separate_parallel)
    from megatron_mm.training.step import batch_to_device, forward_step
    from train_workers import global_names

    dist.init_process_group("gloo")
    ranks = SeparateRanks(placement_sizes(world, 1, 2, 1, 1, edp), 1, 2, 1)
    initialize_separate_parallel(ranks)
    model_parallel_cuda_manual_seed(0)
    cfg = _config(frozen)
    places = separate_model_placements(model_chain(cfg), StagePartition(2, 1, [2, 2]))
    if ranks.is_encoder(rank):
        settings, place = BuildSettings(placements=[places.encoder]), places.encoder
    else:
        settings = BuildSettings(pipeline_model_parallel_size=2, placements=places.llm)
        place = places.llm[parallel_state.get_pipeline_model_parallel_rank()]
    chunk = build_model(cfg, settings, {"image": MEDIA_ID}, placement=place)
    names = global_names(chunk)
    with torch.no_grad():
        for n, p in chunk.named_parameters():
            p.copy_(weights[names[n]])
    executor = SeparateExecutor(
        ranks, lambda n: separate(2, 1, n, 1, edp, not frozen), places.pieces, batch_to_device,
        placements=places.llm)
    losses = executor(forward_step_func=forward_step, data_iterator=iter(_batches()),
                      model=[chunk], num_microbatches=M)
    return [x["lm loss"] for x in losses], _grads([chunk])


@pytest.mark.processes
@pytest.mark.parametrize("edp, frozen", [(1, False), (1, True), (2, False)],
                         ids=["1-encoder-rank", "1-encoder-rank-frozen-vit", "2-encoder-ranks"])
def test_encoder_ranks_and_llm_pp2_equal_one_process(edp, frozen):
    weights, ref_losses, ref_grads = run_distributed(_one_process, 1, frozen)[0]
    world = edp + 2
    out = run_distributed(_separate, world, world, edp, frozen, weights)
    assert not any(losses for losses, _ in out[:-1])  # the loss on the LLM's last stage
    for ours, theirs in zip(out[-1][0], ref_losses, strict=True):
        torch.testing.assert_close(ours, theirs)
    grads = {}
    for rank, (_, g) in enumerate(out):
        if rank < edp:  # the encoder replicas' shares of the micro-batches
            assert rank == 0 or g.keys() == out[0][1].keys()
            g = {n: v + grads.get(n, 0) for n, v in g.items()}
        else:
            assert not set(g) & set(grads)
        grads.update(g)
    assert grads.keys() == ref_grads.keys()
    assert any(n.startswith("vision_model.") for n in grads) != frozen
    for name, g in ref_grads.items():
        torch.testing.assert_close(grads[name], g, rtol=1e-4, atol=1e-6, msg=name)
