"""Trust Region Policy Optimization (Schulman, Levine, Moritz, Jordan and Abbeel 2015, "Trust
Region Policy Optimization"), as sb3-contrib's TRPO runs it, discrete and continuous.

A member of the on-policy family (``corral.algos.onpolicy``): its actor-critic (separate policy
and value MLPs, one batched module), rollout storage, GAE (``OnPolicy.prepare_batch``), reward
scaling, collectors and checkpoints. TRPO's part is ``train_minibatches``, the update itself:

1. **Policy step.** On the rollout (every ``sub_sampling_factor``-th row), the surrogate
   ``L = mean(A ratio)`` and the mean ``KL(pi_old || pi)``. The natural gradient direction
   ``s ~ F^-1 g`` solves ``(F + damping I) s = g`` by conjugate gradient (``conjugate_gradient``),
   ``g = grad L`` and ``F v`` the Fisher-vector product: the gradient of ``grad KL . v``
   (double backward; the Hessian of the KL at the old policy is its Fisher matrix). The full
   step ``sqrt(2 target_kl / s.Fs) s`` reaches the trust region's edge under the quadratic
   model; a backtracking line search shrinks it by ``line_search_shrinking_factor`` until the
   measured KL is below ``target_kl`` *and* the surrogate improved, at most
   ``line_search_max_iter`` times, else the policy is left unchanged. So after every update
   the measured mean KL on the batch is below ``target_kl`` (tested).
2. **Value fitting.** ``n_critic_updates`` epochs of Adam over minibatches of ``batch_size``
   on the GAE returns, no gradient clip (sb3-contrib's). Only the value network's weights
   move: the optimizer's gradient is masked to them, so a shared image encoder is trained by
   the policy step alone (as sb3-contrib drops the critic's gradient on the actor's
   parameters) and the KL just measured still holds.

The policy's outputs for the step are computed through ``ParallelMLP``'s plain autograd path
(``members``: the policy member only), which supports the double backward the Fisher-vector
product needs; the acting path keeps the fused one. No entropy bonus, no clipping.

``use_sde``: gSDE (``corral.algos.sde``) as sb3-contrib's TRPO takes it. The actor-critic is
``SDEActorCritic``; collection acts with each env's exploration matrix, redrawn at every
rollout's start and every ``sde_sample_freq`` vector steps (the on-policy loop's, as PPO's).
The policy step reads the state-dependent distribution ``N(mean(s), (phi(s)^2) @ (sigma^2))``:
its surrogate ratio, its KL (the same diagonal-Gaussian KL, now with a per-state std) and so
its Fisher matrix are those of that distribution, whose parameters are the policy member, the
mean layer and sigma's log std. The line search and the KL bound hold as without gSDE.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from corral.actors.sde import SDEActorCritic
from corral.algos.onpolicy import OnPolicy, OnPolicyConfig, PPOBatch, check_batch_size, normalized
from corral.algos.sde import SDEConfig
from corral.config import option
from corral.nets import DiagGaussianHead
from corral.nets.sde import StateDependentNoise
from corral.optim import FlatAdam


@dataclass
class TRPOConfig(SDEConfig, OnPolicyConfig):
    n_steps: int = option(2048, "env steps per env per rollout", ge=1)
    batch_size: int = option(128, "minibatch size of the value fitting", ge=1)
    n_critic_updates: int = option(10, "epochs of value fitting (Adam) per rollout", ge=1)
    lr: float = option(1e-3, "Adam learning rate of the value fitting", gt=0)
    gae_lambda: float = option(0.95, "GAE lambda", ge=0, le=1)
    target_kl: float = option(0.01, "the trust region: the mean KL(old || new) on the batch after a step stays "
                                    "below this", gt=0)
    cg_max_steps: int = option(15, "conjugate-gradient iterations for the step direction", ge=1)
    cg_damping: float = option(0.1, "added to the Fisher matrix's diagonal (F + damping I)", ge=0)
    line_search_shrinking_factor: float = option(0.8, "the line search multiplies the step by this on each "
                                                      "rejection", gt=0, lt=1)
    line_search_max_iter: int = option(10, "steps tried by the line search before it gives up (no change)", ge=1)
    sub_sampling_factor: int = option(1, "the policy step uses every k-th row of the rollout (the value fitting "
                                         "all of them)", ge=1)
    normalize_advantage: bool = option(True, "normalize the advantages over the batch of the policy step")
    adam_eps: float = option(1e-5, "Adam epsilon", gt=0)
    normalize_reward: bool = option(False, "scale rewards by the running std of the discounted return")
    reward_clip: float = option(10.0, "clip scaled rewards to +-this (with normalize_reward)", gt=0)


def flat_grad(y: torch.Tensor, params: list[torch.Tensor], **kw) -> torch.Tensor:
    """d y / d params as one flat vector (zeros for a parameter ``y`` does not reach)."""
    grads = torch.autograd.grad(y, params, allow_unused=True, **kw)
    return torch.cat([(torch.zeros_like(p) if g is None else g).reshape(-1) for p, g in zip(params, grads)])


def conjugate_gradient(matvec, b: torch.Tensor, max_steps: int, tol: float = 1e-10) -> tuple[torch.Tensor, float]:
    """``x ~ A^-1 b`` for a symmetric positive definite ``A`` given as ``matvec(v) = A v``, by
    conjugate gradient from ``x = 0`` (Hestenes and Stiefel 1952; Nocedal and Wright, Algorithm
    5.2); stops after ``max_steps`` products or once ``|r|^2 < tol``. Returns ``(x, |r|^2)``."""
    x = torch.zeros_like(b)
    r = b.clone()
    p = b.clone()
    rr = r.dot(r)
    for _ in range(max_steps):
        if rr < tol:
            break
        ap = matvec(p)
        alpha = rr / p.dot(ap)
        x.add_(alpha * p)
        r.sub_(alpha * ap)
        rr_new = r.dot(r)
        p = r + (rr_new / rr) * p
        rr = rr_new
    return x, float(rr)


def kl_divergence(head: torch.nn.Module, old: torch.Tensor, new: torch.Tensor) -> torch.Tensor:
    """Per-row ``KL(old || new)`` between two outputs of ``head``: a diagonal Gaussian's
    ``[mean, log_std]`` (gSDE's head gives the same layout, its log std per state), or
    (categorical and multi-categorical heads) log-probabilities, where the sum over every
    branch's entries is the sum of the branches' KLs."""
    if isinstance(head, (DiagGaussianHead, StateDependentNoise)):
        mu0, ls0 = old.chunk(2, dim=-1)
        mu1, ls1 = new.chunk(2, dim=-1)
        return (ls1 - ls0 + ((2 * ls0).exp() + (mu0 - mu1).square()) / (2 * (2 * ls1).exp()) - 0.5).sum(-1)
    return (old.exp() * (old - new)).sum(-1)


class TRPO(OnPolicy):
    name = "trpo"
    Config = TRPOConfig
    STATS = ("pg_loss", "v_loss", "entropy", "kl", "line_search_success")

    def __init__(self, cfg: TRPOConfig, obs_space, act_space, num_envs, device, rng, role="learner"):
        if role == "learner":
            check_batch_size(self.name, cfg.batch_size, cfg.n_steps, num_envs)
        super().__init__(cfg, obs_space, act_space, num_envs, device, rng, role)
        body = self.actor.body
        self._pi = torch.zeros(1, dtype=torch.long, device=device)  # the policy's member of the batched MLPs
        if self.learns:
            # 1 on the value member's weights in the optimizer's flat layout: the value fitting's gradient is
            # masked to them
            value_rows = {id(t) for t in (*body.weights, *body.biases)}
            # gSDE's actor-critic: its value layer sits beside the batched body, all of it the value's
            value_only = {id(t) for t in self.actor.value_net.parameters()} if self.sde is not None else set()
            self.value_mask = torch.cat([
                (torch.zeros_like(p).index_fill_(0, torch.tensor([1], device=device), 1.0) if id(p) in value_rows
                 else torch.ones_like(p) if id(p) in value_only else torch.zeros_like(p)).reshape(-1)
                for p in self.optimizer.params])

    def make_optimizer(self):
        """Adam for the value fitting (its gradient masked to the value network's weights); the
        policy moves by the natural-gradient step, written straight into the same flat buffer."""
        return FlatAdam(self.actor.parameters(), lr=self.cfg.lr, eps=self.cfg.adam_eps)

    def reward_clip(self) -> float | None:
        return self.cfg.reward_clip if self.cfg.normalize_reward else None

    # --- the policy step
    def policy_outputs(self, x: torch.Tensor) -> torch.Tensor:
        """The distribution parameters of stored observations ``x`` through the plain autograd path
        (twice differentiable), the policy member only."""
        actor = self.actor
        if isinstance(actor, SDEActorCritic):  # gSDE: the mean from phi(s), the per-state std from phi(s), sigma
            phi = actor.body(actor.features(x), members=self._pi)[0]
            return actor.head.params(actor.action_net(phi), phi)
        logits = actor.body(actor.features(x), members=self._pi)[0]
        if actor.mask_slice is not None:
            logits = logits.masked_fill(x[:, actor.mask_slice] < 0.5, -1e8)
        return actor.head(logits)

    def fisher_product(self, out: torch.Tensor):
        """``v -> (F + damping I) v``, F the Hessian of the mean ``KL(pi_out || pi)`` at the current
        parameters (the Fisher matrix), in the optimizer's flat layout; ``out``: the policy's
        outputs (``policy_outputs``, with their graph) on the batch."""
        params = self.optimizer.params
        grad_kl = flat_grad(kl_divergence(self.actor.head, out.detach(), out).mean(), params, create_graph=True)
        damping = self.cfg.cg_damping

        def fvp(v: torch.Tensor) -> torch.Tensor:
            return flat_grad(grad_kl.dot(v), params, retain_graph=True) + damping * v

        return fvp

    def surrogate(self, obs, actions, old_log_probs, adv, old) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """``(mean(A ratio), mean KL(old || pi), pi's outputs)`` at the current parameters."""
        out = self.policy_outputs(obs)
        ratio = (self.actor.head.log_prob(out, actions) - old_log_probs).exp()
        kl = None if old is None else kl_divergence(self.actor.head, old, out).mean()
        return (adv * ratio).mean(), kl, out

    def policy_step(self, batch: PPOBatch) -> dict[str, torch.Tensor | float]:
        cfg = self.cfg
        k = cfg.sub_sampling_factor
        obs, actions, old_log_probs, adv = (t[::k] for t in (batch.obs, batch.actions, batch.log_probs, batch.adv))
        if cfg.normalize_advantage and k > 1:  # else prepare_batch normalized the whole batch
            adv = normalized(adv)
        flat = self.optimizer.flat
        theta = flat.clone()
        objective, _, out = self.surrogate(obs, actions, old_log_probs, adv, None)
        old = out.detach()
        g = flat_grad(objective, self.optimizer.params, retain_graph=True)
        fvp = self.fisher_product(out)
        direction, residual = conjugate_gradient(fvp, g, cfg.cg_max_steps)
        shs = direction.dot(fvp(direction)).clamp_min(1e-12)
        full_step = direction * torch.sqrt(2 * cfg.target_kl / shs)
        coef, tries, accepted = 1.0, 0, False
        with torch.no_grad():
            for tries in range(1, cfg.line_search_max_iter + 1):
                flat.copy_(theta + coef * full_step)
                new_objective, kl, out = self.surrogate(obs, actions, old_log_probs, adv, old)
                if kl < cfg.target_kl and new_objective > objective:
                    accepted = True
                    break
                coef *= cfg.line_search_shrinking_factor
            if not accepted:  # nothing in the region improves the surrogate by the quadratic model's direction
                flat.copy_(theta)
                new_objective, kl, out = objective.detach(), torch.zeros(()), old
            entropy = self.actor.head.entropy(out).mean()
        return {"pg_loss": -new_objective, "kl": kl, "entropy": entropy, "line_search_success": float(accepted),
                "line_search_steps": float(tries), "cg_residual": residual, "step_norm": float(coef * full_step.norm())
                if accepted else 0.0}

    # --- the value fitting
    def value_step(self, obs: torch.Tensor, ret: torch.Tensor) -> torch.Tensor:
        """One Adam step on the value loss of a minibatch, only the value network's weights moving."""
        v_loss = F.mse_loss(self.actor.value(obs), ret)
        opt = self.optimizer
        opt.zero_grad()
        v_loss.backward()
        opt.grad.mul_(self.value_mask)
        opt.step()
        return v_loss.detach()

    def train_minibatches(self, batch: PPOBatch, param):
        """The policy step, then ``n_critic_updates`` epochs of value fitting; returns the loop's
        ``(summed stats, evaluated, optimizer steps, extra metrics)``."""
        cfg = self.cfg
        stats = self.policy_step(batch)
        v_sum, steps = torch.zeros((), device=self.device), 0
        for _ in range(cfg.n_critic_updates):
            for idx in torch.randperm(batch.size, generator=self.rng["minibatch"], device=self.device) \
                    .split(cfg.batch_size):
                v_sum += self.value_step(batch.obs[idx], batch.ret[idx])
                steps += 1
        stats["v_loss"] = v_sum / max(steps, 1)
        sums = torch.stack([torch.as_tensor(stats[k], dtype=torch.float32, device=self.device).reshape(())
                            for k in self.STATS])
        extra = {k: float(stats[k]) for k in ("line_search_steps", "cg_residual", "step_norm")}
        return sums, 1, steps, extra

    def update(self, progress: float) -> dict[str, float]:
        stats = super().update(progress)
        if isinstance(self.actor.head, DiagGaussianHead):
            stats["std"] = float(self.actor.head.log_std.detach().exp().mean())
        elif isinstance(self.actor.head, StateDependentNoise):  # gSDE: the exploration matrix's mean sigma
            stats["std"] = float(self.actor.head.std().detach().mean())
        return stats
