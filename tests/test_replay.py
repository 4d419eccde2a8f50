"""Tests for corral.storage.replay and corral.storage.sumtree."""

from __future__ import annotations

import io
import math

import gymnasium as gym
import numpy as np
import pytest
import torch

from corral.storage import replay as replay_module
from corral.storage.prioritized import PrioritizedReplayBuffer
from corral.storage.replay import ReplayBatch, ReplayBuffer, ReplayCapacityError
from corral.storage.sumtree import SumTree

torch.set_num_threads(1)

OBS = gym.spaces.Box(-np.inf, np.inf, (3,), np.float32)
DISCRETE = gym.spaces.Discrete(4)
BOX_ACTION = gym.spaces.Box(-1.0, 1.0, (2,), np.float32)


# ---------------------------------------------------------------------------------------------
# a plain-Python model of what the buffer should return


class Recorder:
    """Feeds a buffer a random multi-env stream and keeps every transition in Python lists.

    Observation ``[s, e, x]`` marks global step ``s`` and env ``e``; a true final
    observation has ``x = 1000 + s`` so it cannot be confused with the reset one.
    """

    def __init__(self, buffer: ReplayBuffer, seed: int = 0, p_term: float = 0.15, p_trunc: float = 0.15):
        self.buffer = buffer
        self.rng = np.random.default_rng(seed)
        self.p_term, self.p_trunc = p_term, p_trunc
        self.N = buffer.num_envs
        self.steps = 0
        self.obs = [[0.0, e, 0.0] for e in range(self.N)]
        self.log: list[list[dict]] = [[] for _ in range(self.N)]  # log[e][s]

    def step(self) -> None:
        N, s = self.N, self.steps
        reward = self.rng.normal(size=N).astype(np.float32)
        u = self.rng.random(N)
        terminated = u < self.p_term
        truncated = (u >= self.p_term) & (u < self.p_term + self.p_trunc)
        action = self.rng.integers(0, 4, size=N)
        next_obs, reset_obs = [], []
        for e in range(N):
            nxt = [s + 1.0, e, 0.0]
            if terminated[e] or truncated[e]:
                final = [s + 1.0, e, 1000.0 + s]
                next_obs.append(final)
                reset_obs.append(nxt)
            else:
                next_obs.append(nxt)
                reset_obs.append(nxt)
            self.log[e].append(
                dict(obs=list(self.obs[e]), action=int(action[e]), reward=float(reward[e]),
                     terminated=bool(terminated[e]), truncated=bool(truncated[e]), next_obs=next_obs[e])
            )
        self.buffer.add(
            torch.tensor(self.obs), torch.tensor(action), torch.tensor(reward),
            torch.tensor(terminated), torch.tensor(truncated), torch.tensor(next_obs),
        )
        self.obs = reset_obs
        self.steps += 1

    def reference(self, s: int, e: int) -> tuple[float, list[float], float, bool] | None:
        """(n-step reward, next obs, discount, terminated) of env e's transition at step s, or None if incomplete."""
        n, gamma = self.buffer.n_step, self.buffer.gamma
        ret = 0.0
        for k in range(n):
            if s + k >= self.steps:
                return None
            tr = self.log[e][s + k]
            ret += gamma**k * tr["reward"]
            if tr["terminated"]:
                return ret, tr["next_obs"], 0.0, True
            if tr["truncated"]:
                return ret, tr["next_obs"], gamma ** (k + 1), False
        if s + n >= self.steps:  # obs[s + n] arrives with the next add
            return None
        return ret, self.log[e][s + n - 1]["next_obs"], gamma**n, False

    def sampleable(self) -> set[tuple[int, int]]:
        oldest = max(0, self.steps - self.buffer.capacity_per_env)
        return {(s, e) for e in range(self.N) for s in range(oldest, self.steps) if self.reference(s, e) is not None}


def batch_keys(batch: ReplayBatch) -> list[tuple[int, int]]:
    return [(int(o[0]), int(o[1])) for o in batch.obs]


def check_against_reference(rec: Recorder, batch: ReplayBatch) -> None:
    for i, (s, e) in enumerate(batch_keys(batch)):
        ref = rec.reference(s, e)
        assert ref is not None, f"sampled incomplete transition (step {s}, env {e})"
        ret, next_obs, discount, terminated = ref
        assert batch.reward[i].item() == pytest.approx(ret, abs=1e-5)
        assert batch.next_obs[i].tolist() == next_obs
        assert batch.discount[i].item() == pytest.approx(discount, rel=1e-6)
        assert bool(batch.terminated[i]) == terminated
        assert int(batch.action[i]) == rec.log[e][s]["action"]


