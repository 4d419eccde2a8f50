import pytest
import yaml

from corral import config as C
from corral.errors import UserError
from corral.train.setup import build_config


def test_preset_is_used_by_default_and_set_overrides_it():
    cfg = build_config("ppo", "CartPole-v1")
    assert cfg.algo_cfg.n_steps == 32 and cfg.env.num_envs == 8  # rl-zoo CartPole preset
    cfg = build_config("ppo", "CartPole-v1", sets=["ppo.n_steps=64", "lr=3e-4", "env.num_envs=2"])
    assert cfg.algo_cfg.n_steps == 64
    assert cfg.algo_cfg.lr == pytest.approx(3e-4)
    assert cfg.env.num_envs == 2


def test_unknown_key_names_the_nearest_valid_keys():
    with pytest.raises(UserError, match=r"unknown config key 'ppo.n_step'.*ppo.n_steps"):
        build_config("ppo", "CartPole-v1", sets=["ppo.n_step=3"])
    with pytest.raises(UserError, match=r"gae_lambda"):
        build_config("ppo", "CartPole-v1", sets=["gae_lamda=0.9"])


def test_wrong_value_type_is_rejected_with_the_expected_type():
    with pytest.raises(UserError, match=r"ppo.n_steps: expected int, got 'many'"):
        build_config("ppo", "CartPole-v1", sets=["ppo.n_steps=many"])
    with pytest.raises(UserError, match=r"expected int, got 2.5"):
        build_config("ppo", "CartPole-v1", sets=["env.num_envs=2.5"])
    with pytest.raises(UserError, match="key=value"):
        build_config("ppo", "CartPole-v1", sets=["justakey"])


def test_optional_and_tuple_fields_parse_from_the_command_line():
    cfg = build_config("ppo", "CartPole-v1", sets=["target_kl=0.02", "hidden=[32, 16]", "clip_range_vf=null"])
    assert cfg.algo_cfg.target_kl == pytest.approx(0.02)
    assert cfg.algo_cfg.hidden == (32, 16)
    assert cfg.algo_cfg.clip_range_vf is None


def test_yaml_round_trip_gives_the_same_config(tmp_path):
    from corral.agent import config_from_dict

    cfg = build_config("ppo", "Pendulum-v1", sets=["seed=3", "env.kwargs.g=9.81"])
    text = C.dump_yaml(cfg)
    again = config_from_dict(yaml.safe_load(text))
    assert C.to_dict(again) == C.to_dict(cfg)
    path = tmp_path / "c.yaml"
    path.write_text(text)
    from_file = build_config("ppo", "Pendulum-v1", config_file=str(path))
    assert C.to_dict(from_file) == C.to_dict(cfg)


def test_unknown_algorithm_suggests_close_names():
    with pytest.raises(UserError, match="did you mean ppo"):
        build_config("ppoo", "CartPole-v1")
