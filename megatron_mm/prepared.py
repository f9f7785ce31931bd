"""``prepare_megatron_core()`` as an import, for the one caller that can only name modules:
a fork server's preload list (``multiprocessing.set_forkserver_preload``), which then imports
Megatron-Core once for every process it forks. Nothing else imports this module."""

from megatron_mm.startup import prepare_megatron_core

prepare_megatron_core()