def make(n_step=1, capacity=21, num_envs=3, gamma=0.9, seed=0, cls=ReplayBuffer, **kw):
    return cls(capacity, num_envs, OBS, DISCRETE, seed=seed, n_step=n_step, gamma=gamma, **kw)


def one_env_add(buf, s, reward=0.0, terminated=False, truncated=False, final=None, action=0):
    obs = torch.tensor([[float(s), 0.0, 0.0]])
    nxt = torch.tensor([final if final is not None else [s + 1.0, 0.0, 0.0]])
    buf.add(obs, torch.tensor([action]), torch.tensor([reward]), torch.tensor([terminated]),
            torch.tensor([truncated]), nxt)


# ---------------------------------------------------------------------------------------------
# ring, layout, validity


def test_only_latest_elements_are_kept():
    buf = make(capacity=12, num_envs=3)  # 4 rows per env
    rec = Recorder(buf, p_term=0.0, p_trunc=0.0)
    for _ in range(10):
        rec.step()
    # Rows hold steps 6..9; step 9's next obs is not written yet.
    assert sorted(batch_keys(buf.get(buf.valid_indices()))) == [(s, e) for s in range(6, 9) for e in range(3)]
    assert len(buf) == 9


def test_the_newest_step_of_each_env_waits_for_its_next_observation():
    buf = make(capacity=20, num_envs=2)
    assert len(buf) == 0 and not buf.can_sample(1)
    with pytest.raises(ValueError, match="nothing can be sampled yet"):
        buf.sample(4)
    buf.add(torch.zeros(2, 3), torch.zeros(2), torch.zeros(2), torch.tensor([False, True]),
            torch.zeros(2, dtype=torch.bool), torch.ones(2, 3))
    # Env 1's episode ended, so its final obs is known and the transition is complete.
    assert len(buf) == 1
    assert buf.sample(8).indices.unique().tolist() == [1]
    buf.add(torch.ones(2, 3), torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool), torch.ones(2, 3))
    assert len(buf) == 2 and buf.can_sample(2) and not buf.can_sample(3)


def test_next_obs_is_the_following_observation_of_the_same_env():
    buf = make(capacity=30, num_envs=3)
    rec = Recorder(buf, p_term=0.0, p_trunc=0.0)
    for _ in range(6):
        rec.step()
    batch = buf.get(buf.valid_indices())
    assert (batch.next_obs[:, 0] == batch.obs[:, 0] + 1).all()
    assert (batch.next_obs[:, 1] == batch.obs[:, 1]).all()
    assert torch.allclose(batch.discount, torch.full_like(batch.discount, 0.9))


def test_final_obs_is_returned_at_episode_end_and_the_reset_obs_is_not():
    buf = make(capacity=10, num_envs=1, gamma=0.5)
    one_env_add(buf, 0, reward=1.0)
    one_env_add(buf, 1, reward=2.0, truncated=True, final=[7.0, 7.0, 7.0])
    one_env_add(buf, 100, reward=3.0, terminated=True, final=[8.0, 8.0, 8.0])
    one_env_add(buf, 200, reward=4.0)
    batch = buf.get(buf.valid_indices())
    assert batch.obs[:, 0].tolist() == [0.0, 1.0, 100.0]
    assert batch.next_obs.tolist() == [[1.0, 0.0, 0.0], [7.0, 7.0, 7.0], [8.0, 8.0, 8.0]]
    assert batch.discount.tolist() == [0.5, 0.5, 0.0]  # truncation bootstraps, termination does not
    assert batch.terminated.tolist() == [False, False, True]
    assert batch.reward.tolist() == [1.0, 2.0, 3.0]


def test_an_env_reporting_both_flags_counts_as_terminated():
    buf = make(capacity=10, num_envs=1)
    one_env_add(buf, 0, reward=1.0, terminated=True, truncated=True, final=[3.0, 3.0, 3.0])
    batch = buf.get(buf.valid_indices())
    assert batch.terminated.tolist() == [True] and batch.discount.tolist() == [0.0]
    assert batch.next_obs.tolist() == [[3.0, 3.0, 3.0]]


