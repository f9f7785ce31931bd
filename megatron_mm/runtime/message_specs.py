"""The shape and dtype of every pipeline message, from host-side metadata of the
micro-batch that both the sender and the receiver hold (no header travels, nothing is read
back from the device).

- An encoder piece's output (``EF``): [T, N, H_enc] in the encoder's dtype (T: the
  encoder's sequence length, N: the micro-batch's items of its modality; a family whose
  shape varies by batch gives (T, N) from the host media, ``EncoderFamily.hidden_shape``);
  None when the micro-batch has none.
- An LLM chunk's output (``F``): [S, B, H] in Megatron's ``pipeline_dtype``; S is this
  context-parallel rank's token count once some chunk up to it ran LLM layers (the model
  takes the rank's tokens there), else the whole sequence; whole always for a forward
  step marked ``whole_sequence`` (generation decodes the whole prompt on every CP rank).
- Under sequence parallelism both travel as this TP rank's shard of their sequence
  (``models/sequence_parallel.py``): [S / TP, B, H], and [T / TP, N, H_enc] with T the
  encoder's ``layer_seq_length`` (its sequence padded to a multiple of TP).
- DeepStack (Qwen3-VL): an encoder piece's output carries the outputs of the DeepStack
  layers up to its end after it, [(1 + k) T, N, H_enc] (``deepstack_carry.py``); a chunk
  whose output goes on to chunks holding LLM layers that add merged DeepStack features
  sends them flat after its [S, B, H]: [S B H + k n H, 1, 1] (n: the micro-batch's
  visual tokens).
- The separate placement sends an encoder's output whole, [T, N, H_enc] without padding,
  whatever the TP of the encoder ranks and of the LLM's (``MultimodalModel`` shards it
  there under sequence parallelism).
- A gradient (``B``, ``EB``) has the shape of the forward message it is the gradient of.

The sender checks its tensor against the same spec, so a model change that breaks these
rules fails with an error that names the message, not with a hang or a wrong result.
"""

from __future__ import annotations

from typing import Callable, Dict, Optional, Sequence, Tuple

from megatron.core.utils import get_attr_wrapped_model, get_model_config

from ..families import family_of, modality_of
from ..plan.schedules.p2p import Key, forward_key
from ..plan.pipeline.placement import ChunkPlacement
from .deepstack_carry import carried
from .mailbox import Spec
from .microbatches import NoData


