"""Every registered kernel (``corral.kernels.registry``) against the readable code it replaces, on
fixed inputs at the presets' shapes, to its registered tolerance; an edit to a reference that the
kernel does not follow fails here (``test_an_edit_to_the_reference_is_reported``); and a
subclass that overrides a reference runs its own code (the newcomer's QR-DQN variant)."""

from __future__ import annotations

import functools
import importlib
import itertools
import pkgutil
from types import SimpleNamespace

import gymnasium as gym
import pytest
import torch
import torch.nn.functional as F

import corral.kernels
from corral import nets
from corral.actors import offpolicy as actors_offpolicy
from corral.actors.distributional import QuantileQNetwork
from corral.algos import distributional as D
from corral.algos import dqn as dqn_module
from corral.algos import get_algo
from corral.algos import ppo as ppo_module
from corral.algos.distributional import QRDQN, quantile_huber_loss
from corral.algos.dqn import DQN
from corral.algos.ppo import PPO, PPOConfig, ppo_loss
from corral.kernels.compiled import update_compile
from corral.kernels.greedy import greedy_numpy
from corral.kernels.mlp import fast_tanh_
from corral.kernels.quantile import QuantileHuber
from corral.kernels.registry import BIT_EXACT, KERNELS, Replaces, register
from corral.rng import RNGStreams
from tests.test_offpolicy import fill, make

for _m in pkgutil.walk_packages(corral.kernels.__path__, "corral.kernels."):  # every kernel registers on import
    importlib.import_module(_m.name)


def _resolve(where: str):
    module, _, qualname = where.partition(":")
    obj = importlib.import_module(module)
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def readable(cls, method: str = "phases"):
    """``cls`` with ``method`` restated as a call to ``cls``'s own: the kernel that follows it
    steps aside (``Replaces``), so the object runs the readable code, whatever ``cls.<method>``
    is when it runs (an edit monkeypatched onto ``cls`` included)."""
    if method == "phases":
        def phases(self, *a, **k):
            return (yield from cls.phases(self, *a, **k))
        body = {"phases": phases}
    else:
        body = {method: lambda self, *a, **k: getattr(cls, method)(self, *a, **k)}
    return type(f"Readable{cls.__name__}", (cls,), body)


def _build(cls, name: str, env_id: str, **overrides):
    """An algorithm of class ``cls`` with the registry entry ``name``'s Config and overrides, as
    ``tests/test_offpolicy.make`` builds it (the same seeds: the same initial weights)."""
    env, spec = gym.make(env_id), get_algo(name)
    cfg = spec.cls.Config()
    for k, v in {**spec.overrides, **overrides}.items():
        setattr(cfg, k, v)
    algo = cls(cfg, env.observation_space, env.action_space, 1, torch.device("cpu"), RNGStreams(0))
    algo.total_steps = 1000
    return algo


# --- the cases: each returns (the kernel's results, the reference's results), the same structure

def _direct_step(name: str, options: dict, steps: int = 6):
    """``steps`` gradient steps of the kernel (``train_step`` where it is in force) and of the
    readable ``phases`` under autograd, on the same replay draws: losses, priorities, parameters
    and the optimizer's moments."""
    fast = make(name, "CartPole-v1", **options)
    ref = _build(readable(type(fast)), name, "CartPole-v1", **options)
    assert fast._direct_chain() is not None and ref._direct_chain() is None
    for a in (fast, ref):
        fill(a, 200, 4, None)
    out = []
    B = fast.cfg.batch_size
    for a in (fast, ref):
        got = []
        for _ in range(steps):
            batch = a.replay.sample(B)
            stats, td = a.train_step(batch, a.shared_targets(batch))
            got += [stats["q_loss"], stats["q_mean"], td]
        opt = a.optimizer
        out.append([*got, *[p.detach() for p in a.actor.parameters()], opt.exp_avg, opt.exp_avg_sq])
    return out


# the CartPole presets' shapes and optimizer (corral/presets/dqn.yaml, qrdqn.yaml)
DQN_PRESET = dict(learning_starts=0, batch_size=64, hidden=(256, 256), lr=2.3e-3)
QRDQN_PRESET = dict(DQN_PRESET, n_quantiles=10, init="torch", adam_eps=1.5625e-4, max_grad_norm=None)


def case_dqn_direct_step():
    cases = [("dqn", DQN_PRESET), ("dqn", dict(DQN_PRESET, prioritized=True, normalize_obs=True)),
             ("mdqn", DQN_PRESET)]
    runs = [_direct_step(name, options) for name, options in cases]
    return [r[0] for r in runs], [r[1] for r in runs]