def test_numpy_inputs_are_accepted():
    buf = make(capacity=10, num_envs=2)
    for s in range(2):
        buf.add(np.full((2, 3), s, np.float64), np.array([1, 2]), np.array([0.5, 1.5]),
                np.array([False, True]), np.array([0, 0]), np.full((2, 3), 9.0))
    batch = buf.get(buf.valid_indices())
    assert batch.obs.dtype == torch.float32 and batch.reward.tolist() == [0.5, 1.5, 1.5]
    assert batch.next_obs[:, 0].tolist() == [1.0, 9.0, 9.0]


@pytest.mark.parametrize("n_step", [1, 3])
def test_numpy_add_path_stores_what_the_torch_path_stores(n_step):
    # CPU buffers write through numpy views; the torch path (used on other devices) is the reference.
    fast = make(n_step=n_step, capacity=30, num_envs=3, final_obs_capacity=3)
    slow = make(n_step=n_step, capacity=30, num_envs=3, final_obs_capacity=3)
    slow._np = None
    rec = Recorder(fast, seed=4)
    for _ in range(40):  # wraps the ring and grows the final-obs store
        rec.step()
        _twin_add_same(rec, slow)
    for name in ("_obs", "_action", "_reward", "_flags", "_final_obs", "_final_keys"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert torch.equal(fast.valid_indices(), slow.valid_indices())


def test_one_draw_for_several_batches_gives_the_per_batch_draws():
    # OffPolicy.update samples all gradient steps of a uniform update at once and splits them.
    a, b = make(n_step=2, capacity=30, num_envs=3, seed=7), make(n_step=2, capacity=30, num_envs=3, seed=7)
    rec = Recorder(a, seed=1)
    for _ in range(15):
        rec.step()
        _twin_add_same(rec, b)
    whole = a.sample(4 * 8).split(8)
    for part in whole:
        one = b.sample(8)
        for name in ("obs", "action", "reward", "next_obs", "discount", "weights", "indices", "terminated"):
            assert torch.equal(getattr(part, name), getattr(one, name)), name


def held_tensors(buf):
    """Every tensor a buffer holds, its side stores' included."""
    for v in vars(buf).values():
        if isinstance(v, torch.Tensor):
            yield v
        elif hasattr(v, "keys") and hasattr(v, "values") and isinstance(v.values, torch.Tensor):
            yield from (v.keys, v.values)


def test_observations_are_stored_once():
    image = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    capacity = 1000
    buf = ReplayBuffer(capacity, 4, image, DISCRETE, seed=0)
    obs_bytes = capacity * 4 * 84 * 84
    # Every tensor the buffer holds, counting storages shared by views once.
    storages = {v.untyped_storage().data_ptr(): v.untyped_storage().nbytes()
                for v in held_tensors(buf)}
    held = sum(storages.values())
    assert buf._obs.dtype == torch.uint8
    assert abs(held - buf.nbytes) < 1024  # nbytes leaves out a few tiny constant tensors
    # One copy of the observations, plus a side store of final obs (1% here) and small per-slot fields.
    assert obs_bytes <= held < 1.05 * obs_bytes
    frames = torch.randint(0, 256, (4, 4, 84, 84), dtype=torch.uint8)
    buf.add(frames, torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.bool),
            torch.zeros(4, dtype=torch.bool), frames)
    buf.add(frames, torch.zeros(4), torch.zeros(4), torch.zeros(4, dtype=torch.bool),
            torch.zeros(4, dtype=torch.bool), frames)
    batch = buf.sample(8)
    assert batch.obs.dtype == torch.uint8 and batch.next_obs.dtype == torch.uint8
    assert batch.obs.shape == (8, 4, 84, 84)


def test_compact_fields_use_few_bytes_per_transition():
    walker_obs = gym.spaces.Box(-np.inf, np.inf, (24,), np.float32)
    walker_act = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    buf = ReplayBuffer(10_000, 1, walker_obs, walker_act, final_obs_capacity=0)
    # 96 obs + 16 action + 4 reward + 1 flags; the side store here holds num_envs entries.
    assert buf.nbytes == 10_000 * 117 + 1 * (96 + 8)


