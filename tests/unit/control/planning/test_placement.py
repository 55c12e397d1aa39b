"""Placement of replicas that span nodes, and of deployments that share nodes (issue 17).

The one-node rules (first fit, spreading, ports) are in ``test_planner.py``.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any, Dict, List

import pytest

from synthbatch.agent_stdlib.contracts import DIST_PORTS, ReplicaSpec
from synthbatch.control.config.profile import Profile
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.placement import PlacementError, Shape, place
from synthbatch.control.planning.planner import make_plan, replica_nodes


def spans(placement: Any) -> List[List[tuple]]:
    return [[(r.span, r.gpus, r.port, r.dist_port) for r in reps] for reps in placement.replicas]


def test_a_replica_across_nodes_takes_consecutive_empty_nodes_and_the_same_gpus() -> None:
    placement = place([Shape(1, 1, 1), Shape(8, 1, 1, nodes_per_replica=2)], 4, 100)
    assert spans(placement) == [[((0,), (0,), 100, 0)],
                                [((1, 2), (0, 1, 2, 3), 101, 102)]]
    assert placement.gpus_used == (1, 4, 4)
    big = placement.replicas[1][0]
    assert big.node == 1 and big.nodes == (1, 2)  # the leader is the first node


def test_replicas_across_nodes_never_share_a_node_and_leave_room_for_later_ones() -> None:
    # TP 3 x 2 nodes on 4-GPU nodes: 3 GPUs per node; a 1-GPU judge fills GPU 3 of node 0
    placement = place([Shape(6, 2, 1, nodes_per_replica=2), Shape(1, 1, 1)], 4, 0)
    assert spans(placement) == [[((0, 1), (0, 1, 2), 0, 3), ((2, 3), (0, 1, 2), 1, 3 + 8)],
                                [((0,), (3,), 2, 0)]]
    assert placement.gpus_used == (4, 3, 3, 3)


def test_a_node_in_use_is_skipped_for_a_replica_across_nodes() -> None:
    placement = place([Shape(2, 2, 2), Shape(8, 1, 1, nodes_per_replica=2)], 4, 0)
    assert placement.replicas[1][0].span == (2, 3)  # nodes 0 and 1 have GPUs in use


def test_shared_node_keeps_a_deployment_on_an_earlier_ones_nodes() -> None:
    # without shared_with the judge would open... nothing: first fit puts it on node 0 too;
    # with a full node 0 it must say so instead of opening a node
    placement = place([Shape(1, 2, 2), Shape(1, 1, 1, shared_with=0)], 4, 0)
    assert [r.node for r in placement.replicas[1]] == [0]
    with pytest.raises(PlacementError) as info:
        place([Shape(4, 1, 1), Shape(1, 1, 1, shared_with=0)], 4, 0)
    assert (info.value.index, info.value.field) == (1, "shared_node")
    assert place([Shape(4, 1, 1), Shape(1, 1, 1)], 4, 0).nodes == 2  # unshared: a new node


def test_shared_node_with_a_replica_across_nodes() -> None:
    placement = place([Shape(6, 1, 1, nodes_per_replica=2), Shape(1, 2, 2, shared_with=0)],
                      4, 0)
    assert [r.node for r in placement.replicas[1]] == [0, 1]
    assert [r.gpus for r in placement.replicas[1]] == [(3,), (3,)]


@pytest.mark.parametrize("shape,field,fragment", [
    (Shape(16, 1, 1, "nodes_per_replica", nodes_per_replica=2), "nodes_per_replica",
     "16 GPUs per replica over 2 nodes (8 per node) but the profile has 4 per node"),
    (Shape(8, 2, 2, nodes_per_replica=2), "nodes", "takes its own nodes"),
])
def test_shapes_across_nodes_that_cannot_be_placed(shape: Shape, field: str,
                                                   fragment: str) -> None:
    with pytest.raises(PlacementError) as info:
        place([shape], 4, 0)
    assert info.value.field == field and fragment in str(info.value)


def test_rank_ports_follow_the_server_ports_and_count_in_the_port_range() -> None:
    placement = place([Shape(8, 2, 1, nodes_per_replica=2), Shape(0, 3, 1)], 4, 1000)
    ports = [r.port for reps in placement.replicas for r in reps]
    assert ports == [1000, 1001, 1002, 1003, 1004]
    assert [r.dist_port for r in placement.replicas[0]] == [1005, 1005 + DIST_PORTS]
    last = 65535 - 5 - 2 * DIST_PORTS + 1
    place([Shape(8, 2, 1, nodes_per_replica=2), Shape(0, 3, 1)], 4, last)
    with pytest.raises(PlacementError, match="65535"):
        place([Shape(8, 2, 1, nodes_per_replica=2), Shape(0, 3, 1)], 4, last + 1)


def test_placement_is_total_and_disjoint_over_many_shapes() -> None:
    """Every combination of small shapes: each replica gets its GPUs on every node of its
    span, no GPU of a node is given twice, ports are distinct, spans are consecutive."""
    singles = [Shape(g, r, n) for g, r, n in itertools.product((0, 1, 2, 4), (1, 2, 3),
                                                                (1, 2)) if n <= r]
    spanning = [Shape(g, r, 1, nodes_per_replica=k)
                for g, r, k in ((8, 1, 2), (6, 1, 2), (12, 2, 3), (2, 1, 2))]
    for first, second in itertools.product(singles + spanning, repeat=2):
        try:
            placement = place([first, second], 4, 0)
        except PlacementError:
            continue
        seen: Dict[tuple, int] = {}
        ports = []
        for replicas in placement.replicas:
            for spec in replicas:
                assert isinstance(spec, ReplicaSpec)
                assert list(spec.span) == list(range(spec.node, spec.node + len(spec.span)))
                for node in spec.span:
                    for gpu in spec.gpus:
                        assert (node, gpu) not in seen, (first, second, placement)
                        seen[(node, gpu)] = 1
                        assert gpu < 4
                ports.append(spec.port)
                if spec.dist_port:
                    ports.extend(range(spec.dist_port, spec.dist_port + DIST_PORTS))
        assert len(ports) == len(set(ports))


# ----------------------------------------------------------------------------- planner


def profile(**changes: Any) -> Profile:
    return Profile(schema_version=1, workspace="/tmp/ws", gpus_per_node=8, **changes)


def run(*deployments: Dict[str, Any]) -> RunConfig:
    return RunConfig.model_validate({
        "schema_version": 1, "name": "big", "records": 10, "shards": {"count": 1},
        "client": {"model": deployments[0]["alias"], "prompt_template": "x {index}"},
        "deployments": list(deployments)})


def vllm(**changes: Any) -> Dict[str, Any]:
    return {"alias": "big", "engine": "vllm", "model": "org/big", **changes}


@pytest.mark.parametrize("dep,per_node,nodes", [
    (vllm(tensor_parallel=8, pipeline_parallel=2), 8, 2),
    (vllm(tensor_parallel=16), 8, 2),
    (vllm(tensor_parallel=8), 8, 1),
    (vllm(tensor_parallel=6), 4, 2),  # 3 per node
    (vllm(tensor_parallel=5), 4, 5),  # no even split into 2..4: one GPU per node
    (vllm(tensor_parallel=1, pipeline_parallel=2, nodes_per_replica=2), 8, 2),
    ({"alias": "big", "model": "m", "command": ["s", "{port}"], "gpus": 16}, 8, 1),  # no inference
    (vllm(tensor_parallel=4), 0, 1),  # a profile without GPUs: the planner says so later
])
def test_replica_nodes_inferred_from_the_gpus_per_node(dep: Dict[str, Any], per_node: int,
                                                       nodes: int) -> None:
    assert replica_nodes(run(dep).deployments[0], per_node) == nodes


def test_a_plan_of_a_405b_model_across_two_nodes_and_a_judge() -> None:
    plan = make_plan(run(vllm(tensor_parallel=8, pipeline_parallel=2, startup_timeout_s=1800.5),
                         {"alias": "judge", "engine": "sglang", "model": "org/judge"}),
                     profile(mem_mb=8000), "r-1", Path("/cfg"))
    big, judge = plan.deployments
    assert (big.nodes_per_replica, big.gpus_per_rank, big.follower_args) == (2, 8, ("--headless",))
    assert [(r.span, r.gpus) for r in big.placement] == [((0, 1), tuple(range(8)))]
    assert [(r.node, r.gpus) for r in judge.placement] == [(2, (0,))]
    assert "--distributed-timeout-seconds" in big.command
    assert big.command[big.command.index("--distributed-timeout-seconds") + 1] == "1801"
    assert (plan.resources.nodes, plan.resources.gpus) == (3, 8)
    assert plan.runtime.step_mem_mb == 4000  # node 0: rank 0 of big + the client


def test_the_plan_summary_shows_every_rank() -> None:
    from synthbatch.control.planning.summary import plan_summary

    plan = make_plan(run(vllm(tensor_parallel=8, pipeline_parallel=2)), profile(), "r-1",
                     Path("/cfg"))
    text = plan_summary(plan, "0" * 64, gpus_per_node=8)
    assert "node 0 (8/8 GPUs): big#0 rank 0/2 GPUs 0,1,2,3,4,5,6,7 port 20000, ranks meet " \
           "at port 20001; client" in text
    assert "node 1 (8/8 GPUs): big#0 rank 1/2 GPUs 0,1,2,3,4,5,6,7" in text
    assert "each across 2 nodes (8 GPU(s) per node, one rank each)" in text
    assert "ranks > 0 add: --headless" in text


def test_the_big_model_example_plans_on_the_h100_profile(tmp_path: Path) -> None:
    from synthbatch.control.images import registry
    from synthbatch.control.runs.plan import dry_run
    from tests.conftest import REPO

    workspace = tmp_path / "ws"
    for alias in ("vllm", "sglang"):
        image = tmp_path / f"{alias}.sqsh"
        image.write_bytes(alias.encode())
        registry.add(workspace, alias, str(image))
    prof = tmp_path / "h100.toml"
    prof.write_text((REPO / "examples" / "profiles" / "h100-cluster.toml").read_text()
                    .replace('"/lustre/proj-42/synthbatch"', f'"{workspace}"'))
    out = dry_run(REPO / "examples" / "big-model.toml", str(prof))
    summary = out["summary"]
    assert "per shard: 3 node(s), 8 GPU(s) per node (--gpus-per-node=8)" in summary
    assert "node 0 (8/8 GPUs): writer#0 rank 0/2 GPUs 0,1,2,3,4,5,6,7 port 20000, ranks " \
           "meet at port 20009; client" in summary
    assert "node 1 (8/8 GPUs): writer#0 rank 1/2 GPUs 0,1,2,3,4,5,6,7" in summary
    assert "node 2 (8/8 GPUs): judge#0 GPUs 0 port 20001;" in summary
    assert "judge#7 GPUs 7 port 20008" in summary
    assert "--nnodes 2 --node-rank '{node_rank}' --master-addr '{leader_host}'" in summary
    assert "#SBATCH --nodes=3" in out["script"] and "#SBATCH --exclusive" in out["script"]
    assert sorted(p.name for p in workspace.iterdir()) == ["images.json", "images.json.lock"]
