"""Give ``torch.cuda.current_stream`` a do-nothing stream without CUDA.

Hit by megatron-core 0.19.2 ``distributed/param_and_grad_buffer.py`` ``start_grad_sync``
(every DDP grad reduce) and ``finish_param_sync``: they only order streams, which CPU
execution does not have.
"""

import torch


class _NullStream:
    def wait_event(self, event):
        pass

    def wait_stream(self, stream):
        pass

    def record_event(self, event=None):
        return event

    def synchronize(self):
        pass


_STREAM = _NullStream()


def _current_stream(device=None):
    return _STREAM


def apply() -> None:
    torch.cuda.current_stream = _current_stream
