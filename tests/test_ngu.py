"""NGU and Agent57 and their parts: DeepSea's dynamics, the episodic kNN novelty against a hand
computation, its reset, the mixtures against the paper's formulas, the sliding-window UCB
bandit, the mixed n-step targets by hand, gradient isolation (Q, embedding, RND; Agent57's two
heads), exact resume, the CLI, collectors, Atari, and learning DeepSea where R2D2 does not."""

import json
import math

import gymnasium as gym
import pytest
import torch

import corral
from corral.algos.ngu import INTRINSIC, MIXTURE, NGU, Agent57
from corral.cli import main
from corral.envs import make_vec_env
from corral.envs.deepsea import DeepSea
from corral.exploration.bandit import SlidingWindowUCB
from corral.exploration.episodic import EpisodicMemory
from corral.exploration.mixtures import column_mixtures, mixture_betas, mixture_gammas
from corral.rng import RNGStreams
from corral.storage.sequence import SequenceBatch
from corral.train.learner import Learner
from corral.train.setup import build_config

QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


# --- DeepSea


def play(env, actions):
    obs, _ = env.reset(seed=0)
    seen, total = [obs], 0.0
    for a in actions:
        obs, r, term, trunc, _ = env.step(a)
        seen.append(obs)
        total += r
    return seen, total, term, trunc


def test_deepsea_pays_one_minus_the_move_cost_only_for_going_right_every_step():
    n = 6
    env = DeepSea(size=n)
    # "right" in each cell of the diagonal the agent walks when it always goes right
    right = [env.right_action(t, t) for t in range(n)]
    seen, total, term, trunc = play(env, right)
    assert total == pytest.approx(1.0 - 0.01) and term and not trunc  # N moves right cost 0.01 / N each
    for t in range(n):  # one-hot at (row t, column t); zeros after the last step
        assert seen[t].shape == (n, n) and seen[t][t, t] == 1.0 and seen[t].sum() == 1.0
    assert seen[n].sum() == 0.0
    # going left everywhere: no cost, no treasure, column 0 all the way down
    left = [1 - env.right_action(t, 0) for t in range(n)]
    seen, total, term, _ = play(env, left)
    assert total == 0.0 and term and all(seen[t][t, 0] == 1.0 for t in range(n))
    # one left turn on the way spoils it: the last column is out of reach
    spoiled = right[:2] + [1 - env.right_action(2, 2)] + [env.right_action(3 + i, 1 + i) for i in range(n - 3)]
    _, total, _, _ = play(env, spoiled)
    assert total == pytest.approx(-0.01 * (n - 1) / n)


def test_deepsea_action_mapping_is_seeded_and_the_family_is_registered():
    a, b, c = DeepSea(10), DeepSea(10), DeepSea(10, mapping_seed=1)
    assert (a.action_mapping == b.action_mapping).all() and not (a.action_mapping == c.action_mapping).all()
    assert 0 < a.action_mapping.mean() < 1  # no action is "right" everywhere
    assert (DeepSea(4, randomize_actions=False).action_mapping == 1).all()
    assert gym.make("DeepSea-v0", size=7).observation_space.shape == (7, 7)
    assert gym.make("DeepSea20-v0").unwrapped.size == 20
    env = make_vec_env("DeepSea-v0", 3, kwargs={"size": 5})
    obs = env.reset(seed=0)
    assert obs.shape == (3, 5, 5) and torch.equal(obs[:, 0, 0], torch.ones(3))
    for _ in range(5):
        obs, reward, term, trunc, info = env.step(torch.zeros(3, dtype=torch.long))
    assert term.all() and not trunc.any() and torch.equal(info["episode_length"], torch.full((3,), 5))
    with pytest.raises(corral.errors.UserError, match="size"):
        DeepSea(1)


# --- episodic memory


