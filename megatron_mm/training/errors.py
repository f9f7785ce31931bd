"""Which exceptions are the user's: caused by the flags or the data (or a run that
diverged). The entry points report them once, one line, without a traceback."""

from ..config import ConfigError
from ..data import DataRecordError
from ..models.multimodal import MediaMismatchError
from .checkpointing import CheckpointError
from .nan_check import NonFiniteError

# Errors caused by the user's flags or data (and a run that diverged); scripts report them
# once, without a traceback.
USER_ERRORS = (ConfigError, DataRecordError, CheckpointError, MediaMismatchError,
               FileNotFoundError, NonFiniteError)
