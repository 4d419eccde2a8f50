"""Replay of stacked frames (Atari): each frame is stored once and the stacks are rebuilt
at sample time. Every sampled ``obs`` and ``next_obs`` must be, bit for bit, the stack the
env produced for that slot: across episode ends (reset padding, zero padding, a stack that
goes on across a lost life as EnvPool's does), n-step windows, the ring's wrap-around,
prioritized sampling, checkpoints, and a real ALE env through corral's env factory."""

from __future__ import annotations

import io
import pickle

import gymnasium as gym
import numpy as np
import pytest
import torch

from corral.envs.spaces import declare_frame_stack, frame_stack_of
from corral.storage import replay as replay_module
from corral.storage.prioritized import PrioritizedReplayBuffer
from corral.storage.replay import ReplayBuffer

torch.set_num_threads(1)

ACTIONS = gym.spaces.Discrete(4)


class StackedFrames:
    """``N`` envs whose observation is the last ``k`` frames stacked on the first axis.

    Frames are random bytes drawn from a seeded stream, so no two steps look alike.
    Episodes last 1 to 12 steps and end terminated or truncated at random. At a reset the
    stack is padded the way ``padding`` says: ``"reset"`` (Gymnasium's FrameStackObservation
    and EnvPool's real reset: the reset frame repeated), ``"zero"``, or ``"life"`` (a
    termination is a lost life: the stack goes on, as EnvPool's episodic life does).
    ``frame`` is one frame's shape; an observation is ``[k * frame[0], *frame[1:]]``.
    """

    def __init__(self, num_envs: int, k: int = 4, frame=(1, 5, 6), padding: str = "reset", seed: int = 0):
        self.N, self.k, self.frame, self.padding = num_envs, k, tuple(frame), padding
        self.rng = np.random.default_rng(seed)
        self.obs_shape = (k * self.frame[0], *self.frame[1:])
        self.space = declare_frame_stack(gym.spaces.Box(0, 255, self.obs_shape, np.uint8), k)
        self.queues = [self._fresh() for _ in range(num_envs)]
        self.left = self.rng.integers(1, 13, num_envs)

    def _frame(self) -> np.ndarray:
        return self.rng.integers(0, 256, self.frame, dtype=np.uint8)

    def _fresh(self) -> list[np.ndarray]:
        f = self._frame()
        pad = np.zeros_like(f) if self.padding == "zero" else f
        return [pad] * (self.k - 1) + [f]

    def _stack(self, e: int) -> np.ndarray:
        return np.concatenate(self.queues[e], axis=0)

    def obs(self) -> np.ndarray:
        return np.stack([self._stack(e) for e in range(self.N)])

    def step(self):
        """``(obs after autoreset, true next obs, terminated, truncated)``."""
        final = np.zeros((self.N, *self.obs_shape), np.uint8)
        term = np.zeros(self.N, bool)
        trunc = np.zeros(self.N, bool)
        for e in range(self.N):
            self.queues[e] = self.queues[e][1:] + [self._frame()]
            final[e] = self._stack(e)
            self.left[e] -= 1
            if self.left[e] == 0:
                term[e] = self.rng.random() < 0.5
                trunc[e] = not term[e]
                self.left[e] = self.rng.integers(1, 13)
                if self.padding == "life" and term[e]:
                    self.queues[e] = self.queues[e][1:] + [self._frame()]  # the game goes on
                else:
                    self.queues[e] = self._fresh()
        return self.obs(), final, term, trunc


