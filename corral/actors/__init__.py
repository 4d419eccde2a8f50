"""Actors: networks that map observations to actions (and what an algorithm needs)."""

from corral.actors.actor_critic import ActorCritic
from corral.actors.normalizer import RunningNormalizer

__all__ = ["ActorCritic", "RunningNormalizer"]
