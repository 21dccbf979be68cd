"""What a trainer rank needs to know, taken once from the command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from slime.backends.fsdp.lr_schedule import Schedule, schedule_for


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Model, optimiser and loss settings of every rank."""

    model_path: str
    lr: float = 1e-5
    critic_lr: float = 1e-4
    weight_decay: float = 0.0
    # The lr schedule (slime.backends.fsdp.lr_schedule), in optimizer steps: one per rollout.
    lr_decay_style: str = "constant"
    lr_warmup_iters: int = 0
    lr_warmup_fraction: float | None = None
    lr_decay_iters: int | None = None
    lr_warmup_init: float = 0.0
    min_lr: float = 0.0
    train_iters: int = 1
    schedule_on_load: str = "check"
    clip_grad: float = 1.0
    advantage_estimator: str = "grpo"
    eps_clip: float = 0.2
    eps_clip_high: float | None = None
    eps_clip_c: float | None = None
    use_kl_loss: bool = False
    kl_loss_coef: float = 0.0
    kl_loss_type: str = "low_var_kl"
    kl_coef: float = 0.0  # KL penalty folded into rewards (PPO, REINFORCE++)
    entropy_coef: float = 0.0
    use_critic: bool = False
    gamma: float = 1.0
    lam: float = 1.0
    temperature: float = 1.0
    max_tokens_per_micro_batch: int = 4096
    # Off-policy correction: weight each token by exp(old - rollout) clipped at this value.
    use_tis: bool = False
    tis_clip: float = 2.0
    seed: int = 1234
    # Layout and normalisation (slime.backends.fsdp.parallel) and the grad-norm replay.
    tensor_model_parallel_size: int = 1
    calculate_per_token_loss: bool = False
    ci_save_grad_norm: str | None = None
    ci_load_grad_norm: str | None = None
    ci_wrong_normalisation: bool = False

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> TrainerConfig:
        """Pick this record's fields out of the parsed command line."""
        names = set(cls.__dataclass_fields__) - {"model_path", "max_tokens_per_micro_batch", "temperature"}
        picked = {n: getattr(args, n) for n in names if hasattr(args, n)}
        if getattr(args, "num_rollout", None):
            # Megatron's train_iters: the steps the schedule decays over unless --lr-decay-iters.
            picked["train_iters"] = args.num_rollout
        if getattr(args, "override_opt_param_scheduler", False):
            picked["schedule_on_load"] = "override"
        elif getattr(args, "use_checkpoint_opt_param_scheduler", False):
            picked["schedule_on_load"] = "checkpoint"
        if getattr(args, "max_tokens_per_gpu", None):
            picked["max_tokens_per_micro_batch"] = args.max_tokens_per_gpu
        return cls(model_path=args.hf_checkpoint, **picked)

    def schedule(self, max_lr: float) -> Schedule:
        """The lr schedule of an optimizer whose peak lr is `max_lr` (the policy's or the critic's)."""
        base = schedule_for(lr=self.lr, min_lr=self.min_lr, init_lr=self.lr_warmup_init,
                            style=self.lr_decay_style, warmup_iters=self.lr_warmup_iters,
                            warmup_fraction=self.lr_warmup_fraction, decay_iters=self.lr_decay_iters,
                            train_iters=self.train_iters)
        return base if max_lr == self.lr else base.with_max_lr(max_lr)

    @property
    def needs_ref(self) -> bool:
        """Whether a frozen reference model is loaded (KL loss or KL-shaped rewards)."""
        return self.use_kl_loss or self.kl_coef > 0 or self.advantage_estimator == "reinforce_plus_plus"
