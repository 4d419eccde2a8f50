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


# --- choices, ranges and other libraries' names, checked where a value is set


@pytest.mark.parametrize("key,value,needle", [
    ("ppo.lr_schedule", "cosine", "config ppo.lr_schedule: 'cosine' is not one of constant, linear; did you mean"),
    ("clip_schedule", "linnear", "'linnear' is not one of constant, linear; did you mean 'linear'?"),
    ("activation", "reluu", "config ppo.activation: 'reluu' is not one of tanh, relu, elu, silu; did you mean 'relu'?"),
    ("env.backend", "subprocess", ("config env.backend: 'subprocess' is not one of sync, subproc, envpool, native; "
                                   "did you mean 'subproc'?")),
    ("env.on_error", "retsart", "did you mean 'restart'?"),
    ("scheme.collect", "asynch", "config scheme.collect: 'asynch' is not one of sync, async; did you mean 'async'?"),
    ("scheme.grad", "SYNC", "did you mean 'sync'?"),
])
def test_a_value_outside_a_closed_set_names_the_choices_and_the_nearest(key, value, needle):
    with pytest.raises(UserError) as e:
        build_config("ppo", "CartPole-v1", sets=[f"{key}={value}"])
    assert needle in str(e.value)


def test_dqn_loss_is_a_closed_set_too():
    with pytest.raises(UserError, match=r"dqn.loss: 'l2' is not one of huber, mse; did you mean 'mse'\?"):
        build_config("dqn", "CartPole-v1", sets=["loss=l2"])
    assert build_config("dqn", "CartPole-v1", sets=["loss=mse"]).algo_cfg.loss == "mse"


def test_activation_choices_are_the_networks_activations():
    import typing

    from corral.nets import ACTIVATIONS

    assert set(typing.get_args(C.Activation)) == set(ACTIVATIONS)


@pytest.mark.parametrize("algo,item,needle", [
    ("ppo", "ppo.n_epochs=-3", "config ppo.n_epochs: -3 is out of range; it must be >= 1"),
    ("ppo", "gamma=1.5", "config ppo.gamma: 1.5 is out of range; it must be in [0, 1]"),
    ("ppo", "gae_lambda=-0.1", "it must be in [0, 1]"),
    ("ppo", "lr=0", "config ppo.lr: 0.0 is out of range; it must be > 0"),
    ("ppo", "batch_size=0", "ppo.batch_size: 0 is out of range"),
    ("ppo", "clip_range=0", "it must be > 0"),
    ("ppo", "clip_range_vf=-1", "ppo.clip_range_vf"),
    ("ppo", "ent_coef=-0.01", "it must be >= 0"),
    ("ppo", "hidden=[64, 0]", "config ppo.hidden: (64, 0) is out of range; it must be >= 1"),
    ("ppo", "gamma=.nan", "ppo.gamma: nan is out of range"),
    ("ppo", "env.num_envs=0", "config env.num_envs: 0 is out of range; it must be >= 1"),
    ("ppo", "steps=0", "config steps: 0 is out of range"),
    ("ppo", "seed=-1", "config seed: -1 is out of range; it must be >= 0"),
    ("ppo", "scheme.collectors=0", "scheme.collectors"),
    ("impala", "batch_size=-1", "it must be >= 0"),
    ("dqn", "tau=0", "config dqn.tau: 0.0 is out of range; it must be in (0, 1]"),
    ("dqn", "buffer_size=0", "dqn.buffer_size"),
    ("dqn", "n_step=0", "dqn.n_step"),
    ("dqn", "gradient_steps=0", "config dqn.gradient_steps: 0 is out of range; it must be >= 1 (or -1)"),
    ("dqn", "exploration_final_eps=2", "it must be in [0, 1]"),
    ("sac", "ent_coef_init=0", "sac.ent_coef_init"),
    ("td3", "policy_delay=0", "td3.policy_delay"),
    ("apex_dqn", "eps_base=1.5", "apex_dqn.eps_base"),
])
def test_a_number_out_of_range_is_rejected_with_the_range(algo, item, needle):
    with pytest.raises(UserError) as e:
        build_config(algo, "CartPole-v1", sets=[item])
    assert needle in str(e.value)


