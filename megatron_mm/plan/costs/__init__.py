"""What work costs: FLOPs and bytes from sizes, the hardware, and the one time model."""
