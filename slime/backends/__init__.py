"""Backends of the training path: rollout engines (`engine`), and the trainer beside them."""
