"""The user jobs of the command line that are not the paper: one module per job.

- :mod:`.demo`: ``mptlml demo``, PPCA on scikit-learn's digits, the exact LML
  beside every estimator;
- :mod:`.curve`: ``mptlml curve``, the MPT curve of a masked LM on texts (and
  the masked-LM run settings and scoring that the parts ``antibody`` and
  ``bert`` share);
- :mod:`.select`: ``mptlml select``, the latent dimension chosen by held-out MPT.

Each ends with ``JOB = Job(...)`` (:class:`mptlml.runs.job.Job`); the command
line turns it into a command with one line. The parts of the paper
(:mod:`mptlml.reproduce`) may build on these jobs; the jobs never import them,
and the library never imports this package.
"""
