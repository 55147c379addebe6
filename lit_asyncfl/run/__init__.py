"""The parts of a ``FederatedTrainer``'s run, one job each: the trainer (:mod:`lit_asyncfl.trainer`) holds the
settings and runs the loop, and calls these.

- :mod:`~lit_asyncfl.run.checks`: the constructor's argument checks;
- :mod:`~lit_asyncfl.run.wiring`: the simulator wired at fit start (data, engine, executor, server);
- :mod:`~lit_asyncfl.run.checkpointing`: a run to and from a resumable checkpoint;
- :mod:`~lit_asyncfl.run.ending`: the end of a run (final evaluation, summary) and a failure's record;
- :mod:`~lit_asyncfl.run.stages`: ``validate`` and ``test``.
"""

__all__: list[str] = []  # internal parts of FederatedTrainer: nothing here is public API
