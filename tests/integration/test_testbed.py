"""Fast checks that the local Slurm testbed behaves like the clusters synthbatch targets."""

from __future__ import annotations

import os
import re
import socket

import pytest


def test_sbatch_parsable_id_and_output(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch(
        "-o", f"{tmp_path}/out-%j.txt", "--wrap", "echo hello from $SLURMD_NODENAME"
    )
    assert re.fullmatch(r"\d+", job_id)
    assert slurm_cluster.wait_job(job_id, timeout=60) == ["COMPLETED"]
    out = (tmp_path / f"out-{job_id}.txt").read_text()
    assert re.fullmatch(r"hello from node\d+\n", out), out


def test_two_nodes_in_one_step(slurm_cluster):
    res = slurm_cluster.run("srun", "-N2", "-n2", "-l", "printenv", "SLURMD_NODENAME", timeout=60)
    assert sorted(res.stdout.split("\n")[:2]) == ["0: node1", "1: node2"], res.stdout


def test_gres_gpu_2(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch(
        "--gres=gpu:2",
        "-o",
        f"{tmp_path}/gpu-%j.txt",
        "--wrap",
        'echo "$SLURM_JOB_GPUS|$CUDA_VISIBLE_DEVICES"',
    )
    assert slurm_cluster.wait_job(job_id) == ["COMPLETED"]
    job_gpus, cvd = (tmp_path / f"gpu-{job_id}.txt").read_text().strip().split("|")
    gpus = job_gpus.split(",")
    assert len(gpus) == 2 and len(set(gpus)) == 2, job_gpus
    assert all(0 <= int(g) < 4 for g in gpus), job_gpus
    assert cvd == job_gpus  # no device cgroup: CUDA_VISIBLE_DEVICES = global indices


def test_small_array(slurm_cluster, tmp_path):
    array_id = slurm_cluster.sbatch(
        "--array=0-4%3",
        "-o",
        f"{tmp_path}/arr-%A_%a.txt",
        "--wrap",
        "echo $SLURM_ARRAY_JOB_ID $SLURM_ARRAY_TASK_ID",
    )
    states = slurm_cluster.wait_job(array_id, timeout=90)
    assert states == ["COMPLETED"] * 5
    for task in range(5):
        out = (tmp_path / f"arr-{array_id}_{task}.txt").read_text()
        assert out == f"{array_id} {task}\n"


def test_hold_and_release(slurm_cluster, tmp_path):
    job_id = slurm_cluster.sbatch("--hold", "-o", f"{tmp_path}/held-%j.txt", "--wrap", "echo ran")
    res = slurm_cluster.run("squeue", "-h", "-j", job_id, "-o", "%T %r")
    assert res.stdout.split() == ["PENDING", "JobHeldUser"]
    slurm_cluster.run("scontrol", "release", job_id)
    assert slurm_cluster.wait_job(job_id, timeout=60) == ["COMPLETED"]
    assert (tmp_path / f"held-{job_id}.txt").read_text() == "ran\n"


# Two concurrent steps in one allocation, under CR_Core_Memory with DefMemPerCPU (the job
# has no --mem). A plain first `srun` takes ALL of the job's memory, so a second
# `srun --overlap` (which shares CPUs, not memory) cannot start:
#   "Unable to create step for job N: Memory required by task is not available".
# What works: --mem=0 or a small per-node --mem on the overlapping step, or --overlap on
# both steps. --mem-per-cpu on the overlapping step does NOT work.
OVERLAP_CASES = [
    # (first step flags, second step flags, second step starts?)
    ("", "--overlap", False),
    ("", "--overlap --mem-per-cpu=64", False),
    ("", "--overlap --mem=0", True),
    ("", "--overlap --mem=128", True),
    ("--overlap", "--overlap", True),
    ("--overlap --mem=0", "--overlap --mem=0", True),
]

_OVERLAP_SCRIPT = """#!/bin/bash
srun {first} -n1 bash -c 'touch "{marker}"; sleep 8' &
for _ in $(seq 100); do [ -e "{marker}" ] && break; sleep 0.1; done
[ -e "{marker}" ] || echo "first step did not start"
srun {second} -n1 --immediate=3 true
echo "second rc=$?"
wait
"""


def test_srun_overlap_steps_memory(slurm_cluster, tmp_path):
    jobs = {}
    for i, (first, second, _) in enumerate(OVERLAP_CASES):
        script = tmp_path / f"overlap{i}.sh"
        script.write_text(
            _OVERLAP_SCRIPT.format(first=first, second=second, marker=tmp_path / f"started{i}")
        )
        jobs[i] = slurm_cluster.sbatch("-n2", "-o", f"{tmp_path}/overlap{i}.txt", str(script))
    results = {}
    for i, job_id in jobs.items():
        slurm_cluster.wait_job(job_id, timeout=90)
        out = (tmp_path / f"overlap{i}.txt").read_text()
        assert "first step did not start" not in out, out
        m = re.search(r"^second rc=(\d+)$", out, re.M)
        assert m, out
        results[i] = (m.group(1) == "0", out)
    table = "\n".join(
        f"first=[{f}] second=[{s}] expected={'ok' if want else 'fail'} "
        f"got={'ok' if results[i][0] else 'fail'}: {results[i][1].strip()!r}"
        for i, (f, s, want) in enumerate(OVERLAP_CASES)
    )
    assert all(results[i][0] == want for i, (_, _, want) in enumerate(OVERLAP_CASES)), table


def test_sacct_failed_exit_code(slurm_cluster):
    if not slurm_cluster.accounting:
        pytest.skip("testbed runs without accounting (SYNTHBATCH_TESTBED_ACCOUNTING=0)")
    job_id = slurm_cluster.sbatch("-o", "/dev/null", "--wrap", "exit 3")
    assert slurm_cluster.wait_job(job_id) == ["FAILED"]

    def sacct_row():
        res = slurm_cluster.run(
            "sacct",
            "-X",
            "-n",
            "--parsable2",
            "-j",
            job_id,
            "--format=State,ExitCode",
            check=False,
        )
        row = res.stdout.strip()
        return row if row == "FAILED|3:0" else None  # records lag the job's end by ~1-3 s

    assert slurm_cluster.wait_for(sacct_row, timeout=30, what=f"sacct FAILED|3:0 for {job_id}")


def _listening() -> dict:
    """Port -> local addresses of listening TCP sockets (IPv4 and IPv6), from /proc."""
    found: dict = {}
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = open(table).read().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            fields = line.split()
            if fields[3] != "0A":  # LISTEN
                continue
            addr, port = fields[1].rsplit(":", 1)
            if len(addr) == 8:
                text = socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1])
            else:
                raw = bytes.fromhex(addr)
                text = socket.inet_ntop(socket.AF_INET6, b"".join(
                    raw[i:i + 4][::-1] for i in range(0, 16, 4)))
            found.setdefault(int(port, 16), set()).add(text)
    return found


def test_daemons_listen_on_loopback_only(slurm_cluster):
    conf = open(os.environ["SLURM_CONF"]).read()
    ports = {"slurmctld": [int(re.search(r"^SlurmctldPort=(\d+)", conf, re.M).group(1))]}
    ports["slurmd"] = [int(p) for p in re.findall(r"^NodeName=\S+ .*\bPort=(\d+)", conf, re.M)]
    assert len(ports["slurmd"]) >= 2, conf
    dbd = re.search(r"^AccountingStoragePort=(\d+)", conf, re.M)
    if dbd:
        ports["slurmdbd"] = [int(dbd.group(1))]
    if not socket.gethostbyname(socket.gethostname()).startswith("127."):
        ports = {"slurmctld": ports["slurmctld"]}  # the testbed cannot bind the others here
    listening = _listening()
    for daemon, numbers in ports.items():
        for port in numbers:
            assert listening.get(port) == {"127.0.0.1"}, (daemon, port, listening.get(port))
