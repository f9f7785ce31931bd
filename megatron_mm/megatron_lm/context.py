"""What the package derives once per Megatron-LM run from its parsed arguments: the
package's run context (``training/run_context.py``, as the Trainer builds it: the
RunConfig, the tokenizer the data are encoded with, the model config with its
vocabulary, the pipeline plan and the attention settings) of Megatron-LM's namespace.
The model provider, forward step and datasets provider read it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..training.assembly.attention import AttentionSettings
from ..training.planning.training_plan import TrainingPlan
from ..training.config.run_config import RunConfig
from ..training.run_context import RunContext as TrainingContext
from .arguments import run_config_from_args


@dataclass
class RunContext:
    args: object  # Megatron-LM's namespace this was derived from
    config: RunConfig
    tokenizer: object
    model_config: object  # with the tokenizer's vocabulary
    plan: TrainingPlan
    attention: AttentionSettings
    _valid: object = field(default=None, repr=False)

    def valid_dataset(self):
        """The validation samples (the answer accuracy decodes them), read once."""
        if self._valid is None:
            from ..training.assembly.data_setup import build_datasets

            self._valid = build_datasets(self.config, self.tokenizer)[1]
        return self._valid


_context: Optional[RunContext] = None


def run_context(args=None) -> RunContext:
    """The context of Megatron-LM's current arguments (``get_args()``), derived on first
    use and again when the arguments are new (another run in the process)."""
    global _context
    if args is None:
        from megatron.training import get_args

        args = get_args()
    if _context is None or _context.args is not args:
        run = TrainingContext.build(run_config_from_args(args))
        _context = RunContext(args, run.config, run.tokenizer, run.model_config, run.plan,
                              run.attention)
    return _context
