"""The batch script renderer: golden files per variant, quoting, and a real bash run."""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import subprocess
import sys
import zipapp
from dataclasses import replace
from pathlib import Path
from typing import Callable, Dict, List, Optional

import pytest

from synthbatch.agent_stdlib.contracts import ResourceSpec
from synthbatch.control.slurm.directives import read_directives, time_limit_seconds
from synthbatch.control.slurm.renderer import BatchScript, render_batch_script, sbatch_directives
from tests.conftest import GOLDENS, REPO

BASH = "/bin/bash"
SHA_A = "a" * 64
SHA_P = "b" * 64


def resources(**changes: object) -> ResourceSpec:
    base = ResourceSpec(partition="gpu", account="proj-42", qos="normal", time_limit="01:30:00",
                        nodes=1, gpus=4, gpu_request="gres", cpus=8, mem_mb=65536)
    return replace(base, **changes)


def spec(**changes: object) -> BatchScript:
    base = BatchScript(
        job_name="synthbatch-quickstart-20240101-000000-abcdef",
        run_dir="/shared/ws/runs/quickstart-20240101-000000-abcdef",
        agent_pyz=f"agent-{SHA_A}.pyz",
        agent_sha256=SHA_A,
        plan_sha256=SHA_P,
        submission=1,
        python="/usr/bin/python3",
        resources=resources(),
        signal_lead_s=120,
    )
    return replace(base, **changes)


VARIANTS: Dict[str, BatchScript] = {
    "gres": spec(),
    "gpus": spec(resources=resources(gpu_request="gpus", gpus=2), submission=3),
    "nogpu": spec(resources=resources(gpus=0, partition=None, account=None, qos=None,
                                      time_limit="30"), signal_lead_s=0),
    "slurm-bin": spec(slurm_bin="/opt/slurm/bin", resources=resources(gpus=1, qos=None)),
    "multinode": spec(resources=resources(nodes=2, gpus=4, gpu_request="gpus",
                                          reservation="maint-2024",
                                          options={"exclusive": "", "constraint": "a100|h100",
                                                   "mail-type": "END,FAIL"}),
                      array_index=1, submission=2),
}


def sbatch_lines(script: str) -> List[str]:
    return [line for line in script.splitlines() if line.startswith("#SBATCH")]


def bash_n(script: str) -> subprocess.CompletedProcess:
    return subprocess.run([BASH, "-n"], input=script, text=True, capture_output=True,
                          check=False, timeout=10)


# ----------------------------------------------------------------------------- goldens


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_golden(variant: str, golden: Callable[[str, str], None]) -> None:
    golden(f"batch-{variant}.sh", render_batch_script(VARIANTS[variant]))


def test_render_is_pure() -> None:
    assert render_batch_script(spec()) == render_batch_script(spec())


# ----------------------------------------------------------------------------- shape


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_sbatch_lines_sorted_and_first(variant: str) -> None:
    script = render_batch_script(VARIANTS[variant])
    lines = script.splitlines()
    assert lines[0] == "#!/bin/bash"
    directives = sbatch_lines(script)
    assert lines[1:1 + len(directives)] == directives  # all directives before any command
    keys = [line.split()[1].split("=")[0] for line in directives]
    assert keys == sorted(keys)
    assert len(set(keys)) == len(keys)
    assert directives == sbatch_directives(VARIANTS[variant])


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_bash_syntax(variant: str) -> None:
    proc = bash_n(render_batch_script(VARIANTS[variant]))
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_requeue_and_signal(variant: str) -> None:
    directives = sbatch_directives(VARIANTS[variant])
    assert "#SBATCH --requeue" in directives
    lead = VARIANTS[variant].signal_lead_s
    assert f"#SBATCH --signal=B:USR1@{lead}" in directives


def test_gres_request() -> None:
    directives = sbatch_directives(VARIANTS["gres"])
    assert "#SBATCH --gres=gpu:4" in directives
    assert not any(d.startswith("#SBATCH --gpus") for d in directives)
    for line in ("#SBATCH --partition=gpu", "#SBATCH --account=proj-42",
                 "#SBATCH --qos=normal", "#SBATCH --time=01:30:00", "#SBATCH --mem=65536M",
                 "#SBATCH --cpus-per-task=8", "#SBATCH --nodes=1", "#SBATCH --ntasks=1"):
        assert line in directives


def test_gpus_request() -> None:
    directives = sbatch_directives(VARIANTS["gpus"])
    assert "#SBATCH --gpus=2" in directives
    assert not any(d.startswith("#SBATCH --gres") for d in directives)


def test_no_gpus_no_partition() -> None:
    directives = sbatch_directives(VARIANTS["nogpu"])
    joined = "\n".join(directives)
    for option in ("--gres", "--gpus", "--partition", "--account", "--qos"):
        assert option not in joined


