"""A ViT on Megatron-Core's TransformerBlock: CLIP (class token, ``ln_pre``) or SigLIP.

Parameter names match Megatron-Core's ``CLIPViTModel`` (``conv1``, ``position_embeddings``,
``class_token``, ``ln_pre``, ``decoder``, ``ln_post``) so checkpoints and converters carry
over. Unlike it, only the layers up to the feature layer are built, the output is the
hidden state LLaVA-style models consume (class token dropped on request), and the norm
comes from the layer-spec table rather than a TE-or-torch guess.
"""

from __future__ import annotations

from typing import Optional

import torch
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec, build_module
from megatron.core.transformer.transformer_config import TransformerConfig

from ...models.encoder_parts import EncoderParts
from ...models.interleaved_blocks import encoder_block
from ...models.te_attention_mask import padded_layer_spec
from ...plan.fp8 import encoder_sequence_multiple
from .config import VisionEncoderConfig
from .transformer_config import vision_transformer_config


class VisionTransformer(EncoderParts, MegatronModule):
    """The ViT, or the part of it one pipeline chunk holds: the patch embedding (``embed``),
    the transformer layers Megatron-Core's layout gives this chunk (``build_layers``), and
    the output norm and class-token drop in front of the projector (``post``)."""

    def __init__(self, config: TransformerConfig, encoder: VisionEncoderConfig,
                 layer_spec: ModuleSpec, norm_impl: type, embed: bool = True,
                 build_layers: bool = True, post: bool = True, vp_stage=None,
                 pg_collection=None, checkpoint_dp_group=None,
                 sequence_multiple: Optional[int] = None):
        """``sequence_multiple``: pad the sequence (patches and class token) to a multiple
        of it; default: the TP size under sequence parallelism (a class token makes the
        length odd), else 1 (``build_vit``: TP x the FP8 alignment when the ViT or its
        projector runs FP8, whose GEMMs take each rank's shard)."""
        super().__init__(config=config)
        self.use_encoder_groups(pg_collection, checkpoint_dp_group)
        self.encoder_config = encoder
        hidden = encoder.hidden_size
        clip = encoder.model_type == "clip"
        self.class_token_len = 1 if encoder.has_class_token else 0
        self.seq_length = encoder.num_patches + self.class_token_len
        if sequence_multiple is None:
            sequence_multiple = (config.tensor_model_parallel_size
                                 if config.sequence_parallel else 1)
        self.sp_padding = -self.seq_length % sequence_multiple
        layer_spec = padded_layer_spec(layer_spec, self.sp_padding)  # either impl
        self.has_embed = embed
        if embed:
            self.conv1 = torch.nn.Conv2d(3, hidden, kernel_size=encoder.patch_dim,
                                         stride=encoder.patch_dim, bias=not clip,
                                         dtype=config.params_dtype)
            self.position_embeddings = torch.nn.Embedding(self.seq_length, hidden,
                                                          dtype=config.params_dtype)
            config.init_method(self.position_embeddings.weight)
            # looked up through the module's call, as CLIPViTModel does (not part of the
            # state dict; moves with the module)
            self.register_buffer("position_ids", torch.arange(self.seq_length),
                                 persistent=False)
            if self.class_token_len:
                self.class_token = torch.nn.Parameter(
                    torch.randn(1, 1, hidden, dtype=config.params_dtype))
            self.ln_pre = (build_module(norm_impl, config=config, hidden_size=hidden,
                                        eps=config.layernorm_epsilon) if clip else None)
        self.decoder = (encoder_block(config, layer_spec, vp_stage, pg_collection)
                        if build_layers else None)
        self.has_post = post
        self.ln_post = (build_module(norm_impl, config=config, hidden_size=hidden,
                                     eps=config.layernorm_epsilon)
                        if post and encoder.apply_post_layernorm else None)

    def embed(self, images: torch.Tensor) -> torch.Tensor:
        """[N, 3, H, W] images -> [T, N, hidden] (Megatron's sequence-first layout).

        Every parameter is read inside a call of the module that owns it, so the forward
        pre-hooks registered on that module run before the read: Megatron-Core's DDP waits
        there for the all-gather of the parameter's bucket under --overlap-param-gather.
        ``class_token`` is this module's own: the embedding runs through its call."""
        return self(images, embed_only=True)

    def _embed(self, images: torch.Tensor) -> torch.Tensor:
        x = self.conv1(images.to(self.conv1.weight.dtype))
        x = x.flatten(2).transpose(1, 2)  # [N, patches, hidden]
        if self.class_token_len:
            x = torch.cat([self.class_token.expand(x.shape[0], -1, -1), x], dim=1)
        x = x + self.position_embeddings(self.position_ids).unsqueeze(0)
        x = self.to_sequence_parallel(x.transpose(0, 1))  # [T(/TP), N, hidden]
        if self.ln_pre is not None:
            x = self.ln_pre(x)
        return x.contiguous()

    def shard_features(self, hidden: torch.Tensor) -> torch.Tensor:
        """The per-token part of ``features``: the output norm, [T, N, hidden] (or this
        rank's shard of it) in and out."""
        return self.ln_post(hidden) if self.ln_post is not None else hidden

    def select_output_tokens(self, x: torch.Tensor) -> torch.Tensor:
        """[N, T, ...] -> [N, T', ...]: the class token dropped on request."""
        if self.class_token_len and self.encoder_config.drop_class_token:
            x = x[:, self.class_token_len:]
        return x

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T (+ padding), N, hidden] -> [N, T', hidden] features (T' =
        ``num_output_tokens``)."""
        hidden = hidden[:self.seq_length]  # drop the padding
        return self.select_output_tokens(self.shard_features(hidden).transpose(0, 1)).contiguous()

    def forward(self, images: torch.Tensor, embed_only: bool = False) -> torch.Tensor:
        """The whole encoder: [N, 3, H, W] images -> [N, T', hidden] features; with
        ``embed_only``, ``embed``'s output."""
        if embed_only:
            return self._embed(images)
        return self.features(self.layers(self.embed(images)))


def build_vit(enc: VisionEncoderConfig, settings, specs, part, name: str, vp_stage=None,
              pg_collection=None, checkpoint_dp_group=None) -> VisionTransformer:
    """The CLIP / SigLIP family's builder (``families/vit/encoder.py``): the part of the ViT the
    chunk's ``part`` (an ``EncoderPart`` of its placement) holds."""
    config = vision_transformer_config(enc, settings, name)
    fp8 = getattr(settings, "fp8", None)
    fp8_here = fp8 is not None and (fp8.applies_to(name) or fp8.applies_to(f"{name}-projector"))
    return VisionTransformer(
        config, enc, specs.vision_layer,
        specs.vision_norm, embed=part.embed, build_layers=part.num_layers > 0,
        post=part.projector, vp_stage=vp_stage, pg_collection=pg_collection,
        checkpoint_dp_group=checkpoint_dp_group,
        sequence_multiple=encoder_sequence_multiple(
            fp8.recipe if fp8_here else None, config.tensor_model_parallel_size,
            config.sequence_parallel))