def case_qrdqn_direct_step():
    cases = [QRDQN_PRESET, dict(QRDQN_PRESET, prioritized=True, normalize_obs=True, activation="tanh")]
    runs = [_direct_step("qrdqn", options) for options in cases]
    return [r[0] for r in runs], [r[1] for r in runs]


def case_quantile_huber():
    """Values and gradients at QR-DQN's (64 x 10 quantiles), IQN's (32 x 64 sampled fractions
    against 64) and TQC's (256 x 25 against the 230 kept) shapes."""
    g = torch.Generator().manual_seed(0)
    fast, ref = [], []
    for B, N, M, per_row in ((64, 10, 10, False), (32, 64, 64, True), (256, 25, 230, False)):
        pred = torch.randn(B, N, generator=g) * 3
        target = torch.randn(B, M, generator=g) * 3
        taus = torch.rand(B, N, generator=g) if per_row else (torch.arange(N) + 0.5) / N
        up = torch.randn(B, generator=g)
        for out, fn in ((fast, QuantileHuber.apply), (ref, D.quantile_huber_loss)):
            p = pred.clone().requires_grad_(True)
            loss = fn(p, target, taus, 1.0)
            (grad,) = torch.autograd.grad((loss * up).sum(), [p])
            out += [loss.detach(), grad]
    return fast, ref


def case_quantile_huber_fused():
    """``QuantileHuber`` inside a ``compile: true`` update (torch.compile's fused loop) at TQC's
    preset shape (256 x 50 pooled quantiles against the 46 kept atoms), values and gradients."""
    g = torch.Generator().manual_seed(1)
    pred, target = torch.randn(256, 50, generator=g) * 3, torch.randn(256, 46, generator=g) * 3
    taus, up = ((torch.arange(25) + 0.5) / 25).repeat(2), torch.randn(256, generator=g)
    fast, ref = [], []
    for out, fn in ((fast, QuantileHuber.apply), (ref, D.quantile_huber_loss)):
        p = pred.clone().requires_grad_(True)
        with update_compile(fn is QuantileHuber.apply):
            loss = fn(p, target, taus, 1.0)
        (grad,) = torch.autograd.grad((loss * up).sum(), [p])
        out += [loss.detach(), grad]
    return fast, ref


class _NotCategorical:
    """An actor-critic seen without its Categorical head: ``ppo_loss`` takes its readable branch."""

    head = None

    def __init__(self, actor):
        self.actor = actor

    def evaluate_actions(self, obs, actions):
        return self.actor.evaluate_actions(obs, actions)


def case_categorical_ppo_loss():
    """One minibatch of the CartPole preset (256 rows, the 64 x 64 actor-critic), ratios on both
    sides of the clip range, both advantage signs: loss, statistics and parameter gradients."""
    torch.manual_seed(0)
    env = gym.make("CartPole-v1")
    cfg = PPOConfig(n_steps=32, batch_size=256, ent_coef=0.01, vf_coef=0.5)
    actor = PPO(cfg, env.observation_space, env.action_space, 8, torch.device("cpu"), RNGStreams(0)).actor
    g = torch.Generator().manual_seed(1)
    n = 256
    x = torch.randn(n, 4, generator=g)
    actions = torch.randint(0, 2, (n,), generator=g)
    with torch.no_grad():
        logp = torch.log_softmax(actor.outputs(x)[0], -1).gather(-1, actions[:, None]).squeeze(-1)
    old = logp + torch.randn(n, generator=g) * 0.4
    adv, ret = torch.randn(n, generator=g), torch.randn(n, generator=g)
    out = []
    for a in (actor, _NotCategorical(actor)):
        loss, stats = ppo_loss(a, x, actions, old, torch.zeros(n), adv, ret, 0.2, cfg, normalize_adv=True)
        out.append([loss.detach(), stats, *torch.autograd.grad(loss, list(actor.parameters()))])
    return out


def _greedy_nets():
    """DQN's, QR-DQN's and C51's CartPole nets, weights moved off their init."""
    nets_ = []
    for name, options in (("dqn", dict(DQN_PRESET)), ("qrdqn", QRDQN_PRESET), ("c51", dict(DQN_PRESET))):
        net = make(name, "CartPole-v1", **options).actor
        with torch.no_grad():
            for p in net.parameters():
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(p.numel())) * 0.05)
        nets_.append(net)
    return nets_


