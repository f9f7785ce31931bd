"""Count what would stall the host on a GPU in a training step's schedule.

``HostSyncCounter`` sees every aten op (a ``TorchDispatchMode``, forward and backward) and
every torch call (a ``TorchFunctionMode``), and records those that read a device value on
the host, need one to size their output, or copy host memory to the device blocking:

* ``aten._local_scalar_dense``: ``.item()``, ``int(t)``, ``float(t)``, ``bool(t)``;
* ``Tensor.tolist`` / ``.numpy`` / ``.cpu``: on a CPU tensor they never reach aten (so the
  dispatch mode cannot see them), hence the function mode;
* ops whose output size depends on values: ``nonzero``, ``masked_select``, ``masked_scatter``
  (a CUDA size check), indexing or assigning through a boolean mask (not ``x[mask] =
  scalar``, which ATen runs as ``masked_fill``), ``repeat_interleave``
  with a tensor of repeats and no ``output_size``, ``unique``; and ``equal``;
* a host tensor copied to a device without ``non_blocking=True`` (``.to(device)``,
  ``.cuda()``) and host data made on a device (``torch.tensor(data, device=...)``): on
  CUDA such a copy synchronises the stream (torch's ``copy_`` ends in
  ``memcpy_and_sync``).

On a CPU machine host and device are one memory, so the counter tells them apart by where
a tensor comes from: host tensors are the micro-batches the data loader hands out, what
``torch.from_numpy`` / ``torch.tensor`` / a factory without ``device=`` makes, and what
ops on host tensors only compute; everything else (parameters, activations, gradients)
is on the device. A copy to the device is the same object on a CPU machine: a host
tensor once copied (and what is computed from it) counts as on the device too, so only a
copy of a host tensor never sent before is taken for a host-to-device copy. On a machine
with CUDA the tensors' own devices decide, and the counter also sets
``torch.cuda.set_sync_debug_mode("warn")`` inside its scope and records each warning
(CUDA's own word that an op synchronised: device-to-host copies, blocking copies, syncs
inside Megatron-Core or TE kernels) where it was raised, as it records the rest.

``count_model_host_syncs`` (a training-worker hook) switches the counter on while a model
chunk's ``forward``, an encoder piece (``run_encoder_piece``) or Megatron-Core's
``backward_step`` runs: there any read counts, host tensor or not (the model takes what
it needs from values through its ``BatchLayout``). ``count_step_host_syncs`` adds the
host work around them, per action of the schedule: the forward step (the batch, its mask
and layout made on the host and copied to the device), Megatron-Core's ``forward_step``
(the loss, the token count) and the executor's handling of each action (``run_F`` ...
``run_EB``, the token count it accumulates). There reading a host tensor is free
(``host_work=True``): only reads of device values and blocking copies count.
"""

from __future__ import annotations

import contextlib
import functools
import os
import traceback
import warnings
import weakref

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

ALWAYS = {"_local_scalar_dense", "nonzero", "masked_select", "masked_scatter", "equal",
          "_unique", "_unique2", "unique_dim", "unique_consecutive", "unique_dim_consecutive"}
HOST_COPIES = {"tolist", "numpy", "cpu"}
DEVICE_COPIES = {"to", "cuda"}  # Tensor methods that copy to a device
FROM_HOST_DATA = {"tensor", "as_tensor"}  # torch factories from Python / numpy data
FACTORIES = FROM_HOST_DATA | {"arange", "zeros", "ones", "empty", "full", "eye", "linspace"}


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


