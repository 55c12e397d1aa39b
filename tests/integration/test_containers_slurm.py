"""Sealed images for real: the agent runs inside a real container (charliecloud's ch-run)
on the testbed, and the image registry knows what is inside.

The image is ``scripts/test-image``'s (``make test-image``): Debian trixie minbase +
Debian's python3, nothing of synthbatch, as a directory and as a SquashFS file. Its Python
is ``/usr/bin/python3`` 3.13 (the build records it in ``python.txt``); the tests run with
another version (the checkout's venv, 3.11 on Debian 12), so every version and
``sys.executable`` below tells the two apart.
"""

from __future__ import annotations

import json
import os
import platform
import secrets
import subprocess
import sys
from pathlib import Path
from typing import Any, Dict, Tuple

import pytest

from fixtures.fake_openai_server import expected_completion
from synthbatch.agent_stdlib.containers import IMAGE_PATH, SCRATCH_MOUNT, with_scratch, wrap
from synthbatch.agent_stdlib.contracts import ContainerSpec, MountSpec
from synthbatch.agent_stdlib.imagedigest import tree_digest
from tests.conftest import REPO
from tests.integration.runs import cli_json, invoke, wait_final, write_profile
from tests.processes import processes_mentioning

IMAGE_DIR = Path(os.environ.get("SYNTHBATCH_TEST_IMAGE_DIR")
                 or REPO / ".work" / "images" / "python3-trixie")
FIXTURES_MOUNT = "/mnt/0"  # the test image has /mnt/0 ... /mnt/9 for user mounts


@pytest.fixture(scope="session")
def test_image() -> Path:
    """The built test image (``make test-image``); skipped (failed under CI) without it."""
    missing = [p for p in (IMAGE_DIR / "rootfs", IMAGE_DIR / "image.sqfs",
                           IMAGE_DIR / "python.txt") if not p.exists()]
    problem = f"no test image at {IMAGE_DIR} (build it: make test-image)" if missing else \
        ("ch-run is not installed (make test-image installs charliecloud-runtime)"
         if subprocess.run(["sh", "-c", "command -v ch-run"], capture_output=True).returncode
         else None)
    if problem:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(problem, pytrace=False)
        pytest.skip(problem)
    version, executable = image_python(IMAGE_DIR)
    assert version != platform.python_version(), "the image's Python must differ from the host's"
    assert executable == "/usr/bin/python3" != sys.executable
    return IMAGE_DIR


def image_python(image: Path) -> Tuple[str, str]:
    """(version, executable) of the image's python3, as its build recorded them."""
    version, executable = (image / "python.txt").read_text().split()
    return version, executable


def charliecloud_profile(tmp_path: Path, python: str, *more: Tuple[Path, str]) -> Path:
    """The testbed profile with charliecloud, the fixtures mounted at /mnt/0 and ``more``
    (host folder, mount point) mounted too."""
    path = write_profile(tmp_path, python)
    mounts = ", ".join(f"{{ host = {json.dumps(str(host))}, container = {json.dumps(inside)} }}"
                       for host, inside in ((REPO / "fixtures", FIXTURES_MOUNT), *more))
    with path.open("a") as handle:
        handle.write(f'[container]\nruntime = "charliecloud"\nmounts = [{mounts}]\n')
    return path


