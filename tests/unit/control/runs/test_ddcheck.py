"""``synthbatch plan`` checks a Data Designer config on the login node through the agent's
``dd --validate`` under the client python (here a stand-in script that records how it was
called and answers like the adapter), and says when it cannot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Dict, List

import pytest

from synthbatch.control.runs.plan import dry_run
from tests.fakes import invoke

CONFIG = "data_designer:\n  columns: []\n"


def stand_in(tmp_path: Path, problems: List[str], notes: List[str], code: int) -> Path:
    """A 'python' that saves its argv, SHIV_ROOT and stdin, then prints a verdict line."""
    script = tmp_path / "env" / "bin" / "python"
    script.parent.mkdir(parents=True)
    (tmp_path / "verdict").write_text(json.dumps({"problems": problems, "notes": notes}))
    script.write_text(
        "#!/bin/sh\n"
        f'printf "%s\\n" "$@" > "{tmp_path}/argv"\n'
        f'printf "%s" "$SHIV_ROOT" > "{tmp_path}/shiv_root"\n'
        f'cat > "{tmp_path}/stdin"\n'
        "echo 'Data Designer logs come first'\n"
        f'cat "{tmp_path}/verdict"\n'
        f"exit {code}\n")
    script.chmod(0o755)
    return script


def write_run(tmp_path: Path, python: str, image: bool = False) -> Path:
    (tmp_path / "dataset.yaml").write_text(CONFIG)
    run = tmp_path / "run.toml"
    client = f'image = "img"\npython = "{python}"\n' if image else f'python = "{python}"\n'
    run.write_text(
        'schema_version = 1\nname = "dd"\nrecords = 6\n[shards]\ncount = 2\n'
        '[client]\ndata_designer = "{config_dir}/dataset.yaml"\n' + client +
        '[client.models]\nwriter = "tiny"\n'
        '[[deployments]]\nalias = "tiny"\nmodel = "m"\ncommand = ["serve", "{port}"]\n')
    return run


@pytest.fixture(autouse=True)
def bundle(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    pyz = tmp_path / "agent.pyz"
    pyz.write_bytes(b"not a real bundle: the stand-in never opens it")
    monkeypatch.setenv("SYNTHBATCH_AGENT_PYZ", str(pyz))
    return pyz


def test_problems_fail_plan_one_line_each(tmp_path: Path, profile_file: Path,
                                          workspace: Path, bundle: Path) -> None:
    python = stand_in(tmp_path, ["model alias 'a' is served by no deployment",
                                 "dataset.yaml: column 'x': bad template"], [], 1)
    run = write_run(tmp_path, str(python))
    result = invoke("plan", str(run), "--profile", str(profile_file))
    assert result.exit_code == 2
    assert result.stderr.splitlines() == [
        f"synthbatch: error: {run}: client.data_designer: {tmp_path}/dataset.yaml: 2 problems "
        f"(checked with {python})",
        "  model alias 'a' is served by no deployment",
        "  dataset.yaml: column 'x': bad template"]
    argv = (tmp_path / "argv").read_text().split()
    assert argv == ["-I", str(bundle), "dd", "--plan", "-", "--validate"]
    plan = json.loads((tmp_path / "stdin").read_text())
    assert plan["client_data_designer"]["config"] == f"{tmp_path}/dataset.yaml"
    assert plan["client_data_designer"]["models"] == {"writer": "tiny"}
    shiv_root = (tmp_path / "shiv_root").read_text()
    assert shiv_root and not shiv_root.startswith(str(tmp_path / "home"))
    assert not Path(shiv_root).exists()  # a private scratch folder, removed again
    assert not workspace.exists()  # a dry run writes no state


def test_problems_in_json_come_as_details(tmp_path: Path, profile_file: Path) -> None:
    run = write_run(tmp_path, str(stand_in(tmp_path, ["one", "two"], [], 1)))
    result = invoke("plan", str(run), "--profile", str(profile_file), "--json")
    error: Dict[str, Any] = json.loads(result.stderr)["error"]
    assert error["code"] == "invalid_input" and error["details"] == ["one", "two"]


def test_a_clean_check_is_in_the_summary_with_its_notes(tmp_path: Path,
                                                       profile_file: Path) -> None:
    python = stand_in(tmp_path, [], ["tiktoken is offline"], 0)
    out = dry_run(write_run(tmp_path, str(python)), str(profile_file))
    assert out["data_designer"] == {"checked": True, "python": str(python),
                                    "notes": ["tiktoken is offline"]}
    assert f"data designer: config checked with {python}\n" in out["summary"]
    assert "data designer: tiktoken is offline\n" in out["summary"]


def test_an_exit_status_without_problems_is_still_a_problem(tmp_path: Path,
                                                            profile_file: Path) -> None:
    run = write_run(tmp_path, str(stand_in(tmp_path, [], [], 3)))
    result = invoke("plan", str(run), "--profile", str(profile_file))
    assert result.exit_code == 2 and "  the check exited with status 3" in result.stderr


def test_without_the_client_python_here_preflight_checks_it(tmp_path: Path,
                                                             profile_file: Path) -> None:
    out = dry_run(write_run(tmp_path, "/nowhere/bin/python"), str(profile_file))
    assert out["data_designer"]["checked"] is False
    assert ("data designer: not checked here: /nowhere/bin/python is not on this node; "
            "preflight checks it before any server starts") in out["summary"]


def test_the_plan_pins_the_config_file_it_read(tmp_path: Path, profile_file: Path,
                                               workspace: Path) -> None:
    import hashlib

    from synthbatch.control.runs.plan import resolve

    run = write_run(tmp_path, str(stand_in(tmp_path, [], [], 0)))
    spec = resolve(run, str(profile_file)).plan.client_data_designer
    assert spec is not None and spec.config == str(tmp_path / "dataset.yaml")
    assert spec.config_sha256 == hashlib.sha256(CONFIG.encode()).hexdigest()
    (tmp_path / "dataset.yaml").unlink()  # not visible on the login node: nothing pinned
    assert resolve(run, str(profile_file)).plan.client_data_designer.config_sha256 == ""
