"""Megatron-LM's rank-filtered prints: the first rank's set-up lines, the last rank's
losses (it holds them under pipeline parallelism)."""

import torch


def print_rank_0(msg: str) -> None:
    if torch.distributed.get_rank() == 0:
        print(msg, flush=True)


def print_rank_last(msg: str) -> None:
    if torch.distributed.get_rank() == torch.distributed.get_world_size() - 1:
        print(msg, flush=True)