def test_episodic_novelty_matches_a_hand_computation():
    eps, xi, c = 0.1, 0.05, 0.001
    mem = EpisodicMemory(2, 2, capacity=8, k=2, kernel_epsilon=eps, cluster_distance=xi, pseudo_count=c,
                         max_similarity=8.0)
    # column 0 sees (0,0), (1,0), (0,2), then (1,1); column 1 the same points scaled by 2
    pts = [(0.0, 0.0), (1.0, 0.0), (0.0, 2.0), (1.0, 1.0)]
    got = [mem.novelty(torch.tensor([p, (2 * p[0], 2 * p[1])])) for p in pts]

    def r(d2s, mean):
        kern = [eps / (max(d / mean - xi, 0.0) + eps) for d in d2s]
        return 1.0 / (math.sqrt(sum(kern)) + c)

    # empty memory: 0. Then the running mean of squared kNN distances d_m^2, by hand:
    # (1,0) vs {(0,0)}: d^2 = [1], d_m^2 = 1
    # (0,2) vs {(0,0),(1,0)}: d^2 = [4, 5], d_m^2 = (1 + 9) / 3
    # (1,1) vs {(0,0),(1,0),(0,2)}: d^2 = [2, 1, 2] -> 2 nearest [1, 2], d_m^2 = (10 + 3) / 5
    want0 = [0.0, r([1.0], 1.0), r([4.0, 5.0], 10 / 3), r([1.0, 2.0], 13 / 5)]
    assert [g[0].item() for g in got] == pytest.approx(want0, rel=1e-5)
    # column 1 (distances x4, and so its running mean: the same rewards) is its own column
    assert [g[1].item() for g in got] == pytest.approx(want0, rel=1e-5)
    assert mem.dist_mean.tolist() == pytest.approx([13 / 5, 4 * 13 / 5])
    # the maximum similarity cuts a state that is too familiar to 0
    mem.max_similarity = 0.5
    assert mem.novelty(torch.tensor([[1.0, 1.0], [2.0, 2.0]])).tolist() == [0.0, 0.0]


def test_episodic_memory_resets_only_the_columns_that_start_an_episode():
    mem = EpisodicMemory(2, 3, capacity=16, k=2)
    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]])
    for _ in range(3):
        mem.novelty(x)
    mean = mem.dist_mean.clone()
    mem.reset(torch.tensor([True, False]))
    assert mem.size.tolist() == [0, 3]
    r = mem.novelty(x)
    assert r[0].item() == 0.0 and r[1].item() > 0.0  # column 0 remembers nothing of its last episode
    assert mem.dist_mean[0] == mean[0]  # the running mean of distances is kept across episodes


def test_the_novelty_of_a_state_seen_many_times_falls():
    g = torch.Generator().manual_seed(0)
    mem = EpisodicMemory(1, 4, capacity=200, k=10)
    for _ in range(30):  # an episode of different states sets the scale of distances
        mem.novelty(torch.randn(1, 4, generator=g))
    x = torch.randn(1, 4, generator=g)
    rewards = [mem.novelty(x).item() for _ in range(12)]
    assert rewards[0] > 5 * rewards[-1] > 0
    assert all(a >= b for a, b in zip(rewards, rewards[1:]))
    # with the k nearest all the same state, s = sqrt(k) + c
    assert rewards[-1] == pytest.approx(1 / (math.sqrt(10) + 1e-3), rel=1e-5)
    assert mem.novelty(torch.randn(1, 4, generator=g) * 3).item() > 2 * rewards[-1]  # a new state


# --- mixtures and the bandit


def test_mixtures_follow_the_papers_formulas():
    N, beta, g_max, g_min = 32, 0.3, 0.997, 0.99
    betas, gammas = mixture_betas(N, beta), mixture_gammas(N, g_max, g_min)
    for j in range(N):
        b = 0.0 if j == 0 else beta if j == N - 1 else beta / (1 + math.exp(-10 * (2 * j - (N - 2)) / (N - 2)))
        g = 1 - math.exp(((N - 1 - j) * math.log(1 - g_max) + j * math.log(1 - g_min)) / (N - 1))
        assert betas[j].item() == pytest.approx(b, abs=1e-12) and gammas[j].item() == pytest.approx(g, abs=1e-12)
    assert gammas[0].item() == pytest.approx(g_max) and gammas[-1].item() == pytest.approx(g_min)
    assert (betas.diff() >= 0).all() and (gammas.diff() <= 0).all()
    # every env column of every collector is an actor: actor i runs mixture i mod N
    assert column_mixtures(0, 2, 3, 4).tolist() == [0, 1, 2]
    assert column_mixtures(1, 2, 3, 4).tolist() == [3, 0, 1]


