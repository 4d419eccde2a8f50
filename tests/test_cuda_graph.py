"""The CUDA-graphed gradient step (``cuda_graph``, ``corral/algos/graphed.py``).

On CPU (CI): the graphed step with graphs off (static buffers filled every step, the step run
eagerly on them) leaves every parameter, optimizer moment, counter and metric bit for bit
where the regular update does, for every algorithm that declares its step capturable; and
that step reads no tensor value on the host and draws nothing from torch's global generator
(either would break a captured graph). On a GPU: the replayed graph matches that eager
static step. And ``cuda_graph=on`` is refused, by name, where it cannot apply."""

from __future__ import annotations

import gymnasium as gym
import pytest
import torch

from corral.algos import ALGOS, SAC, get_algo
from corral.algos.graphed import GraphedStep, refusal
from corral.errors import UserError
from corral.rng import RNGStreams

BOX, DISCRETE = gym.make("Pendulum-v1"), gym.make("CartPole-v1")
# small nets, several gradient steps per update, the actor and the targets on alternate steps
TINY = dict(hidden=(16, 16), batch_size=8, learning_starts=0, gradient_steps=3, buffer_size=500)
EXTRA = {"sac": dict(policy_delay=2, target_update_interval=2), "td3": dict(policy_delay=2),
         "dqn": dict(max_grad_norm=1.0)}


def build(name: str, device: str = "cpu", cls=None, **overrides):
    """``name``'s algorithm on tiny nets, on Pendulum's spaces or (Discrete actions) CartPole's."""
    spec = get_algo(name)
    cls = cls or spec.cls
    cfg = cls.Config()
    for k, v in {**spec.overrides, **TINY, **EXTRA.get(cls.name, {}), **overrides}.items():
        setattr(cfg, k, v)
    try:
        env = BOX
        algo = cls(cfg, env.observation_space, env.action_space, 2, torch.device(device), RNGStreams(0, device))
    except UserError as e:
        if "Box" not in str(e):
            raise
        env = DISCRETE
        algo = cls(cfg, env.observation_space, env.action_space, 2, torch.device(device), RNGStreams(0, device))
    algo.total_steps = 1000
    return algo, env


def fill(algo, env, n: int = 64) -> None:
    """The same ``n`` vector steps of made-up transitions into ``algo``'s replay."""
    g = torch.Generator().manual_seed(1)
    obs_dim = env.observation_space.shape[0]
    for _ in range(n):
        obs = torch.randn(2, obs_dim, generator=g)
        if isinstance(env.action_space, gym.spaces.Box):
            action = torch.rand(2, *env.action_space.shape, generator=g) * 4 - 2
        else:
            action = torch.randint(env.action_space.n, (2,), generator=g)
        reward, done = torch.randn(2, generator=g), torch.rand(2, generator=g) < 0.1
        algo.replay.add(obs.to(algo.device), action.to(algo.device), reward.to(algo.device), done.to(algo.device),
                        torch.zeros(2, dtype=torch.bool, device=algo.device),
                        torch.randn(2, obs_dim, generator=g).to(algo.device))
    algo.env_steps = algo.vector_steps = n


def state(algo) -> dict[str, torch.Tensor]:
    out = {}
    for name in algo.networks:
        for k, v in getattr(algo, name).state_dict().items():
            out[f"{name}.{k}"] = v
    for name in algo.optimizers:
        opt = getattr(algo, name)
        if opt is not None:
            sd = opt.state_dict()
            out[f"{name}.exp_avg"], out[f"{name}.exp_avg_sq"] = sd["exp_avg"], sd["exp_avg_sq"]
            out[f"{name}.steps"] = torch.tensor(sd["steps"])
    for name in algo.free_params:
        out[name] = getattr(algo, name).detach()
    out["grad_steps"] = torch.tensor(algo.grad_steps)
    return out


def capturable_names() -> list[str]:
    """Every registered algorithm whose default config the graphed step takes."""
    names = []
    for name, spec in ALGOS.items():
        if not getattr(spec.cls, "capturable", False):
            continue
        algo, _ = build(name)
        if refusal(algo) is None:
            names.append(name)
    return names


