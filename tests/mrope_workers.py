"""M-RoPE training with 3-D positions that differ across the three axes (the workers of
test_mrope_training and test_host_syncs)."""

import torch
from train_workers import train

MROPE = ["--position-embedding-type", "mrope", "--mrope-section", "2", "3", "3"]


def arbitrary_positions(tokens: torch.Tensor) -> torch.Tensor:
    """[3, S]: a different position on each axis, a function of the sample's tokens (the
    same on every rank and in every batch it lands in)."""
    t = torch.arange(len(tokens))
    return torch.stack([t, t + tokens % 5, 2 * t + 3 - tokens % 3])


def train_with_positions(rank, argv, grad_steps=(), hooks=None):
    """``train`` on samples carrying ``arbitrary_positions``; records the position ids
    each model chunk is called with (and runs ``hooks`` as ``train`` does)."""
    import megatron_mm.data.dataset as dataset

    encode = dataset.encode_record

    def with_positions(*args, **kwargs):
        sample = encode(*args, **kwargs)
        sample.position_ids = arbitrary_positions(sample.tokens)
        return sample

    def watch(model, optimizer, holder):
        seen = holder.setdefault("positions", [])

        def hook(module, args):
            pos = args[1]
            seen.append((pos.dim(), bool((pos[1] != pos[0]).any())))
        for chunk in model:
            chunk.register_forward_pre_hook(hook)
        if hooks is not None:
            hooks(model, optimizer, holder)

    dataset.encode_record = with_positions
    return train(rank, argv, grad_steps, watch)