def test_multinode_directives() -> None:
    directives = sbatch_directives(VARIANTS["multinode"])
    for line in ("#SBATCH --nodes=2", "#SBATCH --ntasks-per-node=1", "#SBATCH --gpus-per-node=4",
                 "#SBATCH --reservation=maint-2024", "#SBATCH --exclusive",
                 "#SBATCH --constraint='a100|h100'", "#SBATCH --mail-type=END,FAIL"):
        assert line in directives, line
    assert not any(d.startswith(("#SBATCH --ntasks=", "#SBATCH --gpus=")) for d in directives)


def test_multinode_gres_stays_per_node() -> None:
    directives = sbatch_directives(spec(resources=resources(nodes=3, gpus=2)))
    assert "#SBATCH --gres=gpu:2" in directives and "#SBATCH --ntasks-per-node=1" in directives


def test_single_node_directives_unchanged_by_empty_options() -> None:
    assert sbatch_directives(spec(resources=resources(options={}, reservation=None))) == \
        sbatch_directives(VARIANTS["gres"])


def test_array_index_is_passed_only_when_set() -> None:
    assert "--array-index" not in render_batch_script(VARIANTS["gres"])
    script = render_batch_script(spec(array_index=3))
    words = shlex.split(script.split("\nexec ", 1)[1].replace("\\\n", " "))
    assert words[words.index("--array-index") + 1] == "3"


def test_slurm_bin_first_on_path() -> None:
    script = render_batch_script(VARIANTS["slurm-bin"])
    assert "export PATH=/opt/slurm/bin:/usr/local/sbin:" in script
    assert "/opt/slurm/bin" not in render_batch_script(VARIANTS["gres"])


def test_execs_agent_isolated() -> None:
    script = render_batch_script(spec(submission=7))
    assert "set -euo pipefail" in script
    exec_lines = [line for line in script.splitlines() if line.startswith("exec ")]
    assert len(exec_lines) == 1
    words = shlex.split(exec_lines[0].rstrip("\\"))
    assert words[:5] == ["exec", "/usr/bin/python3", "-I", "$agent", "allocation"]
    assert "--submission 7 " in script
    assert script.endswith("\n")


def test_hostile_values_are_quoted() -> None:
    hostile = spec(job_name="job name'$(touch x)", run_dir="/shared/my runs/$HOME;rm",
                   agent_pyz="agent x.pyz", agent_sha256="a'b", plan_sha256="c d",
                   python="/opt/my python/bin/python3",
                   resources=resources(partition="p q", account="a$b", qos="`q`",
                                       time_limit="1 2"))
    script = render_batch_script(hostile)
    assert bash_n(script).returncode == 0
    q = shlex.quote
    for line in (f"#SBATCH --job-name={q(hostile.job_name)}",
                 f"#SBATCH --output={q(hostile.run_dir + '/logs/slurm-%A_%a.out')}",
                 f"#SBATCH --partition={q('p q')}", f"#SBATCH --account={q('a$b')}",
                 f"#SBATCH --qos={q('`q`')}", f"#SBATCH --time={q('1 2')}",
                 f"run_dir={q(hostile.run_dir)}", f"plan_sha256={q('c d')}",
                 f"agent=\"$run_dir\"/{q('agent x.pyz')}",
                 f"verify \"$agent\" {q(hostile.agent_sha256)}"):
        assert line in script.splitlines(), line
    assert f"exec {q(hostile.python)} -I " in script


def test_every_plain_value_appears_unquoted_when_safe() -> None:
    script = render_batch_script(VARIANTS["gres"])
    base = VARIANTS["gres"]
    assert f"#SBATCH --job-name={base.job_name}" in script
    assert f"run_dir={base.run_dir}" in script
    assert f"verify \"$agent\" {SHA_A}" in script
    assert f"plan_sha256={SHA_P}" in script


def test_validated_profile_with_trailing_newline_renders_valid_script(tmp_path: Path) -> None:
    from synthbatch.control.config.loader import load_model
    from synthbatch.control.config.profile import Profile

    repo = REPO
    text = (repo / "examples" / "profiles" / "testbed.toml").read_text()
    path = tmp_path / "p.toml"
    path.write_text(text.replace('partition = "debug"', 'partition = "debug\\n"'))
    try:
        profile = load_model(path, Profile)
    except Exception:  # noqa: BLE001 - rejected at validation: the desired behaviour
        return
    script = render_batch_script(spec(resources=resources(partition=profile.partition)))
    assert bash_n(script).returncode == 0
    assert all(line.startswith("#SBATCH") for line in script.splitlines()[1:13])


# ----------------------------------------------------------------------------- real run

