"""What a trainer rank needs to know, taken once from the command line."""

from __future__ import annotations

import argparse
from dataclasses import dataclass


@dataclass(frozen=True, kw_only=True)
class TrainerConfig:
    """Model, optimiser and loss settings of every rank."""

    model_path: str
    lr: float = 1e-5
    critic_lr: float = 1e-4
    weight_decay: float = 0.0
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
        if getattr(args, "max_tokens_per_gpu", None):
            picked["max_tokens_per_micro_batch"] = args.max_tokens_per_gpu
        return cls(model_path=args.hf_checkpoint, **picked)

    @property
    def needs_ref(self) -> bool:
        """Whether a frozen reference model is loaded (KL loss or KL-shaped rewards)."""
        return self.use_kl_loss or self.kl_coef > 0 or self.advantage_estimator == "reinforce_plus_plus"