def case_greedy_numpy():
    obs = torch.randn(64, 4, generator=torch.Generator().manual_seed(2)) * 2
    fast, ref = [], []
    for net in _greedy_nets():
        fast.append(torch.from_numpy(greedy_numpy(net, obs)))
        with torch.no_grad():
            ref.append(net.q(obs).argmax(-1))
    return fast, ref


def case_epsilon_greedy_numpy():
    """200 acting steps on 1 and on 3 envs at an epsilon between 0 and 1, the same noise stream:
    the kernel's choices and ``DQN.explore``'s torch branch's."""
    out = ([], [])
    for n, (name, cls, options) in itertools.product((1, 3), (("qrdqn", QRDQN, QRDQN_PRESET), ("dqn", DQN, DQN_PRESET))):
        fast = make(name, "CartPole-v1", **dict(options, exploration_fraction=0.5))
        ref = _build(readable(cls, "greedy"), name, "CartPole-v1", **dict(options, exploration_fraction=0.5))
        for a in (fast, ref):
            a.total_steps, a.env_steps = 1000, 250
        assert 0.3 < fast.epsilon < 0.7 and fast.numpy_acting.in_force(type(fast))
        g = torch.Generator().manual_seed(3)
        for _ in range(200):
            obs = torch.randn(n, 4, generator=g)
            for side, a in zip(out, (fast, ref)):
                side.append(a.explore(obs)[0])
        assert fast._acts_in_numpy(obs) and not ref._acts_in_numpy(obs)
    return out


def _mlp_grads(net, x, up, forward):
    xg = x.clone().requires_grad_(True)
    y = forward(net, xg)
    return [y.detach(), *torch.autograd.grad((y * up).sum(), [xg, *net.parameters()])]


def case_mlp_fused():
    """A SAC actor's MLP (3 -> 256 -> 256 -> 2, relu) and a tanh one, on 256 rows."""
    fast, ref = [], []
    for act, out_dim in (("relu", 2), ("tanh", 20)):
        torch.manual_seed(4)
        net = nets.MLP(3, (256, 256), act, out_dim=out_dim)
        x = torch.randn(256, 3)
        up = torch.randn(256, out_dim)
        fast += _mlp_grads(net, x, up, lambda m, v: m.fused(v))
        ref += _mlp_grads(net, x, up, lambda m, v: m(v))
    return fast, ref


def case_parallel_mlp():
    """SAC's twin critics (2 x (4 -> 256 -> 256 -> 1), relu) and PPO's actor-critic bodies
    (2 x (4 -> 64 -> 64), tanh) on 256 rows: the kernel and ``forward``'s readable loop
    (``members``: every member)."""
    fast, ref = [], []
    for n, in_dim, hidden, act, out_dim in ((2, 4, (256, 256), "relu", 1), (2, 4, (64, 64), "tanh", None)):
        torch.manual_seed(5)
        net = nets.ParallelMLP(n, in_dim, hidden, act, out_dim=out_dim)
        x = torch.randn(256, in_dim)
        up = torch.randn(n, 256, net.out_dim)
        fast += _mlp_grads(net, x, up, lambda m, v: m(v))
        ref += _mlp_grads(net, x, up, lambda m, v: m(v, members=torch.arange(m.n)))
    return fast, ref


def case_squashed_gaussian():
    """A SAC actor loss's sample on 256 rows of a 6-dimensional action (HalfCheetah's), log stds
    inside and beyond the clamp: actions, log-probs and the gradient of a mix of both."""
    g = torch.Generator().manual_seed(6)
    out = torch.cat([torch.randn(256, 6, generator=g), torch.randn(256, 6, generator=g) * 8 - 4], -1)
    noise = torch.randn(256, 6, generator=g)
    up_a, up_l = torch.randn(256, 6, generator=g), torch.randn(256, generator=g)
    res = []
    for fn in (lambda o: actors_offpolicy._Squash.apply(o, noise),
               lambda o: actors_offpolicy.squashed_sample(*o.chunk(2, dim=-1), noise)[:2]):
        o = out.clone().requires_grad_(True)
        a, logp = fn(o)
        (grad,) = torch.autograd.grad((a * up_a).sum() + (logp * up_l).sum(), [o])
        res.append([a.detach(), logp.detach(), grad])
    return res


def case_fast_tanh():
    z = torch.linspace(-30, 30, 100_001)
    return [fast_tanh_(z.clone())], [torch.tanh(z)]