FAKE_AGENT = """\
import json, os, sys
run_dir = sys.argv[sys.argv.index("--run-dir") + 1]
with open(os.path.join(run_dir, "agent-ran.json"), "w") as out:
    json.dump({"argv": sys.argv, "isolated": sys.flags.isolated,
               "shiv_root": os.environ.get("SHIV_ROOT"),
               "shiv_entry": os.environ.get("SHIV_ENTRY_POINT"),
               "path": os.environ.get("PATH")}, out)
print("fake agent ran")
"""


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    run_dir = tmp_path / "runs" / "my run $x 'q'"
    run_dir.mkdir(parents=True)
    source = tmp_path / "agent-src"
    source.mkdir()
    (source / "__main__.py").write_text(FAKE_AGENT)
    zipapp.create_archive(source, run_dir / "agent-x.pyz")
    (run_dir / "plan.json").write_text(json.dumps({"schema_version": 1}) + "\n")
    return run_dir


def run_script(tmp_path: Path, run_dir: Path, agent_sha: Optional[str] = None,
               plan_sha: Optional[str] = None) -> subprocess.CompletedProcess:
    script_spec = spec(run_dir=str(run_dir), agent_pyz="agent-x.pyz",
                       agent_sha256=agent_sha or sha256(run_dir / "agent-x.pyz"),
                       plan_sha256=plan_sha or sha256(run_dir / "plan.json"),
                       submission=2, python=sys.executable)
    script = tmp_path / "batch.sh"
    script.write_text(render_batch_script(script_spec))
    scratch = tmp_path / "scratch"
    scratch.mkdir(exist_ok=True)
    env = {"SLURM_TMPDIR": str(scratch), "HOME": str(tmp_path), "SHIV_ENTRY_POINT": "evil:x",
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    return subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True,
                          check=False, timeout=30, cwd=tmp_path)


def test_script_passes_array_index_to_the_agent(tmp_path: Path, run_dir: Path) -> None:
    script_spec = spec(run_dir=str(run_dir), agent_pyz="agent-x.pyz",
                       agent_sha256=sha256(run_dir / "agent-x.pyz"),
                       plan_sha256=sha256(run_dir / "plan.json"), submission=2,
                       python=sys.executable, array_index=4)
    script = tmp_path / "batch.sh"
    script.write_text(render_batch_script(script_spec))
    env = {"SLURM_TMPDIR": str(tmp_path), "HOME": str(tmp_path),
           "PATH": os.environ.get("PATH", "/usr/bin:/bin")}
    proc = subprocess.run([BASH, str(script)], env=env, capture_output=True, text=True,
                          check=False, timeout=30, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    argv = json.loads((run_dir / "agent-ran.json").read_text())["argv"]
    assert argv[-2:] == ["--array-index", "4"]


def test_script_runs_agent(tmp_path: Path, run_dir: Path) -> None:
    proc = run_script(tmp_path, run_dir)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout == "fake agent ran\n"
    seen = json.loads((run_dir / "agent-ran.json").read_text())
    agent = str(run_dir / "agent-x.pyz")
    assert seen["argv"] == [agent, "allocation", "--run-dir", str(run_dir),
                            "--plan-sha256", sha256(run_dir / "plan.json"), "--submission", "2",
                            "--agent-pyz", agent]
    assert seen["isolated"] == 1
    assert seen["shiv_root"] == f"{tmp_path}/scratch/synthbatch-shiv-{os.getuid()}"
    assert Path(seen["shiv_root"]).is_dir()
    assert (Path(seen["shiv_root"]).stat().st_mode & 0o777) == 0o700
    assert seen["shiv_entry"] is None  # SHIV_* overrides from the submit env are dropped
    assert seen["path"].startswith("/usr/local/sbin:")


def test_wrong_agent_sha256(tmp_path: Path, run_dir: Path) -> None:
    proc = run_script(tmp_path, run_dir, agent_sha="0" * 64)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"synthbatch: {run_dir}/agent-x.pyz: sha256 ")
    assert "does not match " + "0" * 64 in lines[0]
    assert not (run_dir / "agent-ran.json").exists()


def test_wrong_plan_sha256(tmp_path: Path, run_dir: Path) -> None:
    proc = run_script(tmp_path, run_dir, plan_sha="1" * 64)
    assert proc.returncode == 2
    lines = proc.stderr.splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith(f"synthbatch: {run_dir}/plan.json: sha256 ")
    assert not (run_dir / "agent-ran.json").exists()


def test_tampered_plan_after_render(tmp_path: Path, run_dir: Path) -> None:
    expected = sha256(run_dir / "plan.json")
    (run_dir / "plan.json").write_text("{}\n")
    proc = run_script(tmp_path, run_dir, plan_sha=expected)
    assert proc.returncode == 2
    assert "plan.json" in proc.stderr
    assert not (run_dir / "agent-ran.json").exists()


