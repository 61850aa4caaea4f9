"""Model, optimizer, loss, checkpoints and metric loggers: torch, no Ray."""
