"""Workers: the package's training run with every forward-backward call going through
Megatron-LM's own ``get_forward_backward_func`` name (``megatron.training.training``),
rebound by ``megatron_lm.schedules.use_encoder_schedule``, and called with exactly the
keywords Megatron-LM's ``train_step`` / ``evaluate`` pass (0.19.2)."""

import functools

import torch

from train_workers import train


def _padded(batches, seq_length: int):
    """Each micro-batch right-padded to ``seq_length`` (no loss there, causal attention:
    the real tokens' outputs are the same), as Megatron-LM's fixed shapes want; the
    package pads each batch to its longest sample."""
    for batch in batches:
        extra = seq_length - batch["tokens"].shape[1]
        out = dict(batch)
        for key, value in (("tokens", 0), ("labels", 0), ("loss_mask", 0.0)):
            t = batch[key]
            out[key] = torch.cat([t, torch.full((t.shape[0], extra), value, dtype=t.dtype)], 1)
        b, n = batch["position_ids"].shape
        out["position_ids"] = torch.arange(seq_length).expand(b, -1).contiguous()
        yield out


def _same(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, torch.Tensor):
        return torch.equal(a, b)
    return a == b


class _AsMegatronLM:
    """Stands where the Trainer keeps its schedule executor: each call goes through the
    rebound name, as Megatron-LM's ``train_step`` (training) or ``evaluate`` (forward
    only) calls it. ``without_data``: this stage is handed ``None`` iterators (as
    Megatron-LM's middle stages are); its forward step reads its own copy of the data,
    as a Megatron-LM ``get_batch`` that needs none from the iterator would."""

    def __init__(self, executor, without_data: bool, log: dict):
        from megatron.core import parallel_state
        from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
        from megatron.core.process_groups_config import ProcessGroupCollection

        from megatron_mm.megatron_lm.schedules import use_encoder_schedule

        self.executor, self.without_data, self.log = executor, without_data, log
        self.hook = use_encoder_schedule(executor)
        self.pg_collection = ProcessGroupCollection.use_mpu_process_groups()
        self.pp_group = parallel_state.get_pipeline_model_parallel_group()
        self.P2PCommunicator = P2PCommunicator

    def __getattr__(self, name):  # the Trainer reads the executor's own attributes
        return getattr(self.executor, name)

    def __call__(self, *, forward_step_func, data_iterator, model, num_microbatches,
                 seq_length, micro_batch_size, forward_only=False, collect_non_loss_data=False):
        import megatron.training.training as training
        from megatron.core.utils import get_model_config

        data_iterator = _padded(data_iterator, seq_length)
        if forward_only:  # read once: the package's own call and the hooked one share them
            first = [next(data_iterator) for _ in range(num_microbatches)]
            data_iterator = iter(first)
        step = forward_step_func
        own = data_iterator
        if self.without_data:
            @functools.wraps(forward_step_func)  # keeps its marks (whole_sequence)
            def step(it, chunk):
                assert it is None, it
                return forward_step_func(own, chunk)
            data_iterator = None
        func = training.get_forward_backward_func(schedule_pg_collection=self.pg_collection)
        p2p = self.P2PCommunicator(self.pp_group, get_model_config(model[0]))
        common = dict(forward_step_func=step, data_iterator=data_iterator, model=model,
                      num_microbatches=num_microbatches, seq_length=seq_length,
                      micro_batch_size=micro_batch_size, decoder_seq_length=None,
                      pg_collection=self.pg_collection, p2p_communicator=p2p)
        if forward_only:  # evaluate(): and the package's own call must give the same
            ours = self.executor(forward_step_func=forward_step_func, data_iterator=iter(first),
                                 model=model, num_microbatches=num_microbatches,
                                 seq_length=seq_length, micro_batch_size=micro_batch_size,
                                 forward_only=True, collect_non_loss_data=collect_non_loss_data)
            out = func(**common, forward_only=True, adjust_tensor_shapes_fn=None,
                       **({"collect_non_loss_data": True} if collect_non_loss_data else {}))
            self.log["eval_calls"] = self.log.get("eval_calls", 0) + 1
            self.log["eval_same"] = self.log.get("eval_same", True) and len(ours) == len(out) \
                and all(_same(a, b) for a, b in zip(ours, out))
            return out
        self.log["train_calls"] = self.log.get("train_calls", 0) + 1
        return func(**common, forward_only=False, adjust_tensor_shapes_fn=None,
                    force_all_reduce=True)


