"""Run plumbing shared by every job: the run directory, the settings, threads.

- :mod:`.rundir`: :class:`~.rundir.RunDir`, a run directory written as a
  transaction (:class:`~.rundir.Transaction`: staging directory, lock, atomic
  swap), results.json (:func:`~.rundir.load_results`) and the environment block;
- :mod:`.config`: a run's settings as a ``Config`` dataclass
  (:class:`~.config.RunConfig`, :func:`~.config.setting`), ``--set KEY=VALUE``;
- :mod:`.job`: :class:`~.job.Job` and :func:`~.job.run_job` (settings -> inputs
  -> run directory -> results.json);
- :mod:`.output`: printed tables and figures; :mod:`.threads`: torch threads.

The library (estimators, models, training, ...) never imports this package.
"""
