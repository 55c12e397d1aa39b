"""Fuzzing the batch script renderer (docs/reliability.md).

Every string of a ``BatchScript`` (and of its ``ResourceSpec``) is filled with shell
metacharacters, quotes, ``$(...)``, backticks, newlines and unicode around a payload that
creates a canary file. The renderer either refuses the value (``InvalidInput`` naming the
field: a control character can never be rendered safely, an ``#SBATCH`` line cannot hold
a newline) or renders a script that passes ``bash -n``, whose ``#SBATCH`` block is
exactly its directives, and that, run by bash outside Slurm, never creates the canary.
In half of the cases the paths are real (a run directory and an agent named with the
payload, a stub ``python`` whose file name holds it too), so the script runs to its
``exec`` and the stub records the argv it got: exactly the values given, unevaluated.
"""

from __future__ import annotations

import hashlib
import itertools
import re
import subprocess
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Dict, List, Optional

import pytest
from hypothesis import given
from hypothesis import strategies as st

from synthbatch.agent_stdlib.contracts import ResourceSpec
from synthbatch.control.errors import InvalidInput
from synthbatch.control.slurm.renderer import BatchScript, render_batch_script
from tests.fakes import fuzz

BASH = "/bin/bash"
CANARY = "CANARY"  # replaced by the canary's absolute path in each case
PAYLOADS = ["$(touch CANARY)", "`touch CANARY`", ";touch CANARY;", "'$(touch CANARY)'",
            '"$(touch CANARY)"', "\ntouch CANARY\n", "|touch CANARY", "&&touch CANARY",
            ">CANARY", "$((1))${IFS}touch${IFS}CANARY", "\\'; touch CANARY; '", "${x:=$(touch "
            "CANARY)}", "\r\ntouch CANARY #", "#\ntouch CANARY", "\u2028touch CANARY",
            "<(touch CANARY)", "!!", "$'\\ntouch CANARY'", "%A %a %j"]
PIECES = st.one_of(st.sampled_from(PAYLOADS),
                   st.sampled_from(list(" \t'\"`$\\;&|<>(){}[]*?~#!%=,:/.-_é\u202e\u00a0")),
                   st.text(max_size=6))
hostile = st.lists(PIECES, max_size=5).map("".join)
# A file name: no '/', no NUL, not '.' or '..' (what a directory entry can hold)
names = hostile.map(lambda s: s.replace("/", "_").replace("\x00", "_")).filter(
    lambda s: s not in ("", ".", "..") and len(s.encode()) < 200)
STUB = """#!/bin/bash
printf '%s\\0' "$@" > "$(dirname "$0")/argv"
"""


@dataclass
class Case:
    spec: BatchScript
    canary: Path
    reach: bool  # the paths are real: the script must get to its exec


@dataclass(frozen=True)
class Drawn:
    """A case as drawn: strings hold ``CANARY`` until a folder is made for it."""

    spec: BatchScript
    reach: bool
    names: tuple  # run dir, agent and python file names (used when ``reach``)


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


optional = st.none() | hostile
resources = st.builds(
    ResourceSpec, partition=optional, account=optional, qos=optional, time_limit=hostile,
    nodes=st.integers(1, 4), gpus=st.integers(0, 8),
    gpu_request=st.sampled_from(["gres", "gpus"]) | hostile, cpus=st.integers(1, 64),
    mem_mb=st.integers(1, 10 ** 6), reservation=optional,
    options=st.dictionaries(hostile, hostile, max_size=2))
specs = st.builds(
    BatchScript, job_name=hostile, run_dir=hostile, agent_pyz=hostile, agent_sha256=hostile,
    plan_sha256=hostile, submission=st.integers(0, 10 ** 6), python=hostile,
    resources=resources, signal_lead_s=st.integers(0, 3600), slurm_bin=optional,
    max_requeues=st.integers(0, 5), array_index=st.none() | st.integers(0, 100))
drawn = st.builds(Drawn, spec=specs, reach=st.booleans(),
                  names=st.tuples(names, names, names))
COUNTER = itertools.count()


def _filled(value, canary: Path):  # type: ignore[no-untyped-def]
    if isinstance(value, str):
        return value.replace(CANARY, str(canary))
    if isinstance(value, dict):
        return {_filled(k, canary): _filled(v, canary) for k, v in value.items()}
    return value


