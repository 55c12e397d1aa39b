"""GPU placement: which node(s) and GPU indices each replica gets, and its ports (pure).

Deployments are placed in order. A replica of one node: each deployment spreads its
replicas over ``nodes`` distinct nodes of the allocation, as evenly as possible (earlier
nodes take the remainder), first fit: a deployment's node goes to the first allocation
node with enough free GPUs that the deployment does not use yet; a new node is opened when
none fits. Replicas on a node take contiguous GPU indices.

A replica of ``nodes_per_replica`` = N > 1 nodes (tensor/pipeline parallel across nodes)
takes the first N *consecutive* allocation nodes on which no GPU is in use yet (opening
new ones as needed), and GPUs ``0 .. gpus/N - 1`` on each; its leader is the first of
them. Consecutive, because one ``srun --relative=K --nodes=N`` step runs all its ranks;
empty, so that every rank has the same GPU indices. Later deployments may fill the GPUs
left on those nodes.

``shared_with`` (a deployment's ``shared_node``) restricts a deployment to the nodes an
earlier deployment uses: no node is opened for it, and it fails to place if it does not
fit there.

Ports are ``port_base + k`` for the k-th replica of the allocation, so they are unique
within it; after them, each multi-node replica gets a block of
:data:`~agent_stdlib.contracts.DIST_PORTS` ports for its ranks' distributed init.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import List, Optional, Sequence, Set, Tuple

from synthbatch.agent_stdlib.contracts import DIST_PORTS, ReplicaSpec

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
    nodes_per_replica: int = 1
    shared_with: Optional[int] = None  # index of an earlier deployment whose nodes to use


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


def per_node_gpus(shape: Shape) -> int:
    """GPUs of one replica on each node it spans."""
    return shape.gpus // shape.nodes_per_replica


def _check(index: int, shape: Shape, per_node: int) -> None:
    each = per_node_gpus(shape)
    if each > per_node:
        over = f" over {shape.nodes_per_replica} nodes ({each} per node)" \
            if shape.nodes_per_replica > 1 else ""
        raise PlacementError(index, shape.gpu_field,
                             f"{shape.gpus} GPUs per replica{over} but the profile has "
                             f"{per_node} per node")
    if shape.nodes_per_replica > 1:
        if shape.nodes > 1:
            raise PlacementError(index, "nodes", f"a replica of {shape.nodes_per_replica} "
                                 "nodes takes its own nodes; nodes spreads one-node replicas "
                                 "(remove nodes)")
        return
    most = spread(shape.replicas, shape.nodes)[0]
    if most * shape.gpus > per_node:
        raise PlacementError(index, "replicas",
                             f"{shape.replicas} replicas of {shape.gpus} GPUs on "
                             f"{shape.nodes} node(s) need {most * shape.gpus} GPUs on one node "
                             f"but the profile has {per_node} per node")


def _choose_node(used: List[int], taken: List[int], need: int, per_node: int,
                 allowed: Optional[Set[int]]) -> Optional[int]:
    for node, gpus in enumerate(used):
        if node not in taken and gpus + need <= per_node and (allowed is None or node in allowed):
            return node
    if allowed is not None:
        return None
    used.append(0)
    return len(used) - 1


def _choose_span(used: List[int], count: int, allowed: Optional[Set[int]]) -> Optional[int]:
    """The first node of ``count`` consecutive nodes without GPUs in use (new ones allowed
    unless ``allowed`` restricts the choice)."""
    first = 0
    while True:
        window = range(first, first + count)
        if allowed is not None and not set(window) <= allowed:
            if first >= len(used):
                return None
        elif all(node >= len(used) or used[node] == 0 for node in window):
            while len(used) < first + count:
                used.append(0)
            return first
        first += 1


def _nodes_of(replicas: Sequence[ReplicaSpec]) -> Set[int]:
    return {node for replica in replicas for node in replica.span}


def _place_spanning(index: int, shape: Shape, used: List[int],
                    allowed: Optional[Set[int]], port: int) -> List[ReplicaSpec]:
    each = per_node_gpus(shape)
    out: List[ReplicaSpec] = []
    for replica in range(shape.replicas):
        first = _choose_span(used, shape.nodes_per_replica, allowed)
        if first is None:
            raise PlacementError(index, "shared_node", f"no {shape.nodes_per_replica} "
                                 "consecutive nodes without GPUs in use among the shared "
                                 "deployment's nodes")
        span = tuple(range(first, first + shape.nodes_per_replica))
        for node in span:
            used[node] = each
        out.append(ReplicaSpec(index=replica, node=first, gpus=tuple(range(each)),
                               port=port + replica, nodes=span))
    return out


def _place_single(index: int, shape: Shape, used: List[int], allowed: Optional[Set[int]],
                  per_node: int, port: int) -> List[ReplicaSpec]:
    taken: List[int] = []
    out: List[ReplicaSpec] = []
    for count in spread(shape.replicas, shape.nodes):
        node = _choose_node(used, taken, count * shape.gpus, per_node, allowed)
        if node is None:
            raise PlacementError(index, "shared_node",
                                 f"{count} replica(s) of {shape.gpus} GPU(s) do not fit on "
                                 "the shared deployment's nodes")
        taken.append(node)
        for _ in range(count):
            first = used[node]
            used[node] += shape.gpus
            out.append(ReplicaSpec(index=len(out), node=node,
                                   gpus=tuple(range(first, first + shape.gpus)),
                                   port=port + len(out)))
    return out


def _with_dist_ports(placed: List[List[ReplicaSpec]], port: int) -> List[Tuple[ReplicaSpec, ...]]:
    out = []
    for replicas in placed:
        row = []
        for spec in replicas:
            if len(spec.span) > 1:
                spec = ReplicaSpec(index=spec.index, node=spec.node, gpus=spec.gpus,
                                   port=spec.port, nodes=spec.nodes, dist_port=port)
                port += DIST_PORTS
            row.append(spec)
        out.append(tuple(row))
    return out


def place(shapes: Sequence[Shape], gpus_per_node: int, port_base: int) -> Placement:
    """Place every replica of every deployment; PlacementError if a shape cannot fit."""
    used: List[int] = []
    placed: List[List[ReplicaSpec]] = []
    port = port_base
    for index, shape in enumerate(shapes):
        _check(index, shape, gpus_per_node)
        allowed = None
        if shape.shared_with is not None:
            allowed = _nodes_of(placed[shape.shared_with])
        if shape.nodes_per_replica > 1:
            replicas = _place_spanning(index, shape, used, allowed, port)
        else:
            replicas = _place_single(index, shape, used, allowed, gpus_per_node, port)
        port += len(replicas)
        placed.append(replicas)
    spanning = sum(1 for row in placed for spec in row if len(spec.span) > 1)
    last = port + spanning * DIST_PORTS - 1
    if last > MAX_PORT:
        raise PlacementError(-1, "port_base",
                             f"{port_base} + {last + 1 - port_base} server ports goes past "
                             f"{MAX_PORT}")
    return Placement(tuple(_with_dist_ports(placed, port)), tuple(used))
