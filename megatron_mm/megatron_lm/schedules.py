"""The encoder schedules as Megatron-LM's ``forward_backward_func``.

Megatron-LM's ``train()`` and ``evaluate()`` (``megatron/training/training.py``) each take
their schedule from ``get_forward_backward_func(schedule_pg_collection=...)``, a name the
module imports from ``megatron.core.pipeline_parallel``, and hand it to ``train_step`` /
call it with Megatron-Core's whole forward-backward signature. ``use_encoder_schedule``
rebinds that name in ``megatron.training.training`` (nowhere else: Megatron-Core's own
callers keep theirs), so both run the package's schedule executor (``--encoder-schedule
coarse | bubble``: the encoders as their own pipelines, their work in the LLM's bubbles)
on the model chunks Megatron-LM built, with every keyword honoured or refused
(``runtime/schedule_call.py``) and ``None`` data iterators on the stages that read no data
(``runtime/microbatches.py``)::

    from megatron_mm.megatron_lm.schedules import use_encoder_schedule

    use_encoder_schedule()  # the package's flags say which (--encoder-schedule)
    pretrain(...)

With no argument the schedule is the run's own (``megatron_lm.run_context``: the
package's flags on Megatron-LM's parser, the plan the model provider built the chunks
by): ``--encoder-schedule coarse | bubble`` (or ``auto``'s pick of them) runs the
executor, ``megatron`` keeps Megatron-Core's function. A script with its own plan hands
in an executor, or a function of the model chunks that builds one::

    use_encoder_schedule(lambda model: executor_for(plan, problem, model, "bubble"))

The executor is built at the first call, from the model chunks it is called with (the
plan's placements are what the model provider built them by). Megatron-Core's contract
holds: without ``variable_seq_lengths`` in the model's config every micro-batch is
[``--micro-batch-size``, ``--seq-length``] tokens (the messages' shape on stages without
data), checked where read; with it (the package's provider sets it: each micro-batch is
padded to its own longest sample) every stage sizes its messages from its own copy of the
micro-batch, so a stage without data is refused. The separate placement
(encoder ranks of their own) needs a world Megatron-LM's ``initialize_model_parallel``
does not build: ``separate_run`` runs it, not this hook.
"""

from __future__ import annotations

from typing import Callable, List, Optional, Union

from megatron.core import parallel_state

from ..runtime import ScheduleExecutor
from ..runtime.schedule_call import ScheduleCallError

ExecutorSource = Union[ScheduleExecutor, Callable[[List], ScheduleExecutor]]


def run_executor(model: List) -> Optional[ScheduleExecutor]:
    """The run's own schedule executor (``use_encoder_schedule()``): None where the run
    keeps Megatron-Core's schedules (``--encoder-schedule megatron``)."""
    from ..training.loop.encoder_executor import build_executor
    from .context import run_context

    run = run_context()
    if run.plan.separate is not None:
        raise ScheduleCallError(
            "--encoder-schedule separate puts the encoders on ranks of their own, a world "
            "Megatron-LM's initialize_model_parallel does not build: run it with "
            "examples/pretrain_mllm.py")
    if run.plan.encoder_plan is None:
        return None
    if run.config.encoder_replicas > 1:
        raise ScheduleCallError(
            "--encoder-tensor-model-parallel-size below --tensor-model-parallel-size needs "
            "the encoder replicas' process groups, which Megatron-LM's initialize does not "
            "build: leave it unset under Megatron-LM's pretrain")
    return build_executor(run.config, run.plan.encoder_plan, run.plan.chain, None,
                          run.attention)


