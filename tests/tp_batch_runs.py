"""Workers for the micro-batches read on the first tensor-parallel rank and broadcast
(``runtime/batch_broadcast.py``): the broadcast on its own over two ranks, and training
runs (Megatron-LM's loop and the package's) on the new path or the old one (every rank
reads its own copy), counting the samples each rank decodes."""

from __future__ import annotations

import contextlib

import torch

# -- the broadcast on its own ----------------------------------------------------------


def sample_batches():
    """Micro-batches of every shape the loaders give (the same on every rank: what each
    would read itself): padded with M-RoPE positions, images with grids and an empty
    audio, bf16 and bool tensors; packed (cu_seqlens); one without media."""
    g = torch.Generator().manual_seed(7)
    padded = {
        "tokens": torch.randint(0, 100, (2, 11), generator=g),
        "labels": torch.randint(0, 100, (2, 11), generator=g),
        "loss_mask": torch.rand(2, 11, generator=g),
        "position_ids": torch.randint(0, 11, (3, 2, 11), generator=g),
        "media": {"image": torch.randn(5, 3, 4, 4, generator=g),
                  "image_grid_thw": torch.tensor([[1, 2, 2], [1, 1, 3]]),
                  "audio": torch.empty(0, 8, 6), "audio_frames": torch.empty(0, dtype=torch.long)},
        "prompt_lens": [3, 4], "answers": ["seven", "a longer answer ü"],
        "record_ids": ["a.jsonl:1", "a.jsonl:2"], "seq_lengths": torch.tensor([11, 9]),
        "extra": [torch.randn(3, generator=g).to(torch.bfloat16), torch.tensor([True, False])],
    }
    packed = {"tokens": torch.randint(0, 100, (1, 21), generator=g),
              "labels": torch.randint(0, 100, (1, 21), generator=g),
              "loss_mask": torch.ones(1, 21), "position_ids": torch.arange(21)[None],
              "cu_seqlens": torch.tensor([0, 9, 21], dtype=torch.int32),
              "media": {"image": torch.randn(1, 3, 4, 4, generator=g)},
              "prompt_lens": [2, 5], "answers": ["x", "y"], "record_ids": ["1", "2"]}
    text = {"tokens": torch.arange(6)[None], "media": {}, "answers": ["z"]}
    return [padded, packed, text]


def _compare(got, want, contents=(), stand_ins=False, device=None, path="batch"):
    """Differences of ``got`` from ``want`` (tensors by value, dtype and shape)."""
    if isinstance(want, dict):
        if set(got) != set(want):
            return [f"{path}: keys {sorted(got)} != {sorted(want)}"]
        return [d for k in want for d in _compare(got[k], want[k], contents, stand_ins,
                                                  device, f"{path}[{k!r}]")]
    if isinstance(want, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in want):
        return [d for i, (a, b) in enumerate(zip(got, want, strict=True))
                for d in _compare(a, b, contents, stand_ins, device, f"{path}[{i}]")]
    if isinstance(want, torch.Tensor):
        content = any(path.endswith(f"[{k!r}]") and "['media']" in path for k in contents)
        if got.dtype != want.dtype or got.shape != want.shape:
            return [f"{path}: {got.dtype} {tuple(got.shape)} != {want.dtype} "
                    f"{tuple(want.shape)}"]
        if content and stand_ins:
            return [] if got.untyped_storage().nbytes() <= got.element_size() else [
                f"{path}: a stand-in holds {got.untyped_storage().nbytes()} bytes"]
        where = device if content and device is not None else torch.device("cpu")
        if got.device.type != where.type:
            return [f"{path}: on {got.device}, expected {where}"]
        return [] if torch.equal(got.cpu(), want) else [f"{path}: values differ"]
    return [] if got == want else [f"{path}: {got!r} != {want!r}"]


def _failing():
    yield sample_batches()[0]
    raise ValueError("record 17 of a.jsonl: image not found")


