"""One run's assembly before any process group, shared by every entry point: the package's
``Trainer``, the Megatron-LM adapter (``megatron_lm/context.py``) and the converter's
comparison (``hf/compare.py``) each build a ``RunContext`` from the validated RunConfig.

It holds what a run derives from its flags: the LLM's core attention (what cannot run on
this machine stops the run first), the tokenizer, the model config with its real
vocabulary, the plan (a plan that cannot work is reported before any process group; the
run reads its encoder schedule from it) and the attention settings.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Optional

from ..config import ConfigError
from ..data import build_tokenizer
from ..data.item_tags import MissingTagToken, tag_request
from ..families import family_of
from .assembly.attention import AttentionSettings
from .assembly.build_settings import CPAttentionChoice, cp_attention_choice
from .checkpoint.checkpointing import saved_args
from .config.run_config import RunConfig
from .planning.training_plan import TrainingPlan, plan_pipeline


def tokenizer_from_config(config):
    """The run's tokenizer: --tokenizer-type / --tokenizer-model, the placeholder ids of
    --{image,audio,video}-token-id, and the item tags of --image-tag-type for its
    encoders (a tag a named style needs and the tokenizer cannot hold: a ConfigError)."""
    model, data = config.model, config.data
    families = [family_of(enc) for enc in config.model_config.encoders.values()]
    try:
        return build_tokenizer(data.tokenizer_type, data.tokenizer_model,
                               image_token_id=model.image_token_id,
                               audio_token_id=model.audio_token_id,
                               video_token_id=model.video_token_id,
                               item_tags=tag_request(model.image_tag_type, families))
    except MissingTagToken as e:
        raise ConfigError(f"{e} (--tokenizer-model {data.tokenizer_model})") from None


def model_config_for(config, tokenizer):
    """The flags' model config (``config``: the RunConfig) with the tokenizer's
    vocabulary (and, loading a checkpoint, its vocabulary padding, whatever TP it was
    saved at)."""
    model_config = copy.deepcopy(config.model_config)
    model_config.language.vocab_size = tokenizer.vocab_size
    if config.checkpoint.load:
        model_config.language.padded_vocab_size = saved_args(config.checkpoint).get(
            "padded_vocab_size")
    return model_config


def _checkpoint_model_config(config):
    """The model config of the checkpoint ``--load`` names at its saved vocabulary padding
    (the weights alone: no tokenizer read)."""
    model_config = copy.deepcopy(config.model_config)
    lm = model_config.language
    lm.padded_vocab_size = lm.vocab_size = saved_args(config.checkpoint)["padded_vocab_size"]
    return model_config


def _text_split(config) -> Optional[AttentionSettings]:
    """How a weights-only run splits each sequence over its CP ranks: a causal mask (every
    token attends as text), or None without context parallelism."""
    par = config.parallel
    if par.context_parallel_size == 1:
        return None
    return AttentionSettings(
        {}, "causal", par.context_parallel_size, par.context_parallel_assignment,
        par.context_parallel_block, par.context_parallel_block_overhead,
        linear_attention=config.model_config.language.linear_attention is not None)


@dataclass(frozen=True)
class RunContext:
    config: RunConfig  # the validated flags, with the plan's encoder schedule
    tokenizer: object  # None: a weights-only context
    model_config: object  # with the tokenizer's vocabulary (the checkpoint's: weights only)
    plan: TrainingPlan
    # the LLM's attention settings (weights only: the causal CP split, None without CP)
    attention: Optional[AttentionSettings]
    cp: CPAttentionChoice  # which core attention the LLM runs, and why

    @classmethod
    def build(cls, config: RunConfig, weights_only: bool = False) -> "RunContext":
        """``config``'s context. ``weights_only``: a model loaded from ``--load`` to run
        text forwards (the converter's comparison): the checkpoint's vocabulary, no
        tokenizer, the plan the flags give."""
        # The LLM's attention first: what cannot run on this machine (FlexAttention's
        # backward on CPU) stops the run before any process group exists.
        cp = cp_attention_choice(config)
        if weights_only:
            model_config = _checkpoint_model_config(config)
            plan = plan_pipeline(config, model_config)
            return cls(config, None, model_config, plan, _text_split(config), cp)
        tokenizer = tokenizer_from_config(config)
        model_config = model_config_for(config, tokenizer)
        plan = plan_pipeline(config, model_config)  # a ConfigError here names the flag
        # The run reads its encoder schedule (the flags', or auto's pick) from the plan:
        # auto's separate pick brings its own parallel sizes.
        config = plan.run_config(config)
        attention = AttentionSettings.from_config(config, tokenizer, cp.kind)
        return cls(config, tokenizer, model_config, plan, attention, cp)
