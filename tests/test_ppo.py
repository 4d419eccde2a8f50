"""PPO pieces checked against independent computations (torch.distributions, hand math)."""

import math

import gymnasium as gym
import numpy as np
import pytest
import torch
from torch.distributions import Categorical, Normal

from corral.actors.actor_critic import ActionScaler
from corral.algos.base import Step
from corral.algos.ppo import PPO, PPOConfig
from corral.nets import CategoricalHead, DiagGaussianHead
from corral.rng import RNGStreams


def test_categorical_head_matches_torch_distributions():
    logits = torch.randn(6, 3)
    logp = CategoricalHead()(logits)
    ref = Categorical(logits=logits)
    a = torch.tensor([0, 1, 2, 2, 1, 0])
    assert torch.allclose(CategoricalHead.log_prob(logp, a), ref.log_prob(a))
    assert torch.allclose(CategoricalHead.entropy(logp), ref.entropy())


def test_categorical_sampling_follows_the_probabilities():
    logp = torch.log(torch.tensor([[0.1, 0.6, 0.3]])).expand(20000, 3)
    g = torch.Generator().manual_seed(0)
    counts = torch.bincount(CategoricalHead.sample(logp, g), minlength=3).float() / 20000
    assert torch.allclose(counts, torch.tensor([0.1, 0.6, 0.3]), atol=0.015)


def test_gaussian_head_matches_torch_distributions():
    head = DiagGaussianHead(2, log_std_init=-0.3)
    mean = torch.randn(5, 2)
    params = head(mean)
    ref = Normal(mean, torch.full_like(mean, -0.3).exp())
    a = torch.randn(5, 2)
    assert torch.allclose(DiagGaussianHead.log_prob(params, a), ref.log_prob(a).sum(-1), atol=1e-6)
    assert torch.allclose(DiagGaussianHead.entropy(params), ref.entropy().sum(-1), atol=1e-6)


def test_actions_are_scaled_to_the_box_bounds_and_clipped():
    scaler = ActionScaler(gym.spaces.Box(np.array([-2.0, 0.0], np.float32), np.array([2.0, 10.0], np.float32)))
    out = scaler(torch.tensor([[-1.0, -1.0], [0.0, 0.0], [1.0, 1.0], [5.0, -5.0]]))
    assert out.tolist() == [[-2.0, 0.0], [0.0, 5.0], [2.0, 10.0], [2.0, 0.0]]


def observe(algo, obs, extras, reward, terminated, truncated, final_obs, next_obs):
    """The one place this file hands a step to ``Algorithm.observe`` (its signature is the
    Learner's business; adapt it here)."""
    algo.observe(Step(obs, extras, reward, terminated, truncated, final_obs, next_obs))


def make_ppo(env_id="CartPole-v1", **kw):
    env = gym.make(env_id)
    cfg = PPOConfig(**{"n_steps": 8, "batch_size": 8, "n_epochs": 1, **kw})
    return PPO(cfg, env.observation_space, env.action_space, 2, torch.device("cpu"), RNGStreams(0))


def test_value_loss_moves_only_value_parameters_and_policy_loss_only_policy_parameters():
    algo = make_ppo()
    ac = algo.actor
    x = torch.randn(10, 4)
    params, value = ac(x)
    value.square().mean().backward()
    for w in list(ac.body.weights) + list(ac.body.biases):
        assert w.grad[0].abs().sum() == 0  # policy member untouched
        assert w.grad[1].abs().sum() > 0
    ac.zero_grad()
    params, value = ac(x)
    CategoricalHead.log_prob(params, torch.zeros(10, dtype=torch.long)).mean().backward()
    for w in list(ac.body.weights) + list(ac.body.biases):
        assert w.grad[1].abs().sum() == 0
        assert w.grad[0].abs().sum() > 0