def env_inside(argv: list, env: Dict[str, str]) -> Dict[str, Any]:
    done = subprocess.run(argv, env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


@pytest.mark.slow
def test_image_add_inspects_the_test_image(test_image: Path, tmp_path: Path,
                                           python_exe: str) -> None:
    profile = charliecloud_profile(tmp_path, python_exe)
    tree = str(test_image / "rootfs")
    added = invoke("image", "add", "py", tree, "--kind", "client", "--profile", str(profile))
    assert added.exit_code == 0, added.output
    info = invoke("image", "info", "py", "--verify", "--profile", str(profile))
    assert info.exit_code == 0, info.output
    text = info.stdout
    assert "format: directory" in text and "kind: client" in text
    assert "inspection: ran with charliecloud" in text
    version, executable = image_python(test_image)
    assert f"  python: {version} ({executable})" in text
    assert "  vllm: absent" in text and "  data_designer: absent" in text
    assert "  mount points: all present" in text
    assert " imports with the image's python3" in text  # the zipapp import check, inside
    assert "  note: no data_designer package found" in text
    data = cli_json("image", "info", "py", "--profile", str(profile))
    assert data["sha256"] == tree_digest(tree)[0]
    inspected = data["inspection"]["python"]
    assert (inspected["version"], inspected["executable"]) == (version, executable)
    squash = cli_json("image", "add", "sq", str(test_image / "image.sqfs"),
                      "--profile", str(profile))
    assert squash["format"] == "squashfs" and squash["inspection"]["agent"]["ok"] is True
    assert squash["inspection"]["python"]["executable"] == "/usr/bin/python3"


@pytest.mark.slow
def test_build_zipapp_checks_the_bundle_inside_the_image(test_image: Path,
                                                         agent_pyz: Path) -> None:
    for image in (test_image / "rootfs", test_image / "image.sqfs"):
        done = subprocess.run([sys.executable, str(REPO / "build_zipapp.py"), "--check",
                               str(agent_pyz), "--image", str(image)],
                              capture_output=True, text=True, timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert done.stdout.startswith(f"OK {agent_pyz}: all manifest modules import with "
                                      f"python3 in {image}")


@pytest.mark.slow
def test_the_environment_crosses_by_name_only(test_image: Path, tmp_path: Path) -> None:
    """ch-run with the step flags of agent_stdlib.containers: only the named variables,
    the image's PATH, SHIV_ROOT at the scratch mount, a private /tmp."""
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    marker = Path("/tmp") / f"synthbatch-host-tmp-{secrets.token_hex(4)}"
    marker.write_text("host")
    try:
        box = with_scratch(ContainerSpec(runtime="charliecloud", image="py",
                                         path=str(test_image / "rootfs"), sha256="",
                                         mounts=(MountSpec(str(tmp_path), "/synthbatch/run",
                                                           False),)), str(scratch))
        code = ("import json, os, sys; open(os.environ['SHIV_ROOT'] + '/w', 'w').write('x');"
                f"print(json.dumps({{'env': dict(os.environ), 'exe': sys.executable, "
                f"'tmp': os.path.exists({str(marker)!r})}}))")
        argv = wrap(box, ["python3", "-I", "-c", code], env_names=["MY_SECRET"],
                    inherit=["ALLOWED"]).argv
        env = {"PATH": os.environ["PATH"], "USER": "root", "HOME": "/root", "TMPDIR": "/tmp",
               "MY_SECRET": "s3cr3t", "ALLOWED": "yes", "NOT_NAMED": "leak",
               "SLURM_JOB_ID": "7", "CUDA_VISIBLE_DEVICES": "3", "SHIV_ROOT": str(scratch)}
        seen = env_inside(list(argv), env)
    finally:
        marker.unlink()
    inside = seen["env"]
    assert not any("s3cr3t" in a for a in argv)
    assert inside["MY_SECRET"] == "s3cr3t" and inside["ALLOWED"] == "yes"
    assert inside["SLURM_JOB_ID"] == "7" and inside["CUDA_VISIBLE_DEVICES"] == "3"
    assert "NOT_NAMED" not in inside and "HOME" not in inside and "TMPDIR" not in inside
    assert inside["PATH"] == IMAGE_PATH and inside["SHIV_ROOT"] == SCRATCH_MOUNT
    assert seen["exe"] == "/usr/bin/python3" and seen["tmp"] is False
    assert (scratch / "w").read_text() == "x"  # the scratch mount is writable


def test_a_shard_runs_inside_the_image(slurm_cluster, test_image: Path, tmp_path: Path,
                                       python_exe: str) -> None:
    """Servers (the fake server, mounted) and the client (the built-in generator) all run
    with the image's python3 via ch-run; the GPU binder runs on the host in front of ch-run
    and each replica's narrowed CUDA_VISIBLE_DEVICES reaches its container."""
    profile = charliecloud_profile(tmp_path, python_exe)
    tree = str(test_image / "rootfs")
    cli_json("image", "add", "py", tree, "--no-inspect", "--profile", str(profile))
    model = f"fake-{secrets.token_hex(4)}"
    command = ["python3", f"{FIXTURES_MOUNT}/fake_openai_server.py", "--host", "{host}",
               "--port", "{port}", "--model", "{served_name}"]
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        "schema_version = 1\n"
        'name = "sealed"\n'
        "records = 6\n"
        "[shards]\ncount = 1\n"
        '[client]\nmodel = "tiny"\nprompt_template = "Describe item {index}."\n'
        'max_tokens = 6\ntemperature = 0.0\nconcurrency = 2\nmax_retries = 1\nimage = "py"\n'
        f'[[deployments]]\nalias = "tiny"\nimage = "py"\nmodel = "{model}"\n'
        f"command = {json.dumps(command)}\n"
        "gpus = 1\nreplicas = 2\nstartup_timeout_s = 60\n")
    submitted = cli_json("submit", str(run_file), "--profile", str(profile))
    run_id = submitted["run_id"]
    status = wait_final(run_id, profile)
    run_dir = tmp_path / "workspace" / "runs" / run_id
    logs = run_dir / "shards" / "shard-00000" / "attempts" / "attempt-0001" / "logs" / \
        "execution-1"
    server_logs = [(logs / f"server-tiny-{k}.log").read_text() for k in range(2)]
    client_log = (logs / "client.log").read_text()
    assert status["state"] == "succeeded", (status, server_logs, client_log)

    # both steps ran the image's Python, not the host's
    python = "python {} ({})".format(*image_python(test_image))
    assert f"generate: {python}\n" in client_log, client_log
    seen = []
    for replica, log in enumerate(server_logs):
        assert f"fake-openai-server {python}\n" in log, log
        # the binder ran on the host, and the device list it narrowed reached the image
        binder = [line for line in log.splitlines() if line.startswith("serve: ")]
        assert binder and f": plan GPUs {replica} -> CUDA_VISIBLE_DEVICES=" in binder[0], log
        narrowed = binder[0].split("CUDA_VISIBLE_DEVICES=")[1].split()[0]
        placement = json.loads(next(line for line in log.splitlines()
                                    if line.startswith("fake-openai-server placement "))
                               .split(" ", 2)[2])
        assert placement["cuda_visible_devices"] == narrowed and placement["node"], log
        seen.append((placement["node"], narrowed))
    assert len(set(seen)) == 2, seen  # each replica sees its own GPU

    output = tmp_path / "merged.jsonl"
    manifest = cli_json("merge", run_id, "--output", str(output), "--profile", str(profile))
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert manifest["records"] == 6 and [r["index"] for r in records] == list(range(6))
    for record in records:
        assert record["completion"] == expected_completion(model, record["prompt"], 6)
    # the image is sealed: nothing was written into it (tree digest unchanged)
    verified = invoke("image", "info", "py", "--verify", "--profile", str(profile))
    assert verified.exit_code == 0, verified.output
    slurm_cluster.wait_for(lambda: not processes_mentioning(run_id, model), timeout=30,
                           what="no process of the run left")


def test_a_recipe_reads_its_seed_data_inside_the_image(slurm_cluster, test_image: Path,
                                                       tmp_path: Path, python_exe: str) -> None:
    """The built-in generator in a client image reads the recipe's seed file under its
    mount (/mnt/1): the plan keeps the host path (under /tmp, which the image's private
    /tmp hides), the agent gives the generator the mounted one."""
    seeds = tmp_path / "seeds"
    seeds.mkdir()
    topics = ["tides", "moons", "comets"]
    (seeds / "topics.jsonl").write_text("".join(json.dumps({"topic": t, "source": i}) + "\n"
                                                for i, t in enumerate(topics)))
    profile = charliecloud_profile(tmp_path, python_exe, (seeds, "/mnt/1"))
    cli_json("image", "add", "py", str(test_image / "rootfs"), "--no-inspect",
             "--profile", str(profile))
    model = f"fake-{secrets.token_hex(4)}"
    command = ["python3", f"{FIXTURES_MOUNT}/fake_openai_server.py", "--host", "{host}",
               "--port", "{port}", "--model", "{served_name}"]
    run_file = tmp_path / "run.toml"
    run_file.write_text(
        'schema_version = 1\nname = "sealed-seeds"\nrecords = 6\n[shards]\ncount = 2\n'
        '[client]\nimage = "py"\nseed = 5\n'
        f'[client.seed_data]\npath = {json.dumps(str(seeds / "topics.jsonl"))}\n'
        '[[client.columns]]\nname = "level"\ntype = "category"\nvalues = ["easy", "hard"]\n'
        '[[client.columns]]\nname = "question"\ntype = "llm-text"\nmodel = "tiny"\n'
        'prompt = "Ask a {level} question about {topic}."\nmax_tokens = 6\n'
        f'[[deployments]]\nalias = "tiny"\nimage = "py"\nmodel = "{model}"\n'
        f"command = {json.dumps(command)}\n"
        "gpus = 1\nstartup_timeout_s = 60\n")
    run_id = cli_json("submit", str(run_file), "--profile", str(profile))["run_id"]
    status = wait_final(run_id, profile)
    logs = tmp_path / "workspace" / "runs" / run_id / "shards" / "shard-00000" / "attempts" / \
        "attempt-0001" / "logs" / "execution-1"
    client_log = (logs / "client.log").read_text()
    assert status["state"] == "succeeded", (status, client_log)
    assert "generate: python {} ({})\n".format(*image_python(test_image)) in client_log
    output = tmp_path / "merged.jsonl"
    cli_json("merge", run_id, "--output", str(output), "--profile", str(profile))
    records = [json.loads(line) for line in output.read_text().splitlines()]
    assert [r["index"] for r in records] == list(range(6))
    assert all(r["topic"] in topics and r["source"] == topics.index(r["topic"])
               and r["question"] for r in records), records
    slurm_cluster.wait_for(lambda: not processes_mentioning(run_id, model), timeout=30,
                           what="no process of the run left")