def _tensors(value):
    """The tensors in a (nested) argument or result."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)


def _target_device(args, kwargs):
    """The device a ``Tensor.to`` / ``.cuda`` call names (None: ``.to(dtype)``)."""
    if kwargs.get("device") is not None:
        return torch.device(kwargs["device"])
    for a in args[1:]:
        if isinstance(a, torch.Tensor):
            return a.device
        if isinstance(a, (torch.device, str)) or (isinstance(a, int)
                                                   and not isinstance(a, bool)):
            return torch.device(a)
    return None


def _storage(t: torch.Tensor):
    return t.untyped_storage().data_ptr() if t.layout == torch.strided else id(t)


_TORCH_DIR = os.path.dirname(torch.__file__) + os.sep


def _where() -> str:
    """The innermost frame of the package (or of Megatron-Core) that asked for it."""
    summary = traceback.StackSummary.extract(traceback.walk_stack(None), lookup_lines=False)
    # torch's own frames by its folder: a site-packages under /opt/torch/ holds Megatron-Core
    stack = [f for f in reversed(summary) if not f.filename.endswith("host_syncs.py")
             and not f.filename.startswith(_TORCH_DIR)]
    frames = [f for f in stack if "megatron_mm" in f.filename or "megatron/core" in f.filename]
    f = (frames or stack)[-1]
    return f"{'/'.join(f.filename.split('/')[-2:])}:{f.lineno} {f.line}"


@contextlib.contextmanager
def _outside_modes():
    """No dispatch or function mode of this thread's stacks while inside."""
    from torch.overrides import _get_current_function_mode_stack, _pop_mode, _push_mode

    stack = _get_current_function_mode_stack()
    for _ in stack:
        _pop_mode()
    try:
        with _disable_current_modes():
            yield
    finally:
        for mode in stack:
            _push_mode(mode)


def _compiled_frames() -> int:
    """Frames ``torch.compile`` has compiled in this process so far."""
    from torch._dynamo.utils import counters

    return counters["frames"]["total"]


