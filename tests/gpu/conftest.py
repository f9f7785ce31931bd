import os

# Before anything asks torch.cuda.is_available(): through NVML, which leaves CUDA
# uninitialised in this process, so that the ranks forked for the multi-process tests can
# use it (dist_harness.FORKSERVER_ENV).
os.environ.setdefault("PYTORCH_NVML_BASED_CUDA_CHECK", "1")

import pytest  # noqa: E402
from te_gate import WITHOUT_TE, te_gate  # noqa: E402

TE_UTILS = "transformer_engine.pytorch.attention.dot_product_attention.utils"
TE_DPA = "transformer_engine.pytorch.attention.dot_product_attention.dot_product_attention"


@pytest.fixture(scope="session")
def cuda():
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")


@pytest.fixture(scope="session")
def transformer_engine():
    """For every test that needs TE: skipped without CUDA, FAILS on CUDA where TE does not
    import (unless MEGATRON_MM_GPU_TESTS_WITHOUT_TE=1: skipped, TE absent)."""
    import torch

    from megatron_mm.te_import import import_error

    action, reason = te_gate(torch.cuda.is_available(), import_error(),
                             os.environ.get(WITHOUT_TE) == "1")
    if action == "skip":
        pytest.skip(reason)
    if action == "fail":
        pytest.fail(reason, pytrace=False)


@pytest.fixture(scope="module")
def cuda_world(cuda):
    """A 1-rank NCCL world on GPU 0, model parallel state TP=PP=1, RNG tracker seeded."""
    import torch
    from dist_harness import one_rank_world

    torch.cuda.set_device(0)
    with one_rank_world("nccl") as parallel_state:
        yield parallel_state


@pytest.fixture
def te_backends(monkeypatch):
    """{TE mask type: {"flash" | "fused" | "unfused"}} TE chose in this test (its own
    ``get_attention_backend``, recorded as its ``DotProductAttention`` calls it)."""
    import importlib

    utils, dpa = importlib.import_module(TE_UTILS), importlib.import_module(TE_DPA)
    chosen, real = {}, utils.get_attention_backend

    def record(params):
        result = real(params)
        flash, _, fused, _, unfused, _ = result
        kind = "flash" if flash else "fused" if fused else "unfused" if unfused else "none"
        chosen.setdefault(params.attn_mask_type, set()).add(kind)
        return result

    monkeypatch.setattr(utils, "get_attention_backend", record)
    # TE asks again only for inputs unlike the last call's: forget those
    monkeypatch.setitem(dpa._attention_backends, "attention_params", None)
    return chosen


@pytest.fixture(scope="module")
def world(request):
    """One CUDA rank where there is a GPU, else one gloo rank."""
    import torch

    return request.getfixturevalue("cuda_world" if torch.cuda.is_available() else "gloo_world")


@pytest.fixture
def fp32_matmuls():
    """fp32 matmuls, not TF32, in both paths (flex's kernel reads the same switch)."""
    import torch

    before = torch.backends.cuda.matmul.allow_tf32
    torch.backends.cuda.matmul.allow_tf32 = False
    yield
    torch.backends.cuda.matmul.allow_tf32 = before
