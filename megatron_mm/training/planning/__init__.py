"""The run's plan glue: the training chain, the encoder schedule (the flags', or auto's
pick), the pipeline partition and placements, adaptive recompute and the partition
search's trials, computed once by ``plan_pipeline`` into a ``TrainingPlan``. The planner
itself is ``megatron_mm.plan``; this package feeds it the run's flags."""
