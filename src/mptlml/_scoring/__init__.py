"""The machinery that scores masks: it knows the models' protocols and no estimator.

The estimators (:mod:`mptlml.estimators`) say which masks to score and what
their scores mean; this package scores them, within memory and across
processes:

``dense``        blocks and grids of masks of ``(N, D)`` data, through a model's reductions;
``ragged``       (sequence, mask) pairs of ragged sequences: scoring units (tokens or
                 words) and their expansion to tokens, length buckets under a token
                 budget, chunks, checkpoints, ranks;
``checkpoints``  the ragged runner's validated, atomic chunk files;
``distributed``  ranks, devices, sharding and gathering on accelerate's ``PartialState``.

Nothing here imports :mod:`mptlml.estimators` (``tests/test_architecture.py``).
"""