def test_bandit_goes_round_once_then_picks_the_ucb_arm_by_hand():
    b = SlidingWindowUCB(3, window=10, beta=1.0, epsilon=0.0)
    # the round, then UCB: an empty window scores every arm +inf, the first wins
    assert b.select(2).tolist() == [0, 1] and b.select(2).tolist() == [2, 0]
    # window: arm 0 four times return 1 (1 + sqrt(1/4) = 1.5), arm 1 once 0.8 (1.8),
    # arm 2 twice, 2 and 0 (1 + sqrt(1/2) = 1.707): arm 1
    b.update(torch.tensor([0, 0, 0, 0, 1, 2, 2]), torch.tensor([1.0, 1, 1, 1, 0.8, 2, 0]))
    counts, mean = b.window_stats()
    assert counts.tolist() == [4, 1, 2] and mean.tolist() == pytest.approx([1.0, 0.8, 1.0])
    assert b.scores().tolist() == pytest.approx([1.5, 1.8, 1 + math.sqrt(0.5)])
    assert b.select(3).tolist() == [1, 1, 1]
    b.update(torch.tensor([1]), torch.tensor([-1.0]))  # arm 1's mean falls to -0.1: arm 2 now
    assert b.select(1).tolist() == [2]


def test_bandit_finds_the_best_bernoulli_arm():
    p = torch.tensor([0.2, 0.5, 0.8, 0.35])
    g = torch.Generator().manual_seed(3)
    b = SlidingWindowUCB(4, window=160, beta=1.0, epsilon=0.5, seed=0)
    picks = []
    for _ in range(800):
        arm = b.select(1)
        b.update(arm, (torch.rand(1, generator=g) < p[arm]).double())
        picks.append(int(arm))
    late = torch.bincount(torch.tensor(picks[400:]), minlength=4).double() / 400
    # greedy half the time: the best arm takes well over the 1/4 of a uniform choice
    assert late.argmax().item() == 2 and late[2] > 0.55


