"""What one encoder family declares: the registry's entry (Megatron-Core MIMO's
``ModalitySubmodules`` and torchtitan's ``TrainSpec`` in one record).

Torch-free, so the planner and the argument parser read it before any process group
exists; the torch-side builders are named as ``"package.module:attribute"`` and imported on
first use (``resolve``).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Mapping, Optional, Tuple

from ..plan.model import TransformerSpec

# An encoder's slot: its name in the model ("vision" -> vision_model), the prefix of its
# flags (--vision-*) and the flag that freezes it.
SLOTS = {"vision": "freeze_ViT", "audio": "freeze_audio"}


@dataclass(frozen=True)
class BuiltinData:
    """Data a family trains on when no ``--data-path`` is given (the demos): ``prepare``
    names ``"package.module:function"``, ``function(out_dir) -> (train_path, valid_path)``
    (idempotent), run under ``--data-cache-path``/``name``; ``modalities``: the media keys
    its records hold (``builtin_data_for`` picks data holding every one the model reads)."""

    name: str
    prepare: str
    modalities: Tuple[str, ...]


def resolve(ref: str) -> Any:
    """``"package.module:attribute"`` -> the attribute (imported now)."""
    module, _, attr = ref.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclass(frozen=True)
class EncoderFamily:
    """One kind of encoder, everything the package needs of it.

    - ``model_type``: the ``--{slot}-model-type`` value and the config's ``model_type``.
    - ``slot``: "vision" or "audio" (``SLOTS``).
    - ``modality``: the media key of records, tokenizer placeholders and batches.
    - ``config_class`` / ``from_model_args``: its self-validating config dataclass, built
      from the run's model group (``ModelArgs``; the family's own flags are
      ``model.families[flags]``).
    - ``flags``: the family's own flags, one frozen dataclass (each field a flag, its
      docstring the ``--help`` text, ``argparse_meta`` where argparse needs more: Megatron-LM's
      ``ArgumentGroupFactory`` makes the flags); ``checkpoint_flags``: the names of those a
      checkpoint fixes.
    - ``planner_spec(name, config, items_per_sample, common)``: the planner's
      ``EncoderSpec`` (costs from the family's own shapes).
    - ``build``: ``build(config, settings, specs, part, name, vp_stage, pg_collection,
      checkpoint_dp_group)`` -> the encoder module (or the part a pipeline chunk holds),
      its layers from Megatron-Core specs (``models/specs.py``).
    - ``projector``: ``build_projector(config, proj_config, lm_config, settings, specs,
      name)`` -> the module between the encoder and the LLM (a family's own, e.g.
      Qwen2.5-VL's patch merger); None: Megatron-Core's ``MultimodalProjector`` from
      ``--projector-type``.
    - ``extra_modalities``: further media keys the encoder reads (Qwen2.5-VL: "video"
      next to "image"); each has its own placeholder token, and the features fill the
      placeholders modality by modality in this order (``modality`` first), each in the
      batch's row-major (sample, position) order.
    - ``prepare_batch``: ``prepare(config, media) -> object with .to(device)`` run on the
      host with the batch layout (from host metadata such as grids), bound to the encoder
      module (``bind_batch``) before it runs: indices and masks a variable-length encoder
      needs without reading the device; None: nothing to prepare.
    - ``hidden_shape(config, media)``: (T, N) of the encoder's hidden state for a batch's
      host media (variable-length families pack all items into one sequence: (patches,
      1); their module's ``layer_length(T)`` adds its sequence-parallel padding); None:
      the encoder's fixed length x the batch's items.
    - ``media``: ``media(model, config)`` -> the ``MediaProcessor`` (raw media -> batch
      tensors, and the exact placeholder count of every item); ``model``: the run's model
      group.
    - ``feature_tokens(config, media)``: (items in a batch's media, LLM tokens of each
      item or None: ``config.num_output_tokens`` each; a family reading several
      modalities may give {modality: tokens of each item}, checked modality by modality)
      on the host; ``padded_features``:
      every item's features are padded to ``num_output_tokens`` rows (the model drops each
      item's padding before the merge).
    - ``fp8_token_counts(name, config)``: {FP8 module: (tokens per item, the flags that set
      it)} for the FP8 alignment check; ``fp8_shard_token_counts(name, config, tp,
      recipe)``: the same per TP rank under ``--sequence-parallel`` (the encoder and its
      projector run on each rank's shard; None: those counts / TP);
      ``check_sequence_parallel(name, config, tp, impl)``
      raises a ``ConfigError`` for a layout the family cannot shard (None: none).
    - ``select_items``: ``select(config, media, items) -> media`` of only the items
      numbered ``items`` (sorted, in the features' order) of a batch's host media, for
      ``--vision-dp-when-cp``; None: every media key of the family's modalities (the key
      itself or ``{modality}_...``) holds one row per item.
    - ``builtin_data``: the ``BuiltinData`` its demo trains on without ``--data-path``.
    - ``item_tags``: {modality: (start, end)} token text around each item's placeholder run
      in the model's own (Hugging Face) input layout (InternVL: ``<img>`` ``</img>``); the
      default of ``--image-tag-type auto`` (``data/item_tags.py``), used where the tokenizer
      has those tokens; None: no tags.
    """

    model_type: str
    slot: str
    modality: str
    config_class: type
    from_model_args: Callable
    planner_spec: Callable
    build: str
    media: str
    feature_tokens: Callable
    fp8_token_counts: Callable
    check_sequence_parallel: Optional[Callable] = None  # None: every layout shards
    fp8_shard_token_counts: Optional[Callable] = None
    padded_features: bool = False
    flags: Optional[type] = None
    checkpoint_flags: Tuple[str, ...] = ()
    projector: Optional[str] = None
    extra_modalities: Tuple[str, ...] = ()
    prepare_batch: Optional[str] = None
    hidden_shape: Optional[Callable] = None
    select_items: Optional[str] = None
    builtin_data: Optional[BuiltinData] = None
    item_tags: Optional[Mapping[str, Tuple[str, str]]] = field(default=None, hash=False)

    @property
    def modalities(self) -> Tuple[str, ...]:
        """Every media key the encoder reads, in the order its features fill the text."""
        return (self.modality,) + self.extra_modalities

    def __post_init__(self):
        if self.slot not in SLOTS:
            raise ValueError(f"encoder family {self.model_type!r}: slot must be one of "
                             f"{sorted(SLOTS)}, got {self.slot!r}")

    def build_encoder(self, *args, **kwargs):
        return resolve(self.build)(*args, **kwargs)

    def build_projector(self, *args, **kwargs):
        """The family's own projector, or None: the default one (``models/build.py``)."""
        return None if self.projector is None else resolve(self.projector)(*args, **kwargs)

    def media_processor(self, model, config):
        """``model``: the run's model group (``ModelArgs``); ``config``: the encoder's."""
        return resolve(self.media)(model, config)

    def select(self, config, media, items):
        """The host media of items ``items`` only (``select_items``)."""
        if self.select_items is not None:
            return resolve(self.select_items)(config, media, items)
        rows = list(items)  # a tensor's rows, by advanced indexing
        return {k: v[rows] for k, v in media.items()
                if any(k == m or k.startswith(m + "_") for m in self.modalities)}

    def prepare(self, config, media):
        """The host-side batch object (``prepare_batch``), or None."""
        return None if self.prepare_batch is None else resolve(self.prepare_batch)(config, media)


def fixed_feature_tokens(modality: str) -> Callable:
    """``feature_tokens`` of a family whose items all hand the LLM the same count."""
    def feature_tokens(config, media: Dict[str, Any]):
        items = media.get(modality)
        return (0 if items is None else items.shape[0]), None
    return feature_tokens


def encoder_transformer(enc, num_layers: Optional[int] = None, **extra) -> TransformerSpec:
    """The planner's ``TransformerSpec`` of an encoder config's layers (biased linears, as
    every family here has; ``num_layers``: the config's built layers unless given;
    ``extra``: a family's own fields, e.g. ``gated_linear_unit``)."""
    return TransformerSpec(
        hidden_size=enc.hidden_size,
        num_layers=enc.num_layers_built if num_layers is None else num_layers,
        ffn_hidden_size=enc.ffn_hidden_size, num_attention_heads=enc.num_attention_heads,
        add_bias_linear=True, **extra)
