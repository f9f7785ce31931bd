"""Keep Megatron's model-parallel RNG streams on the CPU generator.

Replaces ``megatron.core.tensor_parallel.random._get_cuda_rng_state`` /
``_set_cuda_rng_state`` and ``CudaRNGStatesTracker.add`` / ``.fork`` (checked against
megatron-core 0.19.2), which call ``torch.cuda.get_rng_state`` and fail without CUDA. On
CPU, dropout and init draw from the CPU generator, so that is the one the tracker switches.
"""

import contextlib

import torch


def _get_rng_state(device="cuda", clone=False, graph_safe=False):
    return torch.get_rng_state()


def _set_rng_state(new_state, device=-1, graph_safe=False):
    torch.set_rng_state(new_state)


def _add(self, name, seed):
    self._is_initialized = True
    if seed in self.seeds_:
        raise Exception(f"seed {seed} already exists")
    self.seeds_.add(seed)
    if name in self.states_:
        raise Exception(f"cuda rng state {name} already exists")
    orig = torch.get_rng_state()
    torch.manual_seed(seed)
    self.states_[name] = torch.get_rng_state()
    torch.set_rng_state(orig)


@contextlib.contextmanager
def _fork(self, name="model-parallel-rng"):
    # Upstream warns when the CPU state changes inside the fork; here that is the point.
    if name not in self.states_:
        raise Exception(f"cuda rng state {name} is not added")
    orig_state = torch.get_rng_state()
    orig_name = self._current_state_name
    if orig_name != "default-rng":
        self.states_[orig_name] = orig_state
    torch.set_rng_state(self.states_[name])
    self._current_state_name = name
    try:
        yield
    finally:
        self.states_[name] = torch.get_rng_state()
        if orig_name != "default-rng":
            orig_state = self.states_[orig_name]
        torch.set_rng_state(orig_state)
        self._current_state_name = orig_name


def apply() -> None:
    from megatron.core.tensor_parallel import random

    random._get_cuda_rng_state = _get_rng_state
    random._set_cuda_rng_state = _set_rng_state
    random.CudaRNGStatesTracker.add = _add
    random.CudaRNGStatesTracker.fork = _fork
