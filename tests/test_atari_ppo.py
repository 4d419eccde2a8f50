"""PPO on Atari at CleanRL's ``ppo_atari_envpool.py`` settings (issue 34): the preset, its env
protocol in training and in the held-out evaluation, and the EnvPool backend against the
Gymnasium (sync) one. Skipped without ale-py; the EnvPool tests also without EnvPool."""

import numpy as np
import pytest
import torch

from corral.envs import make_vec_env
from corral.envs.atari import register_ale
from corral.train.evaluate import evaluate_policy, resolve_protocol
from corral.train.setup import build_config, make_env

try:
    import envpool  # noqa: F401

    HAVE_ENVPOOL = True
except ImportError:
    HAVE_ENVPOOL = False

atari = pytest.mark.skipif(not register_ale(), reason="needs ale-py: pip install 'corral[atari]'")
needs_envpool = pytest.mark.skipif(not (HAVE_ENVPOOL and register_ale()),
                                   reason="needs envpool and ale-py: pip install 'corral[envpool,atari]'")


def wrappers(vec) -> list[str]:
    """The wrapper classes around env 0 of a sync vector env, outermost first."""
    env, out = vec.envs[0], []
    while hasattr(env, "env"):
        out.append(type(env).__name__)
        env = env.env
    return out


def noop(obs):
    return torch.zeros(obs.shape[0], dtype=torch.long)


