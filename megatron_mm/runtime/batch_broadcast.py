"""Micro-batches read once per tensor-parallel group: the first TP rank reads and decodes,
the others receive the collated micro-batch by broadcast, as Megatron-LM's ``get_batch``
does (``get_batch_on_this_tp_rank``, Megatron-Core's ``tensor_parallel.broadcast_data``).

Megatron-Core's ``broadcast_data`` takes fixed keys of one dtype on CUDA and reads their
sizes back from the GPU; a multimodal micro-batch has per-batch shapes, several dtypes,
nested media and Python lists (answers, record ids). So each micro-batch travels as:

1. its sizes (int64: header bytes, host bytes, media bytes);
2. one uint8 buffer: the header (the batch with each tensor replaced by its dtype, shape
   and offset, pickled) and the bytes of every tensor the host reads (tokens, labels,
   masks, positions, lengths, the media's metadata: grids, frame counts);
3. one uint8 buffer of the media contents (pixels, mel frames: the media keyed by a
   modality name), on the TP group's device and left there.

1 and 2 travel over a gloo group of the same ranks (the TP group itself where it is
gloo): the receivers need those values on the host anyway (the layout is planned there,
``models/batch_layout.py``), so nothing is read back from a device: no host sync. 3 goes
over the TP group on its backend's device (NCCL: the current CUDA device); the receivers'
media contents are device tensors the forward step uses as they are.

A stage that reads no media contents (no encoder embeds its input there: the LLM's later
stages, an encoder's later pieces) is sent no 3: its contents are stand-ins of their
shape and dtype (a zero expanded: no memory), which is all the layout reads of them.

The TP ranks of a stage read their micro-batches at the same points of the same schedule,
so the broadcasts meet; a failure reading on the first rank reaches the others as an
error naming it, not a hang.
"""

from __future__ import annotations

import math
import pickle
from dataclasses import dataclass
from typing import Any, Callable, Collection, Dict, Iterator, List, Optional, Union

import torch
import torch.distributed as dist

from .collective_device import collective_device

ALIGN = 16  # bytes: every tensor starts aligned in its buffer (a dtype view needs it)
END, FAILED = -1, -2  # sizes[0] markers: the source iterator ended / raised


class BatchBroadcastError(RuntimeError):
    """Reading the micro-batch failed on the first tensor-parallel rank."""


@dataclass(frozen=True)
class _Slot:
    where: str  # "host", "device", or "shape" (a stand-in: contents not sent)
    dtype: torch.dtype
    shape: tuple
    offset: int = 0


