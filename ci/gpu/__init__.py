"""GPUs on one host: the allocator (`allocator`: per-GPU flock, one fair FIFO queue), its
command line (`lock_gpus`: `lock-gpus`, `gpu-status`), the safe opener of files in shared
directories (`safe_open`) and the port blocks concurrent entries get (`ports`)."""
