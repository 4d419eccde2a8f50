"""PPO's minibatch loss for one Categorical head with its gradient written out. The reference is
``ppo_loss`` in ``corral/algos/ppo.py`` (the clipped surrogate under autograd), which calls this
where it applies: a Categorical head and no value clipping."""

from __future__ import annotations

import torch

from corral.kernels.registry import register


@register("categorical_ppo_loss", reference="corral.algos.ppo:ppo_loss", tolerance=1e-6,
          runs="PPO (and its loop's users) with a Categorical head and no value clipping: loss, "
               "statistics and gradients")
class CategoricalPPOLoss(torch.autograd.Function):
    """``ppo_loss`` for one Categorical head without value clipping, with its gradient
    written out (one autograd node instead of about fifteen; on small nets the autograd
    bookkeeping costs as much as the arithmetic). With logp = log_softmax(logits),
    p = exp(logp), r = exp(logp[a] - old), H = -sum(p logp), over a batch of B:

        d loss / d logp[a] = -A r / B   where the unclipped term is the one used
                                        (r within 1 +- clip, or -A r > -A clip(r)), else 0
        d loss / d logits  = d_logp[a] (onehot(a) - p) + ent_coef / B * p (logp + H)
        d loss / d value   = 2 vf_coef (value - ret) / B

    ``tests/test_kernels.py`` checks loss, statistics and gradients against the autograd path."""

    @staticmethod
    def forward(ctx, logits, value, actions, old_log_probs, adv, ret, clip, ent_coef, vf_coef):
        logp = torch.log_softmax(logits, dim=-1)
        p = logp.exp()
        entropy = -(p * logp).sum(-1)
        idx = actions.long().unsqueeze(-1)
        logratio = logp.gather(-1, idx).squeeze(-1) - old_log_probs
        ratio = logratio.exp()
        clipped = ratio.clamp(1.0 - clip, 1.0 + clip)
        pg_loss = torch.max(-adv * ratio, -adv * clipped).mean()
        v_err = value - ret
        v_loss = v_err.square().mean()
        ent = entropy.mean()
        loss = pg_loss - ent_coef * ent + vf_coef * v_loss
        n = logits.shape[0]
        # the surrogate's gradient flows where the unclipped term is the one used
        live = (ratio == clipped) | (-adv * ratio > -adv * clipped)
        d_logp_a = torch.where(live, -adv * ratio, 0.0).div_(n)
        ctx.save_for_backward(logp, p, entropy, idx, d_logp_a, v_err)
        ctx.ent_scale, ctx.v_scale = ent_coef / n, 2.0 * vf_coef / n
        approx_kl = ((ratio - 1.0) - logratio).mean()
        clipfrac = ((ratio - 1.0).abs() > clip).float().mean()
        stats = torch.stack([pg_loss, v_loss, ent, approx_kl, clipfrac])
        ctx.mark_non_differentiable(stats)
        return loss, stats

    @staticmethod
    def backward(ctx, grad_loss, _grad_stats):
        logp, p, entropy, idx, d_logp_a, v_err = ctx.saved_tensors
        d_logits = p * (logp + entropy.unsqueeze(-1)) * ctx.ent_scale
        d_logits.addcmul_(p, d_logp_a.unsqueeze(-1), value=-1.0)
        d_logits.scatter_add_(-1, idx, d_logp_a.unsqueeze(-1))
        d_value = v_err * ctx.v_scale
        if grad_loss is not None:
            d_logits.mul_(grad_loss)
            d_value = d_value * grad_loss
        return d_logits, d_value, None, None, None, None, None, None, None