def train_through_megatron_lm(rank: int, argv: list, grad_steps=(), without_data=()) -> dict:
    """``train_workers.train`` with the schedule executor called as Megatron-LM calls its
    schedule; ``without_data``: the pipeline ranks handed ``None`` iterators. Also: what
    ``finalize_model_grads`` was handed, and the refusals (``refusals``)."""
    import megatron_mm.training.loop.trainer as trainer_module
    from megatron.core import parallel_state

    log = {}
    real_build = trainer_module.build_executor

    def build_executor(*args, **kwargs):
        executor = real_build(*args, **kwargs)
        log["adapter"] = _AsMegatronLM(
            executor, parallel_state.get_pipeline_model_parallel_rank() in without_data, log)
        return log["adapter"]

    def spy_finalize(chunks, optimizer, holder):  # still Megatron-Core's, recording its call
        from megatron.core.utils import get_model_config
        log["chunks"] = chunks
        config = get_model_config(chunks[0])
        # Megatron-Core's fixed shapes (the batches are padded to --seq-length): the stage
        # without data sizes its messages from --seq-length / --micro-batch-size
        for chunk in chunks:
            get_model_config(chunk).variable_seq_lengths = False
        real = config.finalize_model_grads_func

        def finalize(*args, **kwargs):
            log["finalize"] = {k: (v is not None) if k == "pg_collection" else v
                               for k, v in kwargs.items()}
            return real(*args, **kwargs)
        config.finalize_model_grads_func = finalize

    trainer_module.build_executor = build_executor
    try:
        out = train(rank, argv, grad_steps, spy_finalize)
    finally:
        trainer_module.build_executor = real_build
    adapter = log.pop("adapter")
    out["refusals"] = _refusals(adapter, without_data)
    log.pop("chunks")
    out["hook"] = log
    adapter.hook.remove()
    import megatron.training.training as training
    from megatron.core.pipeline_parallel import get_forward_backward_func
    out["restored"] = training.get_forward_backward_func is get_forward_backward_func
    return out


def _refusals(adapter, without_data) -> dict:
    """Each refused keyword's error (every rank in step: the group creation is
    collective; the calls raise before any message)."""
    import megatron.training.training as training
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.process_groups_config import (MultiModuleProcessGroupCollection,
                                                     ProcessGroupCollection)

    from megatron_mm.megatron_lm.schedules import use_encoder_schedule

    from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator
    from megatron.core.utils import get_model_config

    func = training.get_forward_backward_func()
    model = adapter.log["chunks"]
    singles = [dist.new_group([r]) for r in range(dist.get_world_size())]
    mine = singles[dist.get_rank()]
    other = ProcessGroupCollection()
    other.pp = mine
    errors = {}

    def refused(name, call):
        try:
            call()
        except Exception as e:  # the one clear error
            errors[name] = f"{type(e).__name__}: {e}"
        else:
            errors[name] = None

    base = dict(forward_step_func=None, data_iterator=None, model=model, num_microbatches=4,
                seq_length=64, micro_batch_size=2)
    refused("decoder_seq_length", lambda: func(**base, decoder_seq_length=32))
    refused("adjust_tensor_shapes_fn", lambda: func(**base, adjust_tensor_shapes_fn=len))
    refused("pg_collection", lambda: func(**base, pg_collection=other))
    refused("p2p_communicator", lambda: func(**base, p2p_communicator=P2PCommunicator(
        mine, get_model_config(model[0]))))
    refused("multi_module", lambda: func(**base, pg_collection=MultiModuleProcessGroupCollection(
        {"llm": ProcessGroupCollection.use_mpu_process_groups()}, "llm")))
    refused("pp_size", lambda: training.get_forward_backward_func(pp_size=3))
    refused("twice", lambda: use_encoder_schedule(adapter.executor))
    if parallel_state.get_pipeline_model_parallel_rank() not in without_data:
        # a stage whose part of the plan reads media, handed no iterator: refused before
        # any message (no peer is called)
        refused("no_data", lambda: func(**base, forward_only=True))
    return errors


def pretrain_with_encoder_schedule(rank: int, steps: list) -> list:
    """``megatron_lm_runs.run_steps`` (the example script calls ``use_encoder_schedule()``
    around ``pretrain``); last: how many forward-backward calls Megatron-LM's loop made
    through the last run's hook, and on which executor."""
    from megatron_lm_runs import run_steps

    from megatron_mm.megatron_lm.schedules import EncoderSchedule

    hooks, install = [], EncoderSchedule.install

    def recorded(self):  # the example script's own use_encoder_schedule() hook, kept
        hooks.append(self)
        return install(self)

    EncoderSchedule.install = recorded
    try:
        out = run_steps(rank, steps)
    finally:
        EncoderSchedule.install = install
    hook = hooks[-1]
    return out + [{"calls": hook.calls, "executor": type(hook.executor).__name__}]