def _aligned(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def _bytes(t: torch.Tensor) -> torch.Tensor:
    return t.detach().contiguous().reshape(-1).view(torch.uint8)


class _Packer:
    """The batch's skeleton and its tensors laid out in a host and a media buffer."""

    def __init__(self, contents: Collection[str], send_contents: bool):
        self.contents, self.send_contents = contents, send_contents
        self.parts: Dict[str, List] = {"host": [], "device": []}
        self.size = {"host": 0, "device": 0}

    def skeleton(self, value, path=()):
        if isinstance(value, torch.Tensor):
            content = len(path) == 2 and path[0] == "media" and path[1] in self.contents
            where = "host" if not content else "device" if self.send_contents else "shape"
            if where == "shape":
                return _Slot(where, value.dtype, tuple(value.shape))
            # the loader's collated batch is on the host: .cpu() copies nothing, syncs nothing
            offset, data = self.size[where], _bytes(value.cpu())
            self.parts[where].append((offset, data))
            self.size[where] = _aligned(offset + data.numel())
            return _Slot(where, value.dtype, tuple(value.shape), offset)
        if isinstance(value, dict):
            return {k: self.skeleton(v, path + (k,)) for k, v in value.items()}
        if type(value) in (list, tuple):
            return type(value)(self.skeleton(v, path + (i,)) for i, v in enumerate(value))
        return value

    def buffer(self, where: str, prefix: bytes = b"", pin: bool = False) -> torch.Tensor:
        start = _aligned(len(prefix))
        out = torch.empty(start + self.size[where], dtype=torch.uint8, pin_memory=pin)
        if prefix:
            out[:len(prefix)] = torch.frombuffer(bytearray(prefix), dtype=torch.uint8)
        for offset, data in self.parts[where]:
            out[start + offset:start + offset + data.numel()] = data
        return out


def _unpack(value, host: torch.Tensor, device: Optional[torch.Tensor]):
    if isinstance(value, _Slot):
        if value.where == "shape":
            return torch.zeros((), dtype=value.dtype).expand(value.shape)
        buf = host if value.where == "host" else device
        n = math.prod(value.shape) * value.dtype.itemsize
        return buf[value.offset:value.offset + n].view(value.dtype).view(value.shape)
    if isinstance(value, dict):
        return {k: _unpack(v, host, device) for k, v in value.items()}
    if type(value) in (list, tuple):
        return type(value)(_unpack(v, host, device) for v in value)
    return value


_HOST_GROUPS: Dict[tuple, Any] = {}  # ranks -> (the world it was made in, the gloo group)


def host_group_of(group):
    """A gloo group of ``group``'s ranks (``group`` itself where its collectives take CPU
    tensors): the host values travel there, no device round trip. Made once per world,
    by its members only."""
    if collective_device(group).type == "cpu":
        return group
    ranks = tuple(dist.get_process_group_ranks(group))
    world, made = _HOST_GROUPS.get(ranks, (None, None))
    if world is not dist.group.WORLD:
        made = dist.new_group(list(ranks), backend="gloo", use_local_synchronization=True)
        _HOST_GROUPS[ranks] = (dist.group.WORLD, made)
    return made


class BatchBroadcast:
    """The micro-batches of ``group``'s first rank, on every rank of ``group``: there it
    iterates ``source`` and broadcasts each; elsewhere ``source`` is None and each batch
    is received. ``contents``: the media keys whose values are contents (the modalities);
    ``send_contents``: whether this stage's ranks read them (else stand-ins)."""

    def __init__(self, source: Optional[Iterator], group, contents: Collection[str],
                 send_contents: bool = True):
        self.group, self.contents, self.send_contents = group, set(contents), send_contents
        self.src = dist.get_process_group_ranks(group)[0]
        self.is_source = dist.get_rank() == self.src
        if self.is_source == (source is None):
            raise ValueError("BatchBroadcast: the first rank of the group iterates its "
                             "source, the others receive (source None)")
        self.source = source
        self.host_group = host_group_of(group)
        self.device = collective_device(group)
        self.batches = 0  # micro-batches this rank read from its source (0 on receivers)

    def __iter__(self):
        return self

    def __getattr__(self, name):  # the source's own (an Energon loader's save_state)
        if name == "source" or self.__dict__.get("source") is None:
            raise AttributeError(name)
        return getattr(self.source, name)

    def __next__(self) -> dict:
        return self._send() if self.is_source else self._receive()

    # -- the first rank ----------------------------------------------------------------
    def _send(self) -> dict:
        try:
            batch = next(self.source)
        except StopIteration:
            self._sizes(END, 0, 0)
            raise
        except Exception as e:
            message = f"{type(e).__name__}: {e}".encode()
            self._sizes(FAILED, len(message), 0)
            dist.broadcast(torch.frombuffer(bytearray(message), dtype=torch.uint8),
                           self.src, group=self.host_group)
            raise
        self.batches += 1
        packer = _Packer(self.contents, self.send_contents)
        header = pickle.dumps(packer.skeleton(batch))
        host = packer.buffer("host", header)
        self._sizes(len(header), host.numel(), packer.size["device"])
        dist.broadcast(host, self.src, group=self.host_group)
        if packer.size["device"]:
            # from pinned memory: an asynchronous copy (no host sync)
            device = packer.buffer("device", pin=self.device.type == "cuda").to(
                self.device, non_blocking=True)
            dist.broadcast(device, self.src, group=self.group)
            if self.device.type != "cpu":  # this rank's contents: the copy already there
                moved = _unpack(pickle.loads(header), host[_aligned(len(header)):], device)
                batch = dict(batch, media={**batch["media"], **{
                    k: v for k, v in moved["media"].items() if k in self.contents}})
        return batch

    def _sizes(self, *sizes: int) -> torch.Tensor:
        out = torch.tensor(sizes, dtype=torch.int64)
        dist.broadcast(out, self.src, group=self.host_group)
        return out

    # -- the others --------------------------------------------------------------------
    def _receive(self) -> dict:
        header, host_bytes, device_bytes = self._sizes(0, 0, 0).tolist()  # a host tensor
        if header == END:
            raise StopIteration
        if header == FAILED:
            message = torch.empty(host_bytes, dtype=torch.uint8)
            dist.broadcast(message, self.src, group=self.host_group)
            raise BatchBroadcastError(
                f"tensor-parallel rank 0 (global rank {self.src}) failed reading the "
                f"micro-batch: {bytes(message.tolist()).decode()}")
        host = torch.empty(host_bytes, dtype=torch.uint8,
                           pin_memory=self.device.type == "cuda")
        dist.broadcast(host, self.src, group=self.host_group)
        device = None
        if device_bytes:
            device = torch.empty(device_bytes, dtype=torch.uint8, device=self.device)
            dist.broadcast(device, self.src, group=self.group)
        skeleton = pickle.loads(host[:header].numpy().tobytes())
        return _unpack(skeleton, host[_aligned(header):], device)


Iterators = Union[Iterator, List[Iterator]]


def read_on_first_tp_rank(make: Callable[[], Iterators], group, copies: Optional[int],
                          contents: Collection[str], send_contents: bool) -> Iterators:
    """``make()``'s iterator (``copies``: a list of that many, one per model chunk) on
    ``group``'s first rank, broadcast to the others, which never call ``make`` (no loader,
    no workers decoding there)."""
    source = make() if dist.get_rank() == dist.get_process_group_ranks(group)[0] else None
    if copies is None:
        return BatchBroadcast(source, group, contents, send_contents)
    sources = source if source is not None else [None] * copies
    if len(sources) != copies:
        raise ValueError(f"read_on_first_tp_rank: {len(sources)} iterators, {copies} expected")
    return [BatchBroadcast(s, group, contents, send_contents) for s in sources]
