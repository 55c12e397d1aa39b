"""Server and client step specs (argv + env): goldens per variant, placeholders, secrets."""

from __future__ import annotations

import dataclasses
import json
from typing import Callable, Dict, Optional, Sequence, Tuple

import pytest

from synthbatch.agent_stdlib.allocation.launch import (
    ClientPaths,
    Launch,
    LaunchError,
    Site,
    client_launch,
    fill_placeholders,
    server_launch,
)
from synthbatch.agent_stdlib.allocation.serve import narrow
from synthbatch.agent_stdlib.contracts import (
    CommandClientSpec,
    ContainerSpec,
    DataDesignerSpec,
    MountSpec,
    Plan,
    ReplicaSpec,
    SeedDataSpec,
)
from tests.agent_runs import local_plan

RUN = "/ws/runs/r-1"
AGENT = f"{RUN}/agent-{'a' * 64}.pyz"
AMBIENT = {"PATH": "/usr/bin:/bin", "HOME": "/home/u", "SLURM_JOB_ID": "12",
           "JOB_HF_TOKEN": "hf-secret-value", "JOB_API_KEY": "api-secret-value",
           "UNRELATED": "dropped", "SHIV_ROOT": "/tmp/synthbatch-shiv-0"}
MOUNTS = (MountSpec("/shared/models", "/models", True), MountSpec(RUN, "/synthbatch/run", False))
PYXIS = ContainerSpec(runtime="pyxis", image="vllm", path="/img/vllm.sqsh", sha256="b" * 64,
                      mounts=MOUNTS)
APPTAINER = dataclasses.replace(PYXIS, runtime="apptainer", path="/img/vllm.sif")
CHARLIECLOUD = dataclasses.replace(PYXIS, runtime="charliecloud", path="/img/vllm.sqfs")
PATHS = ClientPaths(agent_pyz=AGENT, plan_json=f"{RUN}/plan.json",
                    output=f"{RUN}/shards/shard-00003/attempts/attempt-0001/output",
                    progress_json=f"{RUN}/shards/shard-00003/attempts/attempt-0001/progress.json",
                    shard=3, record_offset=30, num_records=10)
ENDPOINTS = {"tiny": "http://127.0.0.1:41000"}


def srun_plan(nodes: int = 2, gpu_request: str = "gres", **dep_changes: object) -> Plan:
    plan = local_plan("/usr/bin/python3", ["serve", "--host", "{host}", "--port", "{port}"])
    placement = (ReplicaSpec(index=0, node=0, gpus=(0, 1), port=20000),
                 ReplicaSpec(index=1, node=1, gpus=(0, 1), port=20001))
    dep = dataclasses.replace(plan.deployments[0], gpus_per_replica=2, replicas=2,
                              nodes=nodes, placement=placement if nodes > 1 else (),
                              env={"VLLM_LOGGING_LEVEL": "INFO"}, **dep_changes)
    resources = dataclasses.replace(plan.resources, nodes=nodes, gpus=4 if nodes == 1 else 2,
                                    gpu_request=gpu_request)
    runtime = dataclasses.replace(plan.runtime, launcher="srun", env_allow=("HF_HOME",))
    return plan.replace(deployments=(dep,), resources=resources, runtime=runtime)


def dump(launch: Launch) -> str:
    return json.dumps({"name": launch.name, "argv": list(launch.argv),
                       "env": dict(sorted(launch.env.items()))}, indent=2) + "\n"


def server(plan: Plan, replica: int, site: Site,
           ambient: Optional[Dict[str, str]] = None) -> Launch:
    return server_launch(plan, plan.deployments[0], replica, site, AGENT,
                         AMBIENT if ambient is None else ambient)


