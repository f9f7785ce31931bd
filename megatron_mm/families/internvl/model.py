"""InternVL's vision side on Megatron-Core layers (tensor-parallel): InternViT, the pixel
shuffle and the MLP projector, equal to transformers' ``InternVLModel.get_image_features``.

- Patch embedding: Hugging Face's Conv2d has kernel = stride = the patch, so it is a
  linear map of the flattened patch (``patch_embed``, with bias; the converter reshapes
  the kernel). A class token and absolute position embeddings follow; tiles of another
  size than the config's get the position grid resized bicubically, as Hugging Face does.
- Transformer blocks: Megatron-Core ``TransformerLayer`` (``SelfAttention`` without a
  mask: every tile is its own batch entry, all of one length) with LayerNorm or RMSNorm,
  a GELU ``MLP`` and **layer scale**: each branch's output times a learned per-channel
  vector (``ls1`` / ``ls2``, Hugging Face's ``lambda_1`` / ``lambda_2``, Megatron-LM's
  InternViT names) before the residual add.
- QK normalisation (``qk_norm``): Hugging Face's ``q_norm`` / ``k_norm`` are RMSNorms over
  *all* heads at once (width = hidden size), not per head as Megatron-Core's
  ``qk_layernorm``. Under TP each rank holds some heads, so ``CrossHeadRMSNorm`` sums the
  squares over its heads and all-reduces that sum over the TP group (its gradient too).
- Output: the tower's output (or the selected hidden state), class token dropped, the
  patch grid pixel-shuffled (``pixel_shuffle``: 2x2 patches -> one token of 4 x hidden,
  Hugging Face's exact transposes), then the projector: LayerNorm, Linear, GELU, Linear
  (``InternVLProjector``, a Megatron-Core ``MultimodalProjector`` with the norm in front).
"""

from __future__ import annotations

import math
from functools import partial
from typing import Optional

import torch
from megatron.core import parallel_state
from megatron.core.fusions.fused_bias_dropout import get_bias_dropout_add
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.tensor_parallel.layers import (
    ColumnParallelLinear,
    RowParallelLinear,
    set_tensor_model_parallel_attributes,
)
from megatron.core.transformer.attention import SelfAttention, SelfAttentionSubmodules
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.mlp import MLP, MLPSubmodules
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.spec_utils import ModuleSpec
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_config import TransformerConfig
from megatron.core.transformer.transformer_layer import TransformerLayer, TransformerLayerSubmodules
from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

from ...config import ConfigError
from ...models.encoder_parts import EncoderParts
from ...models.interleaved_blocks import encoder_block
from ...models.te_names import with_te_checkpoint_names
from .config import (PROJECTOR_NORM_EPSILON, QK_NORM_EPSILON,
                     InternViTConfig)


