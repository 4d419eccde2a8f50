"""MPE envs (``mpe2``) with state for exact resume.

``mpe:NAME`` builds ``MPEParallel``: PettingZoo's own AEC-to-parallel conversion of the
module's AEC env (what ``mpe2.NAME.parallel_env`` returns), plus the env-state hooks
``corral.envs.multiagent`` reads (``corral_state`` / ``corral_load_state``), so a checkpoint
holds every env mid-episode and a resumed run continues those episodes bit for bit.

What the state holds, as numpy arrays and plain values: every entity's position, velocity
and colour, every agent's communication state and goal entities (``goal_a``/``goal_b``, as
entity indices, -1 for none), the step counter, the env's ``np_random`` generator state, the
live agents, the AEC bookkeeping between parallel steps (agent selector, rewards), and the
camera range. Scenario state kept outside the entities (``collect_treasure``'s treasure
types, for example) is not covered; ``simple_spread``, ``simple_adversary``, ``simple_tag``
and the other entity-only scenarios are.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from pettingzoo.utils.conversions import aec_to_parallel_wrapper

GOALS = ("goal_a", "goal_b")


def _stack(values: list) -> np.ndarray:
    return np.stack([np.asarray(v, np.float64) for v in values]) if values else np.zeros((0,), np.float64)


class MPEParallel(aec_to_parallel_wrapper):
    """An ``mpe2`` env in PettingZoo's parallel conversion, with ``corral_state`` hooks."""

    @property
    def _raw(self) -> Any:
        return self.aec_env.unwrapped

    def corral_state(self) -> dict:
        raw = self._raw
        world = raw.world
        ents = list(world.entities)
        index = {id(e): i for i, e in enumerate(ents)}
        goals = [[index.get(id(getattr(a, "_" + g, None) if hasattr(a, "_" + g) else getattr(a, g, None)), -1)
                  for g in GOALS] for a in world.agents]
        names = raw.possible_agents
        sel = raw._agent_selector
        return {
            "steps": int(raw.steps),
            "rng": raw.np_random.bit_generator.state,
            "raw_agents": [a in raw.agents for a in names],
            "agents": [a in self.agents for a in names],
            "selection": names.index(raw.agent_selection) if raw.agent_selection in names else -1,
            "selector": [int(sel._current_agent),
                         names.index(sel.selected_agent) if sel.selected_agent in names else -1],
            "rewards": np.array([raw.rewards.get(a, 0.0) for a in names], np.float64),
            "cumulative": np.array([raw._cumulative_rewards.get(a, 0.0) for a in names], np.float64),
            "pos": _stack([e.state.p_pos for e in ents]),
            "vel": _stack([e.state.p_vel for e in ents]),
            "color": _stack([e.color for e in ents]),
            "comm": _stack([a.state.c for a in world.agents]),
            "goals": np.array(goals, np.int64).reshape(len(world.agents), len(GOALS)),
            "cam": float(raw.original_cam_range),
        }

    def corral_load_state(self, state: dict) -> None:
        raw = self._raw
        world = raw.world
        ents = list(world.entities)
        names = raw.possible_agents
        raw.steps = int(state["steps"])
        raw.np_random.bit_generator.state = state["rng"]
        raw.agents = [a for a, on in zip(names, state["raw_agents"]) if on]
        self.agents = [a for a, on in zip(names, state["agents"]) if on]
        for i, e in enumerate(ents):
            e.state.p_pos = np.array(state["pos"][i], np.float64)
            e.state.p_vel = np.array(state["vel"][i], np.float64)
            e.color = np.array(state["color"][i], np.float64)
        for j, a in enumerate(world.agents):
            a.state.c = np.array(state["comm"][j], np.float64)
            for g, k in zip(GOALS, state["goals"][j]):
                if int(k) >= 0:
                    setattr(a, g, ents[int(k)])
        sel = raw._agent_selector
        sel._current_agent = int(state["selector"][0])
        if int(state["selector"][1]) >= 0:
            sel.selected_agent = names[int(state["selector"][1])]
        if int(state["selection"]) >= 0:
            raw.agent_selection = names[int(state["selection"])]
        raw.rewards = {a: float(r) for a, r in zip(names, state["rewards"]) if a in raw.agents}
        raw._cumulative_rewards = {a: float(r) for a, r in zip(names, state["cumulative"]) if a in raw.agents}
        raw.original_cam_range = float(state["cam"])
