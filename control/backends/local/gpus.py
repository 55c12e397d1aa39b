"""The GPUs of this machine that local allocations are given, one ``CUDA_VISIBLE_DEVICES``
entry each.

``nvidia-smi -L`` lists them when it is there (``GPU 0: NVIDIA A100 ... (UUID: ...)``);
the profile's ``local.gpus`` narrows that list (or, without nvidia-smi, names the indices
to use), else ``0 .. gpus_per_node - 1`` stand for them.
"""

from __future__ import annotations

import re
from typing import List, Optional, Sequence

from synthbatch.control.errors import SynthbatchError
from synthbatch.control.slurm.runner import Runner, run_command

GPU_LINE = re.compile(r"^GPU (\d+): ", re.MULTILINE)
DETECT_TIMEOUT_S = 10.0


def parse_nvidia_smi(text: str) -> List[int]:
    """GPU indices from ``nvidia-smi -L`` output, in its order."""
    return [int(index) for index in GPU_LINE.findall(text)]


def detect(runner: Runner = run_command) -> Optional[List[int]]:
    """This machine's GPU indices from ``nvidia-smi -L``; None when it cannot say."""
    try:
        result = runner(["nvidia-smi", "-L"], DETECT_TIMEOUT_S)
    except SynthbatchError:  # not installed, cannot run, no answer
        return None
    return parse_nvidia_smi(result.stdout) if result.returncode == 0 else None


def gpu_pool(listed: Optional[Sequence[int]], gpus_per_node: int,
             detected: Optional[Sequence[int]]) -> List[str]:
    """The GPUs local allocations share (``CUDA_VISIBLE_DEVICES`` entries).

    ``listed`` (the profile's ``local.gpus``) wins; with nvidia-smi present every listed
    index must be one of its GPUs (ValueError names the first that is not).
    """
    if listed is not None:
        unknown = [g for g in listed if detected is not None and g not in detected]
        if unknown:
            have = ", ".join(str(g) for g in detected or []) or "none"
            raise ValueError(f"local.gpus: GPU {unknown[0]} is not one of this machine's "
                             f"(nvidia-smi -L lists {have})")
        return [str(g) for g in listed]
    if detected is not None:
        return [str(g) for g in detected]
    return [str(g) for g in range(gpus_per_node)]


def default_concurrency(pool: Sequence[str], gpus_per_task: int) -> int:
    """How many tasks run at once by default: as many as the GPUs allow; 1 without GPUs."""
    if gpus_per_task <= 0 or not pool:
        return 1
    return max(1, len(pool) // gpus_per_task)