@contextlib.contextmanager
def nccl_like(group, device):
    """``group`` as an NCCL group whose tensors live on ``device`` (not the CPU): its
    collectives refuse host tensors, as NCCL does, and run over gloo on a host copy; the
    gloo group the broadcast makes for host values takes host tensors only."""
    import torch.distributed as dist

    from megatron_mm.runtime import batch_broadcast

    real_broadcast, real_device = dist.broadcast, batch_broadcast.collective_device
    seen = {"device": 0, "host": 0}

    def broadcast(tensor, src, group=None, **kw):
        if group is nccl_group:
            assert tensor.device.type == device.type, f"a {tensor.device} tensor on NCCL"
            seen["device"] += 1
            host = tensor.cpu()
            out = real_broadcast(host, src, group=group, **kw)
            tensor.copy_(host.to(device))
            return out
        assert tensor.device.type == "cpu", f"a {tensor.device} tensor on a gloo group"
        seen["host"] += 1
        return real_broadcast(tensor, src, group=group, **kw)

    nccl_group = group
    dist.broadcast = broadcast
    batch_broadcast.collective_device = lambda g=None: (device if g is nccl_group
                                                        else real_device(g))
    try:
        yield seen
    finally:
        dist.broadcast, batch_broadcast.collective_device = real_broadcast, real_device


def broadcast_cases(rank: int) -> dict:
    """Rank 0 reads, rank 1 receives: per case the differences from what rank 1 would
    have read itself (none expected), and how each case ended."""
    import torch.distributed as dist

    from megatron_mm.runtime.batch_broadcast import BatchBroadcastError, read_on_first_tp_rank

    dist.init_process_group("gloo")
    group, contents = dist.group.WORLD, {"image", "audio"}
    want = sample_batches()
    out = {}

    def run(name, send_contents=True, device=None, make=lambda: iter(sample_batches())):
        calls = []

        def counted():
            calls.append(1)
            return make()

        it = read_on_first_tp_rank(counted, group, None, contents, send_contents)
        got, ended = [], None
        try:
            for _ in range(len(want) + 1):
                got.append(next(it))
        except StopIteration:
            ended = "stop"
        except (ValueError, BatchBroadcastError) as e:
            ended = f"{type(e).__name__}: {e}"
        diffs = [d for a, b in zip(got, want) for d in _compare(
            a, b, contents, stand_ins=not send_contents and rank == 1, device=device)]
        out[name] = {"diffs": diffs, "read": len(got), "ended": ended, "made": len(calls),
                     "batches": it.batches}

    run("contents")

    class Loader:  # an Energon loader's iterator: its state goes into checkpoints
        def __iter__(self):
            return self

        def __next__(self):
            raise StopIteration

        def save_state(self):
            return {"rank": rank}

    from megatron_mm.data.loaders import savable

    it = read_on_first_tp_rank(lambda: [Loader(), Loader()], group, 2, contents, True)
    saved = savable(it)
    out["savable"] = None if saved is None else saved.save_state()
    for copy in it:
        assert next(copy, "end") == "end"
    run("shapes_only", send_contents=False)
    run("failure", make=_failing)
    import torch._lazy
    import torch._lazy.ts_backend

    torch._lazy.ts_backend.init()
    with nccl_like(group, torch.device("lazy")) as seen:
        run("nccl_like", device=torch.device("lazy"))
    out["nccl_like"]["collectives"] = seen
    return out


# -- training runs, new path and old -----------------------------------------------------


@contextlib.contextmanager
def counting_decodes(old_path: bool):
    """Count the samples this rank encodes (each one's media decoded); ``old_path``: every
    rank reads its own copy, as before the broadcast."""
    from megatron_mm.data.dataset import MultimodalDataset
    from megatron_mm.megatron_lm import datasets
    from megatron_mm.training.loop import trainer

    count = {"decoded": 0}
    encode = MultimodalDataset.encode

    def counted(self, idx):
        count["decoded"] += 1
        return encode(self, idx)

    own = lambda config, plan, make, copies=None: make()  # noqa: E731
    saved = datasets.tensor_parallel_batches, trainer.tensor_parallel_batches
    MultimodalDataset.encode = counted
    if old_path:
        datasets.tensor_parallel_batches = trainer.tensor_parallel_batches = own
    try:
        yield count
    finally:
        MultimodalDataset.encode = encode
        datasets.tensor_parallel_batches, trainer.tensor_parallel_batches = saved


def counted_steps(rank: int, steps: list) -> list:
    """``(kind, argv, old_path)`` runs (``megatron_lm_runs.run_steps``' kinds), each with
    this rank's decoded sample count."""
    from megatron_lm_runs import run_steps

    results = []
    for kind, argv, old_path in steps:
        with counting_decodes(old_path) as count:
            result = run_steps(rank, [(kind, argv)])[0]
        result["decoded"] = count["decoded"]
        results.append(result)
    return results
