"""Partitions, their nodes and what jobs used: parsers on literal Slurm 22.05 output, and
the Scheduler calls that make them."""

from __future__ import annotations

import pytest

from synthbatch.control.errors import SchedulerUnavailable
from synthbatch.control.slurm import parsers
from synthbatch.control.slurm.parsers import ParseError, seconds_of
from synthbatch.control.slurm.scheduler import Scheduler
from tests.fakes import FakeSlurm

# Captured on the testbed (`scontrol show partition -o`), with a second partition made by
# `scontrol create PartitionName=small Nodes=node1 MaxTime=01:30:00 MaxNodes=1
# MaxMemPerNode=2048 MaxCPUsPerNode=4 AllowAccounts=proj,root AllowQos=normal State=DOWN`.
PARTITIONS = (
    "PartitionName=debug AllowGroups=ALL AllowAccounts=ALL AllowQos=ALL AllocNodes=ALL "
    "Default=YES QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO GraceTime=0 "
    "Hidden=NO MaxNodes=UNLIMITED MaxTime=UNLIMITED MinNodes=0 LLN=NO "
    "MaxCPUsPerNode=UNLIMITED Nodes=node[1-2] PriorityJobFactor=1 PriorityTier=1 RootOnly=NO "
    "ReqResv=NO OverSubscribe=NO OverTimeLimit=NONE PreemptMode=OFF State=UP TotalCPUs=16 "
    "TotalNodes=2 SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED "
    "MaxMemPerNode=UNLIMITED TRES=cpu=16,mem=8G,node=2,billing=16,gres/gpu=8\n"
    "PartitionName=small AllowGroups=ALL AllowAccounts=proj,root AllowQos=normal "
    "AllocNodes=ALL Default=NO QoS=N/A DefaultTime=NONE DisableRootJobs=NO ExclusiveUser=NO "
    "GraceTime=0 Hidden=NO MaxNodes=1 MaxTime=01:30:00 MinNodes=1 LLN=NO MaxCPUsPerNode=4 "
    "Nodes=node1 PriorityJobFactor=1 PriorityTier=1 RootOnly=NO ReqResv=NO OverSubscribe=NO "
    "OverTimeLimit=NONE PreemptMode=OFF State=DOWN TotalCPUs=8 TotalNodes=1 "
    "SelectTypeParameters=NONE JobDefaults=(null) DefMemPerNode=UNLIMITED MaxMemPerNode=2048 "
    "TRES=cpu=8,mem=4G,node=1,billing=8,gres/gpu=4\n")
# `sinfo -N -h -o '%N|%c|%m|%G|%T'` while node2 was drained (node1 is in both partitions).
NODES = "node1|8|4096|gpu:4|idle\nnode1|8|4096|gpu:4|idle\nnode2|8|4096|gpu:4|drained\n"
# `sacct -n -P -X -D --format=JobID,ElapsedRaw,AllocTRES`: a 2-task array with 2 GPUs a
# task, and two jobs cancelled while pending (nothing allocated).
USAGE = ("1244_0|2|billing=1,cpu=1,gres/gpu=2,mem=100M,node=1\n"
         "1244_1|2|billing=1,cpu=1,gres/gpu=2,mem=100M,node=1\n"
         "1240|0|\n1241|0|\n")


def test_partitions_from_captured_output() -> None:
    debug, small = parsers.parse_partitions(PARTITIONS)
    assert (debug.name, debug.default, debug.state, debug.total_nodes) == ("debug", True, "UP", 2)
    assert (debug.max_nodes, debug.max_time_s, debug.max_mem_per_node_mb,
            debug.max_cpus_per_node, debug.allow_accounts, debug.allow_qos) == \
        (None, None, None, None, None, None)  # UNLIMITED / ALL
    assert (small.name, small.default, small.state, small.total_nodes) == ("small", False,
                                                                          "DOWN", 1)
    assert (small.max_nodes, small.max_time_s, small.max_mem_per_node_mb,
            small.max_cpus_per_node) == (1, 5400, 2048, 4)
    assert small.allow_accounts == ("proj", "root") and small.allow_qos == ("normal",)


def test_partition_values_may_hold_equals_signs() -> None:
    fields = parsers.partition_fields(PARTITIONS.splitlines()[0])
    assert fields["TRES"] == "cpu=16,mem=8G,node=2,billing=16,gres/gpu=8"
    assert fields["JobDefaults"] == "(null)" and fields["Nodes"] == "node[1-2]"


@pytest.mark.parametrize("line", [
    "AllowGroups=ALL State=UP TotalNodes=2",  # no name
    "PartitionName=x TotalNodes=2",  # no state
    "PartitionName=x State=UP TotalNodes=many",
    "PartitionName=x State=UP TotalNodes=2 MaxNodes=lots",
    "PartitionName=x State=UP TotalNodes=2 MaxTime=soon",
    "PartitionName=x State=UP TotalNodes=2 MaxMemPerNode=4G",
    "garbage without any key",
])
def test_malformed_partition_lines(line: str) -> None:
    with pytest.raises(ParseError):
        parsers.parse_partitions(line + "\n")


