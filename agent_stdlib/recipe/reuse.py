"""Digests that decide which LLM cells an earlier run can give back (issue 31).

Two rules, both pure:

- :func:`definition_digests`: per column, its own definition (kind and parameters, exactly
  as authored: whitespace in a prompt counts) plus the digests of every column it uses,
  transitively, plus the model identity of an LLM column. The column's position in the
  file does not count. ``plan`` compares these with a reused run's to say which columns
  are reused and which are regenerated (:func:`compare`).
- :func:`request_digest`: per LLM cell, the request as sent (model identity, messages,
  sampling parameters, response format). It is stored in the cell's ``_meta`` and guards
  what the plan cannot see (a seed file whose rows changed).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Dict, List, Mapping, Optional, Sequence

from ..contracts import DeploymentSpec, Plan
from .columns import LLM, Node, analyze

DIGEST_VERSION = 1


def canonical_json(value: Any) -> bytes:
    """Canonical JSON (sorted keys, no spaces), UTF-8."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False,
                      default=str).encode("utf-8")


def _digest(value: Any) -> str:
    """sha256 of canonical JSON: equal values, equal digests."""
    return "sha256:" + hashlib.sha256(canonical_json(value)).hexdigest()


def definition_digests(nodes: Sequence[Node], inputs: Sequence[Sequence[str]],
                       models: Mapping[str, Mapping[str, Any]],
                       context: Optional[str] = None) -> Dict[str, str]:
    """Column name -> definition digest (own definition + upstream, transitively).

    ``inputs`` are the names each column uses (``columns.analyze(...).inputs``);
    ``models`` maps a model alias to its identity (engine, model path or digest, served
    name, image digest, the engine arguments that change outputs). Names that are no
    column (seed fields, ``index``) enter by name only.
    """
    position = {node.name: i for i, node in enumerate(nodes)}
    done: Dict[str, str] = {}

    def visit(i: int, path: List[int]) -> str:
        node = nodes[i]
        if node.name in done:
            return done[node.name]
        if i in path:  # analyze rejects cycles; never loop here
            raise ValueError(f"cycle at column {node.name!r}")
        upstream = {name: (visit(position[name], path + [i]) if name in position
                           else "input") for name in inputs[i]}
        own: Dict[str, Any] = {"v": DIGEST_VERSION, "name": node.name, "kind": node.kind,
                               "params": dict(node.params), "upstream": upstream}
        if node.kind in LLM:
            own["model"] = dict(models.get(str(node.params.get("model")), {}))
            own["context"] = context
        done[node.name] = _digest(own)
        return done[node.name]

    for i in range(len(nodes)):
        visit(i, [])
    return {node.name: done[node.name] for node in nodes}


def model_identity(deployment: DeploymentSpec) -> Dict[str, Any]:
    """What of a deployment can change an answer: engine, model, served name, image
    digest and the engine's argv (its host and port placeholders are not filled in)."""
    box = deployment.container
    return {"engine": deployment.engine, "model": deployment.model,
            "served_name": deployment.served_name, "command": list(deployment.command),
            "image_digest": box.sha256 if box is not None else None}


def plan_digests(plan: Plan) -> Dict[str, str]:
    """The definition digest of every column of ``plan`` (empty for a plan without the
    built-in generator's columns): what ``plan`` compares with a reused run's, and what
    the generator's whole-record reuse requires equal (``client.wholereuse``)."""
    spec = plan.client
    if spec is None or not spec.columns:
        return {}
    nodes = [Node(c.name, c.type, c.params) for c in spec.columns]
    graph = analyze(nodes, has_seed=spec.seed_data is not None, context=spec.context)
    return definition_digests(nodes, graph.inputs,
                              {d.alias: model_identity(d) for d in plan.deployments},
                              spec.context)


def request_digest(model: Mapping[str, Any], body: Mapping[str, Any],
                   model_json: Optional[bytes] = None) -> str:
    """Digest of one LLM request: the model's identity and the request body as sent.

    The body carries the messages, sampling parameters and response format; a field
    that does not change the answer (``stream``) does not count. ``model_json``:
    ``canonical_json(model)`` made once per model (the generator's every cell); the
    digest is that of ``{"v", "model", "body"}`` in canonical JSON either way.
    """
    sent = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    hasher = hashlib.sha256(b'{"body":')  # the keys in sorted order: body, model, v
    hasher.update(canonical_json(sent))
    hasher.update(b',"model":' + (model_json or canonical_json(dict(model)))
                  + b',"v":%d}' % DIGEST_VERSION)
    return "sha256:" + hasher.hexdigest()


@dataclass(frozen=True)
class Comparison:
    """What ``plan`` says about reuse: LLM columns reused and regenerated, in file order."""

    reused: List[str]
    regenerated: List[str]

    def summary(self) -> str:
        """One line: ``reuse: 3 of 4 LLM columns (a, b, c); regenerate: d``."""
        total = len(self.reused) + len(self.regenerated)
        line = f"reuse: {len(self.reused)} of {total} LLM columns"
        if self.reused:
            line += f" ({', '.join(self.reused)})"
        return line + "; regenerate: " + (", ".join(self.regenerated) or "none")


def compare(nodes: Sequence[Node], new: Mapping[str, str],
            earlier: Sequence[Mapping[str, str]]) -> Comparison:
    """Which LLM columns of ``nodes`` some earlier run's digests match (by name)."""
    reused, regenerated = [], []
    for node in nodes:
        if node.kind not in LLM:
            continue
        hit = any(old.get(node.name) == new.get(node.name) for old in earlier)
        (reused if hit else regenerated).append(node.name)
    return Comparison(reused, regenerated)
