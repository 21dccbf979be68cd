"""The loop's side of trainer checkpoints: when to save, and where to pick up after `--load`.

The trainer ranks write and read the shards (`slime.backends.fsdp.checkpoint`); this module
keeps the loop's counters in step with them: the next rollout id and how many prompts the
data source has handed out, so a resumed run sees the same prompts and rollouts.
"""

from __future__ import annotations

from typing import Any

from slime.rollout.source import PromptSource


def consumed(source: PromptSource | None, in_flight: int = 0, batch: int = 0) -> int:
    """Prompts handed out and trained on (those of rollouts still in flight do not count)."""
    if source is None:
        return 0
    return source.epoch * len(source.prompts) + source.cursor - in_flight * batch


def restore_source(source: PromptSource, count: int) -> None:
    """Move a fresh source to where it stood after handing out `count` prompts."""
    source.epoch, source.cursor = divmod(count, len(source.prompts))
    source._order = source._epoch_order()


def resume(run: Any) -> None:
    """With `--load`: restore the trainer and move the loop's rollout id and data cursor."""
    args = run.args
    if args.load is None or run.trainer is None:
        return
    # --no-load-optim: weights and counters only, a fresh optimizer and schedule (as Megatron).
    state = run.trainer.load_checkpoint(args.load, args.ckpt_step,
                                        None if args.no_load_optim else args.load_optimizer,
                                        not args.no_load_rng)
    if state is None:
        print(f"resume: {args.load} holds no checkpoint yet; starting from rollout "
              f"{args.start_rollout_id}", flush=True)
        return
    end = args.start_rollout_id + args.num_rollout  # --num-rollout counts from the first rollout
    args.start_rollout_id = state["rollout_id"]
    args.num_rollout = max(0, end - state["rollout_id"])
    if run.source is not None:
        restore_source(run.source, state["data_cursor"])
    print(f"resume: step {state['step']} from {args.load}; next rollout {args.start_rollout_id}, "
          f"{args.num_rollout} to go, weight version {state['weight_version']}", flush=True)


def maybe_save(run: Any, rollout_id: int, *, in_flight: int = 0) -> None:
    """Save after `rollout_id` trained, every `--save-interval` rollouts and after the last one."""
    args = run.args
    if args.save is None or run.trainer is None:
        return
    last = rollout_id == args.start_rollout_id + args.num_rollout - 1
    if not (last or (args.save_interval and (rollout_id + 1) % args.save_interval == 0)):
        return
    run.trainer.save_checkpoint(args.save, rollout_id + 1,
                                consumed(run.source, in_flight, args.rollout_batch_size),
                                save_optimizer=args.save_optimizer, async_save=args.async_save)


def finish(run: Any) -> None:
    """Before exit: a background save is written and marked, or it never happened."""
    if run.args.save is not None and run.trainer is not None:
        run.trainer.wait_checkpoint()