@pytest.mark.parametrize("text, seconds", [
    ("UNLIMITED", None), ("INFINITE", None), ("30", 1800), ("30:15", 1815),
    ("01:30:00", 5400), ("2-00:00:00", 172800), ("2-12", 216000), ("1-02:03", 93780),
])
def test_slurm_durations(text: str, seconds: int) -> None:
    assert seconds_of(text) == seconds


@pytest.mark.parametrize("text", ["1:2:3:4", "a-01:00:00", "1h", "-5"])
def test_malformed_durations(text: str) -> None:
    with pytest.raises(ParseError):
        seconds_of(text)


def test_node_shapes_from_captured_output() -> None:
    node1, node2 = parsers.parse_node_shapes(NODES)  # node1 listed twice, kept once
    assert (node1.name, node1.cpus, node1.mem_mb, node1.gpus, node1.usable) == \
        ("node1", 8, 4096, 4, True)
    assert (node2.name, node2.state, node2.usable) == ("node2", "drained", False)


@pytest.mark.parametrize("gres, gpus", [
    ("gpu:4", 4), ("(null)", 0), ("gpu:a100:8(S:0-1)", 8), ("gpu:a100:2,gpu:v100:2", 4),
    ("gpu:h100:8(S:0-1),nvme:1", 8), ("shard:16", 0), ("gpu:tesla:4(IDX:0-3)", 4),
])
def test_gpus_of_gres(gres: str, gpus: int) -> None:
    assert parsers.gpus_of(gres) == gpus


@pytest.mark.parametrize("state, usable", [
    ("idle", True), ("mixed", True), ("allocated", True), ("idle~", True),
    ("down*", False), ("drained", False), ("draining", False), ("maint", False),
])
def test_node_usable(state: str, usable: bool) -> None:
    (node,) = parsers.parse_node_shapes(f"n|8|4096|gpu:4|{state}\n")
    assert node.usable is usable


@pytest.mark.parametrize("line", ["node1|8|4096|gpu:4", "node1|eight|4096|gpu:4|idle",
                                  "node1|8|4G|gpu:4|idle", "node1|8|4096|gpu:4|"])
def test_malformed_node_lines(line: str) -> None:
    with pytest.raises(ParseError):
        parsers.parse_node_shapes(line + "\n")


def test_usage_from_captured_output() -> None:
    rows = parsers.parse_usage(USAGE)
    assert [(r.job_id, r.elapsed_s, r.gpus) for r in rows] == [
        ("1244_0", 2, 2), ("1244_1", 2, 2), ("1240", 0, 0), ("1241", 0, 0)]


@pytest.mark.parametrize("line", ["12|x|gres/gpu=1", "12|5", "bad id|5|", "12|-1|"])
def test_malformed_usage_lines(line: str) -> None:
    with pytest.raises(ParseError):
        parsers.parse_usage(line + "\n")


# ----------------------------------------------------------------------------- Scheduler


def scheduler(fake: FakeSlurm) -> Scheduler:
    return Scheduler(runner=fake)


def test_partition_limits_by_name_and_the_default() -> None:
    fake = FakeSlurm()
    fake.on("scontrol", stdout=PARTITIONS)
    assert scheduler(fake).partition_limits(None).name == "debug"  # Default=YES
    small_only = FakeSlurm()
    small_only.on("scontrol", stdout=PARTITIONS.splitlines(keepends=True)[1])
    assert scheduler(small_only).partition_limits("small").max_nodes == 1
    assert small_only.calls[0][1:] == ["show", "partition", "-o", "small"]


def test_partition_that_does_not_exist_is_none() -> None:
    fake = FakeSlurm()
    fake.on("scontrol", code=1, stderr="Partition nope not found\n")
    assert scheduler(fake).partition_limits("nope") is None


def test_partition_query_failure_is_unavailable() -> None:
    fake = FakeSlurm()
    fake.on("scontrol", code=1, stderr="slurm_load_partitions: Unable to contact slurm "
                                        "controller (connect failure)\n")
    with pytest.raises(SchedulerUnavailable):
        scheduler(fake).partition_limits("debug")


def test_garbled_partition_output_is_unavailable_not_a_traceback() -> None:
    fake = FakeSlurm()
    fake.on("scontrol", stdout="PartitionName=x TotalNodes=?\n")
    with pytest.raises(SchedulerUnavailable):
        scheduler(fake).partition_limits("x")


def test_partition_nodes_asks_sinfo_for_that_partition() -> None:
    fake = FakeSlurm()
    fake.on("sinfo", stdout=NODES)
    nodes = scheduler(fake).partition_nodes("debug")
    assert [n.name for n in nodes] == ["node1", "node2"]
    assert fake.calls[0][1:] == ["-N", "-h", "-p", "debug", "-o", "%N|%c|%m|%G|%T"]


def test_usage_includes_every_execution_and_none_without_accounting() -> None:
    fake = FakeSlurm()
    fake.on("sacct", stdout=USAGE)
    rows = scheduler(fake).usage(["1244", "1240"])
    assert len(rows) == 4 and "-D" in fake.calls[0]
    off = FakeSlurm()
    off.on("sacct", code=1, stderr="Slurm accounting storage is disabled\n")
    assert scheduler(off).usage(["1"]) is None
    assert scheduler(FakeSlurm()).usage([]) == []

