"""Let ``--defer-embedding-wgrad-compute`` run with Megatron-Core's local linears.

Under ``defer_embedding_wgrad_compute`` only the output layer is given the deferral
buffers (``embedding_activation_buffer``, ``grad_output_buffer``): its weight gradient is
computed later, during the pipeline's flush. In megatron-core 0.19.2
``tensor_parallel.layers.ColumnParallelLinear.forward`` appends its input to
``embedding_activation_buffer`` in every column-parallel linear, so each local one that is
not the output layer (QKV, MLP fc1: ``--transformer-impl local``, or any local linear under
TE) stopped the first forward with "'NoneType' object has no attribute 'append'" (TE's
linears do not read the flag). Upstream's backward already computes the weight gradient
of a linear without ``grad_output_buffer``; here its forward gets a throwaway list for the
input it appends, dropped at once, so it neither keeps nor defers anything (upstream
patch: patches/0009-defer-embedding-wgrad-compute-local-linears-without-buffer.patch;
where it is installed, the list is simply never appended to).
"""

import functools


def apply() -> None:
    from megatron.core.tensor_parallel import layers

    upstream = layers.ColumnParallelLinear.forward
    if hasattr(upstream, "__wrapped__"):
        return

    @functools.wraps(upstream)
    def forward(self, *args, **kwargs):
        if self.embedding_activation_buffer is not None \
                or not self.config.defer_embedding_wgrad_compute:
            return upstream(self, *args, **kwargs)
        self.embedding_activation_buffer = []  # upstream's append, not the output layer's
        try:
            return upstream(self, *args, **kwargs)
        finally:
            self.embedding_activation_buffer = None

    layers.ColumnParallelLinear.forward = forward