VLLM = ("vllm", "serve", "/models/llama", "--host", "{host}", "--port", "{port}")
SERVERS: Dict[str, Callable[[], Launch]] = {
    "single-node": lambda: server(srun_plan(nodes=1), 1,
                                  Site(0, "127.0.0.1", 24001, gpus=(2, 3))),
    "single-node-gpus": lambda: server(srun_plan(nodes=1, gpu_request="gpus"), 1,
                                       Site(0, "127.0.0.1", 24001, gpus=(2, 3))),
    "placed-node1": lambda: server(srun_plan(secret_env={"HF_TOKEN": "JOB_HF_TOKEN"}), 1,
                                   Site(1, "10.0.0.2", 20001, gpus=(0, 1))),
    "gpus-per-node": lambda: server(srun_plan(gpu_request="gpus"), 0,
                                    Site(0, "127.0.0.1", 20000, gpus=(0, 1))),
    "pyxis": lambda: server(srun_plan(container=PYXIS, command=VLLM,
                                      secret_env={"HF_TOKEN": "JOB_HF_TOKEN"}), 1,
                            Site(1, "10.0.0.2", 20001, gpus=(0, 1))),
    "apptainer-agent": lambda: server(srun_plan(
        container=APPTAINER, secret_env={"HF_TOKEN": "JOB_HF_TOKEN"},
        command=("python3", "-I", "{agent}", "serve-llamacpp", "-m", "/models/x.gguf",
                 "--host", "{host}", "--port", "{port}")), 0,
        Site(0, "127.0.0.1", 20000, gpus=(0, 1))),
    "charliecloud": lambda: server(srun_plan(nodes=1, container=CHARLIECLOUD, command=VLLM), 1,
                                   Site(0, "127.0.0.1", 24001, gpus=(2, 3))),
}


def with_big(plan: Plan) -> Plan:
    """``plan`` with a second deployment ``big`` (served as ``org/big-model``)."""
    big = dataclasses.replace(plan.deployments[0], alias="big", served_name="org/big-model")
    return plan.replace(deployments=(*plan.deployments, big))


def command_plan(container: Optional[ContainerSpec]) -> Plan:
    command = CommandClientSpec(argv=("/opt/client/run", "--out", "/synthbatch/run/x"),
                                env={"MODE": "fast"}, secret_env={"API_KEY": "JOB_API_KEY"},
                                container=container)
    return srun_plan().replace(client=None, client_command=command)


def builtin_plan(container: ContainerSpec) -> Plan:
    plan = srun_plan(nodes=1)
    return plan.replace(client=dataclasses.replace(plan.client, container=container))


def dd_plan(container: Optional[ContainerSpec]) -> Plan:
    spec = DataDesignerSpec(config="/models/dd/config.yaml",
                            python="/envs/dd/bin/python" if container is None else "python3",
                            models={"writer": "tiny"}, env={"HF_HOME": "/models/hf"},
                            secret_env={"API_KEY": "JOB_API_KEY"}, container=container)
    return with_big(srun_plan(nodes=1)).replace(client=None, client_data_designer=spec)


BOTH = {**ENDPOINTS, "big": "http://127.0.0.1:41001"}
CLIENTS: Dict[str, Callable[[], Launch]] = {
    "builtin": lambda: client_launch(srun_plan(nodes=1), PATHS, ENDPOINTS, AMBIENT),
    "builtin-charliecloud": lambda: client_launch(builtin_plan(CHARLIECLOUD), PATHS, ENDPOINTS,
                                                  AMBIENT),
    "builtin-pyxis": lambda: client_launch(builtin_plan(PYXIS), PATHS, ENDPOINTS, AMBIENT),
    "command-host": lambda: client_launch(command_plan(None), PATHS, ENDPOINTS, AMBIENT),
    "command-apptainer": lambda: client_launch(with_big(command_plan(APPTAINER)), PATHS,
                                               BOTH, AMBIENT),
    "dd-host": lambda: client_launch(dd_plan(None), PATHS, BOTH, AMBIENT),
    "dd-pyxis": lambda: client_launch(dd_plan(PYXIS), PATHS, BOTH, AMBIENT),
}


