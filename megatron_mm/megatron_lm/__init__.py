"""The package as a library inside someone else's Megatron-LM ``pretrain()``."""
