"""The training loop, its checkpoints, throughput meter and logs."""