@pytest.mark.parametrize("variant", sorted(SERVERS))
def test_server_golden(variant: str, golden: Callable[[str, str], None]) -> None:
    golden(f"server-{variant}.json", dump(SERVERS[variant]()))


@pytest.mark.parametrize("variant", sorted(CLIENTS))
def test_client_golden(variant: str, golden: Callable[[str, str], None]) -> None:
    golden(f"client-{variant}.json", dump(CLIENTS[variant]()))


def split_task(argv: Sequence[str]) -> Tuple[Tuple[str, ...], Tuple[str, ...]]:
    """(GPU binder up to its ``--``, the rest) of a step's task (after srun's ``--``)."""
    task = tuple(argv[argv.index("--") + 1:])
    if task[3:5] != ("serve", "--gpus"):
        return (), task
    end = task.index("--") + 1
    return task[:end], task[end:]


def engine_argv(argv: Sequence[str]) -> Tuple[str, ...]:
    """The engine's own argv: after srun's ``--`` and after the GPU binder's."""
    return split_task(argv)[1]


def test_placed_replica_runs_on_its_node_as_one_task() -> None:
    argv = SERVERS["placed-node1"]().argv
    head = argv[:argv.index("--")]
    assert "--relative=1" in head and "--nodes=1" in head and "--ntasks=1" in head
    assert "--kill-on-bad-exit=1" in head and "--gres=gpu:2" in head
    assert engine_argv(argv) == ("serve", "--host", "10.0.0.2", "--port", "20001")
    assert "--relative" not in " ".join(SERVERS["single-node"]().argv)


def test_secrets_reach_the_env_by_name_never_the_argv() -> None:
    for variant in ("placed-node1", "pyxis", "apptainer-agent"):
        launch = SERVERS[variant]()
        assert launch.env["HF_TOKEN"] == "hf-secret-value"
        assert not any("hf-secret-value" in a for a in launch.argv)
        assert "JOB_HF_TOKEN" not in launch.env and "UNRELATED" not in launch.env
    assert SERVERS["apptainer-agent"]().env["APPTAINERENV_HF_TOKEN"] == "hf-secret-value"
    assert "--container-env=HF_TOKEN,SHIV_ROOT,VLLM_LOGGING_LEVEL" in SERVERS["pyxis"]().argv


def test_pyxis_flags_go_before_the_separator() -> None:
    argv = SERVERS["pyxis"]().argv
    sep = argv.index("--")
    assert "--container-image=/img/vllm.sqsh" in argv[:sep]
    assert engine_argv(argv) == ("vllm", "serve", "/models/llama", "--host", "10.0.0.2",
                                 "--port", "20001")


def test_agent_placeholder_is_translated_inside_the_container() -> None:
    engine = engine_argv(SERVERS["apptainer-agent"]().argv)
    assert f"/synthbatch/run/agent-{'a' * 64}.pyz" in engine and AGENT not in engine


def test_missing_secret_names_the_variable() -> None:
    plan = srun_plan(secret_env={"HF_TOKEN": "JOB_NOT_SET"})
    with pytest.raises(LaunchError, match="secret variable JOB_NOT_SET \\(for HF_TOKEN\\)"):
        server(plan, 0, Site(0, "127.0.0.1", 20000))


def test_command_client_in_container_sees_translated_paths() -> None:
    env = CLIENTS["command-apptainer"]().env
    assert env["SYNTHBATCH_OUTPUT_DIR"] == \
        "/synthbatch/run/shards/shard-00003/attempts/attempt-0001/output"
    assert env["APPTAINERENV_SYNTHBATCH_OUTPUT_DIR"] == env["SYNTHBATCH_OUTPUT_DIR"]
    assert env["APPTAINERENV_API_KEY"] == "api-secret-value"
    assert "SYNTHBATCH_OPENAI_BASE_URL" not in env  # two models: no single-model shortcut
    host = CLIENTS["command-host"]().env
    assert host["SYNTHBATCH_OUTPUT_DIR"] == PATHS.output and host["MODE"] == "fast"
    assert host["SYNTHBATCH_OPENAI_BASE_URL"] == "http://127.0.0.1:41000/v1"


