"""When the run exits early and what it checks as it goes."""

import argparse
import signal
from dataclasses import dataclass
from typing import List, Optional

from ....config import ConfigError

from ..logging_args import EXIT_SIGNALS
from .fields import flag, not_positive


@dataclass(frozen=True)
class ExitsArgs:
    """When the run exits early and what it checks as it goes."""

    exit_interval: Optional[int] = None
    """exit the program after the iteration is divisible by this value (saving first with --save)"""
    exit_duration_in_mins: Optional[int] = None
    """exit the program after this many minutes, setup included (saving first with --save); every
    rank takes the same decision"""
    exit_signal_handler: bool = False
    """on --exit-signal (SIGTERM), finish the iteration, save the checkpoint and exit cleanly; all
    ranks agree on the iteration"""
    exit_signal: str = flag("SIGTERM", choices=EXIT_SIGNALS)
    """the signal --exit-signal-handler watches"""
    check_for_nan_in_loss_and_grad: bool = flag(True, action=argparse.BooleanOptionalAction)
    """stop the run, naming the iteration, when the loss or a gradient is NaN or Inf (on by
    default, as in Megatron-LM)"""

    def errors(self) -> List[ConfigError]:
        """This group's own checks, each naming its flag."""
        out = not_positive(self, "exit_interval", "exit_duration_in_mins")
        if self.exit_signal_handler and not hasattr(signal, self.exit_signal):
            out.append(ConfigError(f"--exit-signal {self.exit_signal} does not exist on this "
                                   "system"))
        return out
