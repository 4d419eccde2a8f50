"""Gymnasium's classic-control envs as batched torch physics.

Each class follows ``gymnasium/envs/classic_control/*.py`` (Gymnasium 1.4) line by
line: the same constants, computed the same way, and the same order of floating-point
operations, so that in float64 the trajectories match Gymnasium's numpy arithmetic up
to the odd last-bit difference of ``sin``/``cos`` (checked in
``tests/test_native_envs.py``). Keep the order of operations when editing: ``a + b``
and ``b + a`` round the same, ``(a + b) + c`` and ``a + (b + c)`` do not. For the same
reason there is no ``add_(x, alpha=...)``: it may fuse into an FMA and round once.

Arithmetic on actions stays in the action's dtype (float32 as Gymnasium's Box gives),
mirroring numpy's promotion: ``3.0 * u`` with a float32 ``u`` rounds to float32 there.

On CUDA, division by a Python scalar becomes multiplication by its reciprocal, so
results there agree with Gymnasium to rounding, not to the bit.
"""

from __future__ import annotations

import math

import gymnasium as gym
import numpy as np
import torch

from corral.envs.native.core import NativeVecEnv


class CartPole(NativeVecEnv):
    """CartPole-v1. State: x, x_dot, theta, theta_dot. Reward 1 every step, terminal one included."""

    gym_id = "CartPole-v1"
    max_episode_steps = 500
    state_dim = 4

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    def _spaces(self):
        high = np.array([self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf], dtype=np.float32)
        return gym.spaces.Box(-high, high, dtype=np.float32), gym.spaces.Discrete(2)

    def _sample_initial(self, n):
        return self._uniform(n, [-0.05] * 4, [0.05] * 4)

    def _observe(self, s):
        return self._columns(list(s))

    def _advance(self, s, action):
        # The hot path of the benchmark: every temporary lives in reused scratch rows
        # (see _scratch), each reused once its value is dead.
        x, x_dot, theta, theta_dot = s  # row views: the in-place updates below write the state
        w = self._scratch("cartpole", 5)
        mask = self._scratch("cartpole_mask", 1, torch.bool)[0]
        costheta = torch.cos(theta, out=w[0])
        sintheta = torch.sin(theta, out=w[1])
        # Any action but 1 pushes left, as in gym: 20 * (a == 1) - 10 is exactly +-10.
        force = torch.mul(torch.eq(action, 1, out=mask), 2 * self.force_mag, out=w[2]).sub_(self.force_mag)
        temp = torch.mul(theta_dot, theta_dot, out=w[3]).mul_(self.polemass_length).mul_(sintheta)
        temp.add_(force).div_(self.total_mass)
        # thetaacc = (g sin - cos temp) / (l (4/3 - m_p cos^2 / M))
        thetaacc = sintheta.mul_(self.gravity).sub_(torch.mul(costheta, temp, out=w[2]))
        denom = torch.mul(costheta, costheta, out=w[4]).mul_(self.masspole).div_(self.total_mass)
        thetaacc.div_(denom.neg_().add_(4.0 / 3.0).mul_(self.length))  # 4/3 - v == -v + 4/3 exactly
        xacc = temp.sub_(torch.mul(thetaacc, self.polemass_length, out=w[4]).mul_(costheta).div_(self.total_mass))
        # Explicit Euler (gym's default kinematics_integrator): positions use the old velocities.
        x.add_(torch.mul(x_dot, self.tau, out=w[0]))
        x_dot.add_(xacc.mul_(self.tau))
        theta.add_(torch.mul(theta_dot, self.tau, out=w[0]))
        theta_dot.add_(thetaacc.mul_(self.tau))
        # |x| > t is exactly gym's (x < -t or x > t).
        terminated = torch.abs(x, out=w[0]) > self.x_threshold
        terminated |= torch.gt(torch.abs(theta, out=w[0]), self.theta_threshold_radians, out=mask)
        reward = torch.ones(self.num_envs, dtype=torch.float32, device=self.device)
        return reward, terminated



