"""Training: the Learner loop (``learner``), its hooks (``hooks``), run setup (``setup``),
checkpoints (``checkpoint``) and evaluation (``evaluate``).

Nothing is imported here: collectors build the run's env with ``corral.train.setup``
without pulling in the Learner. The distributed schemes sit above this package and register
themselves with ``scheme_factory`` (``import corral`` does it)."""