class Log:
    """What the env produced, per global step and env: the stack, the true next stack, the flags."""

    def __init__(self, buffer: ReplayBuffer):
        self.buffer = buffer
        self.obs: list[np.ndarray] = []
        self.next: list[np.ndarray] = []
        self.ended: list[np.ndarray] = []
        self.truncated: list[np.ndarray] = []

    def add(self, obs, final, term, trunc, rng) -> None:
        N = self.buffer.num_envs
        self.buffer.add(obs, rng.integers(0, 4, N), rng.random(N).astype(np.float32), term, trunc, final)
        self.obs.append(obs.copy())
        self.next.append(final.copy())
        self.ended.append(term | trunc)
        self.truncated.append(trunc & ~term)

    def expected(self, step: int, env: int):
        """(obs, next_obs) of the slot at global step ``step`` of ``env``, n-step window and all."""
        n = self.buffer.n_step
        for m in range(n):
            if self.ended[step + m][env]:
                return self.obs[step][env], self.next[step + m][env]
        return self.obs[step][env], self.obs[step + n][env]

    def check(self, batch) -> None:
        buf = self.buffer
        T, N, steps = buf.capacity_per_env, buf.num_envs, buf.steps_added
        for i, idx in enumerate(batch.indices.tolist()):
            row, env = divmod(idx, N)
            step = steps - 1 - (steps - 1 - row) % T  # the live global step in that row
            obs, nxt = self.expected(step, env)
            assert np.array_equal(batch.obs[i].numpy(), obs), (step, env)
            assert np.array_equal(batch.next_obs[i].numpy(), nxt), (step, env)


def make(env: StackedFrames, cls=ReplayBuffer, capacity: int = 36, n_step: int = 1, seed: int = 0, **kw):
    return cls(capacity, env.N, env.space, ACTIONS, seed=seed, n_step=n_step, final_obs_capacity=env.N,
               frame_stack=frame_stack_of(env.space), **kw)


def feed(env: StackedFrames, buf: ReplayBuffer, steps: int, seed: int = 0, log: Log | None = None) -> Log:
    log = log or Log(buf)
    rng = np.random.default_rng(seed + 100)
    obs = env.obs()
    for _ in range(steps):
        nxt, final, term, trunc = env.step()
        log.add(obs, final, term, trunc, rng)
        obs = nxt
    return log


# ---------------------------------------------------------------------------------------------
# sampled stacks are the env's stacks


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
@pytest.mark.parametrize("n_step", [1, 3])
@pytest.mark.parametrize("padding", ["reset", "zero", "life"])
def test_sampled_stacks_are_the_stacks_the_env_produced(cls, n_step, padding):
    # 12 rows per env: the ring wraps many times over 150 steps of 1-12-step episodes.
    env = StackedFrames(3, padding=padding, seed=n_step)
    buf = make(env, cls, n_step=n_step)
    log = Log(buf)
    for t in range(150):
        feed(env, buf, 1, seed=t, log=log)
        if buf.can_sample(1):
            log.check(buf.get(buf.valid_indices()))  # every sampleable slot
            log.check(buf.sample(16))
    assert buf.steps_added > 10 * buf.capacity_per_env


@pytest.mark.parametrize("frame", [(3, 5, 6), (1, 5, 6, 3)])
def test_frames_of_several_channels_are_kept_whole(frame):
    # EnvPool's RGB stacks are [k * 3, H, W]; Gymnasium's FrameStackObservation of RGB is [k, H, W, 3].
    env = StackedFrames(2, frame=frame, seed=3)
    buf = make(env, n_step=2)
    log = feed(env, buf, 60)
    assert buf._obs.shape[2:] == frame
    log.check(buf.get(buf.valid_indices()))


def test_stacks_that_do_not_follow_on_in_their_column_are_kept_whole():
    # Ape-X's replay server writes fragments of several collectors into the same columns: a
    # fragment's first stack continues another collector's episode, not the previous row's.
    a, b = StackedFrames(2, seed=1), StackedFrames(2, seed=2)
    buf = make(a, n_step=3, capacity=60)
    log = Log(buf)
    for fragment in range(12):
        feed(a if fragment % 2 else b, buf, 5, seed=fragment, log=log)
    log.check(buf.get(buf.valid_indices()))


def test_only_stacks_that_begin_an_episode_are_starts_and_padded_ones_are_not_kept_whole():
    env = StackedFrames(3, padding="reset", seed=5)
    buf = make(env, capacity=300)
    log = feed(env, buf, 80)
    ended = int(np.array(log.ended[:79]).sum())
    assert ended > 5
    assert int((buf._starts[:80] != 0).sum()) == 3 + ended  # the first adds and every reset
    assert int(buf._heads.cursor) == 0  # the reset frame repeated: rebuilt from the frame itself
    log.check(buf.get(buf.valid_indices()))


