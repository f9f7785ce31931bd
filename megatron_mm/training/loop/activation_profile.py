"""Activation bytes a layer keeps for its backward, measured on CPU.

``saved_tensor_bytes`` counts what autograd saves while a forward runs
(``torch.autograd.graph.saved_tensors_hooks``): each saved tensor's storage once, leaving
out parameter storages (weights are model state, not activations). A recomputed layer
keeps only its inputs (Megatron's checkpoint saves the hidden states), so its bytes are
the input's.
"""

from __future__ import annotations

import contextlib
from typing import Iterable, Iterator, List, Set

import torch


class SavedBytes:
    def __init__(self, exclude: Set[int]):
        self.exclude, self.seen, self.nbytes = exclude, set(), 0

    def pack(self, t: torch.Tensor):
        storage = t.untyped_storage()
        ptr = storage.data_ptr()
        if ptr not in self.exclude and ptr not in self.seen:
            self.seen.add(ptr)
            self.nbytes += storage.nbytes()
        return t


def parameter_storages(modules: Iterable[torch.nn.Module]) -> Set[int]:
    return {p.untyped_storage().data_ptr() for m in modules for p in m.parameters()}


@contextlib.contextmanager
def saved_tensor_bytes(exclude: Set[int]) -> Iterator[SavedBytes]:
    """Counts the bytes autograd saves inside the block (each storage once)."""
    counter = SavedBytes(exclude)
    with torch.autograd.graph.saved_tensors_hooks(counter.pack, lambda t: t):
        yield counter


def tensor_bytes(tensors: List[torch.Tensor]) -> int:
    return sum(t.untyped_storage().nbytes() for t in tensors if t is not None)