def test_clipped_surrogate_matches_the_paper_formula():
    """One minibatch with lr=0 lets us read the loss PPO computed and compare with eq. 7."""
    algo = make_ppo(lr=0.0, normalize_advantage=False, vf_coef=0.5, ent_coef=0.0, clip_range=0.2, gamma=0.9, gae_lambda=1.0)
    g = torch.Generator().manual_seed(3)
    obs = torch.randn(8, 2, 4, generator=g)
    with torch.no_grad():  # as in the Learner's collection loop
        for t in range(8):
            env_a, ex = algo.explore(obs[t])
            ex = ex._replace(log_prob=ex.log_prob + torch.randn(2, generator=g) * 0.3)  # another behaviour policy
            observe(algo, obs[t], ex, torch.ones(2), torch.zeros(2, dtype=torch.bool),
                    torch.zeros(2, dtype=torch.bool), obs[t], obs[min(t + 1, 7)])
    d = algo.storage.data
    with torch.no_grad():
        params, values = algo.actor(d.obs.flatten(0, 1))
        logp = CategoricalHead.log_prob(params, d.actions.flatten())
        ratio = (logp - d.log_probs.flatten()).exp()
        # lambda=1 advantages: discounted returns bootstrapped with V(last obs), minus values
        last_v = algo.actor.value(obs[7])
        ret = torch.empty(8, 2)
        running = last_v
        for t in reversed(range(8)):
            running = 1.0 + 0.9 * running
            ret[t] = running
        adv = (ret - d.values).flatten()
        expected_pg = torch.max(-adv * ratio, -adv * ratio.clamp(0.8, 1.2)).mean()
        expected_v = (values - ret.flatten()).square().mean()
    stats = algo.update(progress=0.0)
    assert stats["pg_loss"] == pytest.approx(expected_pg.item(), rel=1e-5)
    assert stats["v_loss"] == pytest.approx(expected_v.item(), rel=1e-5)
    assert stats["clipfrac"] == pytest.approx(((ratio - 1).abs() > 0.2).float().mean().item())


def test_linear_schedules_anneal_learning_rate_and_clip_range():
    algo = make_ppo(lr=1e-3, lr_schedule="linear", clip_schedule="linear")
    with torch.no_grad():
        for t in range(8):
            _, ex = algo.explore(torch.zeros(2, 4))
            observe(algo, None, ex, torch.ones(2), torch.zeros(2, dtype=torch.bool),
                    torch.zeros(2, dtype=torch.bool), torch.zeros(2, 4), torch.zeros(2, 4))
    stats = algo.update(progress=0.75)
    assert stats["lr"] == pytest.approx(2.5e-4) and stats["clip_range"] == pytest.approx(0.05)


def test_batch_larger_than_the_rollout_is_refused():
    from corral.errors import UserError

    with pytest.raises(UserError, match="larger than the rollout"):
        make_ppo(batch_size=64)


class TinyImageEnv(gym.Env):
    """4x36x36 uint8 frames; reward 1 for action matching the bright half."""

    observation_space = gym.spaces.Box(0, 255, (4, 36, 36), np.uint8)
    action_space = gym.spaces.Discrete(2)

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return self._obs(), {}

    def _obs(self):
        self.side = int(self.np_random.integers(2))
        frame = np.zeros((4, 36, 36), np.uint8)
        frame[:, :, self.side * 18:(self.side + 1) * 18] = 200
        return frame

    def step(self, action):
        self.t += 1
        r = float(action == self.side)
        return self._obs(), r, False, self.t >= 20, {}


def test_image_observations_go_through_a_cnn_and_are_stored_as_uint8():
    import corral

    agent = corral.train("ppo", TinyImageEnv, steps=256, seed=0, save_run=False,
                         **{"eval.episodes": 0, "tensorboard": False, "ppo.n_steps": 64, "ppo.batch_size": 32,
                            "ppo.hidden": []})
    assert agent.actor.cnn is not None
    assert agent.algo.storage.data.obs.dtype == torch.uint8
    assert agent.algo.storage.data.obs.shape[2:] == (4, 36, 36)
    frame = TinyImageEnv().reset(seed=0)[0]
    assert agent.act(frame) in (0, 1)


def test_dqn_handles_image_observations_with_its_own_target_encoder():
    import corral

    agent = corral.train("dqn", TinyImageEnv, steps=300, seed=0, save_run=False,
                         **{"eval.episodes": 0, "tensorboard": False, "dqn.learning_starts": 100,
                            "dqn.batch_size": 16, "dqn.train_freq": 4, "dqn.buffer_size": 1000, "dqn.hidden": [32]})
    assert agent.actor.enc.cnn is not None and agent.algo.target.enc.cnn is not agent.actor.enc.cnn
    assert agent.algo.replay._obs.dtype == torch.uint8


