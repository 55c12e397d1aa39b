"""``#SBATCH`` options the plan adds beyond the renderer's base set (pure).

The renderer builds its option dict (job name, time, nodes, ntasks, cpus, mem, GPUs, ...)
and passes it through ``apply_directives`` before sorting and quoting:

- ``reservation`` and the profile's allow-listed ``sbatch_options`` are added
  (value ``""`` renders as a bare flag, e.g. ``--exclusive``);
- with more than one node, ``--ntasks=1`` becomes ``--ntasks-per-node=1`` (the agent
  runs on the first node and reaches the others with ``srun --relative``), and
  ``--gpus=N`` becomes ``--gpus-per-node=N`` (``--gres=gpu:N`` is per node already).

``read_directives`` reads them back from a rendered script, as ``sbatch`` does (the local
backend runs the same script without Slurm and takes its limits from there).
"""

from __future__ import annotations

import shlex
from typing import Dict, Optional

from synthbatch.agent_stdlib.contracts import ResourceSpec

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


def read_directives(script: str) -> Options:
    """The ``#SBATCH`` options of a batch script, as ``sbatch`` reads them: the lines up to
    the first command (``--key=value`` -> key: value, a bare ``--flag`` -> key: None)."""
    options: Options = {}
    for line in script.splitlines()[1:]:
        text = line.strip()
        if text and not text.startswith("#"):
            break
        if not text.startswith("#SBATCH "):
            continue
        for word in shlex.split(text[len("#SBATCH "):]):
            if word.startswith("--"):
                key, sep, value = word[2:].partition("=")
                options[key] = value if sep else None
    return options


def time_limit_seconds(value: str) -> int:
    """``[D-]HH:MM:SS`` or minutes (the forms ``control.config.fields`` accepts) -> seconds."""
    from synthbatch.control.config.fields import TIME_LIMIT

    if not TIME_LIMIT.fullmatch(value):
        raise ValueError(f"{value!r} is not a time limit ([D-]HH:MM:SS or minutes)")
    days, _, clock = value.rpartition("-")
    parts = [int(p) for p in clock.split(":")]
    if len(parts) == 1:
        return parts[0] * 60
    hours, minutes, seconds = parts
    return ((int(days or 0) * 24 + hours) * 60 + minutes) * 60 + seconds
