"""Every ``gymnasium.spaces`` type as the observation space of a tiny env: it trains for a few
hundred steps, or it is refused before the run starts with one ``UserError`` naming the space
and what to do (the CLI: one line, exit code 2, no traceback)."""

import gymnasium as gym
import numpy as np
import pytest

import corral
from corral.cli import main
from corral.envs import make_vec_env
from corral.envs.spaces import flatten_parts, layout_of
from corral.errors import UserError

S = gym.spaces
QUIET = {"tensorboard": False, "progress": False, "eval.episodes": 0}


class _Custom(gym.Space):
    """A Space subclass corral knows nothing about (as MiniGrid's MissionSpace)."""

    def sample(self, mask=None, probability=None):
        return "anything"

    def contains(self, x):
        return isinstance(x, str)


SPACES = {
    "box": lambda: S.Box(-1.0, 1.0, (3,), np.float32),
    "small_uint8_grid": lambda: S.Box(0, 10, (7, 7, 3), np.uint8),  # too small for the Nature CNN: flattened
    "discrete": lambda: S.Discrete(5, start=2),
    "multidiscrete": lambda: S.MultiDiscrete([3, 4]),
    "multibinary": lambda: S.MultiBinary(4),
    "dict": lambda: S.Dict(pos=S.Box(-1.0, 1.0, (2,), np.float32), cell=S.Discrete(4),
                           word=S.Text(4, charset="abc")),
    "tuple": lambda: S.Tuple((S.Discrete(3), S.Box(0.0, 1.0, (2,), np.float32))),
    "text": lambda: S.Text(6, min_length=1, charset="abcd"),
    "oneof": lambda: S.OneOf((S.Discrete(3), S.Box(0.0, 1.0, (2,), np.float32))),
    "graph": lambda: S.Graph(S.Box(0.0, 1.0, (2,), np.float32), S.Discrete(2)),
    "sequence": lambda: S.Sequence(S.Discrete(3)),
    "custom": lambda: _Custom(),
    "dict_with_graph": lambda: S.Dict(pos=S.Box(-1.0, 1.0, (2,), np.float32),
                                      g=S.Graph(S.Box(0.0, 1.0, (2,), np.float32), None)),
}
TRAINS = ["box", "small_uint8_grid", "discrete", "multidiscrete", "multibinary", "dict", "tuple", "text", "oneof"]
# kind -> what the one message must name
REFUSED = {"graph": ["Graph", "varying number of nodes", "ObservationWrapper"],
           "sequence": ["Sequence", "varying length", "ObservationWrapper"],
           "custom": ["_Custom", "does not know how to encode", "ObservationWrapper"],
           "dict_with_graph": ["Graph", "(at g)", "ObservationWrapper"]}


class SpaceEnv(gym.Env):
    """Observations drawn from the space (seeded); reward 1 for action 1; 8 steps an episode."""

    action_space = S.Discrete(2)

    def __init__(self, kind="box"):
        self.observation_space = SPACES[kind]()

    def reset(self, seed=None, options=None):
        super().reset(seed=seed)
        self.observation_space.seed(int(self.np_random.integers(2 ** 31)))
        self.t = 0
        return self.observation_space.sample(), {}

    def step(self, action):
        self.t += 1
        return self.observation_space.sample(), float(action == 1), self.t >= 8, False, {}


class GraphEnv(SpaceEnv):
    def __init__(self):
        super().__init__("graph")


class SequenceEnv(SpaceEnv):
    def __init__(self):
        super().__init__("sequence")


class CustomSpaceEnv(SpaceEnv):
    def __init__(self):
        super().__init__("custom")


@pytest.mark.parametrize("algo", ["ppo", "dqn"])
@pytest.mark.parametrize("kind", TRAINS)
def test_each_space_type_trains_for_a_few_hundred_steps(kind, algo):
    over = {"ppo.n_steps": 64, "ppo.batch_size": 64, "ppo.n_epochs": 1} if algo == "ppo" else \
        {"dqn.learning_starts": 64, "dqn.buffer_size": 1000, "dqn.batch_size": 32}
    agent = corral.train(algo, SpaceEnv, steps=320, seed=0, save_run=False,
                         **{"env.kwargs": {"kind": kind}, **over, **QUIET})
    assert agent.summary is not None
    env = flatten_parts(SpaceEnv(kind))  # what corral's vector envs give the agent
    obs, _ = env.reset(seed=3)
    action = agent.act(obs)
    assert int(np.asarray(action).reshape(-1)[0]) in (0, 1)


def test_text_and_oneof_are_stored_compactly_and_one_hot_in_the_network():
    env = make_vec_env(SpaceEnv, 2, {"kind": "text"})
    layout = layout_of(env.single_observation_space)
    assert [(p.key, p.stop - p.start, p.nvec) for p in layout] == [("obs", 6, (5,) * 6)]  # 4 letters + padding
    obs = env.reset(seed=0)
    assert obs.shape == (2, 6) and bool(((obs >= 0) & (obs <= 4)).all())
    env = make_vec_env(SpaceEnv, 2, {"kind": "oneof"})
    layout = layout_of(env.single_observation_space)
    assert [(p.key, p.stop - p.start, p.nvec) for p in layout] == [("obs", 1, (2,)), ("obs.value", 3, ())]
    # a small uint8 grid is numbers, not an image: no CNN
    agent = corral.train("ppo", SpaceEnv, steps=64, save_run=False,
                         **{"env.kwargs": {"kind": "small_uint8_grid"}, "ppo.n_steps": 64, **QUIET})
    assert agent.actor.cnn is None and not agent.actor.image


@pytest.mark.parametrize("kind", sorted(REFUSED))
def test_a_space_corral_cannot_encode_is_refused_before_the_run_with_one_message(kind, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError) as e:
        corral.train("ppo", SpaceEnv, steps=320, seed=0, **{"env.kwargs": {"kind": kind}, **QUIET})
    msg = str(e.value)
    for needle in REFUSED[kind]:
        assert needle in msg, msg
    assert "\n" not in msg
    assert not (tmp_path / "runs").exists()  # refused before the run started


@pytest.mark.parametrize("name,space", [("GraphEnv", "Graph"), ("SequenceEnv", "Sequence"),
                                        ("CustomSpaceEnv", "_Custom")])
def test_the_cli_refuses_them_with_one_line_and_exit_code_2(name, space, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc = main(["train", "ppo", f"{__file__}:{name}", "--steps", "100", "--set", "tensorboard=false"])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert f"observation space {space}" in err and "ObservationWrapper" in err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert not (tmp_path / "runs").exists()
