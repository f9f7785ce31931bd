"""Named encoders and projectors feeding a Megatron-Core GPTModel.

Media placeholder tokens in the text (already expanded to one token per encoder output
token) are replaced by the projected features; the language model then runs on the merged
embeddings. Submodules are named ``{name}_model`` / ``{name}_projection`` /
``language_model``, so a ``vision`` encoder has Megatron-Core LLaVA's names.
"""

from __future__ import annotations

from functools import partial
from typing import Dict, Mapping, Optional, Tuple

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.models.vision.multimodal_projector import MultimodalProjector
from megatron.core.transformer.enums import ModelType
from megatron.core.transformer.module import MegatronModule
from megatron.core.transformer.moe.router import TopKRouter

from ..config import ConfigError, MultimodalModelConfig
from ..families import family_of, modality_of
from ..plan.fp8 import fp8_align_size
from ..plan.pipeline.placement import ChunkPlacement
from . import sequence_parallel
from .fp8_context import anchor, idle_run, reduces_amax
from .batch_layout import (  # noqa: F401  (MediaMismatchError: re-exported)
    BatchLayout, FeatureShare, MediaMismatchError, batch_layout, loss_positions)
from .context_parallel import ContextParallelMask
from .cp_gather import gather_rows
from .packed_sequences import PackedSequences
from .deepstack import DeepStack, DeepStackFeatures

