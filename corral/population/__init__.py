"""Populations of agents: ensembles and model fusion (``ensemble``), population-based training
(``pbt``), hyper-parameter search (``tune``) and tournament-based ensemble training
(``tournament``). Ray Tune and Optuna are the engines of search and PBT; nothing in
``corral.algos`` knows about them. docs/populations.md describes each."""
