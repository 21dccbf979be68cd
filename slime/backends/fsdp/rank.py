"""One trainer rank: its share of the rollout, forward/backward with ppo_utils losses, Adam.

A rank is a plain class; `slime.backends.fsdp.group` runs one per placement-group bundle as
a Ray actor. All ranks take the same `TrainBatch` and pick their own samples from one
`dp_schedule` (so every rank runs the same number of micro-batches, which FSDP's
collectives need). The loss of a rank is its per-sample means summed over its samples and
divided by their count; FSDP averages gradients over ranks, so with equal samples per rank
the step equals one rank stepping on the whole batch.
"""

from __future__ import annotations

import datetime
import math
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from slime.backends.fsdp import math as M
from slime.backends.fsdp.config import TrainerConfig
from slime.backends.fsdp.lr_schedule import ParamScheduler, param_groups
from slime.backends.fsdp.model import ValueModel, load_causal_lm, shard_model
from slime.rollout.batch import TrainBatch
from slime.utils.dp_schedule import schedule
from slime.utils.hf_checkpoint import save_hf_checkpoint
from slime.utils.metrics import MetricReport, all_reduce_report
from slime.utils.ppo_utils import compute_approx_kl, compute_policy_loss, masked_whiten

_WEIGHT_SUFFIXES = (".safetensors", ".bin", ".pt", ".index.json")


@dataclass(frozen=True)
class _Scores:
    """Phase 1 of a step, per sample index of this rank: the pre-step policy's log-probs of the
    response (`old`), the reference's (`ref`), the critic's values, and the loss mask."""

    old: dict[int, torch.Tensor] = field(default_factory=dict)
    ref: dict[int, torch.Tensor] = field(default_factory=dict)
    values: dict[int, torch.Tensor] = field(default_factory=dict)
    masks: dict[int, torch.Tensor] = field(default_factory=dict)


