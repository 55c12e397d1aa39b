"""The submit room: a run file becomes a committed run with its arrays in Slurm.

- ``arrays``: held arrays, their submission records, release and crash recovery;
- ``flow``: the order of a submit (and of a benchmark's cases), what ``api.submit`` and
  ``api.benchmark_run`` call: ``checked`` (resolve and run the login-node checks, nothing
  written yet), ``staged`` (stage the run directory, commit ``run.json``), submit.

``status`` finishes a submit that crashed through ``arrays.recover_submissions``.
"""
