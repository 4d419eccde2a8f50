"""Env layer: making envs from what a user names, and vector backends with one contract."""

from corral.envs.base import EnvError, VecEnv
from corral.envs.deepsea import register_deepsea
from corral.envs.goal_envs import register_goal_envs
from corral.envs.host import HostVecEnv
from corral.envs.make import env_name, make_factory, register
from corral.envs.masked import register_masked
from corral.envs.sync import SyncVecEnv
from corral.envs.vec import BACKENDS, make_vec_env

register_masked()  # CartPoleNoVel-v1, PendulumNoVel-v1, ...: the velocities masked
register_deepsea()  # DeepSea-v0 (env.kwargs.size), DeepSea10-v0, ...: bsuite's hard-exploration chain
register_goal_envs()  # BitFlipping-v0, BitFlipping<N>-v0, PointReach-v0: GoalEnvs for HER (replay=her)

__all__ = [
    "BACKENDS",
    "EnvError",
    "HostVecEnv",
    "VecEnv",
    "SyncVecEnv",
    "env_name",
    "make_factory",
    "make_vec_env",
    "register",
]
