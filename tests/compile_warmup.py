"""Megatron-Core's ``quick_gelu`` (the CLIP towers' activation, a ``jit_fuser``:
``torch.compile``) compiled once in the fork server (``dist_harness.PRELOAD``), so that
every rank it forks finds its compiled frames instead of tracing them again (about 0.7 s
of CPU in each rank's first training step otherwise; the suite forks some hundreds).

Compiled as the ranks call it: 3-d fp32 activations of two sizes (the second compiles the
shape-dynamic frame every later size reuses), with and without autograd (training,
evaluation). Without Inductor's on-disk caches (their keys ask torch.cuda.current_device(),
CUDA's lazy init); Inductor compiles in this process (``compile_threads`` 1 meanwhile: its
thread pool would not survive the fork) on one intra-op thread, so no thread outlives the
warm-up; tensors of ones only: no RNG use."""

import torch

# On a CUDA machine the ranks' kernels are Triton's (for CUDA tensors): nothing to share.
# torch asks NVML here (the fork server's PYTORCH_NVML_BASED_CUDA_CHECK).
if not torch.cuda.is_available():
    from megatron.core.activations import quick_gelu
    from torch._functorch import config as aot_config
    from torch._inductor import config

    threads, compile_threads = torch.get_num_threads(), config.compile_threads
    caches = config.fx_graph_cache, aot_config.enable_autograd_cache
    torch.set_num_threads(1)
    config.compile_threads = 1
    # the caches' keys ask torch.cuda.current_device() (CUDA's lazy init) for the device
    config.fx_graph_cache = aot_config.enable_autograd_cache = False
    try:
        for shape in ((16, 2, 64), (17, 3, 65)):
            x = torch.ones(shape, requires_grad=True)
            quick_gelu(x).sum().backward()
            with torch.no_grad():
                quick_gelu(x)
    finally:
        config.compile_threads = compile_threads
        config.fx_graph_cache, aot_config.enable_autograd_cache = caches
        torch.set_num_threads(threads)
