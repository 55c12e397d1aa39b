"""The submit room: a run file becomes a committed run with its arrays in Slurm.

- ``checked``: resolve the run and run the login-node checks (nothing written yet);
- ``stage``: stage the run directory and commit ``run.json`` (removed again on failure);
- ``arrays``: held arrays, their submission records, release and crash recovery;
- ``flow``: the order of a submit (and of a benchmark's cases), what ``api.submit`` and
  ``api.benchmark_run`` call.

``status`` finishes a submit that crashed through ``arrays.recover_submissions``.
"""