def materialize(tmp: Path, case: Drawn) -> Case:
    """The drawn case in its own folder: the canary's path filled in, and with ``reach``
    a run directory, an agent and a stub python named as drawn."""
    sub = tmp / f"case-{next(COUNTER)}"
    sub.mkdir()
    canary = sub / "canary"
    res = case.spec.resources
    res = replace(res, **{f.name: _filled(getattr(res, f.name), canary)
                          for f in fields(res)})
    spec = replace(case.spec, resources=res, **{
        f.name: _filled(getattr(case.spec, f.name), canary)
        for f in fields(case.spec) if f.name != "resources"})
    if case.reach:
        # a file name cannot hold the canary's path: its name, relative to the cwd
        run_name, agent, python_name = (n.replace(CANARY, canary.name) for n in case.names)
        run_dir = sub / run_name
        run_dir.mkdir()
        (run_dir / agent).write_bytes(b"agent")
        (run_dir / "plan.json").write_bytes(b"{}\n")
        stubs = sub / "stubs"
        stubs.mkdir()
        python = stubs / python_name
        python.write_text(STUB)
        python.chmod(0o700)
        spec = replace(spec, run_dir=str(run_dir), agent_pyz=agent,
                       agent_sha256=_sha(run_dir / agent),
                       plan_sha256=_sha(run_dir / "plan.json"), python=str(python))
    return Case(spec, canary, case.reach)


def _strings(spec: BatchScript) -> Dict[str, Optional[str]]:
    res = spec.resources
    found: Dict[str, Optional[str]] = {
        name: getattr(spec, name) for name in ("job_name", "run_dir", "agent_pyz",
                                               "agent_sha256", "plan_sha256", "python",
                                               "slurm_bin")}
    found.update({f"resources.{name}": getattr(res, name) for name in (
        "partition", "account", "qos", "time_limit", "gpu_request", "reservation")})
    for key, value in res.options.items():
        found[f"resources.options[{key!r}]"] = key + value
    return found


# What bash or sbatch would read as the end of a line or a word it cannot quote (NEL and
# U+2028 are plain characters to both).
CONTROL = re.compile(r"[\x00-\x1f\x7f]")
OPTION = re.compile(r"[a-z][a-z0-9-]*")


def _run(script: Path, tmp: Path) -> subprocess.CompletedProcess:
    env = {"SLURM_TMPDIR": str(tmp), "HOME": str(tmp), "PATH": "/usr/bin:/bin",
           "SLURM_JOB_ID": "7", "SLURM_ARRAY_JOB_ID": "7", "SLURM_ARRAY_TASK_ID": "0"}
    return subprocess.run([BASH, str(script)], env=env, capture_output=True, check=False,
                          timeout=30, cwd=tmp)


@pytest.mark.parametrize("chunk", range(4))  # four shards of the budget: xdist spreads them
@fuzz(ci=75, long=2_500)
@given(data=st.data())
def test_hostile_values_are_refused_or_never_evaluated(tmp_path: Path, chunk: int,
                                                       data: st.DataObject) -> None:
    case = materialize(tmp_path, data.draw(drawn, label="case"))
    spec = case.spec
    bad = sorted(k for k, v in _strings(spec).items() if v is not None and CONTROL.search(v))
    bad += ["resources.options"] * any(not OPTION.fullmatch(k) for k in spec.resources.options)
    try:
        script = render_batch_script(spec)
    except InvalidInput as err:
        assert bad, f"refused a script without control characters: {err}"
        assert any(field in err.message for field in bad), err.message
        assert "\n" not in err.message
        return
    assert not bad, f"rendered {bad} with control characters"
    lines = script.split("\n")  # bash and sbatch split on newline only: not U+2028, NEL
    directives = [line for line in lines if line.startswith("#SBATCH")]
    assert lines[1:1 + len(directives)] == directives  # one block, nothing injected into it
    assert all(re.fullmatch(r"#SBATCH --[a-z][a-z-]*(=.*)?", line) for line in directives)
    checked = subprocess.run([BASH, "-n"], input=script.encode(), capture_output=True,
                             check=False, timeout=10)
    assert checked.returncode == 0, checked.stderr
    path = case.canary.parent / "batch.sh"
    path.write_text(script, encoding="utf-8")
    done = _run(path, case.canary.parent)
    assert not case.canary.exists(), (script, done.stderr)
    assert not any(case.canary.parent.glob("*CANARY*"))
    if case.reach:
        assert done.returncode == 0, done.stderr
        argv = (Path(spec.python).parent / "argv").read_bytes().split(b"\0")[:-1]
        agent = f"{spec.run_dir}/{spec.agent_pyz}"
        expected: List[str] = ["-I", agent, "allocation", "--run-dir", spec.run_dir,
                               "--plan-sha256", spec.plan_sha256, "--submission",
                               str(spec.submission), "--agent-pyz", agent]
        if spec.array_index is not None:
            expected += ["--array-index", str(spec.array_index)]
        assert [a.decode() for a in argv] == expected

