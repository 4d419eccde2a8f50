"""Env layer: making envs from what a user names, and vector backends with one contract."""

from corral.envs.base import EnvError, VecEnv
from corral.envs.host import HostVecEnv
from corral.envs.make import env_name, make_factory, register
from corral.envs.masked import register_masked
from corral.envs.sync import SyncVecEnv
from corral.envs.vec import BACKENDS, make_vec_env

register_masked()  # CartPoleNoVel-v1, PendulumNoVel-v1, ...: the velocities masked

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