def test_multi_categorical_head_matches_independent_torch_categoricals():
    from corral.nets import MultiCategoricalHead

    head = MultiCategoricalHead([3, 2, 4])
    logits = torch.randn(5, 9)
    logp = head(logits)
    a = torch.stack([torch.randint(3, (5,)), torch.randint(2, (5,)), torch.randint(4, (5,))], -1)
    parts = logits.split([3, 2, 4], -1)
    ref_lp = sum(Categorical(logits=p).log_prob(a[:, i]) for i, p in enumerate(parts))
    ref_ent = sum(Categorical(logits=p).entropy() for p in parts)
    assert torch.allclose(head.log_prob(logp, a), ref_lp, atol=1e-6)
    assert torch.allclose(head.entropy(logp), ref_ent, atol=1e-6)
    s = head.sample(logp, torch.Generator().manual_seed(0))
    assert s.shape == (5, 3) and (s < torch.tensor([3, 2, 4])).all()


class PickEnv(gym.Env):
    """MultiDiscrete([3, 2]) or MultiBinary(3): reward counts how many branches pick their last option."""

    def __init__(self, binary: bool = False):
        self.observation_space = gym.spaces.Box(-1, 1, (2,), np.float32)
        self.action_space = gym.spaces.MultiBinary(3) if binary else gym.spaces.MultiDiscrete([3, 2])
        self.last = np.ones(3) if binary else np.array([2, 1])

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(2, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(2, np.float32), float((np.asarray(action) == self.last).sum()), False, self.t >= 10, {}


def test_ppo_learns_multidiscrete_and_multibinary_actions():
    import corral

    for binary, best in ((False, 20.0), (True, 30.0)):
        agent = corral.train("ppo", PickEnv, steps=3000, seed=0, save_run=False,
                             **{"env.kwargs.binary": binary, "eval.episodes": 0, "tensorboard": False,
                                "ppo.n_steps": 100, "ppo.batch_size": 50, "ppo.lr": 3e-3})
        res = corral.evaluate(agent, PickEnv(binary=binary), episodes=3)
        assert res["mean_return"] >= 0.9 * best, (binary, res)


@pytest.mark.parametrize("ent_coef", [0.0, 0.05])
def test_categorical_fast_loss_matches_autograd_of_the_formula(ent_coef):
    """ppo_loss's hand-written gradient (one Categorical head) equals autograd through
    the plain formula, with clipped and unclipped samples of both advantage signs."""
    from corral.algos.ppo import ppo_loss

    torch.manual_seed(0)
    algo = make_ppo(ent_coef=ent_coef, vf_coef=0.7)
    actor = algo.actor.double()
    n = 64
    x = torch.randn(n, 4, dtype=torch.double)
    actions = torch.randint(0, 2, (n,))
    with torch.no_grad():
        logp_now = torch.log_softmax(actor.outputs(x)[0], -1).gather(-1, actions[:, None]).squeeze(-1)
    old = logp_now + torch.randn(n, dtype=torch.double) * 0.4  # ratios on both sides of the clip range
    adv = torch.randn(n, dtype=torch.double)
    ret = torch.randn(n, dtype=torch.double)
    clip = 0.2

    loss, stats = ppo_loss(actor, x, actions, old, torch.zeros(n, dtype=torch.double), adv, ret, clip, algo.cfg)
    grads = torch.autograd.grad(loss, list(actor.parameters()))

    logits, value = actor.outputs(x)
    dist = torch.distributions.Categorical(logits=logits)
    ratio = (dist.log_prob(actions) - old).exp()
    pg = torch.max(-adv * ratio, -adv * ratio.clamp(1 - clip, 1 + clip)).mean()
    v = (value - ret).square().mean()
    ref = pg - ent_coef * dist.entropy().mean() + 0.7 * v
    ref_grads = torch.autograd.grad(ref, list(actor.parameters()))

    clipped = ((ratio - 1).abs() > clip).float().mean()
    assert 0.1 < clipped.item() < 0.9  # the test exercises both branches
    assert loss.item() == pytest.approx(ref.item(), rel=1e-10)
    assert stats[0].item() == pytest.approx(pg.item(), rel=1e-10)
    assert stats[4].item() == pytest.approx(clipped.item())
    for g, r in zip(grads, ref_grads):
        assert torch.allclose(g, r, atol=1e-10), (g - r).abs().max()


# --- value clipping, reward normalization and the truncation path


class FixedOutputs:
    """An actor stub for ``ppo_loss``: log-probs 0 (ratio 1 against old log-probs 0), no
    entropy, and values given as a leaf tensor, so the value loss and its gradient are
    read off directly."""

    head = None

    def __init__(self, values):
        self.values = torch.tensor(values, requires_grad=True)

    def evaluate_actions(self, obs, actions):
        n = self.values.shape[0]
        return torch.zeros(n), torch.zeros(n), self.values


def test_value_clipping_takes_the_larger_of_the_clipped_and_unclipped_errors():
    from corral.algos.ppo import ppo_loss

    cfg = PPOConfig(clip_range_vf=0.2, vf_coef=0.5, ent_coef=0.0)
    actor = FixedOutputs([1.5, 0.8, 3.0])
    old_values, ret = torch.tensor([1.0, 1.0, 1.0]), torch.tensor([2.0, 0.0, 1.5])
    zeros = torch.zeros(3)
    loss, stats = ppo_loss(actor, None, None, zeros, old_values, zeros, ret, 0.2, cfg)
    # clipped values: 1.2, 0.8, 1.2
    # row 0: unclipped (1.5 - 2)^2 = 0.25, clipped (1.2 - 2)^2 = 0.64 -> 0.64 (no gradient: the clip saturates)
    # row 1: within the clip, (0.8 - 0)^2 = 0.64 both
    # row 2: unclipped (3 - 1.5)^2 = 2.25, clipped (1.2 - 1.5)^2 = 0.09 -> 2.25
    assert stats[1].item() == pytest.approx((0.64 + 0.64 + 2.25) / 3)
    loss.backward()
    # d/dv of 0.5 * mean: rows 1, 2 give 0.5 * 2 (v - ret) / 3, row 0 nothing
    torch.testing.assert_close(actor.values.grad, torch.tensor([0.0, 0.5 * 2 * 0.8 / 3, 0.5 * 2 * 1.5 / 3]))
    # without value clipping: the plain squared error
    cfg.clip_range_vf = None
    _, stats = ppo_loss(FixedOutputs([1.5, 0.8, 3.0]), None, None, zeros, old_values, zeros, ret, 0.2, cfg)
    assert stats[1].item() == pytest.approx((0.25 + 0.64 + 2.25) / 3)


def test_value_clipping_reaches_the_categorical_actor_critic():
    from corral.algos.ppo import ppo_loss

    algo = make_ppo()
    x = torch.randn(6, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, value = algo.actor(x)
    old_values = value + torch.tensor([0.5, -0.5, 0.05, -0.05, 1.0, 0.0])
    ret = value + torch.tensor([1.0, 1.0, -1.0, 0.3, -2.0, 0.1])
    cfg = PPOConfig(clip_range_vf=0.1)
    _, stats = ppo_loss(algo.actor, x, torch.zeros(6, dtype=torch.long), torch.zeros(6), old_values,
                        torch.zeros(6), ret, 0.2, cfg)
    clipped = old_values + (value - old_values).clamp(-0.1, 0.1)
    expected = torch.max((value - ret).square(), (clipped - ret).square()).mean()
    assert stats[1].item() == pytest.approx(expected.item(), rel=1e-5)
    assert expected.item() != pytest.approx((value - ret).square().mean().item(), rel=1e-3)


def ramp_learner(monkeypatch, **over):
    """PPO through the Learner on ``RampEnv`` (truncation every 3 steps), one env, one
    8-step rollout; returns the learner and what ``gae_batch`` got and gave at the update."""
    import corral.algos.onpolicy as onpolicy_module
    from corral.train.learner import Learner
    from corral.train.setup import build_config

    seen = {}
    real = onpolicy_module.gae_batch

    def spy(cfg, data, last_value, whole):
        seen["data"] = type(data)(**{k: v.clone() for k, v in vars(data).items()})
        seen["last_value"] = last_value.clone()
        seen["out"] = real(cfg, data, last_value, whole)
        return seen["out"]

    monkeypatch.setattr(onpolicy_module, "gae_batch", spy)
    overrides = {"env.num_envs": 1, "n_steps": 8, "batch_size": 8, "n_epochs": 1, "normalize_advantage": False,
                 "gamma": 0.9, "gae_lambda": 0.8, "eval.episodes": 0, "tensorboard": False, "progress": False,
                 "env.kwargs": {"limit": 3}, **over}
    cfg = build_config("ppo", "envs_for_tests:RampEnv", steps=8, overrides=overrides)
    L = Learner(cfg, None, quiet=True)
    values = {x: L.algo.actor.value(L.algo.actor.normalize(torch.tensor([[float(x)]]))).item() for x in range(4)}
    next(L.stream())
    return L, seen, values


def test_a_truncated_steps_final_value_reaches_the_advantages_through_the_learner(monkeypatch):
    L, seen, V = ramp_learner(monkeypatch)
    d = seen["data"]
    # observations 0 1 2 | 0 1 2 | 0 1, truncated after the 2s (final obs [3], next obs the reset [0])
    assert d.obs.flatten().tolist() == [0, 1, 2, 0, 1, 2, 0, 1]
    assert d.truncated.flatten().tolist() == [False, False, True, False, False, True, False, False]
    assert abs(V[3] - V[0]) > 1e-3  # so bootstrapping from the reset obs would show
    torch.testing.assert_close(d.final_values.flatten(), torch.tensor([0, 0, V[3], 0, 0, V[3], 0, 0]))
    # GAE by hand, gamma 0.9, lambda 0.8: bootstrap V(final obs) at truncation, V(2) after the rollout
    obs = [0, 1, 2, 0, 1, 2, 0, 1]
    rewards = [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0]
    nxt = [V[1], V[2], V[3], V[1], V[2], V[3], V[1], V[2]]
    adv, running = [0.0] * 8, 0.0
    for t in reversed(range(8)):
        if obs[t] == 2:  # the episode was cut after this step: nothing flows back across it
            running = 0.0
        running = rewards[t] + 0.9 * nxt[t] - V[obs[t]] + 0.9 * 0.8 * running
        adv[t] = running
    _, advantages, returns, _ = seen["out"]
    assert advantages.tolist() == pytest.approx(adv, rel=1e-5, abs=1e-5)
    assert returns.tolist() == pytest.approx([a + V[o] for a, o in zip(adv, obs)], rel=1e-5, abs=1e-5)


def test_reward_normalization_divides_by_the_running_std_of_the_discounted_return(monkeypatch):
    L, seen, _ = ramp_learner(monkeypatch, normalize_reward=True, reward_clip=5.0)
    rewards = [1.0, 2.0, 3.0, 1.0, 2.0, 3.0, 1.0, 2.0]
    # the discounted return per step, reset after each truncation: 1, 0.9 + 2, 0.9 * 2.9 + 3, 1, ...
    returns, g = [], 0.0
    for t, r in enumerate(rewards):
        g = 0.9 * g + r
        returns.append(g)
        if t % 3 == 2:
            g = 0.0
    # each reward divided by the std of all returns so far (population variance, the running one), clipped
    stored = [max(-5.0, min(5.0, r / math.sqrt(np.var(returns[:t + 1]) + 1e-8))) for t, r in enumerate(rewards)]
    assert stored[0] == 5.0  # one sample: variance 0, so 1 / 1e-4 is clipped
    assert seen["data"].rewards.flatten().tolist() == pytest.approx(stored, rel=1e-5)
    assert L.algo.ret_norm.var.item() == pytest.approx(np.var(returns), rel=1e-6)  # float32 returns
    assert L.algo.ret_norm.count.item() == 8


@pytest.mark.parametrize("algo", ["ppo", "ppo_lstm", "ppo_rnd", "a2c", "trpo"])
def test_init_torch_reaches_the_body_of_every_on_policy_actor(algo):
    """``init=torch`` (rl-zoo's ortho_init=False) builds the policy/value MLP with nn.Linear's
    default: its square hidden layer is no longer orthogonal, and its biases are not zero."""
    from corral.algos import get_algo

    env = gym.make("Pendulum-v1") if algo == "ppo_rnd" else gym.make("CartPole-v1")
    spec = get_algo(algo)
    bodies = {}
    for init in ("orthogonal", "torch"):
        cfg = spec.cls.Config()
        for k, v in spec.overrides.items():
            setattr(cfg, k, v)
        cfg.hidden, cfg.init = (16, 16), init
        a = spec.class_for(cfg)(cfg, env.observation_space, env.action_space, 1, torch.device("cpu"), RNGStreams(0))
        bodies[init] = a.actor.body._layers
    w_o, b_o = bodies["orthogonal"][1]
    w_t, b_t = bodies["torch"][1]
    torch.testing.assert_close(w_o[0] @ w_o[0].T, 2.0 * torch.eye(16))
    assert not torch.allclose(w_t[0] @ w_t[0].T, 2.0 * torch.eye(16), atol=0.5)
    assert torch.count_nonzero(b_o) == 0 and torch.count_nonzero(b_t) == b_t.numel()
    assert w_t.abs().max() <= 1 / math.sqrt(16) + 1e-6  # kaiming_uniform(a=sqrt 5): bound 1/sqrt(fan_in)


def test_mappo_refuses_init_torch_by_name():
    from corral.agent import build_config
    from corral.errors import UserError
    from corral.train.learner import Learner

    pytest.importorskip("mpe2")
    cfg = build_config("mappo", "mpe:simple_spread_v3", steps=256, overrides={"mappo.init": "torch", "eval.episodes": 0})
    with pytest.raises(UserError, match=r"mappo.init=torch: multi-agent actors are initialized orthogonally"):
        Learner(cfg, None, env_spec="mpe:simple_spread_v3", quiet=True)


def test_reward_clip_low_caps_scaled_penalties_for_its_share_of_the_run():
    """``reward_clip_low``: scaled rewards are clipped to [-low, reward_clip] until the first update
    past ``reward_clip_low_until`` of the run, then to +-reward_clip; the share survives a checkpoint."""
    from corral.errors import UserError

    obs, act = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,))

    def make(**over):
        cfg = PPOConfig(n_steps=8, batch_size=8, normalize_reward=True, reward_clip=10.0, **over)
        return PPO(cfg, obs, act, 1, torch.device("cpu"), RNGStreams(0))

    a, plain = make(reward_clip_low=1.0, reward_clip_low_until=0.5), make()
    done = torch.tensor([False])
    rewards = [1.0, 2.0, -100.0, 50.0, -100.0]
    early = [a._scale_reward(torch.tensor([r]), done).item() for r in rewards]
    same = [plain._scale_reward(torch.tensor([r]), done).item() for r in rewards]
    # the same running statistics: only the lower clip differs
    assert early == [max(-1.0, v) for v in same]
    assert min(same) < -1.0 and early[2] == early[4] == -1.0 and early[3] == same[3] > 0
    a.schedules(0.4)
    assert a.reward_clip_below() == 1.0  # still inside its share
    a.schedules(0.5)
    assert a.reward_clip_below() == 10.0 == plain.reward_clip_below()
    late = a._scale_reward(torch.tensor([-100.0]), done).item()
    assert late == plain._scale_reward(torch.tensor([-100.0]), done).item() < -1.0
    b = make(reward_clip_low=1.0, reward_clip_low_until=0.5)
    b.load_extra_state(a.extra_state())
    assert b.reward_clip_below() == 10.0
    assert "progress" not in plain.extra_state()  # runs without it keep their checkpoint as it was
    with pytest.raises(UserError, match="normalize_reward"):
        PPO(PPOConfig(reward_clip_low=1.0), obs, act, 1, torch.device("cpu"), RNGStreams(0))


