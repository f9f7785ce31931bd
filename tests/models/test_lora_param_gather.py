"""Megatron-Core DDP's ``--overlap-param-gather`` contract, emulated in one process: a
trainable parameter may be read in the forward only after the forward pre-hook of a module
that owns it (``module.parameters(recurse=False)``) has finished its bucket's all-gather
(``distributed_data_parallel.py: _make_forward_pre_hook``). A parameter read in a hook or
in a method called around its owner's ``__call__`` is read stale on every DP rank but the
one that updated its shard. Checked on Megatron-Core's own DDP (its buckets, its hook),
the all-gather replaced by a record, on the LoRA adapters (LLM, ViT, projector) and on a
trainable CLIP ViT (its class token and position embeddings)."""

import pytest
import torch
from torch.overrides import TorchFunctionMode
from torch.utils._pytree import tree_flatten

from tiny_multimodal import MEDIA_ID, tiny_config


_METADATA = (torch.Tensor.size, torch.Tensor.dim, torch.Tensor.numel)


class _ReadsBeforeGather(TorchFunctionMode):
    """Every torch call that takes a bucketed parameter whose bucket's all-gather has not
    been finished in this forward: (parameter name, the call)."""

    def __init__(self, names, bucket_of, finished):
        super().__init__()
        self.names, self.bucket_of, self.finished, self.early = names, bucket_of, finished, []

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func in _METADATA or getattr(func, "__name__", "") == "__get__":
            return func(*args, **(kwargs or {}))  # shape, dtype, device: not the values
        for value in tree_flatten((args, kwargs or {}))[0]:
            if isinstance(value, torch.nn.Parameter) and value in self.bucket_of \
                    and self.bucket_of[value] not in self.finished:
                self.early.append((self.names[value], getattr(func, "__name__", str(func))))
        return func(*args, **(kwargs or {}))


def _model(lora_targets):
    from megatron_mm.config import LoraConfig
    from megatron_mm.models import BuildSettings, build_model

    config = tiny_config()
    config.encoders["vision"].drop_class_token = True  # the class token still trains
    config.lora = LoraConfig(targets=lora_targets, rank=2, alpha=4.0) if lora_targets else None
    torch.manual_seed(0)
    return build_model(config, BuildSettings(), {"image": MEDIA_ID})


def _early_reads(model):
    """Wrap ``model`` in Megatron-Core's DDP (distributed optimizer, overlap of the grad
    reduce and param gather, a small bucket: one bucket per few parameters), run a forward
    as after an optimizer step (every bucket stale), and return the early reads."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig

    ddp = DistributedDataParallel(
        model.config, DistributedDataParallelConfig(
            use_distributed_optimizer=True, overlap_grad_reduce=True,
            overlap_param_gather=True, bucket_size=64), model)
    finished = set()
    for group in set(ddp.param_to_bucket_group.values()):
        # the hook's wait for this bucket's all-gather: recorded, nothing sent
        group.finish_param_sync = (lambda g: lambda skip_next_bucket_dispatch=False:
                                   finished.add(g))(group)
    assert len(set(ddp.param_to_bucket_group.values())) > 3
    names = {p: n for n, p in model.named_parameters()}
    tokens = torch.randint(0, 200, (2, 32))
    tokens[:, 2:18] = MEDIA_ID
    batch = dict(tokens=tokens, position_ids=torch.arange(32).expand(2, -1), labels=tokens,
                 media={"image": torch.randn(2, 3, 16, 16)})
    mode = _ReadsBeforeGather(names, ddp.param_to_bucket_group, finished)
    with mode:
        ddp(**batch)
    return mode.early, sorted(names[p] for p in ddp.param_to_bucket_group)


@pytest.mark.parametrize("targets", [
    (("language_model", ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj",
                         "down_proj")),),
    (("language_model", ("q_proj", "v_proj")), ("vision_model", ("q_proj", "v_proj")),
     ("vision_projection", ("up_proj", "down_proj"))),
], ids=["llm-adapters-trainable-vit", "adapters-everywhere"])
def test_every_bucketed_parameter_is_read_after_its_gather(gloo_world, targets):
    model = _model(targets)
    early, bucketed = _early_reads(model)
    assert any(".lora_A" in n for n in bucketed)
    if len(targets) == 1:  # the ViT trains whole: its class token and position embeddings
        assert {"vision_model.class_token", "vision_model.position_embeddings.weight"} <= \
            set(bucketed)
    assert early == [], sorted(set(early))