# An encoder family's module (``EncoderParts``): see ``megatron_mm.families``.
Encoder = MegatronModule


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
        # An MoE LLM's routers: their token counts skip CP ranks' copies of a sequence
        # (moe_router.SequenceScaledRouter.duplicate_tokens)
        self._routers = [m for m in language_model.modules() if isinstance(m, TopKRouter)]
        self.input_tensor: Optional[torch.Tensor] = None
        # Encoder outputs handed to chunk 0 when the encoder runs as its own pipeline.
        self.encoder_inputs: Dict[str, Optional[torch.Tensor]] = {}
        self.encoder_kept: Dict[str, Dict[int, torch.Tensor]] = {}  # their DeepStack layers'
        # Read by Megatron-Core's schedules (first / last pipeline stage of this chunk).
        self.pre_process = language_model.pre_process
        self.post_process = language_model.post_process
        self.share_embeddings_and_output_weights = (
            language_model.share_embeddings_and_output_weights)
        # Read by Megatron-LM's train() (the model's process groups, as GPTModel's)
        self.pg_collection = getattr(language_model, "pg_collection", None)
        # With context parallelism a rank holds tokens from anywhere in the sequence: RoPE
        # must rotate each at its global position, not at its offset in the local chunk.
        # (positions [S_local] on the device, the whole sequence's length on the host)
        # M-RoPE needs no hook: it rotates by the position ids it is given, this rank's.
        self._rope_positions: Optional[Tuple[torch.Tensor, int]] = None
        self.mrope = language_model.position_embedding_type == "mrope"
        rotary = getattr(language_model, "rotary_pos_emb", None)
        if rotary is not None:
            rotary.cp_group = None  # no zigzag slicing: our positions are exact
            if not self.mrope:
                rotary.register_forward_hook(self._rope_at_global_positions)
        self.deepstack = self._attach_deepstack(config)

    def _attach_deepstack(self, config: MultimodalModelConfig) -> Optional[DeepStack]:
        """DeepStack's hooks on this chunk's LLM layers that add an encoder's intermediate
        features (``deepstack_llm_layers`` of its config; Qwen3-VL), or None. The chunk
        that merges the encoder makes the features; the chunks after it receive those of
        their layers and later ones with the hidden state (``_receive_deepstack``)."""
        layers = {name: getattr(c, "deepstack_llm_layers", 0)
                  for name, c in config.encoders.items()}
        layers = {name: n for name, n in layers.items() if n}
        if not layers:
            return None
        if len(layers) > 1:
            raise ConfigError(f"encoders {sorted(layers)} both feed DeepStack features; one "
                              "encoder can")
        (self.deepstack_encoder, n), = layers.items()
        deepstack = DeepStack(n)
        deepstack.attach(self.language_model.decoder)
        return deepstack

    def _deepstack_layers(self, sent: bool) -> range:
        """The LLM layers whose DeepStack features this chunk receives with its input
        (``sent`` False: those it holds or follow, when it does not merge them itself) or
        sends on with its output (those after its own)."""
        return self.placement.deepstack_layers(self.deepstack_encoder,
                                               self.deepstack.num_layers, sent)

    def _send_deepstack(self, out: torch.Tensor) -> torch.Tensor:
        """``out`` (what this chunk hands the next) with the DeepStack features of the LLM
        layers after this chunk's, as one flat tensor (Megatron-Core's p2p carries one)."""
        if self.deepstack is None or self.deepstack.bound is None:
            return out
        layers = self._deepstack_layers(sent=True)
        if not layers:
            return out
        features = self.deepstack.sent.features
        return torch.cat([out.reshape(-1)] + [features[i].to(out.dtype).reshape(-1)
                                              for i in layers]).view(-1, 1, 1)

    def _receive_deepstack(self, received: torch.Tensor, tokens: torch.Tensor,
                           layout: BatchLayout) -> torch.Tensor:
        """The hidden state [S, B, H] of ``_send_deepstack``'s tensor, its features bound
        for this chunk's layers (and those it sends on)."""
        layers, name = self._deepstack_layers(sent=False), self.deepstack_encoder
        if not layers or not layout.items[name]:
            return received
        slots = layout.slots[name]
        h = self.language_model.config.hidden_size
        flat = received.reshape(-1)
        n_text = flat.numel() - len(layers) * slots.numel() * h
        features = [None] * self.deepstack.num_layers
        for j, i in enumerate(layers):
            start = n_text + j * slots.numel() * h
            features[i] = flat[start:start + slots.numel() * h].view(-1, h)
        hidden = flat[:n_text].view(-1, tokens.shape[0], h)
        return self.deepstack.join(hidden, DeepStackFeatures(slots, features, tokens.numel()))

    def set_is_first_microbatch(self):
        """Refresh every TE layer's FP8 weight cache at a step's first micro-batch, whichever
        modules run FP8: Megatron-Core's version looks only at this model's config (the
        LLM's), so FP8 encoders under a BF16 LLM would reuse step 1's FP8 weights."""
        for m in self.modules():
            if hasattr(m, "is_first_microbatch"):
                m.is_first_microbatch = True

    def _rope_at_global_positions(self, module, args, output):
        if self._rope_positions is None:
            return output
        pos, seq_length = self._rope_positions
        emb = module.get_emb(seq_length)
        if isinstance(emb, tuple):  # YaRN: (angles, the cos / sin scale)
            return (emb[0][pos.to(emb[0].device)], *emb[1:])
        return emb[pos.to(emb.device)]

    def rotary_positions(self, position_ids: torch.Tensor) -> torch.Tensor:
        """What the language model's rotary embedding takes: M-RoPE's [3, B, S] (a [B, S]
        batch, text only, has the same position on all three axes); RoPE reads none (it
        rotates at 0..S-1, or at the CP hook's global positions)."""
        if self.mrope and position_ids.dim() == 2:
            return position_ids.unsqueeze(0).expand(3, -1, -1)
        return position_ids

    def rotary_embedding(self, position_ids: torch.Tensor) -> torch.Tensor:
        """The LLM layers' ``rotary_pos_emb`` for a whole (unsplit) micro-batch, as GPTModel
        computes it (for callers running the layers themselves)."""
        rotary = self.language_model.rotary_pos_emb
        if self.mrope:
            return rotary(self.rotary_positions(position_ids), self.language_model.mrope_section)
        emb = rotary(position_ids.shape[-1])
        # YaRN's (angles, scale): the layers take the angles (Attention applies the scale)
        return emb[0] if isinstance(emb, tuple) else emb

    # Read by Megatron-Core's schedules under --defer-embedding-wgrad-compute, on the
    # module their post_process lookup finds (this one): the LLM's output layer and the
    # buffers of its deferred weight gradient (``clear_embedding_activation_buffer``,
    # ``finish_embedding_wgrad_compute``)
    @property
    def output_layer(self):
        return self.language_model.output_layer

    @property
    def embedding_activation_buffer(self):
        return self.language_model.embedding_activation_buffer

    @property
    def grad_output_buffer(self):
        return self.language_model.grad_output_buffer

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
        return modality_of(self.mm_config.encoders[name])

    def _items(self, name: str, media: Mapping[str, torch.Tensor]) -> Optional[torch.Tensor]:
        """The encoder's input: ``media[modality]``, or what the encoder picks from the
        media (``media_input``: a family reading several keys)."""
        pick = getattr(self.encoder(name), "media_input", None)
        items = pick(media) if pick is not None else media.get(self._modality(name))
        return None if items is None or items.shape[0] == 0 else items

    def prepare_encoder_media(self, name: str, host_media: Mapping[str, torch.Tensor]):
        """For encoder pieces run as their own actions (the schedule executor, which holds
        no ``BatchLayout``): encoder ``name``'s family prepared batch for a micro-batch's
        host media, on the encoder's device (None: its module binds none, or no items)."""
        if getattr(self.encoder(name), "bind_batch", None) is None:
            return None
        enc = self.mm_config.encoders[name]
        prepared = family_of(enc).prepare(enc, host_media)
        device = next(self.encoder(name).parameters()).device
        return None if prepared is None else prepared.to(device)

    def bind_encoder_batch(self, name: str, prepared) -> None:
        """Bind encoder ``name`` a prepared batch (``prepare_encoder_media``)."""
        bind = getattr(self.encoder(name), "bind_batch", None)
        if bind is not None:
            bind(prepared)

    def bind_batches(self, layout: BatchLayout) -> None:
        """Hand each encoder that takes one its batch's prepared layout (``bind_batch``)."""
        for name in self.encoder_names:
            bind = getattr(self.encoder(name), "bind_batch", None)
            if bind is not None:
                bind(layout.encoder_batches.get(name))

    def run_encoder(self, name: str, media: Mapping[str, torch.Tensor],
                    hidden: Optional[torch.Tensor]) -> torch.Tensor:
        """This chunk's part of encoder ``name``: [T, N, H] hidden state out (``media``
        on the device is needed only where the chunk embeds)."""
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

    def idle_encoder_piece(self, name: str, layers) -> Optional[torch.Tensor]:
        """For a micro-batch without encoder ``name``'s media: its layers ``[start, end)``
        run on zeros when they reduce FP8 amaxes (delayed scaling), so this rank enters
        and leaves their autocast as its amax peers with media do (``fp8_context``); the
        output is for the piece's backward only. None otherwise."""
        return self._idle_layers(name, *layers)

    def _idle_layers(self, name: str, start=None, end=None) -> Optional[torch.Tensor]:
        encoder = self.encoder(name)
        if encoder.decoder is None or not reduces_amax(encoder.decoder.config):
            return None
        trainable = name not in self.mm_config.freeze.encoders
        with torch.set_grad_enabled(torch.is_grad_enabled() and trainable), \
                idle_run(encoder.decoder, self.training):
            return encoder.layers(encoder.idle_input(), start, end)

    def _idle_projector(self, name: str, text: torch.Tensor) -> torch.Tensor:
        """The FP8 projector's run on zeros (one FP8-aligned block of rows) for a
        micro-batch without the encoder's media, joined to ``text`` for its backward."""
        projector = self.projector(name)
        config = projector.config
        if not reduces_amax(config):
            return text
        linear = getattr(projector.encoder, "linear_fc1", projector.encoder)
        rows = fp8_align_size(getattr(config.fp8_recipe, "value", config.fp8_recipe))
        x = torch.zeros(rows, linear.weight.shape[1], dtype=config.params_dtype,
                        device=linear.weight.device)
        with idle_run(projector, self.training):
            out = projector(x)
        return anchor(text, out)

    def encoder_piece_parameters(self) -> list:
        """The parameters this chunk's encoder pieces compute (embeddings and transformer
        layers; not the output norms, which run with the projectors)."""
        return [p for name in self.encoder_names for p in self.encoder(name).piece_parameters()]

    def set_encoder_inputs(self, inputs: Mapping[str, Optional[torch.Tensor]],
                           kept: Optional[Mapping[str, Mapping[int, torch.Tensor]]] = None
                           ) -> None:
        """The encoders' last hidden states for chunk 0 (``encoder_separate`` placements),
        and per encoder the outputs of its DeepStack layers ({layer: [T, N, H_enc]}) that
        the encoder pieces carried here for its mergers."""
        self.encoder_inputs, self.encoder_kept = dict(inputs), dict(kept or {})

    @property
    def sequence_parallel(self) -> bool:
        return self.language_model.config.sequence_parallel

    def project(self, name: str, hidden: torch.Tensor) -> torch.Tensor:
        """Encoder output norm and projector: [T, N, H_enc] (under sequence parallelism
        this rank's shard of it) -> [N, T', H_llm]."""
        own = getattr(self.encoder(name), "project_shard", None)
        if self.sequence_parallel and own is not None:  # a family's own (Qwen2.5-VL)
            return own(self.projector(name), hidden, self.encoder(name).sequence_parallel_group)
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

    def layout(self, tokens: torch.Tensor, media: Mapping[str, torch.Tensor],
               loss_mask: Optional[torch.Tensor] = None) -> BatchLayout:
        """The batch's ``BatchLayout``, for callers that pass none (reads ``tokens`` on the
        host: the training step computes it before the batch goes to the device)."""
        return batch_layout(self.mm_config, self.media_token_ids, tokens, media,
                            loss_mask).to(tokens.device)

    def merge(self, name: str, text: torch.Tensor, layout: BatchLayout,
              hidden: Optional[torch.Tensor]) -> torch.Tensor:
        """Project encoder ``name``'s output into the placeholder positions of ``text``
        ([S, B, H]), at the layout's positions: index ops of host-known sizes."""
        share = layout.shares.get(name)
        deepstack = None if self.deepstack is None else getattr(
            self.encoder(name), "deepstack_features", None)
        if layout.items[name] == 0:
            text = self._idle_projector(name, text)
            if share is None:
                return text
            features = text.new_zeros(0, text.shape[-1])  # the other CP ranks' items
            extra = [] if deepstack is None else [features] * self.deepstack.num_layers
        else:
            features = self.project(name, hidden)  # [N, T', H]
            extra = [] if deepstack is None else deepstack(self.projector(name))
        # the DeepStack features' rows are the final merger's (item for item)
        features, *extra = (self._feature_rows(name, f, layout, text.dtype)
                            for f in [features, *extra])
        s, b, h = text.shape
        merged = text.reshape(s * b, h).index_copy(0, layout.slots[name],
                                                    features).view(s, b, h)
        if deepstack is not None:
            merged = self.deepstack.join(merged, DeepStackFeatures(
                layout.slots[name], extra, s * b))
        return merged

    def _feature_rows(self, name: str, features: torch.Tensor, layout: BatchLayout,
                      dtype: torch.dtype) -> torch.Tensor:
        """[n, H] features for the batch's placeholders from this chunk's projected ones
        (variable-length items: each one's padding rows dropped; ``--vision-dp-when-cp``:
        every CP rank's, in the batch's order)."""
        features = features.reshape(-1, features.shape[-1])
        keep = layout.keep[name]
        if keep is not None:
            features = features.index_select(0, keep)
        share = layout.shares.get(name)
        if share is not None:
            features = self._gather_features(name, features.to(dtype), share)
        return features.to(dtype)

    def _gather_features(self, name: str, features: torch.Tensor,
                         share: FeatureShare) -> torch.Tensor:
        """Every CP rank's projected features (``--vision-dp-when-cp``); their gradients
        come back summed over the CP ranks. Every rank takes the backward (a collective)
        or none does: whether it does follows from the flags alone, also on a rank
        without items of its own."""
        freeze = self.mm_config.freeze
        trainable = torch.is_grad_enabled() and (
            name not in freeze.encoders or name not in freeze.projectors)
        if not trainable:
            features = features.detach()
        elif not features.requires_grad:
            features = features.detach().requires_grad_()
        return gather_rows(features, share.counts, share.order, share.group)

    def embed(self, tokens: torch.Tensor, position_ids: torch.Tensor,
              media: Mapping[str, torch.Tensor],
              layout: Optional[BatchLayout] = None) -> torch.Tensor:
        """Text embeddings with media features at the placeholder positions: [S, B, H]."""
        layout = layout or self.layout(tokens, media)
        text, hidden = self.front(tokens, position_ids, media, layout)
        assert hidden is None, "this chunk ends inside an encoder"
        return text

    def front(self, tokens: torch.Tensor, position_ids: torch.Tensor,
              media: Mapping[str, torch.Tensor], layout: BatchLayout):
        """This chunk's share of embedding and encoding: (text embeddings with the features
        merged so far, the hidden state of an encoder the chunk ends inside, or None)."""
        place = self.placement
        self.bind_batches(layout)
        if place.llm_embed:
            text = self.language_model.embedding(input_ids=tokens, position_ids=position_ids)
            hidden = None
        else:
            text, hidden = self.unpack(self.input_tensor, tokens, layout)
        if place.encoder_separate:  # the encoder ran as its own actions
            for name in self.encoder_names:
                if self.placement.encoder(name).projector:
                    if self.encoder_kept.get(name):  # bound after its batch (which clears)
                        self.encoder(name).kept.update(self._received_kept(name))
                    text = self.merge(name, self._whole(text, tokens), layout,
                                      self._received(name))
            return text, None
        for name in self.encoder_names:
            if layout.items[name]:  # under --vision-dp-when-cp this CP rank's items
                hidden = self.run_encoder(name, layout.encoder_media.get(name, media), hidden)
            else:  # FP8 layers enter their autocast all the same (fp8_context)
                idle = self._idle_layers(name)
                text = text if idle is None else anchor(text, idle)
            if self.placement.encoder(name).projector:
                text = self.merge(name, self._whole(text, tokens), layout, hidden)
                hidden = None
        return text, hidden

    def _received(self, name: str) -> Optional[torch.Tensor]:
        """Encoder ``name``'s output as another rank sent it (``encoder_separate``), as its
        output norm and projector here take it. From encoder ranks of their own
        (``encoder_ranks_own``) it comes whole: under sequence parallelism this TP rank's
        shard of it, padded as the encoder's layers would run it (the split's backward
        gathers the gradient whole again, the same on every TP rank); from an encoder
        pipeline on the LLM's ranks it is already this rank's shard."""
        hidden = self.encoder_inputs.get(name)
        if hidden is None or not self._shards_received():
            return hidden
        return self.encoder(name).to_sequence_parallel(hidden)

    def _received_kept(self, name: str) -> Dict[int, torch.Tensor]:
        """Encoder ``name``'s DeepStack layer outputs as another rank sent them, sharded
        as ``_received`` shards its output (the mergers run on this rank's shard)."""
        kept = self.encoder_kept[name]
        if not self._shards_received():
            return kept
        return {i: self.encoder(name).to_sequence_parallel(h) for i, h in kept.items()}

    def _shards_received(self) -> bool:
        return self.sequence_parallel and self.placement.encoder_ranks_own

    def needs_media(self) -> bool:
        """Whether this chunk reads the media themselves (it embeds an encoder's input);
        elsewhere the layout's counts are all it needs, so the media stay on the host."""
        return not self.placement.encoder_separate and any(
            e.embed for e in self.placement.encoders)

    def _whole(self, text: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The whole text embeddings [S, B, H], for a merge: under sequence parallelism a
        chunk may hold only this rank's shard of them (sent by the chunk before)."""
        if self.sequence_parallel and text.shape[0] != tokens.shape[1]:
            return sequence_parallel.gather(text)
        return text

    def pack(self, text: torch.Tensor, hidden: Optional[torch.Tensor],
             seq_length: Optional[int] = None) -> torch.Tensor:
        """What this chunk sends on: the text embeddings, with an encoder's hidden state
        and what the encoder carries past the cut with it (``carry``: Qwen3-VL's DeepStack
        layer outputs) (under sequence parallelism this rank's shards; ``seq_length``: the
        micro-batch's, S of whole text embeddings)."""
        if self.sequence_parallel and text.shape[0] == seq_length:
            text = sequence_parallel.split(text)
        if hidden is None:
            return text
        carry = getattr(self.encoder(self.placement.sends_encoder), "carry", None)
        hidden = [hidden, *(carry() if carry is not None else ())]
        return torch.cat([text.reshape(-1)] + [h.to(text.dtype).reshape(-1)
                                               for h in hidden]).view(-1, 1, 1)

    def unpack(self, received: torch.Tensor, tokens: torch.Tensor, layout: BatchLayout):
        """(text [S, B, H], encoder hidden [T, N, H_enc] or None) from ``pack``'s tensor."""
        name = self.placement.receives_encoder
        if name is None or not layout.items[name]:
            return received, None
        b, s = tokens.shape
        if name in layout.hidden_shapes:  # a family whose shape varies by batch (host-known)
            t, n_items = layout.hidden_shapes[name]
            t = self.encoder(name).layer_length(t)  # with its sequence-parallel padding
        else:
            t, n_items = self.encoder(name).layer_seq_length, layout.items[name]
        if self.sequence_parallel:  # this rank's shards
            tp = self.language_model.config.tensor_model_parallel_size
            s, t = s // tp, t // tp
        n_text = s * b * self.language_model.config.hidden_size
        n_hidden = t * n_items * self.mm_config.encoders[name].hidden_size
        flat = received.reshape(-1)
        hidden, *carried = flat[n_text:].split(n_hidden)
        encoder, part = self.encoder(name), self.placement.encoder(name)
        first = part.layers[0] if part.num_layers else None
        expected = encoder.carried(first) if hasattr(encoder, "carried") else []
        if len(carried) != len(expected):
            raise ValueError(f"{len(carried)} {name} layer outputs carried to pipeline chunk "
                             f"{self.placement.chunk}; it needs {len(expected)}")
        if carried:  # the layer outputs ``pack`` carried on, kept where they are needed
            encoder.receive([c.view(t, n_items, -1) for c in carried], first)
        return flat[:n_text].view(s, b, -1), hidden.view(t, n_items, -1)

    def _sequence_parallel_input(self, hidden: torch.Tensor, tokens: torch.Tensor,
                                 cpm: Optional[ContextParallelMask]) -> torch.Tensor:
        """The LLM layers' input under sequence parallelism: this TP rank's shard of (this
        CP rank's tokens of) the sequence. The chunk holding the LLM's first layer gets the
        text embeddings whole, or this rank's shard of the whole sequence from the chunk
        before; later chunks get the LLM's hidden state, already sharded."""
        first = self.placement.num_llm_layers > 0 and self.placement.llm_layers[0] == 0
        if not first:
            return hidden
        if cpm is None and hidden.shape[0] != tokens.shape[1]:
            return hidden
        return self.llm_share(self._whole(hidden, tokens), cpm)

    def llm_share(self, whole: torch.Tensor, cpm: Optional[ContextParallelMask]) -> torch.Tensor:
        """This rank's share of a whole-sequence [S, B, H] tensor, as the LLM's layers hold
        theirs: the CP rank's tokens, then under sequence parallelism the TP rank's shard
        of them (the LLM's input, and the DeepStack features added inside it)."""
        x = whole if cpm is None else whole[cpm.local]
        return sequence_parallel.split(x) if self.sequence_parallel else x

    def forward(self, tokens: torch.Tensor, position_ids: torch.Tensor,
                media: Optional[Mapping[str, torch.Tensor]] = None,
                labels: Optional[torch.Tensor] = None,
                loss_mask: Optional[torch.Tensor] = None,
                attention_mask: Optional[torch.Tensor] = None,
                layout: Optional[BatchLayout] = None) -> torch.Tensor:
        """Per-token loss [B, S] when ``labels`` are given, else vocab-parallel logits (on the
        last chunk; earlier chunks return what the next one receives).

        With a ``loss_mask`` the output layer runs only where the loss is taken (answer
        tokens; not media or prompt), and the loss elsewhere is 0. ``attention_mask``
        ([B, 1, S, S] bool, True = masked; None = causal; a ``PackedSequences``: TE's THD
        attention over the packed row) isolates packed samples; a
        ``ContextParallelMask`` instead runs this CP rank's tokens only: ``tokens``,
        ``labels``, ``loss_mask`` and ``position_ids`` stay whole-sequence, the loss comes
        back for the rank's tokens ([B, S_local], in ``attention_mask.local`` order).
        ``position_ids``: [B, S], or M-RoPE's [3, B, S] (``--position-embedding-type
        mrope``), on every pipeline stage (each from its own copy of the micro-batch).

        ``layout`` (``BatchLayout``, computed on the host) gives every size and position
        the forward needs, so it reads no device value; without one it is computed here
        from ``tokens`` (a host read: for callers off the training step).
        """
        cpm = attention_mask if isinstance(attention_mask, ContextParallelMask) else None
        packed = None  # packed samples on TE's THD attention: no mask, their cu_seqlens
        if isinstance(attention_mask, PackedSequences):  # (a hybrid's local mask with it)
            packed, attention_mask = attention_mask, attention_mask.mask
        media = media or {}
        if layout is None:
            local_mask = loss_mask if cpm is None else cpm.take_loss_mask(loss_mask)
            layout = self.layout(tokens, media, local_mask)
        place = self.placement
        if self.deepstack is not None:
            self.deepstack.bind(None)  # this micro-batch's come with its merge
        if place.llm_embed or (place.encoders and not place.encoder_separate):
            hidden_in, encoder_hidden = self.front(tokens, position_ids, media, layout)
            if not place.runs_llm:
                return self._send_deepstack(
                    self.pack(hidden_in, encoder_hidden, tokens.shape[1]))
        else:
            hidden_in = self.input_tensor
            if self.deepstack is not None:
                hidden_in = self._receive_deepstack(hidden_in, tokens, layout)
        if self.sequence_parallel:
            hidden_in = self._sequence_parallel_input(hidden_in, tokens, cpm)
        elif cpm is not None:
            # The text embeddings are whole until the first chunk running LLM layers takes
            # this rank's tokens; a full-length input (the chunk before held no LLM layer,
            # or nothing is split) is whole, a shorter one already this rank's.
            if hidden_in.shape[0] == tokens.shape[1]:
                hidden_in = self.llm_share(hidden_in, cpm)
        if self.deepstack is not None and (cpm is not None or self.sequence_parallel):
            self.deepstack.take_share(partial(self.llm_share, cpm=cpm))
        position_ids = self.rotary_positions(position_ids)
        if cpm is not None:
            tokens, position_ids = cpm.take(tokens), cpm.take_positions(position_ids)
            labels, loss_mask = cpm.take(labels), cpm.take_loss_mask(loss_mask)
        if self.language_model.pre_process:
            decoder_input = hidden_in
        else:  # GPTModel's decoder reads a chunk's input from set_input_tensor
            self.language_model.set_input_tensor(hidden_in)
            decoder_input = None
        sparse = labels is not None and loss_mask is not None
        self._rope_positions = None if cpm is None else (cpm.local, cpm.codes.shape[1])
        padding = layout.padding if cpm is None else cpm.take(layout.padding)
        if cpm is not None:  # a sequence too short to split: CP rank 0's tokens count
            for router in self._routers:
                router.duplicate_tokens = cpm.replicated and cpm.cp_rank != 0
        if padding is not None and self.sequence_parallel:  # this TP rank's positions
            padding = sequence_parallel.split(padding.t().contiguous()).t()
        try:
            out = self.language_model(
                input_ids=tokens, position_ids=position_ids, attention_mask=attention_mask,
                decoder_input=decoder_input, labels=labels, packed_seq_params=packed,
                padding_mask=padding,
                loss_mask=loss_mask if sparse else None,
                output_processor=loss_at_masked_positions if sparse else None,
                output_processor_context=layout.loss_positions if sparse else None)
            if self.deepstack is not None:
                out = self.deepstack.rebind_in_backward(out)
            return self._send_deepstack(out)
        finally:
            self._rope_positions = None


def loss_at_masked_positions(*, hidden_states, output_layer, output_weight, labels, loss_mask,
                             compute_language_model_loss, scale_logits, context=None, **_):
    """GPTModel output hook: logits and cross entropy only where ``loss_mask`` is set.

    In multimodal SFT most positions are media or prompt tokens, so this skips most of the
    vocabulary-sized matmul and softmax; the per-token losses are the same as the full path.
    ``context`` (``BatchLayout.loss_positions``: the flat [S, B] positions of the loss,
    from the host) keeps it free of host reads; without it they come from ``loss_mask``.
    """
    b, s = labels.shape  # hidden_states: [S, B, H], or this TP rank's shard under SP
    positions = context
    if positions is None:
        positions = loss_positions(loss_mask).to(hidden_states.device)
    if output_layer.sequence_parallel:
        logits = sequence_parallel.logits_at(output_layer, output_weight, hidden_states,
                                             positions)
    else:
        selected = hidden_states.reshape(s * b, -1).index_select(0, positions).unsqueeze(1)
        logits, _ = output_layer(selected, weight=output_weight)  # [n, 1, V / TP]
    targets = labels.transpose(0, 1).reshape(s * b).index_select(0, positions)
    per_token = compute_language_model_loss(targets.unsqueeze(0),
                                            scale_logits(logits))  # [1, n]
    loss = per_token.new_zeros(s * b).index_copy(0, positions, per_token.squeeze(0))
    return loss.view(s, b).transpose(0, 1)  # [B, S] like GPTModel's loss
