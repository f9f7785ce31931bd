"""Give ``CLIPViTModel`` a norm that accepts ``config=`` when Transformer Engine is absent.

Replaces the ``ln_pre_impl`` / ``ln_post_impl`` defaults of
``megatron.core.models.vision.clip_vit_model.CLIPViTModel.__init__`` (megatron-core 0.19.2):
without TE they default to ``torch.nn.LayerNorm``, which ``build_module`` calls with
``config=`` -> TypeError. ``LLaVAModel`` builds the ViT with the defaults, so this is needed
to build Megatron-Core's own LLaVA without TE (our benchmark's reference).
"""


def apply() -> None:
    import torch

    from megatron.core.models.vision import clip_vit_model
    from megatron.core.transformer.torch_norm import WrappedTorchNorm

    init = clip_vit_model.CLIPViTModel.__init__
    init.__defaults__ = tuple(
        WrappedTorchNorm if d is torch.nn.LayerNorm else d for d in init.__defaults__
    )