class MessageSpecs:
    """``pieces``: (encoder name, layers) per encoder piece; ``placements``: every model
    chunk's; ``local_length(batch)``: this CP rank's token count (None: no CP)."""

    def __init__(self, model_chunk, pieces: Sequence, placements: Sequence[ChunkPlacement],
                 local_length: Optional[Callable[[dict], int]] = None):
        self.model, self.pieces = model_chunk, pieces
        self.config = get_model_config(model_chunk)
        # chunk c's output is CP-local once some chunk <= c runs LLM layers
        self.local_from = next((c for c, p in enumerate(placements) if p.runs_llm),
                               len(placements))
        self.local_length = local_length
        # this CP rank's token count per micro-batch (planned from its host tokens): once
        # per micro-batch of the iteration, not per message key
        self._local_lengths: Dict[int, Tuple[dict, int]] = {}
        self.placements = list(placements)
        # the separate placement sends an encoder's output whole (no sequence-parallel
        # shard or padding): the encoder ranks' TP and the LLM's differ
        self.whole_encoder_output = bool(placements) and placements[0].encoder_ranks_own
        encoders = get_attr_wrapped_model(model_chunk, "mm_config").encoders
        # (encoder, LLM layers) of the DeepStack features, or None (``_attach_deepstack``)
        self.deepstack = next(((name, enc.deepstack_llm_layers) for name, enc in
                               encoders.items() if getattr(enc, "deepstack_llm_layers", 0)),
                              None)

    def of(self, key: Key, batch: dict) -> Optional[Spec]:
        kind, _, index = forward_key(key)
        if kind == "EF":
            name, (_, end) = self.pieces[index]
            spec = self.encoder_output(name, batch)
            mm_config = get_attr_wrapped_model(self.model, "mm_config")
            k = carried(mm_config.encoders[name], end)  # DeepStack layers' outputs with it
            if spec is None or not k:
                return spec
            return Spec((spec.shape[0] * (1 + k),) + spec.shape[1:], spec.dtype)
        return self.chunk_output(index, batch)

    def fixed(self, key: Key, micro_batch_size: Optional[int],
              seq_length: Optional[int]) -> Spec:
        """Message ``key``'s spec on a stage without data: an LLM chunk's output
        [S, B, H] from Megatron-LM's ``--seq-length`` and ``--micro-batch-size`` (as
        Megatron-Core's ``get_tensor_shapes``); what varies by micro-batch needs it
        (``NoData``)."""
        kind, _, chunk = forward_key(key)
        if kind == "EF":
            raise NoData(f"message {key} is an encoder output, shaped by the micro-batch's "
                         "media")
        if self.local_length is not None and chunk >= self.local_from:
            raise NoData(f"message {key}: this context-parallel rank's token count comes "
                         "from the micro-batch")
        if self.deepstack is not None and self.placements[chunk].deepstack_layers(
                self.deepstack[0], self.deepstack[1], sent=True):
            raise NoData(f"message {key} carries DeepStack features, counted from the "
                         "micro-batch's media")
        if not seq_length or not micro_batch_size:
            raise NoData(f"message {key}: no seq_length / micro_batch_size given for its "
                         "shape")
        s = seq_length
        if self.config.sequence_parallel:
            s //= self.config.tensor_model_parallel_size
        return Spec((s, micro_batch_size, self.config.hidden_size),
                    self.config.pipeline_dtype or self.config.params_dtype)

    def encoder_output(self, name: str, batch: dict) -> Optional[Spec]:
        mm_config = get_attr_wrapped_model(self.model, "mm_config")
        enc = mm_config.encoders[name]
        encoder = get_attr_wrapped_model(self.model, "encoder")(name)
        family = family_of(enc)
        if family.hidden_shape is not None:  # varies by batch: from its host media
            if not family.feature_tokens(enc, batch["media"])[0]:
                return None
            t, n = family.hidden_shape(enc, batch["media"])
            if self.whole_encoder_output:
                return Spec((t, n, encoder.encoder_config.hidden_size),
                            encoder.config.params_dtype)
            t = encoder.layer_length(t)  # with its sequence-parallel padding
            if encoder.config.sequence_parallel:
                t //= encoder.config.tensor_model_parallel_size
            return Spec((t, n, encoder.encoder_config.hidden_size),
                        encoder.config.params_dtype)
        items = batch["media"].get(modality_of(enc))
        if items is None or items.shape[0] == 0:
            return None
        if self.whole_encoder_output:
            return Spec((encoder.seq_length, items.shape[0], encoder.encoder_config.hidden_size),
                        encoder.config.params_dtype)
        t = encoder.layer_seq_length  # with its padding
        if encoder.config.sequence_parallel:
            t //= encoder.config.tensor_model_parallel_size
        return Spec((t, items.shape[0], encoder.encoder_config.hidden_size),
                    encoder.config.params_dtype)

    def chunk_output(self, chunk: int, batch: dict) -> Spec:
        b, s = batch["tokens"].shape
        if self.local_length is not None and chunk >= self.local_from:
            s = self.local_tokens(batch)
        if self.config.sequence_parallel:
            s //= self.config.tensor_model_parallel_size
        dtype = self.config.pipeline_dtype or self.config.params_dtype
        h = self.config.hidden_size
        features = self.deepstack_rows(chunk, batch)
        if features:  # the merged DeepStack features of later chunks' layers, flat after it
            return Spec((s * b * h + features * h, 1, 1), dtype)
        return Spec((s, b, h), dtype)

    def local_tokens(self, batch: dict) -> int:
        """``local_length(batch)``, computed once per micro-batch (the batch is held with
        its count, so its id stays its own for the iteration these specs serve)."""
        hit = self._local_lengths.get(id(batch))
        if hit is None:
            hit = self._local_lengths[id(batch)] = (batch, self.local_length(batch))
        return hit[1]

    def deepstack_rows(self, chunk: int, batch: dict) -> int:
        """Rows of merged DeepStack features chunk ``chunk`` sends on with its output: one
        [n, H] per LLM layer after its own that adds them (n: the micro-batch's visual
        tokens), as ``MultimodalModel`` appends them."""
        if self.deepstack is None:
            return 0
        name, num_layers = self.deepstack
        layers = self.placements[chunk].deepstack_layers(name, num_layers, sent=True)
        if not layers:
            return 0
        enc = get_attr_wrapped_model(self.model, "mm_config").encoders[name]
        items, tokens = family_of(enc).feature_tokens(enc, batch["media"])
        if tokens is None:
            return len(layers) * items * enc.num_output_tokens
        per_modality = tokens.values() if isinstance(tokens, dict) else [tokens]
        return len(layers) * sum(sum(t) for t in per_modality)