CAPTURED = capturable_names()


def test_sac_td3_and_dqn_are_captured():
    assert {"sac", "tqc", "td3", "ddpg", "dqn", "double_dqn", "d3qn"} <= set(CAPTURED)


class _HostReads:
    """Counts host reads of tensor values (``.item()``, ``bool()``, ...) while on."""

    NAMES = ("item", "__bool__", "__int__", "__float__", "tolist", "numpy", "__index__")

    def __init__(self):
        self.count, self.saved = 0, {}

    def __enter__(self):
        for k in self.NAMES:
            f = self.saved[k] = getattr(torch.Tensor, k)
            setattr(torch.Tensor, k, self._counting(f))
        return self

    def _counting(self, f):
        def g(t, *a, **kw):
            self.count += 1
            return f(t, *a, **kw)
        return g

    def __exit__(self, *exc):
        for k, f in self.saved.items():
            setattr(torch.Tensor, k, f)


@pytest.mark.parametrize("name", CAPTURED)
def test_the_static_step_equals_the_regular_update_bit_for_bit(name):
    eager, env = build(name)
    static, _ = build(name)
    fill(eager, env)
    fill(static, env)
    step = static._graphed = GraphedStep(static, capture=False)
    runs = []
    real_run = step._run

    def run(*args):  # the step itself: no host reads, no global random draws
        rng = torch.get_rng_state()
        with _HostReads() as reads:
            out = real_run(*args)
        runs.append((reads.count, torch.equal(rng, torch.get_rng_state())))
        return out

    step._run = run
    for i in range(4):
        a, b = eager.update(0.5), static.update(0.5)
        assert a == b, f"update {i}: metrics differ"
        if i == 1:  # a target update between updates (DQN's cadence: in observe)
            eager.target_update()
            static.target_update()
    sa, sb = state(eager), state(static)
    assert sa.keys() == sb.keys()
    for k in sa:
        assert torch.equal(sa[k], sb[k]), f"{name}: {k} differs after {eager.grad_steps} gradient steps"
    assert runs and all(reads == 0 for reads, _ in runs), f"{name}: host reads inside the step: {runs}"
    assert all(same for _, same in runs), f"{name}: the step draws from torch's global generator"


class _NotDeclared(SAC):
    capturable = False


@pytest.mark.parametrize("name,overrides,needle", [
    ("sac", {}, "CUDA graphs need device=cuda"),
    ("per_dqn", {}, "prioritized replay samples each step"),
    ("sac", dict(prioritized=True), "prioritized replay samples each step"),
    ("r2d2", {}, "keeps its own replay"),
    ("sac", dict(cls=_NotDeclared), "not declared capturable"),
])
def test_cuda_graph_on_is_refused_by_name_where_it_cannot_apply(name, overrides, needle):
    with pytest.raises(UserError, match=needle) as e:
        build(name, cuda_graph="on", **overrides)
    assert "cuda_graph=auto" in str(e.value)


def test_auto_and_off_keep_the_eager_update_on_cpu():
    for mode in ("auto", "off"):
        algo, env = build("sac", cuda_graph=mode)
        fill(algo, env)
        algo.update(0.5)
        assert algo._graphed is None


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("name", ["sac", "tqc", "td3", "dqn"])
def test_the_replayed_graph_matches_the_eager_static_step_on_cuda(name):
    eager, env = build(name, "cuda", cuda_graph="off")
    graphed, _ = build(name, "cuda", cuda_graph="on")
    fill(eager, env)
    fill(graphed, env)
    eager._graphed = GraphedStep(eager, capture=False)
    for _ in range(12):  # past the warm-up steps and the captures, into replays
        a, b = eager.update(0.5), graphed.update(0.5)
        assert a.keys() == b.keys()
        for k in a:
            assert a[k] == pytest.approx(b[k], rel=1e-5, abs=1e-6), k
    assert graphed._graphed.graphs, "nothing was captured"
    sa, sb = state(eager), state(graphed)
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], rtol=1e-5, atol=1e-6, msg=f"{name}: {k}")