@pytest.mark.parametrize("padding", ["zero", "life"])
def test_stacks_that_begin_otherwise_are_kept_whole(padding):
    # zero padding; or EnvPool's lost life, whose first stack continues the final one, not the row's
    env = StackedFrames(3, padding=padding, seed=5)
    buf = make(env, capacity=300)
    log = feed(env, buf, 80)
    assert int((buf._starts[:80] == 2).sum()) == int(buf._heads.cursor) > 3
    log.check(buf.get(buf.valid_indices()))


def test_a_wrong_declaration_costs_memory_not_exactness():
    # Observations that are not a stack at all: every slot is a start and kept whole.
    env = StackedFrames(2, seed=4)
    space = declare_frame_stack(gym.spaces.Box(0, 255, env.obs_shape, np.uint8), 2)
    buf = ReplayBuffer(40, 2, space, ACTIONS, seed=0, frame_stack=2)
    rng = np.random.default_rng(0)
    log = Log(buf)
    for _ in range(50):
        obs = rng.integers(0, 256, (2, *env.obs_shape), dtype=np.uint8)
        log.add(obs, obs, np.zeros(2, bool), np.zeros(2, bool), rng)
    log.check(buf.get(buf.valid_indices()))


def test_the_torch_add_path_stores_what_the_numpy_path_stores():
    fast_env, slow_env = StackedFrames(3, seed=6), StackedFrames(3, seed=6)
    fast, slow = make(fast_env, n_step=3), make(slow_env, n_step=3)
    slow._np = None  # the path other devices take
    feed(fast_env, fast, 70)
    feed(slow_env, slow, 70)
    for name in ("_obs", "_starts", "_action", "_reward", "_flags", "_last_obs"):
        assert torch.equal(getattr(fast, name), getattr(slow, name)), name
    assert torch.equal(fast._heads.values, slow._heads.values)
    assert torch.equal(fast.sample(32).obs, slow.sample(32).obs)


def test_frame_stack_must_divide_the_first_axis():
    with pytest.raises(ValueError, match="frame_stack=4"):
        ReplayBuffer(100, 1, gym.spaces.Box(0, 255, (6, 84, 84), np.uint8), ACTIONS, frame_stack=4)
    with pytest.raises(ValueError, match="frame_stack=4"):
        ReplayBuffer(100, 1, gym.spaces.Box(0, 1, (8,), np.float32), ACTIONS, frame_stack=4)


# ---------------------------------------------------------------------------------------------
# memory


def test_an_atari_replay_takes_a_quarter_of_the_whole_stack_layout():
    atari = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    whole = ReplayBuffer(4000, 8, atari, ACTIONS)
    frames = ReplayBuffer(4000, 8, atari, ACTIONS, frame_stack=4)
    assert frames.nbytes == frames._bytes_needed(frames._final.keys.numel())  # what the memory check asks for
    assert whole.nbytes == whole._bytes_needed(whole._final.keys.numel())
    assert 0.25 < frames.nbytes / whole.nbytes < 0.27  # the rest: side stores (1% of slots) and per-slot fields
    assert frames.obs_nbytes == whole.obs_nbytes == 4 * 84 * 84  # a sampled stack is still whole


def test_the_memory_message_counts_the_frame_layout(monkeypatch):
    atari = gym.spaces.Box(0, 255, (4, 84, 84), np.uint8)
    monkeypatch.setattr(replay_module, "available_memory", lambda device: 2**30)
    with pytest.raises(replay_module.ReplayCapacityError) as info:
        ReplayBuffer(1_000_000, 8, atari, ACTIONS, frame_stack=4)
    assert 7.0e9 < info.value.bytes_needed < 7.5e9  # 26.6 GiB as whole stacks
    per_transition = info.value.bytes_needed // 1_000_000
    assert f"at {per_transition} bytes each" in str(info.value)


# ---------------------------------------------------------------------------------------------
# checkpoints


