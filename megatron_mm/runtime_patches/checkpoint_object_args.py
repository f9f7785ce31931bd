"""Let Megatron-Core's activation recompute take arguments that are not tensors.

In megatron-core 0.19.2 ``TransformerBlock``'s full recompute
(``recompute.checkpointed_forward``) passes the attention mask through
``tensor_parallel.checkpoint``, whose ``CheckpointFunction.forward`` keeps every argument
with ``ctx.save_for_backward``: tensors only. This package's context-
parallel attention takes a ``ContextParallelMask`` (the rank's token codes, not a
tensor) as the attention mask, so ``--recompute-granularity full`` with context
parallelism stopped with "save_for_backward can only save variables, but argument 1 is
of type ContextParallelMask". As ``torch.utils.checkpoint`` does, the objects stay on the
side (the function re-run in backward gets them back in their places) and only tensors
are saved.
"""

import torch


def apply() -> None:
    from megatron.core.tensor_parallel import random

    upstream = random.CheckpointFunction.forward

    def forward(ctx, run_function, distribute_saved_activations, *args):
        objects = [None if a is None or torch.is_tensor(a) else a for a in args]
        if all(o is None for o in objects):
            return upstream(ctx, run_function, distribute_saved_activations, *args)

        def run(*saved):
            return run_function(*(a if o is None else o for a, o in zip(saved, objects)))

        tensors = [a if o is None else None for a, o in zip(args, objects)]
        return upstream(ctx, run, distribute_saved_activations, *tensors)

    random.CheckpointFunction.forward = staticmethod(forward)