def test_the_bandits_sliding_window_forgets():
    b = SlidingWindowUCB(2, window=20, beta=0.1, epsilon=0.0)
    for _ in range(40):  # arm 0 pays, arm 1 does not
        b.update(torch.tensor([0, 1]), torch.tensor([1.0, 0.0]))
    assert b.select(3).tolist()[2] == 0
    for _ in range(9):  # the world changes: 18 of the 20 episodes in the window are new
        b.update(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
    counts, mean = b.window_stats()
    assert counts.tolist() == [10, 10] and mean.tolist() == pytest.approx([0.1, 0.9])
    assert b.select(1).tolist() == [1]
    for _ in range(1):
        b.update(torch.tensor([0, 1]), torch.tensor([0.0, 1.0]))
    assert b.window_stats()[1].tolist() == pytest.approx([0.0, 1.0])  # nothing of the old regime is left


# --- the algorithms' math


def make(algo="ngu", **over):
    cfg = build_config(algo, "DeepSea-v0", overrides={
        **QUIET, f"{algo}.burn_in": 1, f"{algo}.seq_len": 2, f"{algo}.n_step": 2, f"{algo}.core_size": 8,
        f"{algo}.hidden": [8], f"{algo}.buffer_size": 600, f"{algo}.num_mixtures": 3, f"{algo}.beta": 0.5,
        f"{algo}.embedding_dim": 4, f"{algo}.knn": 2, **{f"{algo}.{k}": v for k, v in over.items()}})
    env = DeepSea(4)
    cls = Agent57 if algo == "agent57" else NGU
    return cls(cfg.algo_cfg, env.observation_space, env.action_space, 1, torch.device("cpu"), RNGStreams(0))


def hand_batch(algo, B=2, seed=1):
    S = algo.sequence
    g = torch.Generator().manual_seed(seed)
    obs = torch.zeros(B, S, 4, 4)
    obs.view(B, S, 16)[..., :].scatter_(-1, torch.randint(16, (B, S, 1), generator=g), 1.0)
    aux = torch.zeros(B, S, 4)
    aux[..., 0] = torch.randint(-1, 2, (B, S), generator=g).float()
    aux[..., 1] = torch.randn(B, S, generator=g)
    aux[..., INTRINSIC] = torch.rand(B, S, generator=g) * 4
    aux[..., MIXTURE] = torch.tensor([[2.0], [1.0]])[:B].expand(B, S)
    return SequenceBatch(obs=obs, action=torch.randint(2, (B, S), generator=g),
                         reward=torch.randn(B, S, generator=g), terminated=torch.zeros(B, S, dtype=torch.bool),
                         truncated=torch.zeros(B, S, dtype=torch.bool), start=torch.zeros(B, S, dtype=torch.bool),
                         state=torch.randn(B, algo.actor.state_dim, generator=g), weights=torch.ones(B),
                         indices=torch.arange(B), aux=aux)


def test_ngu_targets_mix_the_rewards_with_beta_j_and_discount_with_gamma_j_by_hand():
    algo = make(value_rescaling=False)  # burn-in 1, 2 trained steps, n = 2, 3 mixtures, beta 0.5
    batch = hand_batch(algo)
    batch.terminated[1, 2] = True  # sequence 1's episode ends at step 2
    r, ri = batch.reward, batch.aux[..., INTRINSIC]
    q_on = torch.tensor([[[0.0, 1.0], [1.0, 0.0]], [[1.0, 0.0], [0.0, 1.0]]])  # steps 3, 4 (L = 2, B = 2)
    q_tg = torch.tensor([[[10.0, 20.0], [30.0, 40.0]], [[50.0, 60.0], [70.0, 80.0]]])
    target, trained = algo.sequence_targets(batch, q_on, q_tg)
    b2, g2 = 0.5, 1 - math.exp((0 * math.log(1 - 0.997) + 2 * math.log(1 - 0.99)) / 2)  # gamma_min for N=3, j=2
    b1 = 0.5 / (1 + math.exp(-10.0))
    g1 = 1 - math.exp((math.log(1 - 0.997) + math.log(1 - 0.99)) / 2)
    # sequence 0 (j = 2): y_t = (r_t + b r_i(x_{t+1})) + g (r_{t+1} + b r_i(x_{t+2})) + g^2 Q_tg(s_{t+2}, argmax)
    for t, (qt, a) in enumerate(((20.0, 1), (50.0, 0))):
        s = 1 + t
        want = (r[0, s] + b2 * ri[0, s + 1]) + g2 * (r[0, s + 1] + b2 * ri[0, s + 2]) + g2 ** 2 * qt
        assert target[0, t].item() == pytest.approx(want.item(), rel=1e-5)
    # sequence 1 (j = 1): at t = 1 (step 1) the window runs to step 2, which terminates: no
    # bootstrap, and no intrinsic reward on the last step (its next observation is never acted from)
    want = (r[1, 1] + b1 * ri[1, 2]) + g1 * r[1, 2]
    assert target[1, 0].item() == pytest.approx(want.item(), rel=1e-5)
    assert target[1, 1].item() == pytest.approx(r[1, 2].item(), rel=1e-5) and trained.all()


def test_train_mixture_random_trains_each_sequence_for_a_drawn_mixture():
    """train_mixture=random: each sequence gets one j drawn at the learner (all of its steps),
    nothing else changes, and its targets are those of a sequence collected by that j."""
    algo = make(train_mixture="random")
    batch = hand_batch(algo, B=2)
    drawn = []
    for _ in range(30):
        out = algo.relabel_mixtures(batch)
        j = out.aux[..., MIXTURE]
        assert (j == j[:, :1]).all()  # one mixture per sequence
        drawn += j[:, 0].tolist()
        assert torch.equal(out.aux[..., :MIXTURE], batch.aux[..., :MIXTURE]) and torch.equal(out.reward, batch.reward)
    assert set(drawn) == {0.0, 1.0, 2.0}
    assert torch.equal(batch.aux[:, 0, MIXTURE], torch.tensor([2.0, 1.0]))  # the replayed batch is left alone
    out = algo.relabel_mixtures(batch)
    by_hand = hand_batch(algo, B=2)
    by_hand.aux[..., MIXTURE] = out.aux[..., MIXTURE]
    q_on, q_tg = torch.randn(2, 2, 2), torch.randn(2, 2, 2)
    assert torch.equal(algo.sequence_targets(out, q_on, q_tg)[0], algo.sequence_targets(by_hand, q_on, q_tg)[0])


def test_the_lifelong_multiplier_reads_running_error_statistics_that_follow_the_predictor():
    algo = make(**{"lifelong_ema": 0.25, "lifelong_max": 5.0})
    e1, e2 = torch.tensor([1.0, 3.0], dtype=torch.float64), torch.tensor([5.0, 9.0], dtype=torch.float64)
    algo.fold_errors(e1)  # the first step: its mean and variance
    assert algo.err_stats.tolist() == pytest.approx([2.0, 1.0, 1.0])
    algo.fold_errors(e2)  # weight 1/2 (a plain mean of two equal batches): the pooled statistics
    both = torch.cat([e1, e2])
    assert algo.err_stats.tolist() == pytest.approx([both.mean().item(), both.var(unbiased=False).item(), 2.0])
    for _ in range(80):  # then exponential with weight 0.25: the early errors are forgotten
        algo.fold_errors(torch.tensor([0.1, 0.3], dtype=torch.float64))
    assert algo.err_stats[0].item() == pytest.approx(0.2, abs=1e-4)
    assert algo.err_stats[1].item() == pytest.approx(0.01, abs=1e-4)
    # alpha = 1 + (err - mean) / std, clipped to [1, L]: errors 0.1, 0.25, 0.9 -> 1 (clipped), 1.5, 5 (clipped)
    mean, var, _ = algo.err_stats
    alpha = (1 + (torch.tensor([0.1, 0.25, 0.9], dtype=torch.float64) - mean) / var.sqrt()).clamp(1, 5)
    assert alpha.tolist() == pytest.approx([1.0, 1.5, 5.0], abs=1e-3)


def test_ngu_gradient_steps_move_only_their_own_parameters():
    algo = make()
    batch = hand_batch(algo)
    phases = algo.phases(batch, {})
    parts = {"q": algo.actor, "embedding": algo.embedding, "predictor": algo.rnd.predictor}
    for name in ("q", "embedding", "predictor"):
        _, loss = next(phases) if name == "q" else phases.send(None)
        for other, net in parts.items():
            grads = torch.autograd.grad(loss, list(net.parameters()), allow_unused=True, retain_graph=True)
            moved = any(g is not None and g.abs().sum() > 0 for g in grads)
            assert moved == (other == name), (name, other)
    with pytest.raises(StopIteration):
        phases.send(None)
    # the target networks (Q's and RND's) are never trained
    assert not any(p.requires_grad for net in (algo.target, algo.rnd.target) for p in net.parameters())


def test_agent57_heads_each_get_gradient_only_from_their_own_td_loss():
    algo = make("agent57")
    batch = hand_batch(algo)
    q_online, q_tgt = algo.sequence_q(batch)
    le, li, _, _, _ = algo.head_losses(batch, q_online, q_tgt)
    ext, intr = list(algo.actor.ext.parameters()), list(algo.actor.intr.parameters())
    for loss, own, other in ((le.mean(), ext, intr), (li.mean(), intr, ext)):
        g_own = torch.autograd.grad(loss, own, allow_unused=True, retain_graph=True)
        g_other = torch.autograd.grad(loss, other, allow_unused=True, retain_graph=True)
        assert all(g is not None for g in g_own) and sum(g.abs().sum() for g in g_own) > 0
        assert all(g is None or not g.any() for g in g_other)  # (zeros through the stack of the two)
    # the loss of the gradient step is the sum of the two, and acting combines them with beta_j
    _, loss = next(algo.phases(batch, {}))
    assert loss.item() == pytest.approx((le + li).mean().item(), rel=1e-6)
    q = torch.tensor([[[1.0, 2.0]], [[3.0, -1.0]]])  # [2 heads, 1 env, 2 actions]
    algo.cfg.value_rescaling = False
    assert algo.acting_q(q, torch.tensor([2])).tolist() == [[1.0 + 0.5 * 3.0, 2.0 - 0.5]]


def test_the_deepsea_presets_episodic_factor_depends_only_on_the_row_not_on_the_path():
    """Every cell of a DeepSea episode is new (one per row), so the episodic factor can only add
    noise there: with the presets' kernel_epsilon (10) it is the same, within 10%, for 64 random
    paths at each row, whatever the embedding, and the life-long multiplier alone tells paths
    apart; with 0.1 (the old preset) it varied by a factor of about 1.7 between paths."""
    spreads = {}
    for algo, eps in (("ngu", None), ("agent57", None), ("ngu", 0.1)):
        over = {**QUIET} if eps is None else {**QUIET, f"{algo}.kernel_epsilon": eps}
        cfg = build_config(algo, "DeepSea12-v0", overrides=over)
        env = DeepSea(12)
        a = (Agent57 if algo == "agent57" else NGU)(cfg.algo_cfg, env.observation_space, env.action_space, 1,
                                                     torch.device("cpu"), RNGStreams(0))
        K, g = 64, torch.Generator().manual_seed(0)
        memory, col, rewards = a.new_memory(K), torch.zeros(K, dtype=torch.long), []
        with torch.no_grad():
            for row in range(12):
                obs = torch.zeros(K, 12, 12)
                obs[torch.arange(K), row, col] = 1.0
                rewards.append(memory.novelty(a.embedding(obs)))
                col = (col + 2 * torch.randint(2, (K,), generator=g) - 1).clamp(0, 11)
        r = torch.stack(rewards)[1:]  # row 0: an empty memory, 0
        spreads[(algo, eps)] = (r.amax(1) / r.amin(1)).max().item()
    assert spreads[("ngu", None)] < 1.1 and spreads[("agent57", None)] < 1.1
    assert spreads[("ngu", 0.1)] > 1.5


# --- runs

SMALL = ["env.num_envs=4", "env.kwargs.size=5", "{a}.burn_in=2", "{a}.seq_len=4", "{a}.n_step=2",
         "{a}.core_size=16", "{a}.hidden=[16]", "{a}.batch_size=8", "{a}.learning_starts=100",
         "{a}.buffer_size=2000", "{a}.train_freq=2", "{a}.target_update_interval=100", "{a}.knn=3",
         "{a}.num_mixtures=4", "{a}.exploration_fraction=0", "{a}.exploration_initial_eps=0.3",
         "{a}.exploration_final_eps=0.3", "{a}.embedding_hidden=16", "{a}.rnd_hidden=[16]", "{a}.rnd_features=8",
         "eval.episodes=0", "progress=false", "tensorboard=false"]


@pytest.mark.parametrize("algo", ["ngu", "agent57"])
def test_trained_2n_equals_n_then_resumed_bit_for_bit(tmp_path, algo):
    """The checkpoint holds the episodic memories, the bandit, RND's normalisers and the
    running statistics of its errors, and the columns' previous actions and rewards."""
    sets = [s.format(a=algo) for s in SMALL]
    n = 200
    a = Learner(build_config(algo, "DeepSea-v0", steps=2 * n, seed=4, sets=sets), None)
    a.train()
    assert main(["train", algo, "DeepSea-v0", "--steps", str(n), "--seed", "4", "--run-dir",
                 str(tmp_path / "b"), *sum((["--set", s] for s in sets), [])]) == 0
    assert main(["resume", str(tmp_path / "b"), "--steps", str(2 * n)]) == 0
    b = corral.load(tmp_path / "b" / "checkpoints" / "latest.pt")
    for name in NGU.networks:
        for pa, pb in zip(getattr(a.algo, name).state_dict().values(), getattr(b.algo, name).state_dict().values()):
            assert torch.equal(pa, pb), name
    state = torch.load(tmp_path / "b" / "checkpoints" / "latest.pt", weights_only=True)["algo"]
    assert torch.equal(state["ngu_columns"]["memory.memory"], a.algo.memory.memory)
    assert torch.equal(state["ngu_err_stats"], a.algo.err_stats)
    if algo == "agent57":
        assert torch.equal(state["bandit"]["reward_hist"], a.algo.bandit.reward_hist)
        assert a.algo.bandit.chosen > 60
    assert a.algo.grad_steps > 20 and a.algo.err_stats[2] > 0 and a.algo.memory.dist_count.min() > 0


def test_cli_trains_ngu_and_agent57_and_refuses_bad_settings(tmp_path, capsys):
    for algo in ("ngu", "agent57"):
        sets = [s.format(a=algo) for s in SMALL if not s.startswith("eval")] + ["eval.episodes=2"]
        assert main(["train", algo, "DeepSea-v0", "--steps", "400", "--run-dir", str(tmp_path / algo), "--json",
                     *sum((["--set", s] for s in sets), [])]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["env_steps"] == 400 and summary["eval"]["episodes"] == 2
        rows = [json.loads(x) for x in (tmp_path / algo / "metrics.jsonl").read_text().splitlines()]
        assert any("inverse_loss" in r and "rnd_loss" in r and r["intrinsic_mean"] > 0 for r in rows)
    assert main(["train", "ngu", "DeepSea-v0", "--steps", "64", "--set", "ngu.eval_mixture=9"]) != 0
    assert "eval_mixture=9" in capsys.readouterr().err
    assert main(["train", "ngu", "FrozenLake-v1", "--steps", "64"]) != 0
    assert "Box observations" in capsys.readouterr().err


def test_ngu_collectors_act_with_their_mixtures_through_a_sequence_replay_server():
    from corral.schemes.fragments import FragmentScheme

    over = {**QUIET, "scheme.collectors": 2, "env.num_envs": 2, "env.kwargs": {"size": 5}, "ngu.burn_in": 2,
            "ngu.seq_len": 4, "ngu.n_step": 2, "ngu.core_size": 16, "ngu.hidden": [16], "ngu.batch_size": 8,
            "ngu.learning_starts": 256, "ngu.rollout_fragment": 16, "ngu.buffer_size": 4000, "ngu.knn": 3,
            "ngu.num_mixtures": 3}
    L = Learner(build_config("ngu", "DeepSea-v0", steps=768, overrides=over), None, quiet=True)
    scheme = FragmentScheme(L)
    L.make_stream = scheme.stream
    L.train()
    replay = L.algo.replay
    # each collector's 2 columns saw 192 steps: sequences of 8 every 4 steps after the first 8
    assert len(replay) == 2 * 2 * ((192 - 8) // 4 + 1) and L.algo.grad_steps > 20
    mixes = replay.data["aux"][: len(replay), :, MIXTURE]
    # collector 0's columns run mixtures 0, 1 and collector 1's 2, 0 (global column mod 3)
    assert set(mixes.unique().tolist()) == {0.0, 1.0, 2.0}
    assert (replay.data["aux"][: len(replay), :, INTRINSIC] > 0).any()


@pytest.mark.slow
def test_agent57_runs_with_two_ray_collectors_each_with_its_bandit(ray_local):
    """Two Ray collectors feeding a sequence replay server: their fragments carry the aux
    inputs (each collector's bandit picks its columns' mixtures), and the learner trains."""
    from corral.schemes.ray_scheme import RayScheme

    over = {**QUIET, "scheme.collectors": 2, "env.num_envs": 2, "env.kwargs": {"size": 5}, "agent57.burn_in": 2,
            "agent57.seq_len": 4, "agent57.n_step": 2, "agent57.core_size": 16, "agent57.hidden": [16],
            "agent57.batch_size": 8, "agent57.learning_starts": 256, "agent57.rollout_fragment": 16,
            "agent57.buffer_size": 4000, "agent57.knn": 3, "agent57.num_mixtures": 3}
    L = Learner(build_config("agent57", "DeepSea-v0", steps=1024, overrides=over), None, quiet=True)
    scheme = RayScheme(L)
    L.make_stream = scheme.stream
    L.train()
    assert L.algo.grad_steps > 20 and L.episodes > 100
    assert len(L.algo.replay) > 0 and (L.algo.replay.data["aux"][: len(L.algo.replay), :, INTRINSIC] > 0).any()


def test_agent57_runs_on_montezuma_revenge(tmp_path):
    """Montezuma's Revenge through the whole loop: 4x84x84 frames through both Q-networks'
    CNNs, the embedding's and RND's, 2,000 frames (500 agent steps, frame skip 4)."""
    pytest.importorskip("ale_py")
    args = ["--steps", "500", "--set", "env.num_envs=2", "--set", "eval.episodes=1", "--set",
            "eval.max_episode_steps=50", "--set", "tensorboard=false", "--set", "agent57.learning_starts=300", "--set", "agent57.save_replay=false",
            "--set", "agent57.burn_in=2", "--set", "agent57.seq_len=6", "--set", "agent57.n_step=2", "--set",
            "agent57.batch_size=2", "--set", "agent57.buffer_size=600", "--set", "agent57.core_size=32",
            "--set", "agent57.hidden=[32]", "--set", "agent57.episodic_capacity=500", "--set",
            "agent57.train_freq=8"]
    assert main(["train", "agent57", "ALE/MontezumaRevenge-v5", "--run-dir", str(tmp_path / "r"), *args]) == 0
    agent = corral.load(tmp_path / "r")
    assert agent.algo.actor.enc.cnn is not None and agent.algo.embedding.embed[0].conv is not None
    rows = [json.loads(x) for x in (tmp_path / "r" / "metrics.jsonl").read_text().splitlines()]
    assert any("inverse_loss" in r for r in rows)


# --- learning DeepSea


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["agent57"])
def test_agent57_learns_deepsea_8(tmp_path, algo):
    """DeepSea size 8 with the preset (8 envs), seed 0, 15k steps (1,875 episodes); the
    held-out evaluation is the final policy's deterministic episode on mixture 0 (the env is
    deterministic): the optimum, 0.99 (measured: 0.99 from the 10k-step evaluation on, 326 s
    under load). ngu at the same settings finds the treasure in training but its mixture 0 does
    not learn the path by 15k (seeds 0 and 1), and on size 12, where r2d2 never finds the
    treasure in 40k steps, neither does yet (docs/ledger.md)."""
    agent = corral.train(algo, "DeepSea-v0", steps=15_000, seed=0, run_dir=str(tmp_path / "r"),
                         **{"tensorboard": False, "eval.episodes": 0, "env.kwargs": {"size": 8}})
    held_out = corral.evaluate(agent, episodes=2, seed=123)["mean_return"]  # the run's env: size 8
    print(f"\n{algo} DeepSea8 seed 0, 15k steps: held-out {held_out:.3f}")
    assert held_out > 0.9


# the recorded size-12 runs (docs/ledger.md): DeepSea12-v0's preset, spelled out so that r2d2
# runs with the same R2D2 settings; the same eval schedule as the recorded runs
DEEPSEA12 = {"learning_starts": 1000, "burn_in": 2, "seq_len": 10, "n_step": 5, "core_size": 32, "hidden": [32],
             "batch_size": 16, "lr": 0.0005, "train_freq": 2, "target_update_interval": 500,
             "exploration_fraction": 0.05, "exploration_final_eps": 0.01, "buffer_size": 100000}


def deepsea12(algo, steps, run_dir):
    """Train ``algo`` on DeepSea size 12 with DeepSea12-v0's preset settings, seed 0; the final
    policy's held-out deterministic episode (mixture 0 for ngu / agent57)."""
    sets = {"tensorboard": False, "progress": False, "eval.episodes": 1, "eval.every": steps // 8,
            "env.kwargs": {"size": 12}, "env.num_envs": 8, **DEEPSEA12}
    if algo != "r2d2":
        preset = build_config(algo, "DeepSea12-v0", overrides=QUIET).algo_cfg
        assert all(getattr(preset, k) == (tuple(v) if isinstance(v, list) else v) for k, v in DEEPSEA12.items())
        sets.update({k: getattr(preset, k) for k in ("kernel_epsilon", "rnd_hidden", "rnd_features", "num_mixtures",
                                                     "train_mixture")})
    agent = corral.train(algo, "DeepSea-v0", steps=steps, seed=0, run_dir=str(run_dir), **sets)
    return corral.evaluate(agent, episodes=1, seed=123)["mean_return"]


@pytest.mark.slow
@pytest.mark.parametrize("algo", ["ngu", "agent57"])
def test_ngu_and_agent57_learn_deepsea_12(tmp_path, algo):
    """Size 12 (a random policy finds the treasure once in 4,096 episodes), seed 0, 40k steps
    (3,328 episodes), DeepSea12-v0's preset: both hold out the optimum, 0.99, with mixture 0
    (measured: every evaluation from 30k on; 154 s (ngu) and ~150 s (agent57) of wall time at load
    8-11, 573 s for agent57 at load 20-50). ngu needs train_mixture=random (the preset): with the
    paper's training of each sequence for its collecting mixture, its exploratory envs reach the
    treasure in nearly every episode from 46k on and mixture 0 still does not follow at 70k."""
    assert deepsea12(algo, 40_000, tmp_path / algo) > 0.9


@pytest.mark.slow
def test_r2d2_alone_does_not_find_deepsea_12(tmp_path):
    """The same size, seed, budget and R2D2 settings: r2d2 never finds the treasure (measured:
    evaluations -0.0083 ... -0.0017, never a training episode above 0; 149 s at load 8-11; also
    with one gradient step per vector step: held-out -0.0025)."""
    assert deepsea12("r2d2", 40_000, tmp_path) < 0.0