def test_the_generator_in_an_image_reads_the_seed_data_under_its_mount() -> None:
    """The plan holds the host path; in an image the generator is told the mounted one."""
    seed = SeedDataSpec(path="/shared/models/topics.jsonl", fields=("topic",))
    for box in (PYXIS, CHARLIECLOUD):
        plan = builtin_plan(box)
        plan = plan.replace(client=dataclasses.replace(plan.client, seed_data=seed))
        argv = client_launch(plan, PATHS, ENDPOINTS, AMBIENT).argv
        assert argv[argv.index("--seed-data") + 1] == "/models/topics.jsonl"
    host = srun_plan(nodes=1)
    host = host.replace(client=dataclasses.replace(host.client, seed_data=seed))
    assert "--seed-data" not in client_launch(host, PATHS, ENDPOINTS, AMBIENT).argv
    outside = builtin_plan(PYXIS)
    outside = outside.replace(client=dataclasses.replace(
        outside.client, seed_data=dataclasses.replace(seed, path="/elsewhere/t.jsonl")))
    with pytest.raises(LaunchError, match="client: seed data /elsewhere/t.jsonl is not under "
                                          "any mount of image vllm"):
        client_launch(outside, PATHS, ENDPOINTS, AMBIENT)


def test_client_runs_on_the_batch_node_of_a_multi_node_allocation() -> None:
    assert "--relative=0" in CLIENTS["command-host"]().argv
    assert "--relative=0" not in CLIENTS["builtin"]().argv  # one node: no pinning needed


def test_fill_placeholders_is_one_pass() -> None:
    assert fill_placeholders(["{host}:{port}", "--x={agent}", "{model}"], "{port}", 5, "/a") == \
        ["{port}:5", "--x=/a", "{model}"]


def test_pyxis_refuses_the_local_launcher() -> None:
    plan = srun_plan(container=PYXIS)
    local = plan.replace(runtime=dataclasses.replace(plan.runtime, launcher="local"))
    with pytest.raises(LaunchError, match="a pyxis image needs the srun launcher"):
        server(local, 0, Site(0, "127.0.0.1", 20000, gpus=(0, 1)))
    apptainer = srun_plan(container=APPTAINER)
    argv = server(apptainer.replace(runtime=local.runtime), 0,
                  Site(0, "127.0.0.1", 1, gpus=(0, 1))).argv
    binder, rest = split_task(("--",) + argv)  # no srun: the binder runs in front, on host
    assert binder[3:6] == ("serve", "--gpus", "0,1") and rest[:2] == ("apptainer", "exec")


# ----------------------------------------------------------------------------- GPU binding


