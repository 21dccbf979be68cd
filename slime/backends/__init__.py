"""Backends of the training path: rollout engines (`engine`) and the FSDP2 trainer (`fsdp`)."""
