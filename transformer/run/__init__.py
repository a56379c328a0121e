"""A run's folder: its checkpoints, the lock, signals, metric files and config files. Loading a
model to sample or analyse imports this package, never transformer.training."""