CASES = {
    "dqn_direct_step": case_dqn_direct_step,
    "qrdqn_direct_step": case_qrdqn_direct_step,
    "quantile_huber": case_quantile_huber,
    "quantile_huber_fused": case_quantile_huber_fused,
    "categorical_ppo_loss": case_categorical_ppo_loss,
    "greedy_numpy": case_greedy_numpy,
    "epsilon_greedy_numpy": case_epsilon_greedy_numpy,
    "mlp_fused": case_mlp_fused,
    "parallel_mlp": case_parallel_mlp,
    "fast_tanh": case_fast_tanh,
    "squashed_gaussian": case_squashed_gaussian,
}


def _leaves(tree):
    if isinstance(tree, (list, tuple)):
        for t in tree:
            yield from _leaves(t)
    else:
        yield tree


def mismatches(name: str) -> list[str]:
    """Where kernel ``name`` and its reference differ beyond the registered tolerance on its case."""
    tol = KERNELS[name].tolerance
    fast, ref = CASES[name]()
    fast, ref = list(_leaves(fast)), list(_leaves(ref))
    assert len(fast) == len(ref), f"{name}: the case returned {len(fast)} results against {len(ref)}"
    out = []
    for i, (a, b) in enumerate(zip(fast, ref)):
        if a is None or b is None:
            if (a is None) != (b is None):
                out.append(f"{name}[{i}]: one side is None")
            continue
        if a.shape != b.shape:
            out.append(f"{name}[{i}]: shapes {tuple(a.shape)} and {tuple(b.shape)}")
        elif tol == BIT_EXACT or not a.is_floating_point():
            if not torch.equal(a, b):
                out.append(f"{name}[{i}]: not bit for bit ({int((a != b).sum())} of {a.numel()} entries differ)")
        elif (diff := (a.double() - b.double()).abs().max().item()) > tol * (scale := b.abs().max().item()):
            out.append(f"{name}[{i}]: differs by {diff:.3g} > {tol:g} x {scale:.3g} (its largest magnitude)")
    return out


@pytest.mark.parametrize("name", sorted(KERNELS))
def test_each_kernel_equals_its_reference(name):
    assert name in CASES, f"kernel {name} ({KERNELS[name].fast}) has no case in tests/test_kernels.py: add one"
    assert mismatches(name) == []


def test_every_case_is_a_registered_kernel_whose_code_and_reference_exist():
    assert set(CASES) <= set(KERNELS), sorted(set(CASES) - set(KERNELS))
    for k in KERNELS.values():
        assert callable(_resolve(k.fast)) and callable(_resolve(k.reference)), k
        assert k.tolerance >= 0 and k.runs


# --- an edit to a reference that its kernel does not follow is reported

def _scaled_kappa(fn):
    return lambda pred, target, taus, kappa: fn(pred, target, taus, 0.5 * kappa)


EDITS = {
    # DQN.phases with the Huber loss's threshold at 0.5 (the module's F: the kernel keeps its own)
    "dqn_direct_step": lambda mp: mp.setattr(dqn_module, "F", SimpleNamespace(
        smooth_l1_loss=functools.partial(F.smooth_l1_loss, beta=0.5))),
    # QRDQN.phases' loss at half kappa
    "qrdqn_direct_step": lambda mp: mp.setattr(D, "quantile_huber", _scaled_kappa(D.quantile_huber)),
    "quantile_huber": lambda mp: mp.setattr(D, "quantile_huber_loss", _scaled_kappa(D.quantile_huber_loss)),
    "quantile_huber_fused": lambda mp: mp.setattr(D, "quantile_huber_loss", _scaled_kappa(D.quantile_huber_loss)),
    # ppo_loss's value regression as a Huber loss
    "categorical_ppo_loss": lambda mp: mp.setattr(ppo_module, "F", SimpleNamespace(mse_loss=F.smooth_l1_loss)),
    # Q as the largest quantile instead of their mean (expectation_numpy not edited with it)
    "greedy_numpy": lambda mp: mp.setattr(QuantileQNetwork, "expectation", lambda self, out: out.amax(-1)),
    "epsilon_greedy_numpy": lambda mp: mp.setattr(QuantileQNetwork, "expectation", lambda self, out: out.amax(-1)),
    "mlp_fused": lambda mp: mp.setattr(nets, "linear", lambda x, w, b: F.linear(x, w, b) + 1e-3),
    "parallel_mlp": lambda mp: mp.setattr(nets, "baddbmm", lambda b, x, w: torch.baddbmm(b, x, w) + 1e-3),
    # the log-prob scaled (the kernel's values follow, through squashed_sample; its gradient does not)
    "squashed_gaussian": lambda mp: mp.setattr(actors_offpolicy, "squashed_sample", _scaled_log_prob(
        actors_offpolicy.squashed_sample)),
}


