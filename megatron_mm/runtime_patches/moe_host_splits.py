"""Run Megatron-Core's all-to-all token dispatcher without CUDA.

megatron-core 0.19.2 ``MoEAlltoAllTokenDispatcher``:

- ``__init__`` creates the class-wide ``MoEAlltoAllTokenDispatcher.cuda_dtoh_stream`` with
  ``torch.cuda.Stream()`` (which needs CUDA) when it is None, and
  ``_maybe_dtoh_and_synchronize`` copies the split sizes to the host on it, records an
  event and later waits on it. CPU tensors need none
  of it: it is preset to a stream whose methods do nothing and whose event is complete.
- ``_maybe_dtoh_and_synchronize`` turns the split sizes into numpy arrays through
  ``moe_utils.maybe_move_tensor_to_cpu(..., as_numpy=True)``, which converts CUDA tensors
  only; a CPU tensor reaches ``torch.distributed.all_to_all_single`` as a tensor, which
  its ``output_split_sizes`` refuses (TypeError). Ours converts host tensors too.
"""

import torch


class _DoneEvent:
    def synchronize(self):
        pass

    def query(self):
        return True


class _HostStream:
    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event if event is not None else _DoneEvent()

    def synchronize(self):
        pass


def apply() -> None:
    from megatron.core.transformer.moe import moe_utils, token_dispatcher

    upstream = moe_utils.maybe_move_tensor_to_cpu

    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return upstream(tensor, as_numpy=as_numpy, record_stream=record_stream)

    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu
    token_dispatcher.MoEAlltoAllTokenDispatcher.cuda_dtoh_stream = _HostStream()
