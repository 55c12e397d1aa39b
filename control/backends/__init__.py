"""The schedulers the run services talk to: Slurm (``control/slurm/scheduler.Scheduler``)
and the local backend (``control/backends/local``), which runs the same batch scripts as
local process trees, without Slurm. Both answer with the same ``JobRow`` vocabulary.
"""
