"""Named encoders and projectors feeding a Megatron-Core GPTModel.

Media placeholder tokens in the text (already expanded to one token per encoder output
token) are replaced by the projected features; the language model then runs on the merged
embeddings. Submodules are named ``{name}_model`` / ``{name}_projection`` /
``language_model``, so a ``vision`` encoder has Megatron-Core LLaVA's names.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule

from ..config import MultimodalModelConfig
from .vision import VisionTransformer

# Which batch media key feeds each encoder kind.
ENCODER_MODALITY = {"clip": "image", "siglip": "image"}


class MediaMismatchError(ValueError):
    """The placeholder tokens of a batch do not match its media."""


class MultimodalModel(MegatronModule):
    def __init__(self, config: MultimodalModelConfig, language_model: GPTModel,
                 encoders: Mapping[str, VisionTransformer],
                 projectors: Mapping[str, MultimodalProjector],
                 media_token_ids: Mapping[str, int]):
        super().__init__(config=language_model.config)
        self.mm_config = config
        self.model_type = ModelType.encoder_or_decoder
        self.encoder_names = tuple(encoders)
        self.media_token_ids: Dict[str, int] = dict(media_token_ids)
        for name in self.encoder_names:
            setattr(self, f"{name}_model", encoders[name])
            setattr(self, f"{name}_projection", projectors[name])
        self.language_model = language_model
        # Read by Megatron-Core's schedules (first / last pipeline stage of this chunk).
        self.pre_process = language_model.pre_process
        self.post_process = language_model.post_process
        self.share_embeddings_and_output_weights = (
            language_model.share_embeddings_and_output_weights)

    def shared_embedding_or_output_weight(self):
        """For ``finalize_model_grads``: the tied weight whose grads meet across stages."""
        return self.language_model.shared_embedding_or_output_weight()

    def encoder(self, name: str) -> VisionTransformer:
        return getattr(self, f"{name}_model")

    def projector(self, name: str) -> MultimodalProjector:
        return getattr(self, f"{name}_projection")

    def set_input_tensor(self, input_tensor) -> None:
        self.language_model.set_input_tensor(input_tensor)

    def freeze(self) -> None:
        """Apply the freeze config: frozen parameters stop requiring gradients."""
        freeze = self.mm_config.freeze
        modules = [(self.language_model, freeze.language_model)]
        for name in self.encoder_names:
            modules.append((self.encoder(name), name in freeze.encoders))
            modules.append((self.projector(name), name in freeze.projectors))
        for module, frozen in modules:
            if frozen:
                for p in module.parameters():
                    p.requires_grad_(False)

    def encode(self, name: str, media: torch.Tensor) -> torch.Tensor:
        """Encoder then projector: [N, ...] media -> [N, T, llm hidden] features."""
        encoder = self.encoder(name)
        # A frozen encoder has nothing trainable upstream (its input is data), so it
        # runs without autograd: no backward, no saved activations.
        trainable = any(p.requires_grad for p in encoder.parameters())
        with torch.set_grad_enabled(torch.is_grad_enabled() and trainable):
            features = encoder(media)
        n, t, h = features.shape
        return self.projector(name)(features.reshape(n * t, h)).reshape(n, t, -1)

    def embed(self, tokens: torch.Tensor, position_ids: torch.Tensor,
              media: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Text embeddings with media features at the placeholder positions: [S, B, H]."""
        embeddings = self.language_model.embedding(input_ids=tokens, position_ids=position_ids)
        merged = embeddings.transpose(0, 1)  # [B, S, H]: row-major order matches the media
        for name in self.encoder_names:
            modality = ENCODER_MODALITY[self.mm_config.encoders[name].model_type]
            slots = tokens == self.media_token_ids[modality]
            items = media.get(modality)
            n_items = 0 if items is None else items.shape[0]
            per_item = self.mm_config.encoders[name].num_output_tokens
            if int(slots.sum()) != n_items * per_item:
                raise MediaMismatchError(
                    f"batch has {int(slots.sum())} {modality} placeholder tokens but "
                    f"{n_items} {modality} items x {per_item} tokens each")
            if n_items == 0:
                continue
            features = self.encode(name, items).to(merged.dtype)
            merged = merged.masked_scatter(slots.unsqueeze(-1), features)
        return merged.transpose(0, 1).contiguous()

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                media: Optional[Mapping[str, torch.Tensor]] = None,
                labels: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Per-token loss [B, S] when ``labels`` are given, else vocab-parallel logits.

        With a ``loss_mask`` the output layer runs only where the loss is taken (answer
        tokens; not media or prompt), and the loss elsewhere is 0. ``attention_mask``
        ([B, 1, S, S] bool, True = masked; None = causal) isolates packed samples.
        """
        # Later pipeline stages get their input from the previous stage (set_input_tensor).
        decoder_input = (self.embed(tokens, position_ids, media or {})
                         if self.pre_process else None)
        sparse = (labels is not None and loss_mask is not None
                  and not self.language_model.config.sequence_parallel)
        return self.language_model(
            input_ids=tokens, position_ids=position_ids, attention_mask=attention_mask,
            decoder_input=decoder_input, labels=labels,
            loss_mask=loss_mask if sparse else None,
            output_processor=loss_at_masked_positions if sparse else None)


def loss_at_masked_positions(*, hidden_states, output_layer, output_weight, labels, loss_mask,
                             compute_language_model_loss, scale_logits, **_):
    """GPTModel output hook: logits and cross entropy only where ``loss_mask`` is set.

    In multimodal SFT most positions are media or prompt tokens, so this skips most of the
    vocabulary-sized matmul and softmax; the per-token losses are the same as the full path.
    """
    keep = loss_mask.transpose(0, 1) > 0  # [S, B], as hidden_states
    selected = hidden_states[keep].unsqueeze(1)  # [n, 1, H]
    logits, _ = output_layer(selected, weight=output_weight)
    per_token = compute_language_model_loss(labels.transpose(0, 1)[keep].unsqueeze(0),
                                            scale_logits(logits))  # [1, n]
    loss = torch.zeros(keep.shape, dtype=per_token.dtype, device=per_token.device)
    loss[keep] = per_token.squeeze(0)
    return loss.transpose(0, 1)  # [B, S] like GPTModel's loss