class _Ops(TorchDispatchMode):
    def __init__(self, counter: "HostSyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.counter
        if c.paused:
            return func(*args, **kwargs)
        # On CUDA a read of a CPU tensor syncs nothing (Megatron-Core's RNG tracker compares
        # CPU RNG states with .item() in every fork): CUDA's own warnings catch real syncs.
        if is_host_sync(func, args, kwargs) and not (
                (c.host_work or torch.cuda.is_available())
                and all(c.on_host(t) for t in _tensors(args))):
            c.found.append((str(func), _where()))
        out = func(*args, **kwargs)
        inputs = {_storage(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):  # new memory (not an in-place result or a view)
            if _storage(t) not in inputs:
                c.stats["largest"] = max(c.stats["largest"], t.numel())
        return out


class _Methods(TorchFunctionMode):
    def __init__(self, counter: "HostSyncCounter"):
        super().__init__()
        self.counter = counter

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        c = self.counter
        if c.paused:
            return func(*args, **kwargs)
        name = getattr(func, "__name__", None)
        if c.blocking_device_copy(name, args, kwargs):
            c.found.append((f"blocking copy to a device ({name})", _where()))
        elif name in HOST_COPIES and not ((c.host_work or torch.cuda.is_available())
                                          and c.on_host(args[0])):
            c.found.append((f"Tensor.{name}", _where()))
        result = func(*args, **kwargs)
        c.track(name, args, kwargs, result)
        return result


class HostSyncCounter:
    """Records ``(op, where)`` for every host sync while ``active()`` blocks run;
    ``active(host_work=True)`` blocks do host-side work, where reading a host tensor is
    free; ``pause()`` blocks count nothing. Blocks nest: the innermost decides. It also
    keeps the size of the largest tensor the counted ops allocated (``largest``)."""

    def __init__(self):
        # what a training worker hands back: found, how many model / host-work blocks
        # ran, the largest new tensor (elements)
        self.stats = {"found": [], "scopes": 0, "host_scopes": 0, "largest": 0,
                      "compiles": 0}
        self.found: list = self.stats["found"]
        # the open blocks, innermost last: False model, True host work, None paused
        self._kinds: list = []
        # CPU machine: id -> weakref of the host tensors seen, and of those copied to the
        # device (on a CPU machine the copy is the host tensor itself)
        self._host: dict = {}
        self._sent: dict = {}

    @property
    def host_work(self) -> bool:
        return bool(self._kinds) and self._kinds[-1] is True

    @property
    def paused(self) -> bool:
        return bool(self._kinds) and self._kinds[-1] is None

    # -- where tensors live ---------------------------------------------------------
    @staticmethod
    def _is(marks: dict, t: torch.Tensor) -> bool:
        ref = marks.get(id(t))
        return ref is not None and ref() is t

    @staticmethod
    def _mark(marks: dict, value) -> None:
        for t in _tensors(value):
            marks[id(t)] = weakref.ref(t)

    def on_host(self, t: torch.Tensor) -> bool:
        if torch.cuda.is_available():
            return t.device.type == "cpu"
        return self._is(self._host, t)

    def host_only(self, t: torch.Tensor) -> bool:
        """On the host and never copied to the device (on CUDA: a CPU tensor)."""
        return self.on_host(t) and (torch.cuda.is_available() or not self._is(self._sent, t))

    def mark_host(self, value) -> None:
        """The tensors in ``value`` live in host memory (a loader's batch, say)."""
        self._mark(self._host, value)

    def track(self, name, args, kwargs, result) -> None:
        """Mark ``result`` host when a factory made it without a device, or ops computed
        it from host tensors only (sent, when one of those was); a copy to a device
        is on the device."""
        if not isinstance(result, (torch.Tensor, tuple, list)) or torch.cuda.is_available():
            return
        if name in DEVICE_COPIES and (name == "cuda" or _target_device(args, kwargs)):
            self._mark(self._sent, result)
            return
        inputs = list(_tensors(args)) + list(_tensors(kwargs))
        if name in FACTORIES:
            if kwargs.get("device") is None:
                self.mark_host(result)
        elif inputs and all(self.on_host(t) for t in inputs):
            self.mark_host(result)
            if any(self._is(self._sent, t) for t in inputs):
                self._mark(self._sent, result)

    def blocking_device_copy(self, name, args, kwargs) -> bool:
        """A host tensor (or host data) copied to a device without ``non_blocking``."""
        if name in FROM_HOST_DATA:
            device = kwargs.get("device")
            return (device is not None and not isinstance(args[0], torch.Tensor)
                    and not (torch.cuda.is_available() and torch.device(device).type == "cpu"))
        if name not in DEVICE_COPIES or not args or not isinstance(args[0], torch.Tensor):
            return False
        target = torch.device("cuda") if name == "cuda" else _target_device(args, kwargs)
        if target is None or not self.host_only(args[0]):
            return False
        if torch.cuda.is_available() and target.type == "cpu":
            return False  # host to host
        return not (kwargs.get("non_blocking") or any(a is True for a in args[1:]))

    # -- scopes ---------------------------------------------------------------------
    @contextlib.contextmanager
    def pause(self):
        """Nothing counts inside (work measured elsewhere)."""
        self._kinds.append(None)
        try:
            yield
        finally:
            self._kinds.pop()

    @contextlib.contextmanager
    def active(self, host_work: bool = False):
        self.stats["host_scopes" if host_work else "scopes"] += 1
        outermost = not self._kinds
        self._kinds.append(host_work)
        with contextlib.ExitStack() as stack:
            if outermost:
                if torch.cuda.is_available():  # CUDA's own check: every sync warns
                    before = torch.cuda.get_sync_debug_mode()
                    torch.cuda.set_sync_debug_mode("warn")
                    stack.callback(torch.cuda.set_sync_debug_mode, before)
                    stack.enter_context(warnings.catch_warnings())
                    warnings.simplefilter("always")
                    warnings.showwarning = self._cuda_sync(warnings.showwarning)
                # torch.from_numpy is no torch function the mode sees: its tensors are host
                from_numpy = torch.from_numpy
                torch.from_numpy = self._from_numpy(from_numpy)
                stack.callback(setattr, torch, "from_numpy", from_numpy)
                stack.enter_context(_Methods(self))
                stack.enter_context(_Ops(self))
            try:
                yield
            finally:
                self._kinds.pop()

    def fused(self, fn):
        """``fn`` (a compiled kernel: FlexAttention's) run outside the counter's modes, as
        in training: ``torch.compile`` refuses to trace under its dispatch mode (torch 2.11
        on CUDA raised for the flex_attention operator, 2.13 for its eager wrapper's
        graph), and recompiles on every call under a fresh function mode (each step's).
        CUDA's own sync warnings still see it. A call that compiles (``stats["compiles"]``)
        keeps none of them: compiling syncs once, in the first step, not in every step."""
        @functools.wraps(fn)
        def wrapped(*args, **kwargs):
            compiles, seen = _compiled_frames(), len(self.found)
            with _outside_modes():
                out = fn(*args, **kwargs)
            if _compiled_frames() != compiles:
                del self.found[seen:]
                self.stats["compiles"] += 1
            return out
        return wrapped

    def _cuda_sync(self, show):
        """``warnings.showwarning`` that records CUDA's sync warnings where they happen."""
        def showwarning(message, category, filename, lineno, file=None, line=None):
            if "synchronizing CUDA operation" not in str(message):
                return show(message, category, filename, lineno, file, line)
            if not self.paused:
                self.found.append(("CUDA sync", _where()))
        return showwarning

    def _from_numpy(self, from_numpy):
        @functools.wraps(from_numpy)
        def wrapped(array):
            t = from_numpy(array)
            self.mark_host(t)
            return t
        return wrapped


def _counted(counter: HostSyncCounter, fn, host_work: bool = False):
    @functools.wraps(fn)
    def wrapped(*args, **kwargs):
        with counter.active(host_work):
            return fn(*args, **kwargs)
    return wrapped


def count_model_host_syncs(chunks, optimizer, holder):
    """Training-worker hook: count host syncs in the model's forward and backward; the
    result lands in ``holder["host_syncs"]`` (``{"found": [...], "scopes": n, ...}``), and
    the media keys the chunks' forwards received in ``holder["media_seen"]``."""
    from megatron.core.pipeline_parallel import schedules

    from megatron_mm.models import flex_attention
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

    flex_attention._compiled = counter.fused(flex_attention._compiled)
    MultimodalModel.forward = _counted(counter, recorded(MultimodalModel.forward))
    MultimodalModel.run_encoder_piece = _counted(counter, MultimodalModel.run_encoder_piece)
    schedules.backward_step = _counted(counter, schedules.backward_step)
    executor.backward_step = _counted(counter, executor.backward_step)
    holder["host_syncs"] = counter.stats  # filled as it runs
    return counter


def count_step_host_syncs(chunks, optimizer, holder):
    """``count_model_host_syncs``, plus the host work of each action of the schedule: the
    forward step (``training/step.py``: the batch, its mask and layout to the device),
    Megatron-Core's ``forward_step`` (loss, token count) and each executor action
    (``runtime/executor.py``: the token count it accumulates)."""
    from megatron.core.pipeline_parallel import schedules

    from megatron_mm.runtime import executor
    from megatron_mm.training.loop import step

    counter = count_model_host_syncs(chunks, optimizer, holder)
    prepare_batch = step.prepare_batch

    @functools.wraps(prepare_batch)
    def loader_batch(batch, *args, **kwargs):
        counter.mark_host(batch)  # as the data loader hands it out
        return prepare_batch(batch, *args, **kwargs)
    step.prepare_batch = loader_batch
    step.forward_step = _counted(counter, step.forward_step, host_work=True)
    schedules.forward_step = _counted(counter, schedules.forward_step, host_work=True)
    for kind in ("F", "B", "EF", "EB"):
        run = getattr(executor._Iteration, "run_" + kind)

        def action(self, *args, _run=run, **kwargs):
            counter.mark_host(self.batches)  # the iteration's micro-batches, from the loader
            with counter.active(host_work=True):
                return _run(self, *args, **kwargs)
        setattr(executor._Iteration, "run_" + kind, functools.wraps(run)(action))


def count_during(fn, host_work: bool = False, host=()):
    """``fn()`` under a fresh counter (``host``: tensors living in host memory): (its
    result, the counter)."""
    counter = HostSyncCounter()
    counter.mark_host(list(host))
    with counter.active(host_work):
        result = fn()
    return result, counter
