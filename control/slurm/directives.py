"""``#SBATCH`` options the plan adds beyond the renderer's base set (pure).

The renderer builds its option dict (job name, time, nodes, ntasks, cpus, mem, GPUs, ...)
and passes it through ``apply_directives`` before sorting and quoting:

- ``reservation`` and the profile's allow-listed ``sbatch_options`` are added
  (value ``""`` renders as a bare flag, e.g. ``--exclusive``);
- with more than one node, ``--ntasks=1`` becomes ``--ntasks-per-node=1`` (the agent
  runs on the first node and reaches the others with ``srun --relative``), and
  ``--gpus=N`` becomes ``--gpus-per-node=N`` (``--gres=gpu:N`` is per node already).
"""

from __future__ import annotations

from typing import Dict, Optional

from agent_stdlib.contracts import ResourceSpec

Options = Dict[str, Optional[str]]


def apply_directives(options: Options, res: ResourceSpec) -> Options:
    """``options`` (option -> value, None for a flag) with the plan's additions applied."""
    out = dict(options)
    if res.reservation:
        out["reservation"] = res.reservation
    for key, value in res.options.items():
        out[key] = value or None
    if res.nodes > 1:
        if "ntasks" in out:
            del out["ntasks"]
            out["ntasks-per-node"] = "1"
        if "gpus" in out:
            out["gpus-per-node"] = out.pop("gpus")
    return out
