"""Inductor's CPU vector-ISA probe, made once in the fork server (``dist_harness.PRELOAD``)
so that every rank it forks inherits the answer.

Megatron-Core's fused activations are ``torch.compile``d; the first compiled call in a
process on the CPU asks Inductor which vector ISA the CPU has, and Inductor finds out by building
and running a probe program per ISA (about 2 s of subprocesses, behind a file lock every
process on the machine shares). The answer is cached in the process (``functools.cache``),
so a forked rank that inherits it goes straight to the compiled kernels. The probe starts
and waits for its subprocesses only: no thread, pool or process group survives it."""

import torch

# On a CUDA machine the compiled kernels are Triton's and no rank asks: the probe is skipped
# (a GPU node took about a minute over it). torch asks NVML here (the fork server's
# PYTORCH_NVML_BASED_CUDA_CHECK), so CUDA stays uninitialised for the forked ranks.
if not torch.cuda.is_available():
    from torch._inductor.cpu_vec_isa import pick_vec_isa

    pick_vec_isa()
