"""Train with rollout k + 1 generated while the trainer steps on rollout k (separate GPUs).

Each step after the first trains on samples one weight version old; `--use-tis` corrects
for it with truncated importance weights. Flags as `train.py`; `--rollout-num-gpus` is required.
"""

import sys

from slime.loop import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], asynchronous=True))