def roundtrip(state):
    f = io.BytesIO()
    torch.save(state, f)
    f.seek(0)
    return torch.load(f, weights_only=True)


@pytest.mark.parametrize("cls", [ReplayBuffer, PrioritizedReplayBuffer])
def test_state_dict_round_trip_gives_identical_samples(cls):
    env = StackedFrames(3, padding="zero", seed=7)
    buf = make(env, cls, n_step=3, seed=1)
    log = feed(env, buf, 50)
    restored = make(StackedFrames(3), cls, n_step=3, seed=99)
    restored.load_state_dict(roundtrip(buf.state_dict()))
    copied = pickle.loads(pickle.dumps(buf))
    for other in (restored, copied):
        assert torch.equal(other._last_obs, buf._last_obs)
    a, b, c = buf.sample(64), restored.sample(64), copied.sample(64)
    for name in ("obs", "next_obs", "reward", "discount", "indices", "weights"):
        assert torch.equal(getattr(a, name), getattr(b, name)), name
        assert torch.equal(getattr(a, name), getattr(c, name)), name
    # and they go on alike: the same adds give the same stacks
    env_state = pickle.dumps(env)
    feed(env, buf, 20, seed=5, log=log)
    feed(pickle.loads(env_state), restored, 20, seed=5)
    log.check(restored.get(restored.valid_indices()))
    assert torch.equal(buf.sample(64).obs, restored.sample(64).obs)


def test_a_version_1_checkpoint_of_whole_stacks_loads_into_the_frame_layout():
    env = StackedFrames(3, seed=8)
    twin = pickle.loads(pickle.dumps(env))
    frames = make(env, n_step=2, seed=3)
    whole = ReplayBuffer(36, 3, env.space, ACTIONS, seed=3, n_step=2, final_obs_capacity=3)
    log = feed(env, frames, 40)
    feed(twin, whole, 40)
    state = whole.state_dict()
    state["version"] = 1
    del state["frame_stack"]
    converted = make(StackedFrames(3), n_step=2, seed=0)
    converted.load_state_dict(roundtrip(state))
    log.check(converted.get(converted.valid_indices()))
    assert torch.equal(converted.sample(64).obs, frames.sample(64).obs)


def test_a_checkpoint_of_another_frame_stack_is_refused():
    env = StackedFrames(3, seed=9)
    buf = make(env)
    feed(env, buf, 10)
    other = ReplayBuffer(36, 3, env.space, ACTIONS, frame_stack=2, final_obs_capacity=3)
    with pytest.raises(ValueError, match="frame_stack"):
        other.load_state_dict(buf.state_dict())


# ---------------------------------------------------------------------------------------------
# a real Atari env


def test_atari_stacks_from_corral_envs_come_back_exactly():
    pytest.importorskip("ale_py")
    pytest.importorskip("cv2")
    from corral.envs import make_vec_env

    env = make_vec_env("ALE/Breakout-v5", 2, backend="sync")
    try:
        assert frame_stack_of(env.single_observation_space) == 4  # declared by corral's Atari wrappers
        # 100 rows per env over 300 steps: the ring wraps; random play loses lives (episodic life) often
        buf = ReplayBuffer(200, 2, env.single_observation_space, env.single_action_space, seed=0, n_step=3,
                           frame_stack=4)
        log = Log(buf)
        obs = env.reset(seed=0)
        g = torch.Generator().manual_seed(0)
        for _ in range(300):
            action = torch.randint(0, 4, (2,), generator=g)
            nxt, reward, term, trunc, info = env.step(action)
            buf.add(obs, action, reward, term, trunc, info["final_obs"])
            log.obs.append(obs.numpy().copy())
            log.next.append(info["final_obs"].numpy().copy())
            log.ended.append((term | trunc).numpy())
            obs = nxt
        assert np.array(log.ended).sum() >= 2
        log.check(buf.get(buf.valid_indices()))
        assert buf._starts.sum() <= 2 + np.array(log.ended).sum()  # continuing stacks are not kept whole
    finally:
        env.close()