class EncoderSchedule:
    """The hook ``use_encoder_schedule`` installs (``remove`` undoes it; a context
    manager too)."""

    def __init__(self, source: Optional[ExecutorSource] = None):
        self._source = source if source is not None else run_executor
        self._built = False
        self.calls = 0  # forward-backward calls run by the executor
        self.executor: Optional[ScheduleExecutor] = (
            source if isinstance(source, ScheduleExecutor) else None)
        self._original = None
        self._original_evaluate = None

    # -- what Megatron-LM calls --------------------------------------------------------
    def get_forward_backward_func(self, pp_size: Optional[int] = None,
                                  vp_size: Optional[int] = None,
                                  schedule_pg_collection=None):
        """Megatron-Core's ``get_forward_backward_func`` signature: the sizes, when given,
        must be the pipeline's; a MIMO grid collection is refused."""
        if schedule_pg_collection is not None:
            from megatron.core.process_groups_config import MultiModuleProcessGroupCollection
            if isinstance(schedule_pg_collection, MultiModuleProcessGroupCollection):
                raise ScheduleCallError(
                    "get_forward_backward_func(schedule_pg_collection="
                    "MultiModuleProcessGroupCollection): the encoder schedules run one grid; "
                    "MIMO's per-module grids need --encoder-schedule megatron")
        pp = parallel_state.get_pipeline_model_parallel_world_size()
        vp = parallel_state.get_virtual_pipeline_model_parallel_world_size() or 1
        if (pp_size is not None and pp_size != pp) or (vp_size is not None
                                                       and (vp_size or 1) != vp):
            raise ScheduleCallError(
                f"get_forward_backward_func(pp_size={pp_size}, vp_size={vp_size}): the "
                f"encoder schedule is this run's pipeline (PP {pp}, VPP {vp})")
        if self._source is run_executor and not self._built:
            from .context import run_context
            if run_context().plan.encoder_plan is None and run_context().plan.separate is None:
                # --encoder-schedule megatron: Megatron-Core's own
                return self._original(pp_size, vp_size, schedule_pg_collection)
        return self.forward_backward_func

    def forward_backward_func(self, *, model, **kwargs) -> list:
        """The schedule executor, called as Megatron-LM calls Megatron-Core's schedules."""
        if self._executor(model) is None:
            raise ScheduleCallError("the run's --encoder-schedule runs Megatron-Core's "
                                    "schedules: nothing for the encoder schedule hook")
        self.calls += 1
        return self.executor(model=model, **kwargs)

    def _executor(self, model) -> Optional[ScheduleExecutor]:
        """The executor, built at the first call from the model chunks (None: the run keeps
        Megatron-Core's schedules)."""
        if self.executor is None and not self._built:
            chunks = model if isinstance(model, list) else [model]
            self.executor = self._source(chunks)
            self._built = True
        return self.executor

    def evaluate_and_print_results(self, prefix, forward_step_func, data_iterator, model,
                                   iteration, *args, **kwargs):
        """Megatron-LM's, then the package's answer accuracy (``--eval-max-new-tokens``)
        through the same schedule (``validation.py``)."""
        from .validation import report_answer_accuracy

        out = self._original_evaluate(prefix, forward_step_func, data_iterator, model,
                                      iteration, *args, **kwargs)
        if data_iterator is not None:  # the validation set (the package has no test set)
            report_answer_accuracy(prefix, model, iteration, self._schedule_for(model),
                                   kwargs.get("write_to_tensorboard", True))
        return out

    def _schedule_for(self, model) -> Optional[ScheduleExecutor]:
        if self._source is run_executor:
            from .context import run_context

            plan = run_context().plan
            if plan.encoder_plan is None and plan.separate is None:
                return None  # Megatron-Core's
        return self._executor(model)

    # -- installing --------------------------------------------------------------------
    def install(self) -> "EncoderSchedule":
        import megatron.training.training as training
        if isinstance(getattr(training.get_forward_backward_func, "__self__", None),
                      EncoderSchedule):
            raise RuntimeError("use_encoder_schedule was called twice: remove() the first")
        self._original = training.get_forward_backward_func
        self._original_evaluate = training.evaluate_and_print_results
        training.get_forward_backward_func = self.get_forward_backward_func
        training.evaluate_and_print_results = self.evaluate_and_print_results
        return self

    def remove(self) -> None:
        """Megatron-LM's ``get_forward_backward_func`` back."""
        if self._original is not None:
            import megatron.training.training as training
            training.get_forward_backward_func = self._original
            training.evaluate_and_print_results = self._original_evaluate
            self._original = None

    def __enter__(self) -> "EncoderSchedule":
        return self

    def __exit__(self, *exc) -> None:
        self.remove()


def use_encoder_schedule(source: Optional[ExecutorSource] = None) -> EncoderSchedule:
    """Make Megatron-LM's ``train_step`` and ``evaluate`` run the package's encoder
    schedule (module docstring), and its validation report the answer accuracy
    (``--eval-max-new-tokens``). ``source``: a ``ScheduleExecutor``, or a function of the
    model chunks that builds one (``training.encoder_executor.executor_for``), called at
    the first step; None: the run's own (``run_executor``)."""
    return EncoderSchedule(source).install()
