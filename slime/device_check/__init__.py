"""`python tools/cuda_check.py`: the training path on one device, in one process, in five checks.

No Ray, no Docker, no HTTP: the rollout engine (`Engine`, the class the HTTP server wraps) and
one trainer rank (`TrainRank`, FSDP2 at world size 1 over NCCL on CUDA, gloo on CPU) run in
this process, and the RL loop's own functions (`slime.loop.make_batch`, `train_step`, `refit`,
`run_sync`, `slime.resume`) drive them through the in-process groups of `local`.

- `local`: in-process stand-ins for the Ray engine and trainer groups (same methods).
- `measure`: builds the tiny model and takes the figures of the five checks.
- `judge`: pure; figures in, one verdict per check out (what held, or which and why not).
- `report`: the table and the JSON document.
"""