def test_discrete_actions_come_back_as_int64_and_box_actions_as_float32():
    buf = make(capacity=10, num_envs=2)
    buf.add(torch.zeros(2, 3), torch.tensor([[3], [1]]), torch.zeros(2), torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool), torch.zeros(2, 3))
    buf.add(torch.zeros(2, 3), torch.tensor([0, 0]), torch.zeros(2), torch.zeros(2, dtype=torch.bool),
            torch.zeros(2, dtype=torch.bool), torch.zeros(2, 3))
    batch = buf.get(torch.tensor([0, 1]))
    assert batch.action.dtype == torch.int64 and batch.action.tolist() == [3, 1]
    box = ReplayBuffer(10, 1, OBS, BOX_ACTION)
    one = torch.zeros(1, dtype=torch.bool)
    box.add(torch.zeros(1, 3), torch.tensor([[0.5, -0.5]]), torch.zeros(1), one, one, torch.zeros(1, 3))
    assert box.get(torch.tensor([0])).action.tolist() == [[0.5, -0.5]]


def test_add_rejects_a_wrongly_shaped_input_with_a_clear_message():
    buf = make(capacity=10, num_envs=2)
    with pytest.raises(ValueError, match=r"obs has shape \(3, 3\), expected \(2, 3\)"):
        buf.add(torch.zeros(3, 3), torch.zeros(2), torch.zeros(2), torch.zeros(2, dtype=torch.bool),
                torch.zeros(2, dtype=torch.bool), torch.zeros(2, 3))


def test_too_few_rows_for_the_n_step_window_is_refused():
    with pytest.raises(ValueError, match="buffer_size >= 12"):
        make(n_step=3, capacity=9, num_envs=3)


# ---------------------------------------------------------------------------------------------
# n-step targets against the reference loop


@pytest.mark.parametrize("n_step", [1, 2, 4])
def test_n_step_targets_match_a_plain_python_loop_through_episode_ends_and_ring_wraps(n_step):
    # 7 rows per env and a side store of num_envs entries: the ring wraps many times and
    # the final-obs store has to wrap and grow.
    buf = make(n_step=n_step, capacity=21, num_envs=3, gamma=0.9, final_obs_capacity=3)
    rec = Recorder(buf, seed=n_step)
    for step in range(60):
        rec.step()
        if step % 5 == 0 or step > 50:
            expected = rec.sampleable()
            batch = buf.get(buf.valid_indices())
            assert sorted(batch_keys(batch)) == sorted(expected)
            assert len(buf) == len(expected)
            check_against_reference(rec, batch)
    check_against_reference(rec, buf.sample(64))


def test_n_step_window_with_a_truncation_in_the_middle_bootstraps_from_the_final_obs():
    buf = make(n_step=3, capacity=10, num_envs=1, gamma=0.5)
    one_env_add(buf, 0, reward=1.0)
    one_env_add(buf, 1, reward=2.0, truncated=True, final=[9.0, 9.0, 9.0])
    one_env_add(buf, 50, reward=4.0)
    one_env_add(buf, 51, reward=8.0)
    one_env_add(buf, 52, reward=16.0)
    batch = buf.get(buf.valid_indices())
    # Step 0: 1 + 0.5 * 2, stops at the truncation, bootstraps with 0.5^2 from the final obs.
    # Step 1: truncated at once. Step 50: 4 + 0.5 * 8 + 0.25 * 16, then obs[53].
    assert batch.obs[:, 0].tolist() == [0.0, 1.0]
    assert batch.reward.tolist() == [2.0, 2.0]
    assert batch.discount.tolist() == [0.25, 0.5]
    assert batch.next_obs[:, 0].tolist() == [9.0, 9.0]
    one_env_add(buf, 53, reward=0.0)
    batch = buf.get(buf.valid_indices())
    assert batch.obs[:, 0].tolist() == [0.0, 1.0, 50.0]
    assert batch.reward[2].item() == 12.0 and batch.discount[2].item() == 0.125
    assert batch.next_obs[2, 0].item() == 53.0


def test_n_step_window_stops_at_termination_without_bootstrap():
    buf = make(n_step=4, capacity=10, num_envs=1, gamma=0.5)
    one_env_add(buf, 0, reward=1.0)
    one_env_add(buf, 1, reward=1.0, terminated=True, final=[5.0, 5.0, 5.0])
    batch = buf.get(buf.valid_indices())
    assert batch.reward.tolist() == [1.5, 1.0]
    assert batch.discount.tolist() == [0.0, 0.0]
    assert batch.terminated.tolist() == [True, True]