class CartPoleNoVel(CartPole):
    """CartPole-v1 with the velocities (x_dot, theta_dot) read as 0: ``CartPoleNoVel-v1``."""

    gym_id = "CartPoleNoVel-v1"

    def _observe(self, s):
        x, _, theta, _ = s
        zero = torch.zeros_like(x)
        return self._columns([x, zero, theta, zero])

class Acrobot(NativeVecEnv):
    """Acrobot-v1 ("book" dynamics, RK4 over dt=0.2). State: theta1, theta2, dtheta1, dtheta2."""

    gym_id = "Acrobot-v1"
    max_episode_steps = 500
    state_dim = 4

    dt = 0.2
    LINK_LENGTH_1 = 1.0
    LINK_MASS_1 = 1.0
    LINK_MASS_2 = 1.0
    LINK_COM_POS_1 = 0.5
    LINK_COM_POS_2 = 0.5
    LINK_MOI = 1.0
    MAX_VEL_1 = 4 * math.pi
    MAX_VEL_2 = 9 * math.pi
    g = 9.8

    def _spaces(self):
        high = np.array([1.0, 1.0, 1.0, 1.0, self.MAX_VEL_1, self.MAX_VEL_2], dtype=np.float32)
        return gym.spaces.Box(-high, high, dtype=np.float32), gym.spaces.Discrete(3)

    def _sample_initial(self, n):
        # gym draws in float64 and stores float32 (``.astype(np.float32)``).
        return self._uniform(n, [-0.1] * 4, [0.1] * 4).to(torch.float32).to(self.dtype)

    def _observe(self, s):
        th1, th2, dth1, dth2 = s
        return self._columns([th1.cos(), th1.sin(), th2.cos(), th2.sin(), dth1, dth2])

    def _dsdt(self, theta1, theta2, dtheta1, dtheta2, a):
        """Time derivative of the state; gym's ``_dsdt`` with its constants folded the way Python folds them."""
        m1, m2 = self.LINK_MASS_1, self.LINK_MASS_2
        l1, lc1, lc2 = self.LINK_LENGTH_1, self.LINK_COM_POS_1, self.LINK_COM_POS_2
        I1 = I2 = self.LINK_MOI
        g = self.g
        cos2 = theta2.cos()
        sin2 = theta2.sin()
        # d1 = m1 lc1^2 + m2 (l1^2 + lc2^2 + 2 l1 lc2 cos2) + I1 + I2, summed left to right.
        d1 = ((m2 * ((cos2 * (2 * l1 * lc2)) + (l1**2 + lc2**2))) + m1 * lc1**2) + I1 + I2
        d2 = m2 * ((cos2 * (l1 * lc2)) + lc2**2) + I2
        phi2 = (m2 * lc2 * g) * (theta1 + theta2 - math.pi / 2.0).cos()
        phi1 = (
            (-m2 * l1 * lc2) * dtheta2.square() * sin2
            - (2 * m2 * l1 * lc2) * dtheta2 * dtheta1 * sin2
            + ((m1 * lc1 + m2 * l1) * g) * (theta1 - math.pi / 2).cos()
            + phi2
        )
        ddtheta2 = (a + d2 / d1 * phi1 - (m2 * l1 * lc2) * dtheta1.square() * sin2 - phi2) / (
            (m2 * lc2**2 + I2) - d2.square() / d1
        )
        ddtheta1 = -(d2 * ddtheta2 + phi1) / d1
        return dtheta1, dtheta2, ddtheta1, ddtheta2

    def _advance(self, s, action):
        torque = action.to(self.dtype) - 1.0  # AVAIL_TORQUE = [-1, 0, +1]
        y0 = tuple(s)
        dt = self.dt - 0  # gym integrates over t = [0, dt]
        dt2 = dt / 2.0
        k1 = self._dsdt(*y0, torque)
        k2 = self._dsdt(*(y + dt2 * k for y, k in zip(y0, k1)), torque)
        k3 = self._dsdt(*(y + dt2 * k for y, k in zip(y0, k2)), torque)
        k4 = self._dsdt(*(y + dt * k for y, k in zip(y0, k3)), torque)
        ns = [y + dt / 6.0 * (a + 2 * b + 2 * c + d) for y, a, b, c, d in zip(y0, k1, k2, k3, k4)]
        th1 = _wrap(ns[0], -math.pi, math.pi)
        th2 = _wrap(ns[1], -math.pi, math.pi)
        dth1 = ns[2].clamp_(-self.MAX_VEL_1, self.MAX_VEL_1)
        dth2 = ns[3].clamp_(-self.MAX_VEL_2, self.MAX_VEL_2)
        for row, new in zip(s, (th1, th2, dth1, dth2)):
            row.copy_(new)
        terminated = (-th1.cos() - (th2 + th1).cos()) > 1.0
        reward = terminated.to(torch.float32) - 1.0  # -1 each step, 0 on reaching the goal
        return reward, terminated