class _AllReduceSum(torch.autograd.Function):
    """Sum over a group, forward and backward: each rank's partial sum feeds every rank's
    output, so each rank's gradient is the sum of all ranks' gradients."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        x = x.clone()
        torch.distributed.all_reduce(x, group=group)
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        torch.distributed.all_reduce(grad, group=ctx.group)
        return grad, None


class CrossHeadRMSNorm(MegatronModule):
    """RMSNorm of q or k over all heads (Hugging Face's ``q_norm`` / ``k_norm``, eps 1e-6)
    on [s, b, local heads, head dim]. Its weight is split over TP ranks like the heads
    (rank r holds the channels of its heads), and so is its checkpoint tensor. The TP
    group is Megatron-Core's global one (an encoder TP of its own is not wired yet)."""

    def __init__(self, config: TransformerConfig, hidden_size: int, eps: float = None):
        super().__init__(config=config)
        # hidden_size: Megatron-Core passes the head dim; this norm spans the local heads.
        del hidden_size, eps
        self.group = parallel_state.get_tensor_model_parallel_group()
        tp = torch.distributed.get_world_size(self.group)
        if config.tensor_model_parallel_size != tp:
            raise ConfigError(f"the InternViT QK norm runs over the global tensor-parallel "
                              f"group ({tp} ranks); an encoder TP of "
                              f"{config.tensor_model_parallel_size} is not implemented")
        if config.num_attention_heads % tp:
            raise ConfigError(f"the tensor-parallel size {tp} must divide the vision "
                              f"heads {config.num_attention_heads}")
        self.tp = tp
        self.full_width = config.num_attention_heads * config.kv_channels
        self.weight = torch.nn.Parameter(torch.ones(self.full_width // tp,
                                                    dtype=config.params_dtype))
        set_tensor_model_parallel_attributes(self.weight, True, 0, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        shape = x.shape
        flat = x.reshape(*shape[:-2], -1).float()
        squares = flat.pow(2).sum(-1, keepdim=True)
        if self.tp > 1:
            squares = _AllReduceSum.apply(squares, self.group)
        normed = flat * torch.rsqrt(squares / self.full_width + QK_NORM_EPSILON)
        return (self.weight * normed.to(x.dtype)).reshape(shape)

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        state = self.state_dict(prefix="", keep_vars=True)
        return make_sharded_tensors_for_checkpoint(state, prefix, {"weight": 0},
                                                   sharded_offsets)


def layer_scale_bias_dropout_add(scale: torch.Tensor, training: bool, fused: bool):
    """Megatron-Core's bias-dropout-add with the branch scaled per channel:
    residual + scale * dropout(x + bias). Unfused whatever ``fused`` asks (a scaled
    variant of the fused kernel does not exist)."""

    def bda(x_with_bias, residual, prob):
        x, bias = x_with_bias
        if bias is not None:
            x = x + bias
        x = torch.nn.functional.dropout(x, p=prob, training=training)
        return residual + scale * x

    return bda


class LayerScaleTransformerLayer(TransformerLayer):
    """A transformer layer whose attention and MLP outputs are scaled by ``ls1`` / ``ls2``
    (InternViT's layer scale) before their residual adds."""

    def __init__(self, config: TransformerConfig, *args, **kwargs):
        super().__init__(config, *args, **kwargs)
        self.ls1 = torch.nn.Parameter(torch.ones(config.hidden_size, dtype=config.params_dtype))
        self.ls2 = torch.nn.Parameter(torch.ones(config.hidden_size, dtype=config.params_dtype))
        self.self_attn_bda = partial(layer_scale_bias_dropout_add, self.ls1)
        self.mlp_bda = partial(layer_scale_bias_dropout_add, self.ls2)


class ColumnParallelLinearWithoutBias(ColumnParallelLinear):
    """``linear_qkv`` when the config has no attention bias: Megatron-Core gives the QKV
    projection a bias whenever the other linears have one (``add_bias_linear``), while
    Hugging Face's ``attention_bias`` concerns q / k / v only."""

    def __init__(self, *args, bias: bool = True, **kwargs):
        super().__init__(*args, bias=False, **kwargs)


def internvit_layer_spec(encoder: InternViTConfig,
                         transformer_impl: str = "local") -> ModuleSpec:
    """The ViT block's spec. Checkpoint keys are TE's (``te_names.py``)."""
    if transformer_impl == "transformer_engine":
        # TODO: TEDotProductAttention (no mask, fixed length per tile) and
        # TELayerNormColumnParallelLinear; the cross-head q/k norm stays ours.
        raise ConfigError("the InternViT encoder is not wired for --transformer-impl "
                          "transformer_engine yet; use --transformer-impl local")
    if transformer_impl != "local":
        raise ConfigError(f"--transformer-impl must be local or transformer_engine, got "
                          f"{transformer_impl!r}")
    qk_norm = CrossHeadRMSNorm if encoder.qk_norm else None
    return with_te_checkpoint_names(ModuleSpec(
        module=LayerScaleTransformerLayer,
        submodules=TransformerLayerSubmodules(
            input_layernorm=WrappedTorchNorm,
            self_attention=ModuleSpec(
                module=SelfAttention,
                params={"attn_mask_type": AttnMaskType.no_mask},
                submodules=SelfAttentionSubmodules(
                    linear_qkv=(ColumnParallelLinear if encoder.attention_bias
                                else ColumnParallelLinearWithoutBias),
                    core_attention=DotProductAttention,
                    linear_proj=RowParallelLinear,
                    q_layernorm=qk_norm,
                    k_layernorm=qk_norm,
                ),
            ),
            # Replaced by the layer-scaled variant in the layer (Megatron-LM's way).
            self_attn_bda=get_bias_dropout_add,
            pre_mlp_layernorm=WrappedTorchNorm,
            mlp=partial(MLP.as_mlp_submodule, submodules=MLPSubmodules(
                linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)),
            mlp_bda=get_bias_dropout_add,
        ),
    ))


def pixel_shuffle(features: torch.Tensor, scale_factor: float = 0.5) -> torch.Tensor:
    """Hugging Face's ``InternVLModel.pixel_shuffle``, step for step: [B, W, H, C] ->
    [B, W * s, H * s, C / s^2] (s = ``scale_factor``), transposes included, so the
    channels of one output token come in Hugging Face's order."""
    b, w, h, c = features.shape
    x = features.reshape(b, w, int(h * scale_factor), int(c / scale_factor))
    x = x.permute(0, 2, 1, 3)
    x = x.reshape(b, int(h * scale_factor), int(w * scale_factor),
                  int(c / scale_factor ** 2))
    return x.permute(0, 2, 1, 3)


class InternViTParts(EncoderParts, MegatronModule):
    """InternViT, or the part of it one pipeline chunk holds (the InternVL family's module,
    ``families/internvl/encoder.py``): the patch embedding with class token and positions
    (``embed``), the layers Megatron-Core's layout gives this chunk (``build_layers``), and
    the output side in front of the projector (``post``: the tower's LayerNorm, class token
    dropped, pixel shuffle). Every tile is one item: a batch entry of ``seq_length``
    tokens."""

    def __init__(self, config: TransformerConfig, encoder: InternViTConfig,
                 layer_spec: ModuleSpec, embed: bool = True, build_layers: bool = True,
                 post: bool = True, vp_stage=None, pg_collection=None,
                 checkpoint_dp_group=None):
        super().__init__(config=config)
        if config.sequence_parallel:
            raise ConfigError("the InternViT encoder does not implement --sequence-parallel")
        self.use_encoder_groups(pg_collection, checkpoint_dp_group)
        self.encoder_config = e = encoder
        self.seq_length = e.seq_length
        dtype = config.params_dtype
        self.has_embed = embed
        if embed:
            self.patch_embed = torch.nn.Linear(e.patch_input_size, e.hidden_size, dtype=dtype)
            config.init_method(self.patch_embed.weight)
            torch.nn.init.zeros_(self.patch_embed.bias)
            self.class_token = torch.nn.Parameter(torch.zeros(1, 1, e.hidden_size,
                                                              dtype=dtype))
            self.position_embeddings = torch.nn.Parameter(
                torch.zeros(1, e.num_positions, e.hidden_size, dtype=dtype))
            config.init_method(self.position_embeddings)
        self.decoder = (encoder_block(config, layer_spec, vp_stage, pg_collection)
                        if build_layers else None)
        for layer in self.decoder.layers if self.decoder is not None else ():
            with torch.no_grad():
                layer.ls1.fill_(e.layer_scale_init)
                layer.ls2.fill_(e.layer_scale_init)
        self.has_post = post
        # Hugging Face's tower LayerNorm (use_mean_pooling=False): a LayerNorm whatever
        # norm_type says.
        self.ln_post = (torch.nn.LayerNorm(e.hidden_size, eps=e.norm_epsilon, dtype=dtype)
                        if post and e.applies_final_layernorm else None)

    def _positions(self, side: int) -> torch.Tensor:
        """[1, 1 + side^2, hidden]: the trained grid, or it resized to ``side`` patches a
        side (bicubic, as Hugging Face's ``interpolate_pos_encoding``)."""
        e = self.encoder_config
        if side == e.patches_per_side:
            return self.position_embeddings
        cls_pos, grid = self.position_embeddings[:, :1], self.position_embeddings[:, 1:]
        n = e.patches_per_side
        grid = grid.reshape(1, n, n, -1).permute(0, 3, 1, 2)
        grid = torch.nn.functional.interpolate(grid, size=(side, side), mode="bicubic",
                                               align_corners=False)
        return torch.cat([cls_pos, grid.permute(0, 2, 3, 1).reshape(1, side * side, -1)],
                         dim=1)

    def _check(self, pixel_values: torch.Tensor) -> int:
        e = self.encoder_config
        if pixel_values.dim() != 4 or pixel_values.shape[1] != e.in_channels:
            raise ValueError(f"pixel_values must be [tiles, {e.in_channels}, H, W]; got "
                             f"{tuple(pixel_values.shape)}")
        h, w = pixel_values.shape[2:]
        if h != w:
            raise ValueError(f"InternViT tiles must be square (Hugging Face's pixel shuffle "
                             f"assumes it); got {h}x{w}")
        step = e.patch_size * e.shuffle_scale
        if h % step:
            raise ValueError(f"a tile side of {h} px is not a multiple of the patch size x "
                             f"the pixel shuffle ({e.patch_size} x {e.shuffle_scale})")
        return h // e.patch_size

    def embed(self, tiles: torch.Tensor) -> torch.Tensor:
        """[N, C, H, W] tiles (square, H a multiple of 2 patches; another size than the
        config's gets resized positions) -> [T, N, hidden], class token first. Training
        batches hold tiles of ``--img-h``: the pipeline's message shapes assume it.

        ``class_token`` and ``position_embeddings`` are this module's own parameters, so
        the embedding runs through its call: Megatron-Core's DDP waits for their bucket's
        all-gather in this module's forward pre-hook (``--overlap-param-gather``)."""
        return self(tiles, embed_only=True)

    def _embed(self, tiles: torch.Tensor) -> torch.Tensor:
        e = self.encoder_config
        side = self._check(tiles)
        n, p = tiles.shape[0], e.patch_size
        x = tiles.to(self.patch_embed.weight.dtype)
        # [N, C, side, P, side, P] -> [N, side*side, C*P*P]: the Conv2d's kernel order.
        x = x.reshape(n, e.in_channels, side, p, side, p).permute(0, 2, 4, 1, 3, 5)
        x = self.patch_embed(x.reshape(n, side * side, e.patch_input_size))
        x = torch.cat([self.class_token.expand(n, -1, -1), x], dim=1) + self._positions(side)
        return x.transpose(0, 1).contiguous()

    def shard_features(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.ln_post(hidden) if self.ln_post is not None else hidden

    def features(self, hidden: torch.Tensor) -> torch.Tensor:
        """[T, N, hidden] -> [N, tokens per tile, 4 x hidden]: the pixel-shuffled patches."""
        e = self.encoder_config
        patches = self.shard_features(hidden)[1:].transpose(0, 1)  # 'default': no class token
        n, side = patches.shape[0], math.isqrt(patches.shape[1])
        shuffled = pixel_shuffle(patches.reshape(n, side, side, e.hidden_size),
                                 e.downsample_ratio)
        return shuffled.reshape(n, -1, e.shuffled_size).contiguous()

    def forward(self, tiles: torch.Tensor, embed_only: bool = False) -> torch.Tensor:
        """The whole tower: tiles [N, C, H, W] (all images' tiles of the batch) ->
        pixel-shuffled features [N, (H/P/2)^2, 4 x hidden] (before the projector); with
        ``embed_only``, ``embed``'s output."""
        if embed_only:
            return self._embed(tiles)
        return self.features(self.layers(self.embed(tiles)))


class InternViT(InternViTParts):
    """The whole tower in one module (every part), as transformers' ``InternVLVisionModel``
    plus the feature selection and pixel shuffle of ``get_image_features``."""

    def __init__(self, config: TransformerConfig, encoder: InternViTConfig,
                 layer_spec: Optional[ModuleSpec] = None, vp_stage=None, pg_collection=None):
        super().__init__(config, encoder, layer_spec or internvit_layer_spec(encoder),
                         vp_stage=vp_stage, pg_collection=pg_collection)


class InternVLProjector(MultimodalProjector):
    """Hugging Face's ``InternVLMultiModalProjector``: LayerNorm over the shuffled
    features (eps 1e-5), then Megatron-Core's MLP projector (Linear, GELU, Linear)."""

    def __init__(self, config: TransformerConfig, submodules: MLPSubmodules, input_size: int):
        super().__init__(config, submodules, "mlp", input_size)
        self.layer_norm = WrappedTorchNorm(config=config, hidden_size=input_size,
                                           eps=PROJECTOR_NORM_EPSILON)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return super().forward(self.layer_norm(hidden_states))


def projector_submodules(transformer_impl: str = "local") -> MLPSubmodules:
    """The projector MLP's linears (plain column / row parallel)."""
    if transformer_impl == "transformer_engine":
        from megatron.core.extensions.transformer_engine import (
            TEColumnParallelLinear,
            TERowParallelLinear,
        )

        return MLPSubmodules(linear_fc1=TEColumnParallelLinear,
                             linear_fc2=TERowParallelLinear)
    return MLPSubmodules(linear_fc1=ColumnParallelLinear, linear_fc2=RowParallelLinear)


class InternViTWithProjector(MegatronModule):
    """The vision tower and the projector: tiles -> [tiles, tokens per tile,
    out_hidden_size] for the LLM (Hugging Face's ``get_image_features(...).pooler_output``),
    named as the multimodal model names an encoder and its projector."""

    def __init__(self, vision_config: TransformerConfig, projector_config: TransformerConfig,
                 encoder: InternViTConfig, transformer_impl: str = "local"):
        super().__init__(config=vision_config)
        self.vision_model = InternViT(vision_config, encoder,
                                      internvit_layer_spec(encoder, transformer_impl))
        self.vision_projection = InternVLProjector(
            projector_config, projector_submodules(transformer_impl), encoder.shuffled_size)

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        return self.vision_projection(self.vision_model(pixel_values))


def tokens_per_tile(encoder: InternViTConfig, tile_size: Optional[int] = None) -> int:
    """LLM tokens of one tile (256 for 448 px, patch 14, ratio 0.5): the placeholder count
    per tile."""
    side = (tile_size or encoder.image_size) // encoder.patch_size
    return (side // encoder.shuffle_scale) ** 2


def build_internvit(enc: InternViTConfig, settings, specs, part, name: str, vp_stage=None,
                    pg_collection=None, checkpoint_dp_group=None) -> InternViTParts:
    """The InternVL family's builder: the part of InternViT the chunk's ``part`` holds."""
    from .transformer_config import internvit_transformer_config

    return InternViTParts(
        internvit_transformer_config(enc, settings, name),
        enc, internvit_layer_spec(enc, specs.impl), embed=part.embed,
        build_layers=part.num_layers > 0, post=part.projector, vp_stage=vp_stage,
        pg_collection=pg_collection, checkpoint_dp_group=checkpoint_dp_group)


def build_internvl_projector(enc: InternViTConfig, proj, lm, settings, specs,
                             name: str) -> InternVLProjector:
    """The InternVL family's projector: LayerNorm + MLP over the pixel-shuffled features
    (Linear 4 x hidden -> LLM hidden, GELU, Linear)."""
    from .transformer_config import internvl_projector_transformer_config

    if proj.projector_type != "mlp":
        raise ConfigError(f"the InternVL projector is an MLP; --projector-type "
                          f"{proj.projector_type} is not one")
    if proj.ffn_hidden_size not in (None, lm.hidden_size):
        raise ConfigError(f"the InternVL projector's hidden width is the LLM's --hidden-size "
                          f"{lm.hidden_size}; --projector-ffn-hidden-size "
                          f"{proj.ffn_hidden_size} differs")
    if enc.out_hidden_size != lm.hidden_size:
        raise ConfigError(f"the {name} projector outputs {enc.out_hidden_size} channels, the "
                          f"LLM's --hidden-size is {lm.hidden_size}")
    return InternVLProjector(internvl_projector_transformer_config(enc, settings, name),
                             projector_submodules(specs.impl), enc.shuffled_size)
