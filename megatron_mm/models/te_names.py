"""The names one weight has in local and in Transformer Engine layers.

Megatron-Core's TE layer specs (``get_gpt_layer_with_transformer_engine_spec``,
``get_vit_layer_with_transformer_engine_spec``) fuse each pre-norm into the linear after it
(``TELayerNormColumnParallelLinear``): the local layer's ``input_layernorm.{weight,bias}``
is the TE layer's ``self_attention.linear_qkv.layer_norm_{weight,bias}``, and
``pre_mlp_layernorm.*`` is ``mlp.linear_fc1.layer_norm_*``. Every other weight keeps its
name. TE modules also hold ``_extra_state`` (their FP8 scaling metadata), which is module
state, not a weight: nothing to convert.

Distributed checkpoints always carry TE's names: Megatron-Core's local GPT spec renames its
norms through ``sharded_state_dict_keys_map`` (the same table as ``LOCAL_TO_TE``) and
``with_te_checkpoint_names`` gives the local encoder specs that map too, so a checkpoint
saved with either ``--transformer-impl`` loads into the other. ``to_te`` / ``to_local``
rename in-memory state-dict names (the Hugging Face tables are written in local names).
"""

from __future__ import annotations

import dataclasses
import re
from typing import Dict

# Local layer name prefix -> TE layer name prefix, inside one transformer layer.
LOCAL_TO_TE: Dict[str, str] = {
    "input_layernorm.": "self_attention.linear_qkv.layer_norm_",
    "pre_mlp_layernorm.": "mlp.linear_fc1.layer_norm_",
}
TE_TO_LOCAL = {te: local for local, te in LOCAL_TO_TE.items()}
EXTRA_STATE = "_extra_state"
_IN_LAYER = re.compile(r"(?P<layer>(?:.*\.)?layers\.(?:\d+|\{i\})\.)(?P<rest>.*)")


def _rename(name: str, table: Dict[str, str]) -> str:
    m = _IN_LAYER.fullmatch(name)
    if m is None:
        return name
    rest = m["rest"]
    for old, new in table.items():
        if rest.startswith(old):
            return m["layer"] + new + rest[len(old):]
    return name


def to_te(name: str) -> str:
    """A local model's state-dict name (or table pattern with ``{i}``) -> the TE model's."""
    return _rename(name, LOCAL_TO_TE)


def to_local(name: str) -> str:
    """A TE model's state-dict name -> the local model's."""
    return _rename(name, TE_TO_LOCAL)


def is_module_state(name: str) -> bool:
    """TE's per-module ``_extra_state`` (FP8 metadata): not a weight."""
    return name.rsplit(".", 1)[-1] == EXTRA_STATE


def with_te_checkpoint_names(layer_spec):
    """A copy of a local layer spec whose checkpoint keys are TE's (Megatron-Core's local
    GPT spec does this itself; its local ViT spec does not)."""
    keys_map = {**layer_spec.submodules.sharded_state_dict_keys_map, **LOCAL_TO_TE}
    submodules = dataclasses.replace(layer_spec.submodules,
                                     sharded_state_dict_keys_map=keys_map)
    return dataclasses.replace(layer_spec, submodules=submodules)
