"""The one-pass MIMO policy's forward pass for a single channel, in numpy: the MLP in single
precision (as in the batched torch path), the structure and the unrolled layers in double.

At batch 1 a forward pass is some 200 tiny operations, and their cost is dispatch, not
arithmetic: numpy's per-operation overhead, and LAPACK's Cholesky called directly through
scipy's wrappers, are several times lower than torch's. :func:`export` copies a
:class:`~corral.problems.mimo_policy.BeamPolicy`'s weights once; :func:`act_one` computes what
``BeamPolicy.forward`` does with fewer calls (each layer reuses the previous one's ``Gm X``, a
power is one ``vdot``; ``tests/test_problems_mimo.py`` checks that the two agree).
Without scipy it falls back to ``numpy.linalg.solve`` (slower, same result).
"""

from __future__ import annotations

import math

import numpy as np
from torch import nn

try:  # scipy is an optional dependency (corral[solve])
    from scipy.linalg.lapack import zpotrf, zpotrs
except ImportError:  # pragma: no cover - exercised only without scipy
    zpotrf = zpotrs = None


def export(policy) -> dict:
    """The weights and constants of a ``BeamPolicy`` as numpy arrays (the MLP's in float32)."""
    body = []
    for mod in policy.body:
        if isinstance(mod, nn.Linear):
            body.append(("linear", mod.weight.detach().float().numpy().T.copy(),
                         mod.bias.detach().float().numpy().copy()))
        elif isinstance(mod, nn.LayerNorm):
            body.append(("norm", mod.weight.detach().float().numpy().copy(),
                         mod.bias.detach().float().numpy().copy(), mod.eps))
        elif isinstance(mod, nn.SiLU):
            body.append(("silu",))
        else:  # pragma: no cover - BeamPolicy builds only these
            raise TypeError(f"mimo_fast cannot export {type(mod).__name__}")
    k = policy.k
    return {"n": policy.n, "k": k, "P": policy.P, "noise": policy.noise, "body": body,
            "head": (policy.head.weight.detach().float().numpy().T.copy(),
                     policy.head.bias.detach().float().numpy().copy()),
            "mu_scale": np.exp(policy.theta.detach().double().clamp(-3.0, 3.0).numpy()) * (policy.noise / policy.P),
            "beta": policy.beta.detach().double().numpy().copy(),
            "eye": np.eye(k, dtype=np.complex128), "diag": np.arange(k) * (k + 1)}


def _solve(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """``A^-1 B`` for a Hermitian positive definite ``A`` (Cholesky; LU if that fails)."""
    if zpotrf is not None:
        c, info = zpotrf(A, lower=1)
        if info == 0:
            return zpotrs(c, B, lower=1)[0]
    return np.linalg.solve(A, B)


def _mlp(f: dict, gram: np.ndarray) -> np.ndarray:
    g = gram[0]
    ph = g / np.maximum(np.abs(g), 1e-12)
    gauged = gram * ph[:, None] * ph.conj()[None, :] / f["n"]
    x = np.concatenate([gauged.real.ravel(), gauged.imag.ravel(), np.log(gram.real.flat[f["diag"]] / f["n"] + 1e-6)])
    x = x.astype(np.float32)  # the MLP in single precision, as in the batched path
    for op in f["body"]:
        if op[0] == "linear":
            x = x @ op[1] + op[2]
        elif op[0] == "norm":  # sums and a dot product: fewer numpy calls than mean()
            x = x - x.sum() / x.size
            x = x * (op[1] / math.sqrt(float(x @ x) / x.size + op[3])) + op[2]
        else:
            x = x / (1.0 + np.exp(-x))
    return (x @ f["head"][0] + f["head"][1]).astype(np.float64)


def _softmax(z: np.ndarray, total: float) -> np.ndarray:
    e = np.exp(z - z.max())
    return e * (total / e.sum())


def act_one(f: dict, H: np.ndarray) -> np.ndarray:
    """Beams ``[N, K]`` (complex128, total power ``P (1 - 1e-12)``) for one channel ``H [K, N]``."""
    k, P, noise, diag = f["k"], f["P"], f["noise"], f["diag"]
    H = np.asarray(H, dtype=np.complex128)
    Hh = H.conj().T
    gram = H @ Hh
    out = _mlp(f, gram)
    lam, p = _softmax(out[:k], P), _softmax(out[k:], P)
    A = gram.copy()
    A.flat[diag] += noise / lam
    X = _solve(A, f["eye"])
    GX = gram @ X
    scale = np.sqrt(p / (X.conj() * GX).real.sum(0))
    X, G = X * scale, GX * scale  # G = gram @ X, carried along so each layer does one product fewer
    for mu_scale, beta in zip(f["mu_scale"], f["beta"]):
        M = G.real * G.real + G.imag * G.imag
        T = M.sum(1) + noise
        S = np.maximum(M.flat[diag], 1e-12)
        a = S / (T * (T - S))
        A = gram.copy()
        A.flat[diag] += (mu_scale * a.sum()) / a
        X = X + beta * (_solve(A, f["eye"]) * (G.flat[diag] * (T / S)) - X)  # A^-1 diag(v): columns scaled
        GX = gram @ X
        c = math.sqrt(P / np.vdot(X, GX).real)  # the power tr(X^H Gm X)
        X, G = X * c, GX * c
    W = Hh @ X
    return W * math.sqrt(P * (1 - 1e-12) / np.vdot(W, W).real)