def _scaled_log_prob(fn):
    def edited(mean, log_std, noise, log_prob=True):
        action, logp, pre, spread = fn(mean, log_std, noise, log_prob)
        return action, None if logp is None else 1.1 * logp, pre, spread
    return edited


@pytest.mark.parametrize("name", sorted(EDITS))
def test_an_edit_to_the_reference_is_reported(name, monkeypatch):
    """The check above, run after a small edit to the reference's math that the kernel does not
    follow: it reports the mismatch (so such an edit fails ``test_each_kernel_equals_its_reference``)."""
    assert mismatches(name) == []
    EDITS[name](monkeypatch)
    assert mismatches(name), f"{name}: an edit to {KERNELS[name].reference} went unnoticed"


def test_every_kernel_with_a_reference_in_corral_has_an_edit_shown():
    ours = {n for n, k in KERNELS.items() if k.reference.startswith("corral.")}
    assert ours <= set(EDITS), sorted(ours - set(EDITS))


# --- a subclass that overrides the reference runs its own code

class PlainQuantileRegressionQRDQN(QRDQN):
    """A newcomer's QR-DQN variant: ``phases`` copied from QR-DQN's with the loss changed to plain
    quantile regression (kappa 0), at the preset's kappa of 1."""

    calls = 0

    def phases(self, batch, noise, shared=None):
        type(self).calls += 1
        quantiles, next_q_online = self.online(batch)
        with torch.no_grad():
            target = self.td_targets(batch, shared, next_q_online)
        chosen = quantiles.gather(1, self.chosen_index(batch)).squeeze(1)
        per_sample = quantile_huber_loss(chosen, target, self.taus, 0.0)
        loss, stats, td = self.finish(per_sample, batch, chosen.detach())
        yield self.optimizer, loss
        return stats, td


def test_a_newcomers_qrdqn_variant_trains_with_its_own_loss():
    variant = _build(PlainQuantileRegressionQRDQN, "qrdqn", "CartPole-v1", **dict(QRDQN_PRESET, gradient_steps=4))
    plain = make("qrdqn", "CartPole-v1", **QRDQN_PRESET)
    assert variant.cfg.kappa == 1.0 and plain._direct_chain() is not None
    assert variant._direct_chain() is None  # the kernel steps aside for the subclass's own phases
    for a in (variant, plain):
        fill(a, 200, 4, None)
    batch = variant.replay.sample(64)
    plain.replay.sample(64)
    with torch.no_grad():  # the variant's loss, from the weights before the step
        chosen = variant.actor.out(batch.obs).gather(1, variant.chosen_index(batch)).squeeze(1)
        own = quantile_huber_loss(chosen, variant.td_targets(batch, None, None), variant.taus, 0.0).mean()
    stats, _ = variant.train_step(batch)
    plain_stats, _ = plain.train_step(batch)
    assert torch.equal(stats["q_loss"], own) and not torch.equal(stats["q_loss"], plain_stats["q_loss"])
    # its updates in the learner's loop are its own steps too
    PlainQuantileRegressionQRDQN.calls = 0
    variant.env_steps = 1000
    variant.update(0.5)
    assert PlainQuantileRegressionQRDQN.calls == variant.cfg.gradient_steps


def test_replaces_follows_the_methods_it_names():
    @register("test_only_kernel", reference="tests.test_kernels:test_replaces_follows_the_methods_it_names",
              tolerance=BIT_EXACT, runs="never")
    def kernel():
        return None

    try:
        class Base:
            def step(self):
                return 1
            fast = Replaces(kernel, step=step)

        class Other(Base):
            def helper(self):
                return 2

        class Edited(Base):
            def step(self):
                return 3

        assert Base.fast.in_force(Base) and Base.fast.in_force(Other) and not Base.fast.in_force(Edited)
        with pytest.raises(ValueError, match="not a registered kernel"):
            Replaces(lambda: None, step=Base.step)
        with pytest.raises(ValueError, match="registered twice"):
            register("test_only_kernel", reference="x:y", tolerance=0.0, runs="never")(lambda: None)
    finally:
        KERNELS.pop("test_only_kernel")


def test_dqn_variants_that_override_a_followed_method_act_and_step_through_torch():
    assert not DQN.direct.in_force(readable(DQN)) and not DQN.numpy_acting.in_force(readable(DQN, "greedy"))
    assert QRDQN.direct.in_force(QRDQN) and not QRDQN.direct.in_force(D.C51) and DQN.direct.in_force(
        type(make("mdqn", "CartPole-v1")))