def test_missing_plan_fails(tmp_path: Path, run_dir: Path) -> None:
    plan_sha = sha256(run_dir / "plan.json")
    (run_dir / "plan.json").unlink()
    proc = run_script(tmp_path, run_dir, plan_sha=plan_sha)
    assert proc.returncode != 0
    assert not (run_dir / "agent-ran.json").exists()


# ----------------------------------------------------------------------------- golden helper


def test_golden_mismatch_shows_a_diff(request: pytest.FixtureRequest,
                                      golden: Callable[[str, str], None]) -> None:
    if request.config.getoption("--update-goldens"):
        pytest.skip("would rewrite the golden file")
    script = render_batch_script(VARIANTS["gres"]).replace("--qos=normal", "--qos=high")
    with pytest.raises(pytest.fail.Exception) as info:
        golden("batch-gres.sh", script)
    text = str(info.value)
    assert "-#SBATCH --qos=normal" in text and "+#SBATCH --qos=high" in text
    assert "--update-goldens" in text


def test_golden_missing_is_not_created(request: pytest.FixtureRequest,
                                       golden: Callable[[str, str], None]) -> None:
    if request.config.getoption("--update-goldens"):
        pytest.skip("would create the golden file")
    goldens = GOLDENS
    with pytest.raises(pytest.fail.Exception, match="missing"):
        golden("batch-does-not-exist.sh", "x")
    assert not (goldens / "batch-does-not-exist.sh").exists()


@pytest.mark.parametrize("field", ["run_dir", "job_name", "python", "partition", "options"])
def test_a_newline_in_a_value_is_refused_not_rendered_as_a_line(tmp_path: Path,
                                                                  field: str) -> None:
    # A quoted value with a newline is inert in bash, but an #SBATCH line ends at the
    # newline: the rest became a command of its own (the old renderer ran it).
    payload = f"x\ntouch {tmp_path / 'canary'} #"
    if field == "partition":
        hostile = spec(resources=resources(partition=payload))
    elif field == "options":
        hostile = spec(resources=resources(options={"comment": payload}))
    else:
        hostile = spec(**{field: payload})
    from synthbatch.control.errors import InvalidInput

    with pytest.raises(InvalidInput, match="control characters are not allowed"):
        render_batch_script(hostile)


def test_an_option_name_that_is_not_one_is_refused() -> None:
    from synthbatch.control.errors import InvalidInput

    with pytest.raises(InvalidInput, match="not an sbatch option name"):
        render_batch_script(spec(resources=resources(options={"x y": "1"})))


# ----------------------------------------------------------------------------- read back


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_read_directives_gets_back_what_was_rendered(variant: str) -> None:
    script = render_batch_script(VARIANTS[variant])
    read = read_directives(script)
    rendered = {}
    for line in sbatch_lines(script):
        key, sep, value = line[len("#SBATCH --"):].partition("=")
        rendered[key] = shlex.split(value)[0] if sep else None
    assert read == rendered and "time" in read and "requeue" in read


def test_read_directives_stops_at_the_first_command_and_unquotes() -> None:
    hostile = spec(job_name="job name'$(touch x)", run_dir="/shared/my runs/$HOME;rm")
    read = read_directives(render_batch_script(hostile))
    assert read["job-name"] == "job name'$(touch x)"
    assert read["output"] == "/shared/my runs/$HOME;rm/logs/slurm-%A_%a.out"
    assert read_directives("#!/bin/bash\necho hi\n#SBATCH --time=5\n") == {}


@pytest.mark.parametrize("text, seconds", [("30", 1800), ("00:00:20", 20), ("01:30:00", 5400),
                                           ("2-00:00:01", 172801), ("0", 0)])
def test_time_limits_in_seconds(text: str, seconds: int) -> None:
    assert time_limit_seconds(text) == seconds


@pytest.mark.parametrize("text", ["", "1:2", "a", "1-2", "00:00:xx", "-1"])
def test_malformed_time_limits_are_refused(text: str) -> None:
    with pytest.raises(ValueError, match="not a time limit"):
        time_limit_seconds(text)


def test_the_job_environment_is_an_allow_list_of_names() -> None:
    # sbatch's default (--export=ALL) sent the whole submitting shell to the job, and
    # slurmctld stored it in its state directory (measured on 22.05)
    script = render_batch_script(spec(export=("HF_TOKEN", "HOME", "PATH")))
    assert read_directives(script)["export"] == "HF_TOKEN,HOME,PATH"
    assert "--export=ALL" not in script
    from synthbatch.control.errors import InvalidInput

    with pytest.raises(InvalidInput, match="export: 'A,B' is not a variable name"):
        render_batch_script(spec(export=("A,B",)))
