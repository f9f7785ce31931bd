"""Count what would stall the host on a GPU inside the model's forward and backward.

``HostSyncCounter`` sees every aten op (a ``TorchDispatchMode``, forward and backward) and
every tensor method call (a ``TorchFunctionMode``), and records those that read a device
value on the host or need one to size their output:

* ``aten._local_scalar_dense``: ``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``;
* ``Tensor.tolist`` / ``.numpy`` / ``.cpu``: on a CPU tensor they never reach aten (so the
  dispatch mode cannot see them), hence the function mode;
* ops whose output size depends on values: ``nonzero``, ``masked_select``, ``masked_scatter``
  (a CUDA size check), indexing or assigning through a boolean mask (not ``x[mask] =
  scalar``, which ATen runs as ``masked_fill``), ``repeat_interleave``
  with a tensor of repeats and no ``output_size``, ``unique``; and ``equal``.

On a machine with CUDA the counter also sets ``torch.cuda.set_sync_debug_mode("error")``
inside its scope, so any op that synchronises with the device raises there: the check a
GPU run adds to the count.

``count_model_host_syncs`` (a training-worker hook) switches the counter on exactly while
a model chunk's ``forward``, an encoder piece (``run_encoder_piece``) or Megatron-Core's
``backward_step`` runs: data loading, the host-side batch preparation, the loss
reduction and the optimizer step stay out of scope.
"""

from __future__ import annotations

import contextlib
import functools
import traceback

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode

ALWAYS = {"_local_scalar_dense", "nonzero", "masked_select", "masked_scatter", "equal",
          "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"}
HOST_COPIES = {"tolist", "numpy", "cpu"}


def _bool_index(indices) -> bool:
    return any(isinstance(i, torch.Tensor) and i.dtype in (torch.bool, torch.uint8)
               for i in (indices or ()))


def is_host_sync(func, args, kwargs) -> bool:
    name = func._schema.name.split("::")[-1]
    if name in ALWAYS:
        return True
    if name == "index":
        return _bool_index(args[1])
    if name in ("index_put", "index_put_"):
        indices, value = args[1], args[2]
        # ``x[mask] = python scalar`` runs as masked_fill (ATen's canDispatchToMaskedFill)
        scalar_fill = (len([i for i in indices if i is not None]) == 1 and value.dim() == 0
                       and value.device.type == "cpu")
        return _bool_index(indices) and not scalar_fill
    if name == "repeat_interleave" and func._overloadname.startswith("Tensor"):
        return kwargs.get("output_size") is None and not (len(args) > 3 and args[3] is not None)
    return False


def _where() -> str:
    """The innermost frame of the package (or of Megatron-Core) that asked for it."""
    summary = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
    stack = [f for f in reversed(summary) if not f.filename.endswith("host_syncs.py")
             and "/torch/" not in f.filename]
    frames = [f for f in stack if "megatron_mm" in f.filename or "megatron/core" in f.filename]
    f = (frames or stack)[-1]
    return f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.line}"


class _Ops(TorchDispatchMode):
    def __init__(self, found: list):
        super().__init__()
        self.found = found

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if is_host_sync(func, args, kwargs):
            self.found.append((str(func), _where()))
        return func(*args, **kwargs)


class _Methods(TorchFunctionMode):
    def __init__(self, found: list):
        super().__init__()
        self.found = found

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if getattr(func, "__name__", None) in HOST_COPIES:
            self.found.append((f"Tensor.{func.__name__}", _where()))
        return func(*args, **(kwargs or {}))


class HostSyncCounter:
    """Records ``(op, where)`` for every host sync while ``active()`` blocks run."""

    def __init__(self):
        self.found: list = []
        self.scopes = 0  # how many blocks ran under it

    @contextlib.contextmanager
    def active(self):
        self.scopes += 1
        # On a GPU, CUDA's own check too: any op that synchronises raises.
        cuda = torch.cuda.is_available()
        before = torch.cuda.get_sync_debug_mode() if cuda else None
        if cuda:
            torch.cuda.set_sync_debug_mode("error")
        try:
            with _Methods(self.found), _Ops(self.found):
                yield
        finally:
            if cuda:
                torch.cuda.set_sync_debug_mode(before)


def _counted(counter: HostSyncCounter, fn):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with counter.active():
            return fn(*args, **kwargs)
    return wrapped


def count_model_host_syncs(chunks, optimizer, holder):
    """Training-worker hook: count host syncs in the model's forward and backward; the
    result lands in ``holder["host_syncs"]`` (``{"found": [...], "scopes": n}``), and the
    media keys the chunks' forwards received in ``holder["media_seen"]``."""
    from megatron.core.pipeline_parallel import schedules

    from megatron_mm.models.multimodal import MultimodalModel
    from megatron_mm.runtime import executor

    counter = HostSyncCounter()
    media_seen = holder["media_seen"] = []  # media keys each chunk forward received

    def recorded(forward):
        @functools.wraps(forward)
        def wrapped(self, tokens, position_ids, media=None, *args, **kwargs):
            if sorted(media or {}) not in media_seen:
                media_seen.append(sorted(media or {}))
            return forward(self, tokens, position_ids, media, *args, **kwargs)
        return wrapped

    MultimodalModel.forward = _counted(counter, recorded(MultimodalModel.forward))
    MultimodalModel.run_encoder_piece = _counted(counter, MultimodalModel.run_encoder_piece)
    schedules.backward_step = _counted(counter, schedules.backward_step)
    executor.backward_step = _counted(counter, executor.backward_step)
    holder["host_syncs"] = counter.__dict__  # found (filled as it runs) and scopes


def count_during(fn):
    """``fn()`` under a fresh counter: (its result, the counter)."""
    counter = HostSyncCounter()
    with counter.active():
        result = fn()
    return result, counter