def one_node_plan(gpu_request: str, per_replica: int, container: Optional[ContainerSpec] = None,
                  command: Sequence[str] = ("serve", "--host", "{host}", "--port", "{port}"),
                  launcher: str = "srun") -> Plan:
    """``4 // per_replica`` replicas of ``per_replica`` GPUs on one 4-GPU node."""
    plan = srun_plan(nodes=1, gpu_request=gpu_request, container=container,
                     command=tuple(command))
    dep = dataclasses.replace(plan.deployments[0], gpus_per_replica=per_replica,
                              replicas=4 // per_replica)
    runtime = dataclasses.replace(plan.runtime, launcher=launcher)
    return plan.replace(deployments=(dep,), runtime=runtime)


def replica_sites(per_replica: int):  # type: ignore[no-untyped-def]
    return [Site(0, "127.0.0.1", 24000 + r,
                 gpus=tuple(range(r * per_replica, (r + 1) * per_replica)))
            for r in range(4 // per_replica)]


@pytest.mark.parametrize("gpu_request, flag", [("gres", "--gres=gpu:4"), ("gpus", "--gpus=4")])
@pytest.mark.parametrize("per_replica", [1, 2, 4])
def test_every_replica_asks_for_the_node_and_is_bound_to_its_own_gpus(
        gpu_request: str, flag: str, per_replica: int) -> None:
    plan = one_node_plan(gpu_request, per_replica)
    bound = []
    for replica, site in enumerate(replica_sites(per_replica)):
        argv = server(plan, replica, site).argv
        head = argv[:argv.index("--")]
        assert [a for a in head if a.startswith(("--gres", "--gpus"))] == [flag]  # the node
        binder, engine = split_task(argv)
        gpus = ",".join(str(g) for g in site.gpus)
        assert binder == ("/usr/bin/python3", "-I", AGENT, "serve", "--gpus", gpus,
                          "--replica", f"server-tiny-{replica}", "--")
        assert engine == ("serve", "--host", "127.0.0.1", "--port", str(site.port))
        bound.append(set(site.gpus))
    assert set().union(*bound) == {0, 1, 2, 3} and sum(len(b) for b in bound) == 4


@pytest.mark.parametrize("container, binder, runtime_head", [
    (None, ("/usr/bin/python3", "-I", AGENT), ()),
    (PYXIS, ("python3", "-I", f"/synthbatch/run/agent-{'a' * 64}.pyz"), ()),
    (APPTAINER, ("/usr/bin/python3", "-I", AGENT), ("apptainer", "exec", "--nv")),
    (CHARLIECLOUD, ("/usr/bin/python3", "-I", AGENT), ("ch-run", "--private-tmp")),
])
def test_the_binder_runs_where_the_task_runs(container: Optional[ContainerSpec],
                                             binder: Tuple[str, ...],
                                             runtime_head: Tuple[str, ...]) -> None:
    plan = one_node_plan("gres", 2, container=container, command=VLLM)
    argv = server(plan, 1, replica_sites(2)[1]).argv
    wrapper, rest = split_task(argv)
    prefix = ("--env-prefix", "APPTAINERENV_") if container is APPTAINER else ()
    assert wrapper == binder + ("serve", "--gpus", "2,3", "--replica", "server-tiny-1",
                                *prefix, "--")
    assert rest[:len(runtime_head)] == runtime_head  # apptainer/ch-run run behind it, on host
    assert rest[-len(VLLM):][:3] == VLLM[:3]
    pyxis_flags = [a for a in argv[:argv.index("--")] if a.startswith("--container-image")]
    assert bool(pyxis_flags) == (container is PYXIS)  # pyxis: the whole task is in the image


def test_no_binder_without_gpus() -> None:
    plan = one_node_plan("gres", 2)
    cpu = plan.replace(deployments=(dataclasses.replace(plan.deployments[0],
                                                         gpus_per_replica=0),))
    argv = server(cpu, 0, Site(0, "127.0.0.1", 24000)).argv
    assert "--gres=none" in argv and split_task(argv)[0] == ()
    local_cpu = cpu.replace(runtime=dataclasses.replace(cpu.runtime, launcher="local"))
    launch = server(local_cpu, 0, Site(0, "127.0.0.1", 24000),
                    ambient={"CUDA_VISIBLE_DEVICES": "2,3", "PATH": "/bin"})
    assert launch.argv == ("serve", "--host", "127.0.0.1", "--port", "24000")
    assert launch.env["CUDA_VISIBLE_DEVICES"] == ""  # a step without GPUs sees none


@pytest.mark.parametrize("per_replica", [1, 2, 4])
def test_local_replicas_are_bound_to_their_gpus_of_the_allocation(per_replica: int) -> None:
    # The local backend gives the allocation CUDA_VISIBLE_DEVICES (here the machine's GPUs
    # 4-7); each replica's binder narrows it to the plan's positions, as on Slurm.
    plan = one_node_plan("gres", per_replica, launcher="local")
    ambient = {"CUDA_VISIBLE_DEVICES": "4,5,6,7", "PATH": "/bin"}
    for replica, site in enumerate(replica_sites(per_replica)):
        launch = server(plan, replica, site, ambient=ambient)
        binder, engine = split_task(("--",) + launch.argv)
        gpus = ",".join(str(g) for g in site.gpus)
        assert binder == ("/usr/bin/python3", "-I", AGENT, "serve", "--gpus", gpus,
                          "--replica", f"server-tiny-{replica}", "--")
        assert engine == ("serve", "--host", "127.0.0.1", "--port", str(site.port))
        assert launch.env["CUDA_VISIBLE_DEVICES"] == "4,5,6,7"  # the binder narrows it
        narrowed = narrow(launch.env, site.gpus).env["CUDA_VISIBLE_DEVICES"]
        assert narrowed == ",".join(str(4 + g) for g in site.gpus)


def test_a_site_without_the_replicas_gpus_is_refused() -> None:
    with pytest.raises(LaunchError, match=r"server-tiny-0: the plan gives it GPUs \(0,\), "
                                          r"the deployment needs 2"):
        server(one_node_plan("gres", 2), 0, Site(0, "127.0.0.1", 24000, gpus=(0,)))


# ------------------------------------------------------------------------ environment allow-list


def test_every_srun_step_exports_exactly_the_env_the_agent_gives_it() -> None:
    # sbatch --export=NAMES leaves SLURM_EXPORT_ENV=NAMES in the job; an srun inheriting it
    # would pass only those names to its tasks (measured on 22.05): each step says ALL of
    # its own, already allow-listed, environment
    ambient = {**AMBIENT, "SLURM_EXPORT_ENV": "HOME,PATH"}
    plan = command_plan(None)
    for launch in (client_launch(plan, PATHS, ENDPOINTS, ambient),
                   server(srun_plan(), 0, Site(0, "127.0.0.1", 20000, gpus=(0, 1)), ambient)):
        assert "--export=ALL" in launch.argv[:launch.argv.index("--")]
        assert "UNRELATED" not in launch.env and "JOB_API_KEY" not in launch.env


def test_an_allowed_proxy_variable_never_covers_loopback() -> None:
    from synthbatch.agent_stdlib.allocation.steps import step_env

    plan = srun_plan()
    runtime = dataclasses.replace(plan.runtime, env_allow=("HTTPS_PROXY", "NO_PROXY"))
    env = step_env(runtime, {**AMBIENT, "HTTPS_PROXY": "http://proxy:3128",
                             "NO_PROXY": "internal.example", "HTTP_PROXY": "http://p:1"}, {})
    assert env["HTTPS_PROXY"] == "http://proxy:3128" and "HTTP_PROXY" not in env
    assert env["NO_PROXY"] == "internal.example,127.0.0.1,localhost,::1"
    assert env["no_proxy"] == "127.0.0.1,localhost,::1"
    assert "NO_PROXY" not in step_env(plan.runtime, AMBIENT, {})  # no proxy, nothing added


def test_the_job_env_allow_list_names_every_secret_and_nothing_else() -> None:
    from synthbatch.agent_stdlib.contracts import JOB_ENV

    plan = command_plan(None)
    plan = plan.replace(runtime=dataclasses.replace(plan.runtime, secrets=("HF_TOKEN",)),
                        deployments=(dataclasses.replace(plan.deployments[0], secret_env={
                            "HF_TOKEN": "JOB_HF_TOKEN"}),))
    names = plan.job_env()
    assert names == tuple(sorted(set(JOB_ENV) | {"HF_HOME", "HF_TOKEN", "JOB_HF_TOKEN",
                                                   "JOB_API_KEY"}))
    assert "SHIV_ROOT" not in names and "UNRELATED" not in names
