"""Ray Train: the driver that launches a run and the per-worker training loop."""
