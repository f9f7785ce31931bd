"""Load a converted checkpoint the way the training script does (``--load`` alone
decides the architecture) at some TP / PP, and run it to full-vocabulary logits."""

from __future__ import annotations

import torch


def load_converted(ckpt: str, tp: int = 1, pp: int = 1):
    """This rank's model chunk, loaded from ``ckpt``; the Megatron world must be set up
    with the same TP / PP."""
    from megatron.core import parallel_state
    from megatron_mm.models import build_model
    from megatron_mm.training.arguments import parse_args
    from megatron_mm.training.checkpointing import load_checkpoint, saved_args
    from megatron_mm.training.pipeline_plan import plan_pipeline
    from megatron_mm.training.pretrain import build_settings

    args = parse_args(["--load", ckpt, "--tensor-model-parallel-size", str(tp),
                       "--pipeline-model-parallel-size", str(pp)], world_size=tp * pp)
    lm = args.model_config.language
    lm.padded_vocab_size = lm.vocab_size = saved_args(args)["padded_vocab_size"]
    media = {"image": args.image_token_id} if args.model_config.encoders else {}
    _, placements = plan_pipeline(args)  # --pipeline-partition uniform: Megatron's layout
    model = build_model(args.model_config, build_settings(args, placements), media,
                        placement=placements[parallel_state.get_pipeline_model_parallel_rank()])
    load_checkpoint(args, [model], None, None)
    return model.eval()


@torch.no_grad()
def logits(model, tokens: torch.Tensor, pixels) -> torch.Tensor:
    """Full logits [B, S, padded vocab] on the last pipeline stage (None elsewhere):
    stage 0 sends its hidden states on, TP ranks gather their vocabulary shards."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import gather_from_tensor_model_parallel_region

    positions = torch.arange(tokens.shape[1]).expand_as(tokens)
    media = {"image": pixels} if pixels is not None else None
    first, last = (parallel_state.is_pipeline_first_stage(),
                   parallel_state.is_pipeline_last_stage())
    if not first:
        hidden = torch.empty(tokens.shape[1], tokens.shape[0], model.config.hidden_size)
        torch.distributed.recv(hidden, parallel_state.get_pipeline_model_parallel_prev_rank())
        model.set_input_tensor(hidden)
    out = model(tokens, positions, media)
    if not last:
        torch.distributed.send(out.contiguous(),
                               parallel_state.get_pipeline_model_parallel_next_rank())
        return None
    return gather_from_tensor_model_parallel_region(out)
