"""The training script's entry: ``main()`` parses the command line, trains, and owns how a
job ends. A user's error (bad flags or data, ``errors.USER_ERRORS``) is one line from rank
0, once per job, without a traceback (exit 2); a rank whose peer stopped (and said why)
stops without a word (exit 1); the process groups are shut down either way, after a
barrier on success (gloo's threads left to interpreter teardown abort a finished run)."""

from __future__ import annotations

import sys
from typing import Callable, Optional, Sequence, TypeVar

from .assembly.initialize import shutdown_distributed
from .cli.arguments import parse_run_config
from .cli.user_errors import exit_with_user_error
from .errors import USER_ERRORS, peer_stopped
from .pretrain import pretrain

T = TypeVar("T")


def run_job(job: Callable[[], T]) -> T:
    """``job()``'s result, with the script's error reporting and shutdown around it."""
    try:
        result = job()
    except USER_ERRORS as e:  # bad input: say what to fix, once per job, no traceback
        shutdown_distributed(barrier=False)
        exit_with_user_error(e)
    except RuntimeError as e:  # another rank stopped (and said why): stop without a word
        if not peer_stopped(e):
            raise
        shutdown_distributed(barrier=False)
        sys.exit(1)
    shutdown_distributed()
    return result


def main(argv: Optional[Sequence[str]] = None) -> dict:
    """Train as the command line ``argv`` (default ``sys.argv[1:]``) says; returns the run's
    summary. A bad flag exits with one line naming it."""
    config = parse_run_config(argv)
    return run_job(lambda: pretrain(config))