# ---------------------------------------------------------------------------------------------
# uniform sampling


def test_uniform_sampling_only_draws_sampleable_slots_and_draws_them_evenly():
    buf = make(n_step=3, capacity=30, num_envs=3)
    rec = Recorder(buf, seed=3)
    for _ in range(25):
        rec.step()
    valid = set(buf.valid_indices().tolist())
    draws = torch.cat([buf.sample(512).indices for _ in range(40)])
    counts = torch.bincount(draws, minlength=buf.capacity)
    assert set(counts.nonzero().squeeze(1).tolist()) == valid
    expected = draws.numel() / len(valid)
    chi2 = sum((counts[i].item() - expected) ** 2 / expected for i in valid)
    assert chi2 < len(valid) + 5 * math.sqrt(2 * len(valid))


def test_the_same_seed_gives_the_same_batches():
    batches = []
    for _ in range(2):
        buf = make(n_step=2, seed=7)
        rec = Recorder(buf, seed=1)
        for _ in range(12):
            rec.step()
        batches.append(buf.sample(16).indices)
    assert torch.equal(batches[0], batches[1])


# ---------------------------------------------------------------------------------------------
# sum tree


@pytest.mark.parametrize("fanout", [2, 3, 32])
@pytest.mark.parametrize("capacity", [1, 2, 13, 64, 1000])
def test_sum_tree_sums_min_and_find_match_brute_force(capacity, fanout):
    gen = torch.Generator().manual_seed(capacity)
    tree = SumTree(capacity, fanout=fanout)
    values = torch.zeros(capacity, dtype=torch.float64)
    for _ in range(5):
        idx = torch.randint(capacity, (max(1, capacity // 3),), generator=gen)
        val = torch.rand(idx.numel(), generator=gen, dtype=torch.float64)
        val[val < 0.2] = 0.0
        tree.update(idx, val)
        for i, v in zip(idx.tolist(), val.tolist()):  # sequential: the last duplicate wins
            values[i] = v
        assert torch.equal(tree.leaves, values)
        assert tree.total.item() == pytest.approx(values.sum().item(), rel=1e-12)
        positive = values[values > 0]
        assert tree.min.item() == (positive.min().item() if positive.numel() else math.inf)
        if values.sum() > 0:
            u = torch.rand(200, generator=gen, dtype=torch.float64) * values.sum()
            cumsum = np.cumsum(values.numpy())
            expected = np.searchsorted(cumsum, u.numpy(), side="right")
            assert tree.find(u).tolist() == expected.tolist()


@pytest.mark.parametrize("fanout", [2, 4, 32])
def test_sum_tree_never_finds_a_zero_leaf_even_at_the_edges(fanout):
    tree = SumTree(10, fanout=fanout)
    tree.update(torch.tensor([2, 3, 7]), torch.tensor([0.5, 0.25, 0.125], dtype=torch.float64))
    total = tree.total.item()
    u = torch.tensor([0.0, 0.5, 0.75, total - 1e-12, total, total * (1 + 1e-9)], dtype=torch.float64)
    assert tree.find(u).tolist() == [2, 3, 7, 7, 7, 7]


def test_sum_tree_state_dict_rebuilds_the_same_tree():
    tree = SumTree(37, fanout=4)
    tree.update(torch.arange(37), torch.rand(37, dtype=torch.float64))
    other = SumTree(37, fanout=4)
    other.load_state_dict(tree.state_dict())
    assert torch.equal(other._sums, tree._sums) and torch.equal(other._mins, tree._mins)


# ---------------------------------------------------------------------------------------------
# prioritized replay


def fill_prioritized(n_slots=8, **kw):
    buf = PrioritizedReplayBuffer(n_slots + 2, 1, OBS, DISCRETE, seed=0, **kw)
    for s in range(n_slots + 1):
        one_env_add(buf, s, reward=float(s))
    return buf


def test_new_transitions_get_the_largest_priority_seen_so_far():
    buf = fill_prioritized(4)
    assert buf.priorities.tolist()[:4] == [1.0] * 4 and buf.priorities[4].item() == 0.0
    buf.update_priorities(torch.tensor([0, 1]), torch.tensor([3.0, 0.5]))
    one_env_add(buf, 5)
    top = (3.0 + buf.eps) ** buf.alpha
    assert buf.priorities[4].item() == pytest.approx(top)
    assert buf.priorities[5].item() == 0.0  # newest slot: next obs not written yet


def test_prioritized_sampling_follows_the_priorities():
    buf = fill_prioritized(16, alpha=1.0)
    td = torch.arange(1, 17, dtype=torch.float32)
    buf.update_priorities(torch.arange(16), td)
    draws = torch.cat([buf.sample(256).indices for _ in range(100)])
    counts = torch.bincount(draws, minlength=16)[:16].double()
    p = (td.double() + buf.eps) / (td.double() + buf.eps).sum()
    expected = p * draws.numel()
    chi2 = ((counts - expected) ** 2 / expected).sum().item()
    assert chi2 < 37.7  # chi-square, 15 degrees of freedom, p = 0.001
    assert torch.bincount(draws, minlength=18)[16:].sum() == 0  # incomplete slots never


def test_importance_weights_match_a_hand_computation():
    buf = fill_prioritized(6, alpha=0.5, beta=0.7, beta_steps=1000)
    td = torch.tensor([0.0, 1.0, 2.0, 4.0, 8.0, 16.0])
    buf.update_priorities(torch.arange(6), td)
    batch = buf.sample(32)
    p = [(abs(d) + buf.eps) ** 0.5 for d in td.tolist()]
    P = [x / sum(p) for x in p]
    w_all = [(6 * Pi) ** -0.7 for Pi in P]
    for i, w in zip(batch.indices.tolist(), batch.weights.tolist()):
        assert w == pytest.approx(w_all[i] / max(w_all), rel=1e-5)


def test_beta_is_annealed_linearly_with_the_step_counter():
    buf = fill_prioritized(4, beta=0.4, beta_final=1.0, beta_steps=10)
    seen = []
    for _ in range(12):
        seen.append(buf.beta)
        buf.sample(2)
    assert seen == pytest.approx([0.4 + 0.06 * k for k in range(11)] + [1.0])
    assert buf.step == 12


def test_non_finite_td_errors_raise_a_clear_error():
    buf = fill_prioritized(4)
    with pytest.raises(ValueError, match=r"2 non-finite TD error\(s\) out of 3"):
        buf.update_priorities(torch.tensor([0, 1, 2]), torch.tensor([1.0, float("nan"), float("inf")]))
    assert buf.priorities.tolist()[:4] == [1.0] * 4  # nothing was written


def test_stale_priority_updates_do_not_revive_overwritten_slots():
    buf = PrioritizedReplayBuffer(4, 1, OBS, DISCRETE, seed=0)
    for s in range(4):
        one_env_add(buf, s)
    # Row 0 (step 0) is overwritten by step 4; its slot is now the newest and incomplete.
    one_env_add(buf, 4)
    buf.update_priorities(torch.tensor([0]), torch.tensor([5.0]))
    assert buf.priorities[0].item() == 0.0


def test_prioritized_n_step_targets_match_the_reference_loop():
    buf = make(n_step=3, capacity=21, num_envs=3, cls=PrioritizedReplayBuffer, final_obs_capacity=3)
    rec = Recorder(buf, seed=11)
    # The tree catches up lazily: check it after 1, 2, 3 and 12 adds (more than the 7 rows).
    for gap in [1] * 8 + [2, 3, 1, 12, 1, 2, 3]:
        for _ in range(gap):
            rec.step()
        positive = set((buf.priorities > 0).nonzero().squeeze(1).tolist())
        assert positive == set(buf.valid_indices().tolist())
        batch = buf.sample(64)
        check_against_reference(rec, batch)
        buf.update_priorities(batch.indices, torch.randn(64))


def test_priorities_survive_adds_that_do_not_overwrite_them():
    buf = PrioritizedReplayBuffer(20, 1, OBS, DISCRETE, seed=0)
    for s in range(6):
        one_env_add(buf, s)
    buf.update_priorities(torch.tensor([0, 1, 2]), torch.tensor([0.5, 2.0, 4.0]))
    expected = [(x + buf.eps) ** buf.alpha for x in (0.5, 2.0, 4.0)]
    for s in range(6, 12):
        one_env_add(buf, s)
    assert buf.priorities[:3].tolist() == pytest.approx(expected)
    # Slots 3-4 were complete before the update raised the max; 5-10 became complete after.
    assert buf.priorities[3:5].tolist() == [1.0, 1.0]
    assert buf.priorities[5:11].tolist() == pytest.approx([expected[2]] * 6)
    assert buf.priorities[11:].tolist() == [0.0] * 9


# ---------------------------------------------------------------------------------------------
# checkpoints and errors


def roundtrip(state: dict) -> dict:
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    return torch.load(f, weights_only=True)


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_state_dict_round_trip_gives_identical_next_batches(cls):
    buf = make(n_step=3, capacity=30, num_envs=3, cls=cls, seed=1, final_obs_capacity=3)
    rec = Recorder(buf, seed=5)
    for _ in range(17):
        rec.step()
    for _ in range(3):
        b = buf.sample(8)
        if cls is PrioritizedReplayBuffer:
            buf.update_priorities(b.indices, torch.rand(8))
    restored = make(n_step=3, capacity=30, num_envs=3, cls=cls, seed=999)
    restored.load_state_dict(roundtrip(buf.state_dict()))
    assert len(restored) == len(buf)
    for _ in range(4):
        a, b = buf.sample(16), restored.sample(16)
        for name in ("obs", "action", "reward", "next_obs", "discount", "weights", "indices", "terminated"):
            assert torch.equal(getattr(a, name), getattr(b, name)), name
        if cls is PrioritizedReplayBuffer:
            td = torch.randn(16)
            buf.update_priorities(a.indices, td)
            restored.update_priorities(b.indices, td)
        # Both keep going on the same stream and stay in step.
        rec.step()
        _twin_add_same(rec, restored)


def _twin_add_same(rec: Recorder, other: ReplayBuffer) -> None:
    """Replay the transition ``rec`` just added into ``other``."""
    N = rec.N
    last = [rec.log[e][-1] for e in range(N)]
    other.add(
        torch.tensor([t["obs"] for t in last]), torch.tensor([t["action"] for t in last]),
        torch.tensor([t["reward"] for t in last]), torch.tensor([t["terminated"] for t in last]),
        torch.tensor([t["truncated"] for t in last]), torch.tensor([t["next_obs"] for t in last]),
    )


def test_loading_a_checkpoint_from_a_different_buffer_says_what_differs():
    buf = make(capacity=30, num_envs=3)
    other = make(capacity=60, num_envs=3)
    with pytest.raises(ValueError, match="capacity=30 but this ReplayBuffer has capacity=60"):
        other.load_state_dict(buf.state_dict())


def test_capacity_error_names_the_capacity_the_bytes_needed_and_the_bytes_free(monkeypatch):
    monkeypatch.setattr(replay_module, "available_memory", lambda device: 5000)
    walker_obs = gym.spaces.Box(-np.inf, np.inf, (24,), np.float32)
    walker_act = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    with pytest.raises(ReplayCapacityError) as info:
        ReplayBuffer(1000, 1, walker_obs, walker_act)
    needed = 1000 * (96 + 16 + 4 + 1) + 10 * (96 + 8)  # slots + side store of capacity // 100
    message = str(info.value)
    assert "1000 transitions" in message and str(needed) in message and "5000" in message
    assert "smaller buffer_size" in message
    assert isinstance(info.value, MemoryError)
    assert (info.value.capacity, info.value.bytes_needed, info.value.bytes_free) == (1000, needed, 5000)


def test_a_buffer_larger_than_memory_is_refused_before_allocating():
    huge = 10**13
    with pytest.raises(ReplayCapacityError, match=str(huge)):
        PrioritizedReplayBuffer(huge, 1, OBS, BOX_ACTION)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_buffers_on_cuda_match_the_reference_loop_and_round_trip(cls):
    buf = make(n_step=3, capacity=60, num_envs=3, cls=cls, final_obs_capacity=3, device="cuda")
    rec = Recorder(buf, seed=2)
    for _ in range(45):
        rec.step()
    assert sorted(batch_keys(buf.get(buf.valid_indices()))) == sorted(rec.sampleable())
    batch = buf.sample(128)
    assert batch.obs.is_cuda and batch.indices.is_cuda and batch.weights.is_cuda
    check_against_reference(rec, batch)
    if cls is PrioritizedReplayBuffer:
        buf.update_priorities(batch.indices, torch.rand(128, device="cuda"))
    restored = make(n_step=3, capacity=60, num_envs=3, cls=cls, seed=5, device="cuda")
    restored.load_state_dict(roundtrip(buf.state_dict()))
    assert torch.equal(buf.sample(64).indices, restored.sample(64).indices)
