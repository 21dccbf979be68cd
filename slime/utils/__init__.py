"""Framework utilities: PPO math, samples, scheduling, metrics, arguments, checkpoints."""
