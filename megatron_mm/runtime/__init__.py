"""Executing plans: the schedule executor and the messages between pipeline ranks."""

from megatron_mm.startup import require_prepared

require_prepared(__name__)  # the CPU patches go in before the megatron.core imports below

from .executor import ScheduleExecutor  # noqa: E402

__all__ = ["ScheduleExecutor"]