def test_special_values_inside_and_at_the_edges_of_ranges_pass():
    cfg = build_config("dqn", "CartPole-v1", sets=["gradient_steps=-1", "tau=1", "gamma=0", "learning_starts=0"])
    assert (cfg.algo_cfg.gradient_steps, cfg.algo_cfg.tau, cfg.algo_cfg.gamma) == (-1, 1.0, 0.0)
    assert build_config("impala", "CartPole-v1", sets=["batch_size=0"]).algo_cfg.batch_size == 0
    assert build_config("ppo", "CartPole-v1", sets=["clip_range_vf=null"]).algo_cfg.clip_range_vf is None


def test_python_overrides_and_config_files_are_checked_too(tmp_path):
    import corral

    with pytest.raises(UserError, match=r"ppo.gamma: 1.5 is out of range; it must be in \[0, 1\]"):
        corral.train("ppo", "CartPole-v1", steps=64, save_run=False, gamma=1.5)
    with pytest.raises(UserError, match="ppo.lr_schedule: 'cosine'"):
        corral.train("ppo", "CartPole-v1", steps=64, save_run=False, lr_schedule="cosine")
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  n_epochs: -3\n")
    with pytest.raises(UserError, match="ppo.n_epochs: -3 is out of range"):
        build_config("ppo", "CartPole-v1", config_file=str(path))
    path.write_text("env:\n  on_error: ignore\n")
    with pytest.raises(UserError, match="env.on_error: 'ignore' is not one of raise, restart"):
        build_config("ppo", "CartPole-v1", config_file=str(path))


def test_native_and_problem_runs_are_checked_like_any_run():
    from corral.problems.maxcut_solver import ppo_config

    with pytest.raises(UserError, match="ppo.gamma: 1.5 is out of range"):
        build_config("ppo", "native:CartPole-v1", overrides={"ppo.gamma": 1.5})
    with pytest.raises(UserError, match="ppo.lr_schedule: 'cos'"):
        ppo_config(4, 0, "cpu", {"lr_schedule": "cos"})
    assert ppo_config(4, 0, "cpu", {"hidden": [32, 32]}).algo_cfg.hidden == (32, 32)


@pytest.mark.parametrize("algo,alias,value,key", [
    ("ppo", "learning_rate", 1e-3, "lr"),
    ("ppo", "num_sgd_iter", 3, "n_epochs"),
    ("ppo", "num_epochs", 3, "n_epochs"),
    ("ppo", "sgd_minibatch_size", 16, "batch_size"),
    ("ppo", "minibatch_size", 16, "batch_size"),
    ("ppo", "lambda", 0.9, "gae_lambda"),
    ("ppo", "lambda_", 0.9, "gae_lambda"),
    ("ppo", "clip_param", 0.1, "clip_range"),
    ("ppo", "vf_clip_param", 10.0, "clip_range_vf"),
    ("ppo", "entropy_coeff", 0.01, "ent_coef"),
    ("ppo", "vf_loss_coeff", 1.0, "vf_coef"),
    ("ppo", "rollout_fragment_length", 50, "n_steps"),
    ("ppo", "grad_clip", 1.0, "max_grad_norm"),
    ("ppo", "fcnet_hiddens", [32, 32], "hidden"),
    ("impala", "vtrace_clip_rho_threshold", 0.9, "rho_bar"),
    ("dqn", "train_batch_size", 64, "batch_size"),
    ("dqn", "target_network_update_freq", 500, "target_update_interval"),
    ("dqn", "double_q", True, "double"),
    ("dqn", "final_epsilon", 0.02, "exploration_final_eps"),
    ("apex_dqn", "rollout_fragment_length", 50, "rollout_fragment"),
    ("td3", "target_policy_noise", 0.1, "target_noise"),
])
def test_sb3_and_rllib_names_map_to_corrals_key_with_a_note(capsys, algo, alias, value, key):
    cfg = build_config(algo, "CartPole-v1", sets=[f"{alias}={value}"])
    got = getattr(cfg.algo_cfg, key)
    assert got == (tuple(value) if isinstance(value, list) else value)
    assert f"{alias!r} is '{algo}.{key}' in corral" in capsys.readouterr().err