@atari
@pytest.mark.parametrize("game", ["ALE/Pong-v5", "ALE/Breakout-v5", "Pong"])
def test_every_ale_game_gets_cleanrls_ppo_settings(game):
    cfg = build_config("ppo", game)
    p = cfg.algo_cfg
    assert (cfg.env.num_envs, p.n_steps, p.n_epochs, cfg.env.num_envs * p.n_steps // p.batch_size) == (8, 128, 4, 4)
    assert (p.lr, p.lr_schedule, p.adam_eps) == (2.5e-4, "linear", 1e-5)
    assert (p.schedule_steps, p.init) == (10_000_000, "orthogonal")  # CleanRL's anneal horizon and layer_init
    assert (p.clip_range, p.clip_schedule, p.clip_range_vf) == (0.1, "constant", 0.1)
    assert (p.ent_coef, p.gamma, p.gae_lambda, p.max_grad_norm, p.normalize_advantage) == (0.01, 0.99, 0.95, 0.5, True)
    # CleanRL's 0.5 * vf_coef 0.5 on the squared error is corral's vf_coef 0.25 on it
    assert p.vf_coef == 0.25
    assert p.hidden == () and cfg.env.repeat_action_probability == 0.0


@atari
def test_the_shared_nature_cnn_feeds_linear_policy_and_value_heads():
    from corral.algos import get_algo
    from corral.rng import RNGStreams

    cfg = build_config("ppo", "ALE/Pong-v5")
    env = make_env(cfg, num_envs=1)
    try:
        algo = get_algo("ppo").cls(cfg.algo_cfg, env.single_observation_space, env.single_action_space, 8,
                                   torch.device("cpu"), RNGStreams(0))
    finally:
        env.close()
    actor = algo.actor
    assert actor.cnn is not None and actor.cnn.out_dim == 512
    assert [tuple(w.shape) for w in actor.body.weights] == [(2, 6, 512)]  # one layer: policy logits, value
    # CleanRL's layer_init (SB3's ortho_init): every encoder layer orthogonal with gain sqrt 2, zero biases
    for layer in (*actor.cnn.conv, *actor.cnn.fc):
        if isinstance(layer, (torch.nn.Conv2d, torch.nn.Linear)):
            w = layer.weight.detach().flatten(1)
            rows, cols = w.shape
            gram = w @ w.T if rows <= cols else w.T @ w
            torch.testing.assert_close(gram, 2.0 * torch.eye(min(rows, cols)), atol=1e-4, rtol=0)
            assert not layer.bias.any()


@atari
def test_training_envs_lose_lives_and_clip_rewards_without_sticky_actions():
    cfg = build_config("ppo", "ALE/Breakout-v5")
    env = make_env(cfg, num_envs=1)
    try:
        chain = wrappers(env)
        assert chain == ["FrameStackObservation", "ClipReward", "FireReset", "EpisodicLife", "RawEpisodeStats",
                         "AtariPreprocessing", "OrderEnforcing", "PassiveEnvChecker"]
        ale = env.envs[0].unwrapped.ale
        assert ale.getFloat("repeat_action_probability") == 0.0
        assert env.single_observation_space.shape == (4, 84, 84) and env.single_observation_space.dtype == np.uint8
        pre = env.envs[0].get_wrapper_attr("noop_max"), env.envs[0].get_wrapper_attr("frame_skip")
        assert pre == (30, 4) and env.single_action_space.n == 4  # the minimal action set
    finally:
        env.close()


@atari
def test_the_held_out_evaluation_is_the_raw_score_of_whole_games_without_sticky_actions():
    cfg = build_config("ppo", "ALE/Breakout-v5")
    env = make_env(cfg, num_envs=1, evaluation=True)
    try:
        chain = wrappers(env)
        assert "EpisodicLife" not in chain and "ClipReward" not in chain and "FireReset" in chain
        assert env.envs[0].unwrapped.ale.getFloat("repeat_action_probability") == 0.0
    finally:
        env.close()
    p = resolve_protocol(cfg)
    assert (p.family, p.deterministic, p.epsilon, p.repeat_action_probability) == ("atari", True, 0.0, 0.0)
    assert (p.max_episode_steps, p.max_episode_frames, p.frame_skip, p.noop_max) == (27_000, 108_000, 4, 30)
    assert "no reward clipping, no episodic life" in p.score


@atari
def test_a_sampled_evaluation_is_a_setting_and_says_so():
    p = resolve_protocol(build_config("ppo", "ALE/Pong-v5", sets=["eval.deterministic=false"]))
    assert not p.deterministic and p.describe().startswith("atari; sampled actions, epsilon 0")


# --- the EnvPool backend


@needs_envpool
@pytest.mark.parametrize("evaluation", [False, True])
def test_envpool_runs_the_presets_protocol_with_the_sync_backends_layout(evaluation):
    cfg = build_config("ppo", "ALE/Pong-v5", sets=["env.backend=envpool"])
    env = make_env(cfg, num_envs=2, evaluation=evaluation)
    try:
        opts = env._options
        assert (opts["repeat_action_probability"], opts["noop_max"], opts["frame_skip"], opts["stack_num"]) == (0.0, 30, 4, 4)
        assert (opts["episodic_life"], opts["reward_clip"]) == (not evaluation, not evaluation)
        assert (opts["img_height"], opts["img_width"], opts["gray_scale"], opts["use_fire_reset"]) == (84, 84, True, True)
        sync = make_env(build_config("ppo", "ALE/Pong-v5"), num_envs=2, evaluation=evaluation)
        try:
            assert env.single_observation_space == sync.single_observation_space
            assert env.single_action_space == sync.single_action_space
            a, b = env.reset(seed=0), sync.reset(seed=0)
            assert (a.dtype, a.shape) == (b.dtype, b.shape) == (torch.uint8, (2, 4, 84, 84))
            out = [env.step(torch.randint(0, 6, (2,))) for _ in range(200)]
            ref = [sync.step(torch.randint(0, 6, (2,))) for _ in range(200)]
        finally:
            sync.close()
    finally:
        env.close()
    for steps in (out, ref):
        obs, rew, term, trunc, info = steps[-1]
        assert obs.dtype == torch.uint8 and rew.dtype == torch.float32 and term.dtype == trunc.dtype == torch.bool
        assert set(info) >= {"final_obs", "episode_return", "episode_length"}
        rewards = torch.cat([s[1] for s in steps])
        assert set(rewards.tolist()) <= {-1.0, 0.0, 1.0}  # Pong scores one point at a time either way
    # the same screen: grey levels of the background agree to within a few units
    means = [torch.stack([s[0].float().mean() for s in steps]).mean().item() for steps in (out, ref)]
    assert abs(means[0] - means[1]) < 3.0


@needs_envpool
def test_envpool_reads_noop_max_zero_as_no_noops_instead_of_crashing():
    # EnvPool itself draws 0 .. noop_max - 1 no-ops and dies with SIGSEGV on noop_max=0
    env = make_vec_env("Pong", 4, {"repeat_action_probability": 0.0}, backend="envpool",
                       atari_wrappers={"noop_max": 0})
    try:
        first = torch.cat([env.reset(seed=0), env.reset(seed=5)])
    finally:
        env.close()
    assert env._options["noop_max"] == 1
    assert all(torch.equal(o, first[0]) for o in first)  # no random no-ops: every start is the same screen


@needs_envpool
@pytest.mark.parametrize("sticky", [0.0, 0.25])
@pytest.mark.parametrize("backend", ["sync", "envpool"])
def test_a_policy_that_never_fires_plays_whole_breakout_games_on_either_backend(backend, sticky):
    # EnvPool presses FIRE on reset only, and not at all under sticky actions: without corral's
    # FIRE a no-op policy would play until the cap (the evaluation's protocol says FIRE is pressed)
    cfg = build_config("ppo", "Breakout", sets=[f"env.backend={backend}", "eval.max_episode_steps=3000",
                                                f"env.repeat_action_probability={sticky}"])
    env = make_env(cfg, num_envs=2, evaluation=True)
    try:
        result = evaluate_policy(noop, env, 2, resolve_protocol(cfg), seed=0)
    finally:
        env.close()
    assert result["episodes"] == 2 and result["episodes_at_cap"] == 0
    assert result["mean_length"] < 1000  # five lives of a few dozen steps each


@needs_envpool
@pytest.mark.parametrize("sticky", [0.0, 0.25])
def test_envpool_training_envs_launch_the_ball_after_every_lost_life(sticky):
    env = make_vec_env("Breakout", 2, {"repeat_action_probability": sticky}, backend="envpool")
    lives_lost = 0
    try:
        env.reset(seed=0)
        for _ in range(600):
            _, _, term, _, info = env.step(torch.zeros(2, dtype=torch.long))
            lives_lost += int((term & ~info.get("episode_done", torch.zeros_like(term))).sum())
    finally:
        env.close()
    assert lives_lost >= 8  # each life ends within ~25 steps when the ball is in play


@needs_envpool
def test_ppo_trains_and_evaluates_on_envpool_pong_with_the_preset(tmp_path):
    from corral import train

    agent = train("ppo", "ALE/Pong-v5", steps=1024, run_dir=str(tmp_path / "run"), **{
        "env.backend": "envpool", "progress": False, "tensorboard": False, "eval.episodes": 1,
        "eval.num_envs": 1, "eval.max_episode_steps": 100})
    assert (tmp_path / "run" / "eval.json").is_file()
    protocol = agent.summary["eval"]["protocol"]
    assert (protocol["repeat_action_probability"], protocol["deterministic"], protocol["epsilon"]) == (0.0, True, 0.0)


def test_the_atari_suite_runs_the_issues_budgets_in_frames():
    from corral.bench.suite import load_suite

    suite = load_suite("atari")
    frames = {f"{algo}/{env}": 4 * steps for algo, env, steps, _ in suite.cells}
    assert frames == {"ppo/ALE/Pong-v5": 15_000_000, "ppo/ALE/Breakout-v5": 10_000_000,
                      "rainbow/ALE/Pong-v5": 10_000_000, "qrdqn/ALE/Pong-v5": 10_000_000}
    assert len(suite.seeds) >= 2 and set(suite.speeds) == set(frames)  # --dry-run estimates every cell