class TrainRank:
    """Policy (sharded), frozen reference, optional critic (sharded), optimisers."""

    def __init__(self, *, rank: int, world_size: int, master_addr: str, master_port: int,
                 config: TrainerConfig, device: str) -> None:
        self.rank, self.world_size, self.config, self.device = rank, world_size, config, device
        self.version = 0
        self.lr = config.lr
        backend = "nccl" if device == "cuda" else "gloo"
        if device == "cuda":
            torch.cuda.set_device(0)  # Ray exposes the bundle's GPU as device 0
        else:
            # Ranks and engines share a few cores: intra-op threads only fight each other.
            torch.set_num_threads(1)
        if not dist.is_initialized():  # tests hand in a group they made themselves
            dist.init_process_group(
                backend, init_method=f"tcp://{master_addr}:{master_port}", rank=rank,
                world_size=world_size, timeout=datetime.timedelta(minutes=10),
            )
        torch.manual_seed(config.seed)
        from slime.backends.fsdp.grad_norm import GradNormRecorder
        from slime.backends.fsdp.parallel import build_mesh, layout_for, parallelize

        # dp × tp mesh: tensor-parallel ranks of one dp group take the same samples.
        self.layout = layout_for(world_size, config.tensor_model_parallel_size)
        policy = load_causal_lm(config.model_path, device)
        if self.layout.tp > 1:
            mesh = build_mesh(self.layout, device)
            self.dp_rank = mesh["dp"].get_local_rank()
            self.policy = parallelize(policy, mesh)
        else:
            self.dp_rank = rank
            self.policy = shard_model(policy, world_size=world_size)
        self.grad_norms = None
        if config.ci_save_grad_norm or config.ci_load_grad_norm:
            self.grad_norms = GradNormRecorder(save_dir=config.ci_save_grad_norm,
                                               load_dir=config.ci_load_grad_norm, write=rank == 0)
        # AdamW: Megatron's Adam decays weights decoupled from the gradient; at weight decay 0
        # it is the same update as Adam, bit for bit.
        self.optimizer = torch.optim.AdamW(param_groups(self.policy.named_parameters(), config.weight_decay),
                                           lr=config.lr)
        self.scheduler = ParamScheduler(self.optimizer, config.schedule(config.lr),
                                        on_load=config.schedule_on_load)  # type: ignore[arg-type]
        self.ref = None
        if config.needs_ref:
            self.ref = load_causal_lm(config.model_path, device).eval().requires_grad_(False)
        self._checkpointer: Any = None
        self.critic = None
        self.critic_optimizer = None
        self.critic_scheduler: ParamScheduler | None = None
        if config.use_critic:
            self.critic = shard_model(ValueModel(config.model_path, device), world_size=world_size)
            self.critic_optimizer = torch.optim.AdamW(
                param_groups(self.critic.named_parameters(), config.weight_decay), lr=config.critic_lr)
            self.critic_scheduler = ParamScheduler(self.critic_optimizer, config.schedule(config.critic_lr),
                                                   on_load=config.schedule_on_load)  # type: ignore[arg-type]

    # -- one rollout ------------------------------------------------------------------------

    def _my_micro_batches(self, batch: TrainBatch) -> list[M.MicroBatch]:
        lengths = [len(t) for t in batch.tokens]
        plan = schedule(lengths, self.layout.dp, self.config.max_tokens_per_micro_batch,
                        equal_samples_per_rank=True)
        if plan.dropped:
            raise ValueError(f"{batch.size} samples do not split evenly over {self.layout.dp} ranks")
        return [M.make_micro_batch(mb, batch.tokens, batch.response_lengths, batch.loss_masks, self.device)
                for mb in plan.micro_batches[self.dp_rank] if mb]

    def _logits(self, model: Any, mb: M.MicroBatch) -> torch.Tensor:
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
        return out.logits if hasattr(out, "logits") else out

    def train(self, batch: TrainBatch) -> dict[str, float]:
        """One optimiser step on this rollout; returns the metrics merged over all ranks."""
        start = time.monotonic()
        mbs = self._my_micro_batches(batch)
        n_local = sum(len(mb.indices) for mb in mbs)
        report = MetricReport()
        scores = self._score(batch, mbs)
        self._record_rollout_agreement(report, batch, scores.old, scores.masks)
        advantages, returns = self._advantages(batch, scores)
        objective_sum = self._backward(batch, mbs, scores, advantages, returns, n_local, report)
        grad_norm, mismatch = self._optimizer_step(objective_sum)
        report.add("train/grad_norm", grad_norm, reduce="max")
        report.add("train/lr", self.lr, reduce="max")
        report.add("train/samples", float(n_local), reduce="sum")
        report.add("train/seconds", time.monotonic() - start, reduce="max")
        merged = all_reduce_report(report) if self.world_size > 1 else report
        results: dict[str, Any] = merged.results()
        if mismatch is not None:
            results["ci/grad_norm_mismatch"] = mismatch
        return results

    def _score(self, batch: TrainBatch, mbs: list[M.MicroBatch]) -> _Scores:
        """Phase 1, no gradient: the pre-step policy's, the reference's and the critic's view of
        every sample of this rank; they fix the advantages of the whole step."""
        cfg = self.config
        scores = _Scores()
        with torch.no_grad():
            for mb in mbs:
                lengths = [batch.response_lengths[i] for i in mb.indices]
                logp, _ = M.response_log_probs(self._logits(self.policy, mb), mb, cfg.temperature)
                ref_logp = None
                if self.ref is not None:
                    ref_logp, _ = M.response_log_probs(self._logits(self.ref, mb), mb, cfg.temperature)
                value = None
                if self.critic is not None:
                    value = M.gather_response(self.critic(mb.input_ids, mb.attention_mask), mb)
                for row, i in enumerate(mb.indices):
                    n = lengths[row]
                    scores.old[i] = logp[row, :n].float()
                    scores.masks[i] = mb.mask[row, :n]
                    if ref_logp is not None:
                        scores.ref[i] = ref_logp[row, :n].float()
                    if value is not None:
                        scores.values[i] = value[row, :n].float()
        return scores

    def _advantages(self, batch: TrainBatch,
                    scores: _Scores) -> tuple[dict[int, torch.Tensor], dict[int, torch.Tensor]]:
        """The estimator's per-token advantages of this rank's samples, and the critic's
        returns (PPO only; empty otherwise)."""
        cfg = self.config
        old, ref, values, masks = scores.old, scores.ref, scores.values, scores.masks
        mine = sorted(old)
        rewards = [batch.rewards[i] for i in mine]
        returns: dict[int, torch.Tensor] = {}
        if cfg.advantage_estimator == "ppo":
            if self.critic is None:
                raise ValueError("--advantage-estimator ppo needs --use-critic")
            adv_list, ret_list = M.ppo_advantages(
                rewards, [old[i] for i in mine], [ref[i] for i in mine] if ref else None,
                [values[i] for i in mine], [masks[i] for i in mine], cfg.kl_coef, cfg.gamma, cfg.lam)
            returns = dict(zip(mine, ret_list, strict=True))
            adv_list = self._whiten(adv_list, [masks[i] for i in mine])
        elif cfg.advantage_estimator == "reinforce_plus_plus":
            adv_list = M.reinforce_pp_advantages(rewards, [old[i] for i in mine], [ref[i] for i in mine],
                                                 [masks[i] for i in mine], cfg.kl_coef, cfg.gamma)
            adv_list = self._whiten(adv_list, [masks[i] for i in mine])
        elif cfg.advantage_estimator == "grpo":
            adv_list = [a.to(self.device) for a in
                        M.grpo_token_advantages(rewards, [batch.response_lengths[i] for i in mine])]
        else:
            raise ValueError(f"--advantage-estimator {cfg.advantage_estimator} is not trained here; "
                             "use grpo, ppo or reinforce_plus_plus")
        return dict(zip(mine, adv_list, strict=True)), returns

    def _backward(self, batch: TrainBatch, mbs: list[M.MicroBatch], scores: _Scores,
                  advantages: dict[int, torch.Tensor], returns: dict[int, torch.Tensor],
                  n_local: int, report: MetricReport) -> float:
        """Phase 2: per micro-batch, forward with gradient, the policy's loss (and the critic's)
        backward and its metrics; gradients accumulate for one step. Returns the summed
        objective (what a grad-norm replay compares)."""
        global_tokens = int(sum(sum(m) for m in batch.loss_masks))
        objective_sum = 0.0
        self.optimizer.zero_grad(set_to_none=True)
        if self.critic_optimizer is not None:
            self.critic_optimizer.zero_grad(set_to_none=True)
        for mb in mbs:
            objective_sum += self._policy_backward(batch, mb, scores, advantages, global_tokens, report)
            if self.critic is not None:
                self._critic_backward(mb, returns, n_local, report)
        return objective_sum

    def _policy_backward(self, batch: TrainBatch, mb: M.MicroBatch, scores: _Scores,
                         advantages: dict[int, torch.Tensor], global_tokens: int,
                         report: MetricReport) -> float:
        from slime.backends.fsdp.parallel import normalise_loss

        cfg = self.config
        width = mb.mask.shape[1]
        logp, entropy = M.response_log_probs(self._logits(self.policy, mb), mb, cfg.temperature)
        old_t = M.pad_rows([scores.old[i] for i in mb.indices], width)
        adv_t = M.pad_rows([advantages[i] for i in mb.indices], width)
        rollout_t = M.pad_rows([torch.tensor(batch.rollout_log_probs[i], device=self.device)
                                for i in mb.indices], width)
        ppo_kl = old_t - logp
        pg, clipfrac = compute_policy_loss(ppo_kl, adv_t, cfg.eps_clip, cfg.eps_clip_high, cfg.eps_clip_c)
        if cfg.use_tis:
            # Tokens sampled by an older policy: weight by how much likelier the trainer's
            # pre-step policy finds them, clipped so one token cannot dominate.
            pg = pg * torch.exp(old_t - rollout_t).clamp(max=cfg.tis_clip).detach()
        loss_tok = pg - cfg.entropy_coef * entropy
        kl_loss = torch.zeros_like(pg)
        if cfg.use_kl_loss and self.ref is not None:
            ref_t = M.pad_rows([scores.ref[i] for i in mb.indices], width)
            kl_loss = compute_approx_kl(logp, ref_t, cfg.kl_loss_type)  # type: ignore[arg-type]
            loss_tok = loss_tok + cfg.kl_loss_coef * kl_loss
        per_sample = M.per_sample_mean(loss_tok, mb.mask)
        objective = normalise_loss(loss_tok, mb.mask, per_token=cfg.calculate_per_token_loss,
                                   global_tokens=global_tokens, global_samples=batch.size,
                                   dp_size=self.layout.dp, wrong_normalisation=cfg.ci_wrong_normalisation)
        # With --ci-wrong-normalisation each micro-batch is its own token mean and the
        # means are summed: gradient accumulation that forgets the global count.
        objective.backward()
        b = len(mb.indices)
        for name, tok in (("pg_loss", pg), ("ppo_kl", ppo_kl), ("kl_loss", kl_loss),
                          ("entropy", entropy), ("clipfrac", clipfrac)):
            report.add(f"train/{name}", float(M.per_sample_mean(tok.detach(), mb.mask).mean()), count=b)
        report.add("train/loss", float(per_sample.detach().mean()), count=b)
        report.add("train/ppo_kl_abs_max", float((ppo_kl.detach().abs() * mb.mask).max()), reduce="max")
        report.add("train/kl_loss_abs_max", float((kl_loss.detach().abs() * mb.mask).max()), reduce="max")
        report.add("train/entropy_min", float(entropy.detach()[mb.mask > 0].min()), reduce="min")
        return float(objective.detach())

    def _critic_backward(self, mb: M.MicroBatch, returns: dict[int, torch.Tensor], n_local: int,
                         report: MetricReport) -> None:
        assert self.critic is not None
        width = mb.mask.shape[1]
        value = M.gather_response(self.critic(mb.input_ids, mb.attention_mask), mb)
        ret_t = M.pad_rows([returns[i] for i in mb.indices], width)
        v_loss = M.per_sample_mean(0.5 * (value - ret_t) ** 2, mb.mask)
        (v_loss.sum() / n_local).backward()
        report.add("train/value_loss", float(v_loss.detach().mean()), count=len(mb.indices))

    def _optimizer_step(self, objective_sum: float) -> tuple[float, str | None]:
        """Clip and step the policy (and the critic); the policy's grad norm before clipping and
        a grad-norm replay's mismatch line, if any."""
        from slime.backends.fsdp.parallel import clip_grads
        from slime.backends.fsdp.parallel import grad_norm as global_grad_norm

        cfg = self.config
        policy_params = list(self.policy.parameters())
        # Exact for FSDP2 and 2-D (dp × tp) DTensors alike; one all-reduce.
        grad_norm = global_grad_norm(policy_params)
        clip_grads(policy_params, cfg.clip_grad, grad_norm)
        mismatch = self._record_grad_norm(grad_norm, objective_sum)
        self.lr = float(self.optimizer.param_groups[0]["lr"])  # the lr of this update
        self.optimizer.step()
        self.scheduler.step()
        if self.critic is not None and self.critic_optimizer is not None:
            torch.nn.utils.clip_grad_norm_(self.critic.parameters(), cfg.clip_grad)
            self.critic_optimizer.step()
            if self.critic_scheduler is not None:
                self.critic_scheduler.step()
        self.version += 1
        return grad_norm, mismatch

    def _record_grad_norm(self, norm: float, objective: float) -> str | None:
        """Record or compare this step's grad norm and loss; the mismatch line, if any (same on all ranks)."""
        if self.grad_norms is None:
            return None
        from slime.backends.fsdp.grad_norm import GradNormMismatch

        total = torch.tensor([objective], dtype=torch.float64,
                             device=self.device if self.device == "cuda" else "cpu")
        if self.world_size > 1:
            dist.all_reduce(total)  # tp replicas hold equal values: the world mean is the dp mean
        try:
            self.grad_norms.record(self.version, norm, float(total.item()) / self.world_size)
        except GradNormMismatch as e:
            return str(e)
        return None

    def _whiten(self, values: list[torch.Tensor], masks: list[torch.Tensor]) -> list[torch.Tensor]:
        # Statistics over every rank's tokens: a rank whitening alone would shift its advantages.
        flat = torch.cat([v.float() for v in values])
        mask = torch.cat(masks)
        group = dist.group.WORLD if self.world_size > 1 else None
        white = masked_whiten(flat.cpu(), mask.cpu(), process_group=group).to(self.device)
        out, at = [], 0
        for v in values:
            out.append(white[at: at + v.numel()])
            at += v.numel()
        return out

    def _record_rollout_agreement(self, report: MetricReport, batch: TrainBatch,
                                  old: dict[int, torch.Tensor], masks: dict[int, torch.Tensor]) -> None:
        """How the trainer's log-probs of the sampled tokens compare with the engine's."""
        diffs, ratios, logps = [], [], []
        for i, lp in old.items():
            m = masks[i] > 0
            rollout = torch.tensor(batch.rollout_log_probs[i], device=lp.device)
            diffs.append((lp - rollout)[m])
            ratios.append(torch.exp(lp - rollout)[m])
            logps.append(lp[m])
        d, r, lp_all = torch.cat(diffs), torch.cat(ratios), torch.cat(logps)
        count = int(d.numel())
        report.add("check/logprob_abs_diff_max", float(d.abs().max()) if count else 0.0, reduce="max")
        report.add("check/logprob_abs_diff_mean", float(d.abs().mean()) if count else 0.0, count=count)
        report.add("check/is_ratio_mean", float(r.mean()) if count else 1.0, count=count)
        report.add("check/is_ratio_max", float(r.max()) if count else 1.0, reduce="max")
        report.add("check/is_ratio_min", float(r.min()) if count else 1.0, reduce="min")
        report.add("check/logprob_max", float(lp_all.max()) if count else -math.inf, reduce="max")
        report.add("check/logprob_nonfinite", float((~torch.isfinite(lp_all)).sum()), reduce="sum")

    # -- weights ----------------------------------------------------------------------------

    def full_state_dict(self) -> dict[str, torch.Tensor] | None:
        """The whole policy on rank 0 (CPU tensors), None elsewhere; a collective on all ranks."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        state = get_model_state_dict(self.policy, options=StateDictOptions(full_state_dict=True,
                                                                           cpu_offload=True))
        return {k: v.detach().clone() for k, v in state.items()} if self.rank == 0 else None

    def export_hf(self, out_dir: str) -> str | None:
        """Rank 0 writes the policy as an HF model directory (config and tokenizer copied along)."""
        state = self.full_state_dict()
        if state is None:
            return None
        out = Path(out_dir)
        tmp = out.with_name(out.name + ".partial")
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir(parents=True)
        for f in Path(self.config.model_path).iterdir():
            if f.is_file() and not f.name.endswith(_WEIGHT_SUFFIXES):
                shutil.copy2(f, tmp / f.name)
        save_hf_checkpoint(state, tmp, metadata={"weight_version": str(self.version)})
        shutil.rmtree(out, ignore_errors=True)
        tmp.replace(out)  # a reader never sees a half-written version
        return str(out)

    # -- checkpoints (slime.backends.fsdp.checkpoint) ----------------------------------------

    def save_checkpoint(self, root: str, rollout_id: int, data_cursor: int, *, save_optimizer: str,
                        async_save: bool) -> None:
        """Every rank writes its shards of the policy, the critic (PPO) and their optimizers."""
        from slime.backends.fsdp import checkpoint as ck

        if self._checkpointer is None:  # made on all ranks at once: async makes a process group
            self._checkpointer = ck.Checkpointer(root, save_optimizer=save_optimizer,  # type: ignore[arg-type]
                                                 async_save=async_save)
        state = ck.TrainState(step=self.version, rollout_id=rollout_id, data_cursor=data_cursor,
                              weight_version=self.version)
        self._checkpointer.save(state, self.policy, self.optimizer, self.scheduler, critic=self.critic,
                                critic_optimizer=self.critic_optimizer,
                                critic_scheduler=self.critic_scheduler)

    def wait_checkpoint(self) -> None:
        """Block until a background save is written and marked latest."""
        if self._checkpointer is not None:
            self._checkpointer.wait()

    def load_checkpoint(self, root: str, step: int | None, load_optimizer: str | None,
                        load_rng: bool = True) -> dict[str, int] | None:
        """Restore policy, critic, optimizers with their schedules (unless `load_optimizer` is None:
        `--no-load-optim`) and RNG; returns the saved train state (None: nothing saved)."""
        import dataclasses

        from slime.backends.fsdp import checkpoint as ck

        with_optim = load_optimizer is not None
        state = ck.load(root, self.policy, self.optimizer, self.scheduler if with_optim else None,
                        step=step,
                        load_optimizer=load_optimizer,  # type: ignore[arg-type]
                        load_rng=load_rng, critic=self.critic, critic_optimizer=self.critic_optimizer,
                        critic_scheduler=self.critic_scheduler if with_optim else None)
        if state is None:
            return None
        self.version = state.weight_version
        return dataclasses.asdict(state)

    def get_version(self) -> int:
        """How many optimiser steps this rank has taken."""
        return self.version

    def pid(self) -> int:
        """This process's id (for placement checks)."""
        return os.getpid()

    def shutdown(self) -> None:
        """Finish a background save, then leave the process group."""
        # Destroying the groups under a save still in flight would end its gloo group
        # mid-collective, on this rank first, while the peers' writes still talk to it.
        self.wait_checkpoint()
        if dist.is_initialized():
            dist.destroy_process_group()
