"""Patch ``tensor_cuda_noop``: ``torch.Tensor.cuda`` is the identity without CUDA."""

import torch
from megatron.core.models.common.embeddings import rope_utils
from megatron.core.models.vision.clip_vit_model import CLIPViTModel
from megatron.core.models.vision.vit_layer_specs import get_vit_layer_with_local_spec

CUDA_MISSING = "Torch not compiled with CUDA enabled"


def test_upstream_fails(upstream):
    upstream.raised("tensor_cuda", "AssertionError", CUDA_MISSING)
    # CLIPViTModel.__init__, once its norm is fixed (patch clip_vit_norm)
    upstream.raised("clip_vit_build_with_norm", "AssertionError", CUDA_MISSING,
                    where=("clip_vit_model.py", "self.position_ids = torch.arange("
                                                "self.seq_length).expand(1, -1).cuda()"))


def test_cuda_returns_the_tensor_itself():
    t = torch.arange(6.0).reshape(2, 3)
    assert t.cuda() is t
    assert t.cuda(0) is t and t.cuda("cuda:0", non_blocking=True) is t
    weight = torch.nn.Parameter(torch.ones(3))
    # language_module.py: ``weight.data.cuda()`` shares storage with the parameter
    assert weight.data.cuda().data_ptr() == weight.data_ptr()


def test_clip_vit_position_ids(gloo_world, tiny_config):
    model = CLIPViTModel(tiny_config, get_vit_layer_with_local_spec(), img_h=28, img_w=28,
                         patch_dim=14)
    assert torch.equal(model.position_ids, torch.arange(5).expand(1, -1))
    assert model.position_ids.device.type == "cpu"


def test_rope_pos_emb_on_cp_rank(gloo_world):
    """``rope_utils``: ``torch.tensor(..., pin_memory=True).cuda(non_blocking=True)``."""
    emb = torch.randn(6, 1, 1, 4)
    out = rope_utils.get_pos_emb_on_this_cp_rank(emb, 0, gloo_world.get_context_parallel_group())
    assert torch.equal(out, emb)