def _wrap(x: torch.Tensor, m: float, M: float) -> torch.Tensor:
    """gym's ``wrap``: ``while x > M: x -= M - m`` then ``while x < m: x += M - m``.

    One pass of each loop matches gym exactly and covers every step we have seen (an
    angle leaves [-pi, pi] by less than a period per RK4 step unless the speeds are
    extreme); what is still outside after it is brought in with a remainder, which
    agrees with gym's repeated subtraction up to rounding. No data-dependent loop:
    that would need a device sync.
    """
    diff = M - m
    x = torch.where(x > M, x - diff, x)
    x = torch.where(x < m, x + diff, x)
    return torch.where((x > M) | (x < m), torch.remainder(x - m, diff) + m, x)


class MountainCar(NativeVecEnv):
    """MountainCar-v0. State: position, velocity. Reward -1 every step."""

    gym_id = "MountainCar-v0"
    max_episode_steps = 200
    state_dim = 2

    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.5
    goal_velocity = 0
    force = 0.001
    gravity = 0.0025

    def _spaces(self):
        low = np.array([self.min_position, -self.max_speed], dtype=np.float32)
        high = np.array([self.max_position, self.max_speed], dtype=np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32), gym.spaces.Discrete(3)

    def _sample_initial(self, n):
        position = self._uniform(n, [-0.6], [-0.4])
        return torch.cat([position, torch.zeros_like(position)])

    def _observe(self, s):
        return self._columns(list(s))

    def _advance(self, s, action):
        position, velocity = s
        velocity.add_((action - 1).to(self.dtype).mul_(self.force).add_((3 * position).cos_().mul_(-self.gravity)))
        velocity.clamp_(-self.max_speed, self.max_speed)
        position.add_(velocity).clamp_(self.min_position, self.max_position)
        # The left wall is inelastic.
        velocity.masked_fill_((position == self.min_position) & (velocity < 0), 0.0)
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        reward = torch.full((self.num_envs,), -1.0, dtype=torch.float32, device=self.device)
        return reward, terminated


