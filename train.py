"""Train a policy with RL: rollout → reward → filter → train → refit, on one Ray placement group.

Run as a Ray job (`U.execute_train` submits it): `python train.py --hf-checkpoint DIR
--prompt-data FILE --rollout-batch-size 8 --n-samples-per-prompt 4 --num-rollout 10 --colocate`.
`python train.py --help` lists every flag.
"""

import sys

from slime.loop import main

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:], asynchronous=False))
