"""Exploration bonuses shared by the exploration algorithms (``ppo_rnd``; NGU and Agent57 use
RND's novelty as their life-long multiplier)."""

from corral.exploration.rnd import RND, IntrinsicReturnNormalizer

__all__ = ["RND", "IntrinsicReturnNormalizer"]