def test_aliases_resolve_in_dotted_keys_files_and_python_overrides(tmp_path, capsys):
    cfg = build_config("ppo", "CartPole-v1", sets=["ppo.learning_rate=1e-3", "n_envs=3", "num_env_runners=2"],
                       overrides={"total_timesteps": 5000})
    assert (cfg.algo_cfg.lr, cfg.env.num_envs, cfg.scheme.collectors, cfg.steps) == (1e-3, 3, 2, 5000)
    path = tmp_path / "c.yaml"
    path.write_text("ppo:\n  num_sgd_iter: 4\n  learning_rate: 0.002\n")
    cfg = build_config("ppo", "CartPole-v1", config_file=str(path))
    assert (cfg.algo_cfg.n_epochs, cfg.algo_cfg.lr) == (4, 0.002)
    assert "'ppo.num_sgd_iter' is 'ppo.n_epochs' in corral" in capsys.readouterr().err
    with pytest.raises(UserError, match="ppo.lr: -1.0 is out of range"):  # an alias is checked like its key
        build_config("ppo", "CartPole-v1", sets=["learning_rate=-1"])


def test_names_whose_meaning_differs_are_explained_not_mapped():
    # RLlib's train_batch_size is PPO's rollout size, not its minibatch
    with pytest.raises(UserError, match=r"'train_batch_size': RLlib's train_batch_size is the rollout size.*n_steps"):
        build_config("ppo", "CartPole-v1", sets=["train_batch_size=4000"])
    with pytest.raises(UserError, match="adaptive KL penalty.*target_kl"):
        build_config("ppo", "CartPole-v1", sets=["kl_target=0.01"])
    with pytest.raises(UserError, match="unknown config key 'rollout_fragment_length'"):
        build_config("dqn", "CartPole-v1", sets=["rollout_fragment_length=4"])


def test_a_misspelt_name_suggests_the_key_it_meant():
    with pytest.raises(UserError, match=r"unknown config key 'learnig_rate'; nearest valid keys: ppo.lr"):
        build_config("ppo", "CartPole-v1", sets=["learnig_rate=1e-3"])


def _variants():
    from corral.algos import ALGOS

    return sorted(ALGOS)


@pytest.mark.parametrize("algo", _variants())
def test_every_algorithm_variant_and_its_presets_validate(algo):
    """Each registered variant's defaults and every preset of its algorithm (or of the base
    algorithm it reuses) build a config that passes every check."""
    from corral.algos import get_algo
    from corral.train.setup import PRESET_DIR

    spec = get_algo(algo)
    cfg = build_config(algo, "CartPole-v1", use_preset=False)
    C.check_config(cfg)
    envs = set()
    for name in {algo, spec.cls.name}:
        path = PRESET_DIR / f"{name}.yaml"
        if path.is_file():
            envs |= set(C.load_yaml(str(path)))
    for env_id in sorted(envs):
        C.check_config(build_config(algo, env_id))


def test_every_preset_file_is_some_algorithms():
    from corral.algos import ALGOS
    from corral.train.setup import PRESET_DIR

    assert {p.stem for p in PRESET_DIR.glob("*.yaml")} <= set(ALGOS)


def test_check_config_catches_an_out_of_range_default():
    cfg = build_config("ppo", "CartPole-v1")
    cfg.algo_cfg.gamma = 2.0  # what a Config with a bad default would hold
    with pytest.raises(UserError, match="ppo.gamma: 2.0 is out of range"):
        C.check_config(cfg)
