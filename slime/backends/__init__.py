"""Backends: the trainer (`fsdp`) and the rollout engines."""
