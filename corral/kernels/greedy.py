"""Epsilon-greedy acting on a few CPU rows in numpy: the value family's collection step.

An epsilon-greedy step acts on one row: torch dispatches each of the ~10 ops of that in ~4 us,
numpy in ~1 us. ``greedy_numpy`` runs a chain net (``QNetwork.chain``, ``ZNetwork.chain``) through numpy views of
its weights; ``epsilon_greedy_numpy`` makes ``DQN.explore``'s epsilon decision in numpy from
the same draws. References: ``QNetwork.q`` / ``ZNetwork.q(obs).argmax(-1)`` and ``DQN.explore``'s torch branch
(``tests/test_kernels.py``: the same actions)."""

from __future__ import annotations

import numpy as np
import torch

from corral.kernels.registry import BIT_EXACT, register


def _owner(cls: type, name: str) -> type | None:
    return next((c for c in cls.__mro__ if name in c.__dict__), None)


def _numpy_views(net):
    """``(params, their data pointers, [(w^T, b, activation or None)])`` of the net's chain, or
    False where it is not a chain, or where its ``expectation`` has no numpy twin written beside
    it (a subclass that changes ``expectation`` alone acts through torch)."""
    chain = net.chain()
    if chain is None or _owner(type(net), "expectation") is not _owner(type(net), "expectation_numpy"):
        return False
    params, acts, act = chain
    fn = {"relu": lambda h: np.maximum(h, 0, out=h), "tanh": lambda h: np.tanh(h, out=h)}[act]
    layers = [(params[2 * i].detach().numpy().T, params[2 * i + 1].detach().numpy(), fn if a else None)
              for i, a in enumerate(acts)]
    return params, [p.data_ptr() for p in params], layers


@register("greedy_numpy", reference="corral.actors.distributional:ZNetwork.q", tolerance=BIT_EXACT,
          runs="acting with a chain QNetwork (DQN) or ZNetwork (QR-DQN, C51) on <= 16 CPU rows: the same argmax (values may "
               "differ in the last bits, another BLAS, so may exact ties)")
def greedy_numpy(net, obs: torch.Tensor) -> np.ndarray | None:
    """``net.q(obs).argmax(-1)`` as an array, the chain run by numpy on views of the weights, or
    None where the net is not a chain. The views share the parameters' memory, so every
    optimizer step shows at once (a parameter moved to new memory -- a copy, ``.to()`` -- is
    noticed and the views made again)."""
    cached = net.__dict__.get("_numpy")
    if cached is None or (cached and [p.data_ptr() for p in cached[0]] != cached[1]):
        cached = _numpy_views(net)
        net.__dict__["_numpy"] = cached
    if not cached:
        return None
    enc = net.enc
    h = (obs if enc.identity else enc(obs)).detach().numpy()
    for w, b, fn in cached[2]:
        h = h @ w
        h += b
        if fn is not None:
            fn(h)
    if getattr(net, "k", None) is None:  # Q-values straight out of the chain (DQN's QNetwork)
        return h.argmax(-1)
    return net.expectation_numpy(h.reshape(-1, net.n, net.k)).argmax(-1)


@register("epsilon_greedy_numpy", reference="corral.algos.dqn:DQN.explore", tolerance=BIT_EXACT,
          runs="DQN-family acting through greedy_numpy: the same choices from the same draws")
def epsilon_greedy_numpy(net, obs: torch.Tensor, random_action: torch.Tensor, u: torch.Tensor,
                         epsilon: float) -> torch.Tensor:
    """``torch.where(u < epsilon, random_action, greedy)`` decided in numpy; one row: one
    comparison of Python floats (epsilon rounded to float32 as torch's ``<`` does)."""
    if obs.shape[0] == 1:
        at_random = u.item() < float(np.float32(epsilon))
        return random_action if at_random else torch.from_numpy(net.greedy_numpy(obs))
    explore_mask = u.numpy() < epsilon
    if explore_mask.all():
        return random_action
    return torch.from_numpy(np.where(explore_mask, random_action.numpy(), net.greedy_numpy(obs)))
