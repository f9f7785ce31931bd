"""Which exceptions are the user's: caused by the flags or the data (or a run that
diverged). The entry points report them once, one line, without a traceback."""

from ..config import ConfigError
from ..data import DataRecordError
from ..models.multimodal import MediaMismatchError
from ..runtime.batch_broadcast import BatchBroadcastError
from .checkpoint.errors import CheckpointError
from .loop.nan_check import NonFiniteError

# Errors caused by the user's flags or data (and a run that diverged); scripts report them
# once, without a traceback.
USER_ERRORS = (ConfigError, DataRecordError, CheckpointError, MediaMismatchError,
               FileNotFoundError, NonFiniteError)

# What a collective raises on a rank whose peer has stopped: gloo's closed connection,
# NCCL's remote error. The peer that stopped says why (a user error's one line, or its
# own traceback); the ranks left waiting add nothing.
_PEER_STOPPED = ("Connection closed by peer", "Connection reset by peer", "ncclRemoteError",
                 "remote process exited")


def peer_stopped(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because another rank stopped (or the
    first TP rank failing to read the micro-batch it broadcasts: it says why)."""
    return isinstance(error, BatchBroadcastError) or (
        isinstance(error, RuntimeError) and any(s in str(error) for s in _PEER_STOPPED))
