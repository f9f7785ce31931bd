"""Named encoders and projectors feeding a Megatron-Core GPTModel.

Media placeholder tokens in the text (already expanded to one token per encoder output
token) are replaced by the projected features; the language model then runs on the merged
embeddings. Submodules are named ``{name}_model`` / ``{name}_projection`` /
``language_model``, so a ``vision`` encoder has Megatron-Core LLaVA's names.
"""

from __future__ import annotations

from typing import Dict, Mapping, Optional, Union

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule

from ..config import MultimodalModelConfig
from ..plan.placement import ChunkPlacement
from . import sequence_parallel
from .audio import AudioEncoder
from .context_parallel import ContextParallelMask
from .vision import VisionTransformer

Encoder = Union[VisionTransformer, AudioEncoder]

# Which batch media key feeds each encoder kind.
ENCODER_MODALITY = {"clip": "image", "siglip": "image", "whisper": "audio"}
# Batch media key with each clip's true length (mel frames) for variable-length modalities.
LENGTHS_KEY = {"audio": "audio_frames"}


class MediaMismatchError(ValueError):
    """The placeholder tokens of a batch do not match its media."""


class MultimodalModel(MegatronModule):
    """The whole model, or the pipeline chunk ``placement`` describes.

    A chunk runs, in chain order, whatever parts it holds: the word embedding (chunk 0),
    encoder embeddings, encoder layers, projectors (each merges its features into the text
    embeddings), LLM decoder layers and the output layer. Between chunks travel the text
    embeddings (or, once the LLM runs, its hidden state) and, when a cut falls inside an
    encoder, that encoder's hidden state: both packed into one flat tensor for Megatron-Core's
    p2p, which carries one tensor of variable shape. The receiving chunk knows the shapes
    from its own copy of the micro-batch.
    """

    def __init__(self, config: MultimodalModelConfig, language_model: GPTModel,
                 encoders: Mapping[str, Encoder],
                 projectors: Mapping[str, MultimodalProjector],
                 media_token_ids: Mapping[str, int], placement: ChunkPlacement):
        super().__init__(config=language_model.config)
        self.mm_config = config
        self.placement = placement
        self.model_type = ModelType.encoder_or_decoder
        self.encoder_names = tuple(e.name for e in placement.encoders)
        self.media_token_ids: Dict[str, int] = dict(media_token_ids)
        for name in self.encoder_names:
            setattr(self, f"{name}_model", encoders[name])
            if name in projectors:
                setattr(self, f"{name}_projection", projectors[name])
        self.language_model = language_model
        self.input_tensor: Optional[torch.Tensor] = None
        # Encoder outputs handed to chunk 0 when the encoder runs as its own pipeline.
        self.encoder_inputs: Dict[str, Optional[torch.Tensor]] = {}
        # Read by Megatron-Core's schedules (first / last pipeline stage of this chunk).
        self.pre_process = language_model.pre_process
        self.post_process = language_model.post_process
        self.share_embeddings_and_output_weights = (
            language_model.share_embeddings_and_output_weights)
        # With context parallelism a rank holds tokens from anywhere in the sequence: RoPE
        # must rotate each at its global position, not at its offset in the local chunk.
        self._rope_positions: Optional[torch.Tensor] = None
        rotary = getattr(language_model, "rotary_pos_emb", None)
        if rotary is not None:
            rotary.cp_group = None  # no zigzag slicing: our positions are exact
            rotary.register_forward_hook(self._rope_at_global_positions)

    def _rope_at_global_positions(self, module, args, output):
        pos = self._rope_positions
        if pos is None:
            return output
        return module.get_emb(int(pos.max()) + 1)[pos.to(output.device)]

    def shared_embedding_or_output_weight(self):
        """For ``finalize_model_grads``: the tied weight whose grads meet across stages."""
        return self.language_model.shared_embedding_or_output_weight()

    def encoder(self, name: str) -> Encoder:
        return getattr(self, f"{name}_model")

    def projector(self, name: str) -> MultimodalProjector:
        return getattr(self, f"{name}_projection")

    def set_input_tensor(self, input_tensor) -> None:
        if isinstance(input_tensor, (list, tuple)):
            assert len(input_tensor) == 1, "one tensor travels between chunks"
            input_tensor = input_tensor[0]
        self.input_tensor = input_tensor

    def freeze(self) -> None:
        """Apply the freeze config: frozen parameters stop requiring gradients."""
        freeze = self.mm_config.freeze
        modules = [(self.language_model, freeze.language_model)]
        for name in self.encoder_names:
            modules.append((self.encoder(name), name in freeze.encoders))
            if hasattr(self, f"{name}_projection"):
                modules.append((self.projector(name), name in freeze.projectors))
        for module, frozen in modules:
            if frozen:
                for p in module.parameters():
                    p.requires_grad_(False)

    def _modality(self, name: str) -> str:
        return ENCODER_MODALITY[self.mm_config.encoders[name].model_type]

    def _items(self, name: str, media: Mapping[str, torch.Tensor]) -> Optional[torch.Tensor]:
        items = media.get(self._modality(name))
        return None if items is None or items.shape[0] == 0 else items

    def run_encoder(self, name: str, media: Mapping[str, torch.Tensor],
                    hidden: Optional[torch.Tensor]) -> torch.Tensor:
        """This chunk's part of encoder ``name``: [T, N, H] hidden state out."""
        part = self.placement.encoder(name)
        encoder = self.encoder(name)
        # A frozen encoder has nothing trainable upstream (its input is data), so it runs
        # without autograd: no backward, no saved activations, on every stage it spans.
        trainable = name not in self.mm_config.freeze.encoders
        with torch.set_grad_enabled(torch.is_grad_enabled() and trainable):
            if part.embed:
                hidden = encoder.embed(self._items(name, media))
            return encoder.layers(hidden)

    def run_encoder_piece(self, name: str, media: Mapping[str, torch.Tensor],
                          hidden: Optional[torch.Tensor], layers) -> Optional[torch.Tensor]:
        """One piece of encoder ``name`` run as its own action: the patch embedding when
        ``hidden`` is None, then its layers ``[start, end)``; None for a micro-batch
        without this encoder's media."""
        if self._items(name, media) is None:
            return None
        encoder = self.encoder(name)
        trainable = name not in self.mm_config.freeze.encoders
        with torch.set_grad_enabled(torch.is_grad_enabled() and trainable):
            if hidden is None:
                hidden = encoder.embed(self._items(name, media))
            return encoder.layers(hidden, *layers)

    def encoder_piece_parameters(self) -> list:
        """The parameters this chunk's encoder pieces compute (embeddings and transformer
        layers; not the output norms, which run with the projectors)."""
        return [p for name in self.encoder_names for p in self.encoder(name).piece_parameters()]

    def set_encoder_inputs(self, inputs: Mapping[str, Optional[torch.Tensor]]) -> None:
        """The encoders' last hidden states for chunk 0 (``encoder_separate`` placements)."""
        self.encoder_inputs = dict(inputs)

    @property
    def sequence_parallel(self) -> bool:
        return self.language_model.config.sequence_parallel

    def project(self, name: str, hidden: torch.Tensor) -> torch.Tensor:
        """Encoder output norm and projector: [T, N, H_enc] (under sequence parallelism
        this rank's shard of it) -> [N, T', H_llm]."""
        if self.sequence_parallel:
            return sequence_parallel.project_shard(
                self.encoder(name), self.projector(name), hidden,
                self.mm_config.projectors[name].projector_type,
                self.encoder(name).sequence_parallel_group)
        features = self.encoder(name).features(hidden)
        n, t, h = features.shape
        return self.projector(name)(features.reshape(n * t, h)).reshape(n, t, -1)

    def encode(self, name: str, media: torch.Tensor) -> torch.Tensor:
        """The whole encoder and projector (a chunk that holds them): [N, ...] media ->
        [N, T', H_llm] features."""
        return self.project(name, self.run_encoder(name, {self._modality(name): media}, None))

    def _keep(self, name: str, media: Mapping[str, torch.Tensor], n_items: int):
        """Which features of each item go to the LLM: None (all of them), or a [N, T'] mask
        (a clip's first ``output_tokens(frames)``; the rest come from its padding)."""
        key = LENGTHS_KEY.get(self._modality(name))
        if key is None:
            return None
        frames = media.get(key)
        if frames is None or frames.shape[0] != n_items:
            raise MediaMismatchError(f"batch has {n_items} {self._modality(name)} items but "
                                     f"{'no' if frames is None else frames.shape[0]} "
                                     f"lengths in media[{key!r}]")
        # From the config, not the module: a chunk may hold only the encoder's projector.
        enc = self.mm_config.encoders[name]
        per_clip = torch.tensor([enc.output_tokens(int(f)) for f in frames.tolist()],
                                dtype=torch.long, device=frames.device)
        width = enc.num_output_tokens
        return torch.arange(width, device=per_clip.device)[None, :] < per_clip[:, None]

    def merge(self, name: str, tokens: torch.Tensor, text: torch.Tensor,
              media: Mapping[str, torch.Tensor], hidden: Optional[torch.Tensor]) -> torch.Tensor:
        """Project encoder ``name``'s output into the placeholder positions of ``text``."""
        modality = self._modality(name)
        slots = tokens == self.media_token_ids[modality]
        items = self._items(name, media)
        n_items = 0 if items is None else items.shape[0]
        keep = self._keep(name, media, n_items) if n_items else None
        if keep is None:
            per_item = self.mm_config.encoders[name].num_output_tokens
            expected, what = n_items * per_item, f"x {per_item} tokens each"
        else:
            expected = int(keep.sum())
            what = f"(their lengths give {expected} tokens)"
        if int(slots.sum()) != expected:
            raise MediaMismatchError(
                f"batch has {int(slots.sum())} {modality} placeholder tokens but "
                f"{n_items} {modality} items {what}")
        if n_items == 0:
            return text
        features = self.project(name, hidden)
        if keep is not None:  # variable-length items: drop each one's padding features
            features = features[keep]
        merged = text.transpose(0, 1)  # [B, S, H]: row-major order matches the media
        merged = merged.masked_scatter(slots.unsqueeze(-1), features.to(merged.dtype))
        return merged.transpose(0, 1).contiguous()

    def embed(self, tokens: torch.Tensor, position_ids: torch.Tensor,
              media: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """Text embeddings with media features at the placeholder positions: [S, B, H]."""
        text, hidden = self.front(tokens, position_ids, media)
        assert hidden is None, "this chunk ends inside an encoder"
        return text

    def front(self, tokens: torch.Tensor, position_ids: torch.Tensor,
              media: Mapping[str, torch.Tensor]):
        """This chunk's share of embedding and encoding: (text embeddings with the features
        merged so far, the hidden state of an encoder the chunk ends inside, or None)."""
        place = self.placement
        if place.llm_embed:
            text = self.language_model.embedding(input_ids=tokens, position_ids=position_ids)
            hidden = None
        else:
            text, hidden = self.unpack(self.input_tensor, tokens, media)
        if place.encoder_separate:  # the encoder ran as its own actions
            for name in self.encoder_names:
                if self.placement.encoder(name).projector:
                    text = self.merge(name, tokens, self._whole(text, tokens), media,
                                      self.encoder_inputs.get(name))
            return text, None
        for name in self.encoder_names:
            if self._items(name, media) is not None:
                hidden = self.run_encoder(name, media, hidden)
            if self.placement.encoder(name).projector:
                text = self.merge(name, tokens, self._whole(text, tokens), media, hidden)
                hidden = None
        return text, hidden

    def _whole(self, text: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The whole text embeddings [S, B, H], for a merge: under sequence parallelism a
        chunk may hold only this rank's shard of them (sent by the chunk before)."""
        if self.sequence_parallel and text.shape[0] != tokens.shape[1]:
            return sequence_parallel.gather(text)
        return text

    def pack(self, text: torch.Tensor, hidden: Optional[torch.Tensor],
             seq_length: Optional[int] = None) -> torch.Tensor:
        """What this chunk sends on: the text embeddings, with an encoder's hidden state
        (under sequence parallelism this rank's shards of both; ``seq_length``: the
        micro-batch's, S of whole text embeddings)."""
        if self.sequence_parallel and text.shape[0] == seq_length:
            text = sequence_parallel.split(text)
        if hidden is None:
            return text
        hidden = hidden.to(text.dtype)
        return torch.cat([text.reshape(-1), hidden.reshape(-1)]).view(-1, 1, 1)

    def unpack(self, received: torch.Tensor, tokens: torch.Tensor,
               media: Mapping[str, torch.Tensor]):
        """(text [S, B, H], encoder hidden [T, N, H_enc] or None) from ``pack``'s tensor."""
        name = self.placement.receives_encoder
        if name is None or self._items(name, media) is None:
            return received, None
        b, s = tokens.shape
        t = self.encoder(name).layer_seq_length
        if self.sequence_parallel:  # this rank's shards
            tp = self.language_model.config.tensor_model_parallel_size
            s, t = s // tp, t // tp
        n_text = s * b * self.language_model.config.hidden_size
        enc = self.mm_config.encoders[name]
        n_items = self._items(name, media).shape[0]
        flat = received.reshape(-1)
        hidden = flat[n_text:].view(t, n_items, enc.hidden_size)
        return flat[:n_text].view(s, b, -1), hidden

    def _sequence_parallel_input(self, hidden: torch.Tensor, tokens: torch.Tensor,
                                 cpm: Optional[ContextParallelMask]) -> torch.Tensor:
        """The LLM layers' input under sequence parallelism: this TP rank's shard of (this
        CP rank's tokens of) the sequence. The chunk holding the LLM's first layer gets the
        text embeddings whole, or this rank's shard of the whole sequence from the chunk
        before; later chunks get the LLM's hidden state, already sharded."""
        first = self.placement.num_llm_layers > 0 and self.placement.llm_layers[0] == 0
        if not first:
            return hidden
        if cpm is None:
            return sequence_parallel.split(hidden) if hidden.shape[0] == tokens.shape[1] \
                else hidden
        hidden = self._whole(hidden, tokens)
        return sequence_parallel.split(hidden[cpm.local.to(hidden.device)])

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                media: Optional[Mapping[str, torch.Tensor]] = None,
                labels: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None) -> torch.Tensor:
        """Per-token loss [B, S] when ``labels`` are given, else vocab-parallel logits (on the
        last chunk; earlier chunks return what the next one receives).

        With a ``loss_mask`` the output layer runs only where the loss is taken (answer
        tokens; not media or prompt), and the loss elsewhere is 0. ``attention_mask``
        ([B, 1, S, S] bool, True = masked; None = causal) isolates packed samples; a
        ``ContextParallelMask`` instead runs this CP rank's tokens only: ``tokens``,
        ``labels``, ``loss_mask`` and ``position_ids`` stay whole-sequence, the loss comes
        back for the rank's tokens ([B, S_local], in ``attention_mask.local`` order).
        """
        cpm = attention_mask if isinstance(attention_mask, ContextParallelMask) else None
        media = media or {}
        place = self.placement
        if place.llm_embed or (place.encoders and not place.encoder_separate):
            hidden_in, encoder_hidden = self.front(tokens, position_ids, media)
            if not place.runs_llm:
                return self.pack(hidden_in, encoder_hidden, tokens.shape[1])
        else:
            hidden_in = self.input_tensor
        if self.sequence_parallel:
            hidden_in = self._sequence_parallel_input(hidden_in, tokens, cpm)
        elif cpm is not None:
            # The text embeddings are whole until the first chunk running LLM layers takes
            # this rank's tokens; a full-length input (the chunk before held no LLM layer,
            # or nothing is split) is whole, a shorter one already this rank's.
            if hidden_in.shape[0] == tokens.shape[1]:
                hidden_in = hidden_in[cpm.local.to(hidden_in.device)]
        if cpm is not None:
            tokens, position_ids = cpm.take(tokens), cpm.take(position_ids)
            labels, loss_mask = cpm.take(labels), cpm.take_loss_mask(loss_mask)
        if self.language_model.pre_process:
            decoder_input = hidden_in
        else:  # GPTModel's decoder reads a chunk's input from set_input_tensor
            self.language_model.set_input_tensor(hidden_in)
            decoder_input = None
        sparse = labels is not None and loss_mask is not None
        self._rope_positions = None if cpm is None else cpm.local
        try:
            return self.language_model(
                input_ids=tokens, position_ids=position_ids, attention_mask=attention_mask,
                decoder_input=decoder_input, labels=labels,
                loss_mask=loss_mask if sparse else None,
                output_processor=loss_at_masked_positions if sparse else None)
        finally:
            self._rope_positions = None


def loss_at_masked_positions(*, hidden_states, output_layer, output_weight, labels, loss_mask,
                             compute_language_model_loss, scale_logits, **_):
    """GPTModel output hook: logits and cross entropy only where ``loss_mask`` is set.

    In multimodal SFT most positions are media or prompt tokens, so this skips most of the
    vocabulary-sized matmul and softmax; the per-token losses are the same as the full path.
    """
    keep = loss_mask.transpose(0, 1) > 0  # [S, B], as hidden_states
    if output_layer.sequence_parallel:  # hidden_states: this TP rank's shard
        logits = sequence_parallel.logits_at(output_layer, output_weight, hidden_states, keep)
    else:
        selected = hidden_states[keep].unsqueeze(1)  # [n, 1, H]
        logits, _ = output_layer(selected, weight=output_weight)
    per_token = compute_language_model_loss(labels.transpose(0, 1)[keep].unsqueeze(0),
                                            scale_logits(logits))  # [1, n]
    loss = torch.zeros(keep.shape, dtype=per_token.dtype, device=per_token.device)
    loss[keep] = per_token.squeeze(0)
    return loss.transpose(0, 1)  # [B, S] like GPTModel's loss
