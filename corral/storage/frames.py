"""Frame stacks in the replay ring (``frame_stack > 1``; "Frame stacks" in
``corral.storage.replay``): a row holds the newest frame of each observation, and a stack is
rebuilt from the rows up to it, back to the nearest start."""

from __future__ import annotations

import torch

from corral.storage.replay_parts import _CONTINUES, _KEPT


class FrameStackParts:
    """``ReplayBuffer``'s frame-stack writes and reads (a part of it: it reads the ring's
    tensors and counters)."""

    def _add_frames(self, obs: torch.Tensor, first: bool = False) -> None:
        """Frame-stack ``add`` of ``obs [N, *obs_shape]``: the newest frame of each stack goes
        in the row. A stack that is not the column's previous one shifted by a frame starts
        a chain: it is its newest frame repeated (a reset, as Gymnasium and EnvPool pad), or
        it is kept whole in ``_heads`` (zero padding, another env's fragment, anything else)."""
        N, k, step = self.num_envs, self.frame_stack, self._steps
        obs = obs.to(self.device, self.obs_dtype)
        stacks = obs.reshape(N, k, -1)
        row = step % self._obs_rows
        self._obs[row] = stacks[:, -1].reshape(N, *self.frame_shape)
        if step == 0 or first:
            starts = torch.ones(N, dtype=torch.bool, device=self.device)
        else:
            starts = (stacks[:, :-1] != self._last_obs.view(N, k, -1)[:, 1:]).reshape(N, -1).any(1)
        self._last_obs.copy_(obs)
        if not starts.any():
            self._starts[row] = _CONTINUES
            return
        kept = starts & (stacks[:, :-1] != stacks[:, -1:]).reshape(N, -1).any(1)
        self._starts[row] = torch.where(kept, _KEPT, starts.to(torch.uint8))  # _PADDED == 1
        if kept.any():
            ids = kept.nonzero().squeeze(1)
            # a start's stack is read while slots up to k - 2 steps later are live; its frames' rows outlast that
            self._heads.put(step * N + ids, obs[ids], max(0, step + 1 - self._obs_rows) * N)

    def _stacks(self, step: torch.Tensor, env: torch.Tensor) -> torch.Tensor:
        """The observations (whole stacks) of columns ``env`` at global steps ``step``, both ``[B]``.

        Position ``p`` of a stack holds the frame ``j = k - 1 - p`` steps back. Going back
        stops at the nearest start ``d`` steps back (``d <= k - 2``; a stack ``k - 1`` back
        or more is not needed): positions with ``j <= d`` are frames of this episode, the
        others the start's own stack shifted by ``d``: its frame repeated (``_PADDED``) or
        the stack kept whole in ``_heads`` (``_KEPT``).
        """
        k, N, R = self.frame_stack, self.num_envs, self._obs_rows
        B = step.numel()
        kinds = self._starts_flat[((step[:, None] - self._start_lags) % R) * N + env[:, None]]  # [B, k-1]
        starts = kinds != _CONTINUES
        d = torch.where(starts.any(1), starts.to(torch.uint8).argmax(1), k)  # k: no start within reach
        lags = torch.minimum(self._stack_lags, d[:, None])  # [B, k]: a padded start repeats its own frame
        rows = (step[:, None] - lags) % R
        out = self._obs_flat[rows * N + env[:, None]]  # [B, k, *frame_shape]
        kept = kinds.gather(1, d.clamp(max=k - 2)[:, None]).squeeze(1) == _KEPT
        near = (kept & (d < k - 1)).nonzero().squeeze(1)
        if near.numel():
            dn = d[near]
            head = self._heads.get((step[near] - dn) * N + env[near]).view(-1, k, *self.frame_shape)
            src = (self._stack_lags.flip(0) + dn[:, None]).clamp_(max=k - 1)  # position p -> p + d of the head
            shifted = head[torch.arange(near.numel(), device=self.device)[:, None], src]
            before = (self._stack_lags > dn[:, None]).view(-1, k, *([1] * len(self.frame_shape)))
            out[near] = torch.where(before, shifted, out[near])
        return out.view(B, *self.obs_shape)
