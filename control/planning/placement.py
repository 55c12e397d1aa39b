"""GPU placement: which node and GPU indices each replica gets, and its port (pure).

Each deployment spreads its replicas over ``nodes`` distinct nodes of the allocation, as
evenly as possible (earlier nodes take the remainder). Deployments are placed in order,
first fit: a deployment's node goes to the first allocation node with enough free GPUs
that the deployment does not use yet; a new node is opened when none fits. Replicas on a
node take contiguous GPU indices. Ports are ``port_base + k`` for the k-th replica of the
allocation, so they are unique within it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Sequence, Tuple

from agent_stdlib.contracts import ReplicaSpec

MAX_PORT = 65535


class PlacementError(ValueError):
    """A shape that cannot be placed; ``field`` is the deployment field to blame."""

    def __init__(self, index: int, field: str, message: str) -> None:
        super().__init__(message)
        self.index = index
        self.field = field


@dataclass(frozen=True)
class Shape:
    """What placement needs to know about one deployment."""

    gpus: int  # per replica
    replicas: int
    nodes: int
    gpu_field: str = "gpus"  # the field named when one replica is too big


@dataclass(frozen=True)
class Placement:
    """Replicas per deployment, and the GPUs used on each allocation node."""

    replicas: Tuple[Tuple[ReplicaSpec, ...], ...]
    gpus_used: Tuple[int, ...]  # per allocation node

    @property
    def nodes(self) -> int:
        """Nodes of the allocation."""
        return len(self.gpus_used)


def spread(replicas: int, nodes: int) -> List[int]:
    """Replicas per node, as even as possible, earlier nodes take the remainder."""
    base, extra = divmod(replicas, nodes)
    return [base + (1 if i < extra else 0) for i in range(nodes)]


def _check(index: int, shape: Shape, per_node: int) -> None:
    if shape.gpus > per_node:
        raise PlacementError(index, shape.gpu_field,
                             f"{shape.gpus} GPUs per replica but the profile has {per_node} "
                             f"per node")
    most = spread(shape.replicas, shape.nodes)[0]
    if most * shape.gpus > per_node:
        raise PlacementError(index, "replicas",
                             f"{shape.replicas} replicas of {shape.gpus} GPUs on "
                             f"{shape.nodes} node(s) need {most * shape.gpus} GPUs on one node "
                             f"but the profile has {per_node} per node")


def _choose_node(used: List[int], taken: List[int], need: int, per_node: int) -> int:
    for node, gpus in enumerate(used):
        if node not in taken and gpus + need <= per_node:
            return node
    used.append(0)
    return len(used) - 1


def place(shapes: Sequence[Shape], gpus_per_node: int, port_base: int) -> Placement:
    """Place every replica of every deployment; PlacementError if a shape cannot fit."""
    used: List[int] = []
    out: List[Tuple[ReplicaSpec, ...]] = []
    port = port_base
    for index, shape in enumerate(shapes):
        _check(index, shape, gpus_per_node)
        taken: List[int] = []
        replicas: List[ReplicaSpec] = []
        for count in spread(shape.replicas, shape.nodes):
            node = _choose_node(used, taken, count * shape.gpus, gpus_per_node)
            taken.append(node)
            for _ in range(count):
                first = used[node]
                used[node] += shape.gpus
                replicas.append(ReplicaSpec(index=len(replicas), node=node,
                                            gpus=tuple(range(first, first + shape.gpus)),
                                            port=port))
                port += 1
        out.append(tuple(replicas))
    if port - 1 > MAX_PORT:
        raise PlacementError(-1, "port_base",
                             f"{port_base} + {port - port_base} server ports goes past "
                             f"{MAX_PORT}")
    return Placement(tuple(out), tuple(used))
