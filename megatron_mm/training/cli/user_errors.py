"""A user's mistake is reported once per job: by global rank 0, one line, no usage dump.

No torch import: flags are checked before any process group exists, so the rank comes
from the launcher's environment (``RANK``, set by torchrun and Slurm launches).
"""

from __future__ import annotations

import argparse
import os
import sys
from typing import NoReturn

EXIT_CODE = 2  # argparse's status for a usage error


def job_rank() -> int:
    """This process's global rank as the launcher set it (0 for a plain ``python``)."""
    for name in ("RANK", "SLURM_PROCID"):
        if os.environ.get(name, "").isdigit():
            return int(os.environ[name])
    return 0


def original_message(message: str) -> str:
    """The error's own message out of torch's DataLoader wrapper ("Caught X in DataLoader
    worker process 0. Original Traceback ...", the worker's traceback as text, re-raised
    as X in the main process): its last line, after the exception's name."""
    if not message.startswith("Caught ") or "Original Traceback" not in message:
        return message
    last = message.rstrip().splitlines()[-1]
    return last.split(": ", 1)[1] if ": " in last else last


def report_user_error(message: str, prog: str = None, rank_local: bool = False) -> None:
    """Print ``prog: error: message`` on rank 0 only (every rank raises the same error on
    the same flags). ``rank_local``: an error only this rank can see (a record it alone
    reads) is printed by that rank, naming it."""
    prog = prog or os.path.basename(sys.argv[0])
    message = original_message(message)
    rank = job_rank()
    if rank == 0:
        print(f"{prog}: error: {message}", file=sys.stderr, flush=True)
    elif rank_local:
        print(f"{prog}: error (rank {rank}): {message}", file=sys.stderr, flush=True)


def exit_with_user_error(error: BaseException, prog: str = None) -> NoReturn:
    report_user_error(str(error), prog, rank_local=getattr(error, "rank_local", False))
    sys.exit(EXIT_CODE)


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose errors (an unknown flag, a bad choice) are one line on rank 0; the
    full usage is ``--help``'s job."""

    def error(self, message: str) -> NoReturn:
        report_user_error(f"{message} (see --help)", self.prog)
        sys.exit(EXIT_CODE)
