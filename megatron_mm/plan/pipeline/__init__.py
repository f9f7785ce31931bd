"""The LLM pipeline's layout: the layer chain, stage partitions, module placement,
memory, recomputation and the partition's estimate."""
