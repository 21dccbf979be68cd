"""The trainer: ranks as Ray actors, torch.distributed data parallel with FSDP2, ppo_utils losses."""
