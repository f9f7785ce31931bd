"""What the fork server of ``dist_harness`` imports before it forks the ranks: Megatron-Core
prepared as an entry point prepares it, then the training code every rank runs."""

from megatron_mm.startup import prepare_megatron_core

prepare_megatron_core()

import megatron_mm.training.pretrain  # noqa: E402,F401