def test_schedule_steps_anneals_over_its_own_horizon_not_the_runs():
    """``schedule_steps``: a run of 1,000 steps with a 4,000-step schedule ends a quarter of the way
    down its linear lr and clip schedules; without it, the schedules reach 0 at the run's end."""
    obs, act = gym.spaces.Box(-1, 1, (3,)), gym.spaces.Box(-1, 1, (2,))

    def at_end(**over):
        cfg = PPOConfig(n_steps=8, batch_size=8, lr=1e-3, lr_schedule="linear", clip_range=0.2,
                        clip_schedule="linear", **over)
        a = PPO(cfg, obs, act, 1, torch.device("cpu"), RNGStreams(0))
        a.total_steps = 1000
        return [a.schedules(p)[0] for p in (0.0, 0.5, 1.0)]

    long = at_end(schedule_steps=4000)
    assert [m["lr"] for m in long] == pytest.approx([1e-3, 1e-3 * (1 - 0.125), 1e-3 * 0.75])
    assert [m["clip_range"] for m in long] == pytest.approx([0.2, 0.2 * (1 - 0.125), 0.2 * 0.75])
    plain = at_end()
    assert [m["lr"] for m in plain] == pytest.approx([1e-3, 5e-4, 0.0])
    short = at_end(schedule_steps=500)  # a schedule shorter than the run stays at its end
    assert [m["lr"] for m in short] == pytest.approx([1e-3, 0.0, 0.0])
