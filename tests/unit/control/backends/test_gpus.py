"""The GPUs local allocations get: nvidia-smi -L, the profile's list, or its count."""

from __future__ import annotations

from typing import List

import pytest

from synthbatch.control.backends.local.gpus import (
    default_concurrency,
    detect,
    gpu_pool,
    parse_nvidia_smi,
)
from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.slurm.runner import CommandResult

SMI = """GPU 0: NVIDIA A100-SXM4-40GB (UUID: GPU-5f8b2a8e-0c1f-7c3e-aaaa-000000000000)
GPU 1: NVIDIA A100-SXM4-40GB (UUID: GPU-5f8b2a8e-0c1f-7c3e-aaaa-000000000001)
  MIG 1g.5gb Device 0: (UUID: MIG-aaaa)
GPU 3: NVIDIA A100-SXM4-40GB (UUID: GPU-5f8b2a8e-0c1f-7c3e-aaaa-000000000003)
"""


def test_nvidia_smi_lists_the_machines_gpus() -> None:
    assert parse_nvidia_smi(SMI) == [0, 1, 3]
    assert parse_nvidia_smi("No devices were found\n") == []


def test_detect_asks_nvidia_smi_and_says_none_when_it_cannot() -> None:
    calls: List[List[str]] = []

    def runner(argv, timeout):  # type: ignore[no-untyped-def]
        calls.append(list(argv))
        return CommandResult(argv, 0, SMI, "")

    assert detect(runner) == [0, 1, 3] and calls == [["nvidia-smi", "-L"]]

    def missing(argv, timeout):  # type: ignore[no-untyped-def]
        raise SchedulerUnavailable("nvidia-smi: command not found")

    assert detect(missing) is None
    assert detect(lambda argv, timeout: CommandResult(argv, 9, "", "NVML failed")) is None


def test_the_pool_is_the_profiles_list_else_detected_else_the_count() -> None:
    assert gpu_pool(None, 4, [0, 1, 3]) == ["0", "1", "3"]
    assert gpu_pool([3, 1], 2, [0, 1, 3]) == ["3", "1"]
    assert gpu_pool([5, 6], 2, None) == ["5", "6"]
    assert gpu_pool(None, 2, None) == ["0", "1"]
    with pytest.raises(ValueError, match=r"local.gpus: GPU 2 is not one of this machine's "
                                         r"\(nvidia-smi -L lists 0, 1, 3\)"):
        gpu_pool([2], 1, [0, 1, 3])


def test_as_many_at_once_as_the_gpus_allow_one_without() -> None:
    assert default_concurrency(["0", "1", "2", "3"], 1) == 4
    assert default_concurrency(["0", "1", "2", "3"], 3) == 1
    assert default_concurrency(["0", "1"], 0) == 1
    assert default_concurrency([], 0) == 1
