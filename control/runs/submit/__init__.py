"""The submit room: a run file becomes a committed run with its arrays in Slurm.

- ``checked``: resolve the run and run the login-node checks (nothing written yet);
- ``stage``: stage the run directory and commit ``run.json`` (removed again on failure);
- ``arrays``: held arrays, their submission records, release and crash recovery;
- ``flow``: the order of a submit (and of a benchmark's cases), what ``api.submit`` and
  ``api.benchmark_run`` call.

``load_submissions`` and ``recover_submissions`` are here for ``status``, which finishes
a submit that crashed.
"""

from synthbatch.control.runs.submit.arrays import load_submissions, recover_submissions

__all__ = ["load_submissions", "recover_submissions"]