class MountainCarContinuous(NativeVecEnv):
    """MountainCarContinuous-v0. State: position, velocity. Reward 100 at the goal minus 0.1 a^2."""

    gym_id = "MountainCarContinuous-v0"
    max_episode_steps = 999
    state_dim = 2

    min_action = -1.0
    max_action = 1.0
    min_position = -1.2
    max_position = 0.6
    max_speed = 0.07
    goal_position = 0.45
    goal_velocity = 0
    power = 0.0015

    def _spaces(self):
        low = np.array([self.min_position, -self.max_speed], dtype=np.float32)
        high = np.array([self.max_position, self.max_speed], dtype=np.float32)
        act = gym.spaces.Box(low=self.min_action, high=self.max_action, shape=(1,), dtype=np.float32)
        return gym.spaces.Box(low, high, dtype=np.float32), act

    def _sample_initial(self, n):
        position = self._uniform(n, [-0.6], [-0.4])
        return torch.cat([position, torch.zeros_like(position)])

    def _observe(self, s):
        return self._columns(list(s))

    def _physics(self, s, a, work):
        """One step of gym's arithmetic with the state in ``work`` precision.

        gym stores this env's state as a float32 array and numpy keeps float32
        arithmetic when the other operand is a Python float (NEP 50): so its physics
        runs in float32, except on the first step of an episode, which starts from the
        float64 array ``reset`` makes. The slope term is a Python double in gym
        (``0.0025 * math.cos(3 * position)``); we take it in ``self.dtype``.
        """
        f32 = torch.float32
        position = s[0].to(work, copy=True)
        velocity = s[1].to(work, copy=True)
        slope = (3 * position).to(self.dtype).cos_().mul_(0.0025)
        # gym's min(max(a, -1.0), 1.0) keeps the float32 action when in range (float32
        # product, then float32 difference); when clipped the force is a Python float
        # and the whole term is one double expression.
        in_range = (a >= self.min_action) & (a <= self.max_action)
        dv_in = (a * self.power).sub_(slope.to(f32))
        dv_out = (a.clamp(self.min_action, self.max_action).to(self.dtype) * self.power).sub_(slope).to(work)
        velocity.add_(torch.where(in_range, dv_in.to(work), dv_out)).clamp_(-self.max_speed, self.max_speed)
        position.add_(velocity).clamp_(self.min_position, self.max_position)
        velocity.masked_fill_((position == self.min_position) & (velocity < 0), 0.0)  # inelastic left wall
        terminated = (position >= self.goal_position) & (velocity >= self.goal_velocity)
        return position, velocity, terminated

    def _advance(self, s, action):
        a = action[:, 0].to(torch.float32)
        position, velocity, terminated = self._physics(s, a, torch.float32)
        if self.dtype == torch.float64:
            # Reproduce gym's float64 first step of each episode too (a last-bit matter).
            p64, v64, term64 = self._physics(s, a, torch.float64)
            first = self._elapsed == 0
            position = torch.where(first, p64.to(torch.float32), position)
            velocity = torch.where(first, v64.to(torch.float32), velocity)
            terminated = torch.where(first, term64, terminated)
        s[0].copy_(position)  # float32 values, as gym stores them
        s[1].copy_(velocity)
        # The penalty uses the unclipped action, in double as gym's math.pow.
        reward = terminated.to(self.dtype).mul_(100.0).sub_(a.to(self.dtype).square().mul_(0.1))  # a may be the caller's
        return reward.to(torch.float32), terminated


class Pendulum(NativeVecEnv):
    """Pendulum-v1. State: theta, theta_dot. Obs: cos, sin, theta_dot. Never terminates."""

    gym_id = "Pendulum-v1"
    max_episode_steps = 200
    state_dim = 2

    max_speed = 8
    max_torque = 2.0
    dt = 0.05
    g = 10.0
    m = 1.0
    l = 1.0  # noqa: E741 (gym's name)

    def _spaces(self):
        high = np.array([1.0, 1.0, self.max_speed], dtype=np.float32)
        act = gym.spaces.Box(low=-self.max_torque, high=self.max_torque, shape=(1,), dtype=np.float32)
        return gym.spaces.Box(low=-high, high=high, dtype=np.float32), act

    def _sample_initial(self, n):
        return self._uniform(n, [-math.pi, -1.0], [math.pi, 1.0])

    def _observe(self, s):
        th, thdot = s
        return self._columns([th.cos(), th.sin(), thdot])

    def _advance(self, s, action):
        th, thdot = s
        g, m, l, dt = self.g, self.m, self.l, self.dt  # noqa: E741 - gym's names
        u = action[:, 0].clamp(-self.max_torque, self.max_torque)
        angle = torch.remainder(th + math.pi, 2 * math.pi) - math.pi  # gym's angle_normalize
        costs = angle.square() + 0.1 * thdot.square() + 0.001 * u.square()
        newthdot = thdot + (3 * g / (2 * l) * th.sin() + 3.0 / (m * l**2) * u) * dt
        newthdot.clamp_(-self.max_speed, self.max_speed)
        th.add_(newthdot * dt)
        thdot.copy_(newthdot)
        reward = costs.neg_().to(torch.float32)
        terminated = torch.zeros(self.num_envs, dtype=torch.bool, device=self.device)
        return reward, terminated
