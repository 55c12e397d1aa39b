"""Automatic layout: tensor/pipeline parallel sizes, replicas and the split of a GPU budget
between deployments (pure: the model facts come from ``control/runs/modelinfo.py``).

The rule (``docs/configuration.md`` "Automatic layout"):

* **Fit.** A replica of TP x PP GPUs fits when, on every GPU,
  ``weights / (TP x PP) + KV / (TP x PP) + RESERVE_GB <= UTILIZATION x gpu_memory_gb``,
  where KV is the cache of ``KV_SEQUENCES`` sequences of the deployment's context (the
  longest request of its alias in the recipe, at least ``MIN_CONTEXT`` tokens). When TP
  exceeds the KV heads, each KV head is kept by TP / KV-heads ranks (vLLM replicates
  them); an MLA model (DeepSeek) keeps its latent cache on every rank.
* **TP** is the smallest power of two, at most the GPUs of a node, that divides the
  attention heads and divides or is a multiple of the KV heads, and fits. When none fits
  on one node, TP is the largest such value that fits a node and **PP** the smallest
  number of stages that fits; a replica of TP x PP GPUs then spans PP nodes.
* **Replicas**: one deployment takes its budget in whole replicas; several share it in
  proportion to their **work** per record: the tokens the recipe sends each alias
  (``max_tokens`` out, plus ``PREFILL_WEIGHT`` x the prompt's estimated tokens) x the
  model's active parameters (a token's cost grows with them). Replicas are added one at
  a time to the deployment with the least GPUs per unit of work while the budget and the
  nodes (budget / GPUs per node) allow.

Any field the user wrote wins; ``Choice`` says, per deployment, what was chosen and why.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Dict, List, Mapping, Optional, Sequence, Tuple

from pydantic import ValidationError

from synthbatch.control.config.client import GenerateClient
from synthbatch.control.config.columns import LLMColumn
from synthbatch.control.config.deployment import Deployment
from synthbatch.control.config.engines import PARALLEL
from synthbatch.control.config.run import RunConfig
from synthbatch.control.planning.modelfacts import ModelFacts
from synthbatch.control.planning.placement import PlacementError, Shape, place

UTILIZATION = 0.9  # vLLM's --gpu-memory-utilization default
RESERVE_GB = 2.0  # per GPU, inside the utilisation: activations, CUDA graphs, NCCL
KV_SEQUENCES = 16  # sequences of full context the KV cache must hold at least
MIN_CONTEXT = 4096  # tokens
LLAMACPP_CONTEXT = 4096  # llama-server's default --ctx-size
PREFILL_WEIGHT = 0.1  # a prompt token's cost against a generated one (prefill batches)
CHARS_PER_TOKEN = 4  # prompt text -> tokens, for the work estimate only
MAX_REPLICAS = 64  # Deployment.replicas' bound
GB = 1e9


class LayoutError(ValueError):
    """A layout that cannot be chosen; ``where`` is the field path to name."""

    def __init__(self, where: str, message: str, source: str = "run") -> None:
        super().__init__(message)
        self.where = where
        self.source = source


@dataclass(frozen=True)
class Gpu:
    """The GPUs of the profile's partition."""

    memory_gb: Optional[float]
    per_node: int


@dataclass(frozen=True)
class Choice:
    """What the layout chose for one deployment, and why."""

    alias: str
    chosen: Dict[str, int]
    reason: str

    def to_dict(self) -> Dict[str, object]:
        """The JSON form ``plan --json`` prints under ``layout``."""
        return {"alias": self.alias, "chosen": dict(self.chosen), "reason": self.reason}


@dataclass(frozen=True)
class Parallel:
    """TP x PP of one replica, the nodes it spans and why."""

    tp: int
    pp: int
    nodes_per_replica: int
    why: str = ""

    @property
    def gpus(self) -> int:
        """GPUs of one replica."""
        return self.tp * self.pp


@dataclass
class _Auto:
    index: int
    dep: Deployment
    parallel: bool  # TP/PP/gpus are chosen
    replicas: bool  # replicas are chosen (nodes too, with a budget, unless written)
    facts: Optional[ModelFacts] = None
    chosen: Dict[str, int] = field(default_factory=dict)
    why: List[str] = field(default_factory=list)


# ------------------------------------------------------------------------------------------
# which deployments are automatic


def wants_parallel(dep: Deployment, budget: Optional[int]) -> bool:
    """TP/PP (or a llama.cpp server's GPUs) are chosen: ``gpus = "auto"``, or a budget and
    no GPU count written (a TP written alone still gets its PP chosen)."""
    if dep.gpus == "auto":
        return True
    written = dep.model_fields_set
    return (budget is not None and dep.engine in PARALLEL + ("llamacpp",)
            and "gpus" not in written
            and not {"tensor_parallel", "pipeline_parallel"} <= written)


def wants_replicas(dep: Deployment, budget: Optional[int]) -> bool:
    """Replicas are chosen: a budget is given and the deployment does not write them."""
    return budget is not None and "replicas" not in dep.model_fields_set


def automatic(run: RunConfig, budget: Optional[int]) -> List[int]:
    """Indices of the deployments whose layout is chosen (their models must be read)."""
    return [i for i, d in enumerate(run.deployments)
            if wants_parallel(d, budget) or wants_replicas(d, budget)]


# ------------------------------------------------------------------------------------------
# what fits


def kv_replication(facts: ModelFacts, tp: int) -> int:
    """Copies of the KV cache a TP group keeps (each KV head on TP / KV-heads ranks)."""
    return max(1, tp // facts.kv_heads)


def per_gpu_bytes(facts: ModelFacts, tp: int, pp: int, kv_tokens: int) -> float:
    """Bytes one GPU of a TP x PP replica needs (weights, KV, reserve)."""
    gpus = tp * pp
    kv = kv_tokens * facts.kv_bytes_per_token * kv_replication(facts, tp)
    return (facts.weight_bytes + kv) / gpus + RESERVE_GB * GB


def usable_bytes(memory_gb: float) -> float:
    """What the engine may use of one GPU."""
    return UTILIZATION * memory_gb * GB


def fits(facts: ModelFacts, tp: int, pp: int, kv_tokens: int, memory_gb: float) -> bool:
    """A TP x PP replica holds the weights and the KV target on GPUs of this memory."""
    return per_gpu_bytes(facts, tp, pp, kv_tokens) <= usable_bytes(memory_gb)


def valid_tp(facts: ModelFacts, tp: int) -> bool:
    """vLLM's rule: TP divides the attention heads; it divides the KV heads or is a
    multiple of them."""
    return facts.heads % tp == 0 and (facts.kv_heads % tp == 0 or tp % facts.kv_heads == 0)


def tp_choices(facts: ModelFacts, per_node: int) -> List[int]:
    """Powers of two up to a node's GPUs that the heads allow, smallest first."""
    out, tp = [], 1
    while tp <= per_node:
        if valid_tp(facts, tp):
            out.append(tp)
        tp *= 2
    return out


def _need(facts: ModelFacts, tp: int, pp: int, kv_tokens: int) -> str:
    return f"{per_gpu_bytes(facts, tp, pp, kv_tokens) / GB:.0f} GB"


def choose_parallel(facts: ModelFacts, memory_gb: float, per_node: int, kv_tokens: int,
                    tp: Optional[int] = None, pp: Optional[int] = None) -> Parallel:
    """The smallest TP (then PP) that fits; a written ``tp``/``pp`` is kept
    (LayoutError when nothing fits in 64 GPUs)."""
    usable = f"{usable_bytes(memory_gb) / GB:.0f} GB usable of {memory_gb:g} GB"
    tps = [tp] if tp is not None else tp_choices(facts, per_node)
    if not tps:
        raise LayoutError("tensor_parallel", f"no power of two up to {per_node} divides "
                          f"{facts.heads} attention heads and {facts.kv_heads} KV heads")
    pps = [pp] if pp is not None else list(range(1, 65))
    for stages in pps:
        for size in tps:
            if size * stages > 64 or stages > facts.layers:
                continue
            if stages > 1 and tp is None and size != tps[-1]:
                continue  # with stages, only the largest TP a node allows
            if fits(facts, size, stages, kv_tokens, memory_gb):
                smaller = [t for t in tps if t < size] if stages == 1 else []
                if smaller:
                    why = (f"TP {smaller[-1]} needs {_need(facts, smaller[-1], 1, kv_tokens)} "
                           f"per GPU > {usable}")
                elif stages > 1:
                    why = (f"TP {size} on one node needs "
                           f"{_need(facts, size, stages - 1, kv_tokens)} per GPU with "
                           f"PP {stages - 1} > {usable}")
                else:
                    why = f"{_need(facts, size, 1, kv_tokens)} per GPU <= {usable}"
                return Parallel(size, stages, _span(size * stages, per_node), why)
    raise LayoutError("gpus", f"{facts.describe()} + KV for {KV_SEQUENCES} sequences do "
                      f"not fit in 64 GPUs of {memory_gb:g} GB")


def _span(gpus: int, per_node: int) -> int:
    return 1 if gpus <= per_node else -(-gpus // per_node)


def llamacpp_context(facts: ModelFacts, extra_args: Sequence[str]) -> int:
    """The context llama-server allocates its KV cache for: ``-c``/``--ctx-size`` in the
    deployment's ``extra_args`` (0: the model's trained context), else llama-server's
    default ``LLAMACPP_CONTEXT``; never more than the model's trained context."""
    context = LLAMACPP_CONTEXT
    for index, arg in enumerate(extra_args):
        value = None
        if arg in ("-c", "--ctx-size") and index + 1 < len(extra_args):
            value = extra_args[index + 1]
        elif arg.startswith("--ctx-size="):
            value = arg.split("=", 1)[1]
        if value is not None and value.strip().isdigit():
            context = int(value) or (facts.context or LLAMACPP_CONTEXT)
    return min(context, facts.context) if facts.context else context


def llamacpp_gpus(facts: ModelFacts, memory_gb: float, per_node: int,
                  context: int = LLAMACPP_CONTEXT) -> int:
    """GPUs of one llama.cpp server (layers split over the GPUs of one node): the fewest
    whose usable memory holds the file, the KV cache of ``context`` tokens (from the GGUF
    header) and the reserve."""
    need = facts.weight_bytes + context * facts.kv_bytes_per_token
    for gpus in range(1, per_node + 1):
        if need / gpus + RESERVE_GB * GB <= usable_bytes(memory_gb):
            return gpus
    raise LayoutError("gpus", f"{facts.describe()} + KV for {context} tokens do not fit on "
                      f"one node of {per_node} GPUs of {memory_gb:g} GB (a llama.cpp server "
                      "runs on one node)")


# ------------------------------------------------------------------------------------------
# the recipe's tokens per alias


_FIELD = re.compile(r"\{([^{}.]+)(?:\.[^{}]*)?\}")


def alias_tokens(client: object) -> Dict[str, Tuple[float, float, int]]:
    """Per alias: (prompt tokens, generated tokens) per record and its longest request,
    estimated from the recipe (a placeholder naming an LLM column counts that column's
    ``max_tokens``; other text ``CHARS_PER_TOKEN`` characters a token). Empty for a
    client synthbatch cannot read (a command or a Data Designer config)."""
    if not isinstance(client, GenerateClient):
        return {}
    if client.columns is None:
        prompt = len((client.prompt_template or "") + (client.system_prompt or ""))
        prompt_tokens = prompt / CHARS_PER_TOKEN
        return {str(client.model): (prompt_tokens, float(client.max_tokens),
                                    int(prompt_tokens) + client.max_tokens)}
    outputs = {c.name: c.max_tokens for c in client.columns if isinstance(c, LLMColumn)}
    out: Dict[str, Tuple[float, float, int]] = {}
    for column in client.columns:
        if not isinstance(column, LLMColumn):
            continue
        text = column.prompt + (column.system or "")
        names = _FIELD.findall(text)
        prompt_tokens = (len(_FIELD.sub("", text)) / CHARS_PER_TOKEN
                         + sum(outputs.get(n, 4) for n in names))
        before = out.get(column.model, (0.0, 0.0, 0))
        out[column.model] = (before[0] + prompt_tokens, before[1] + column.max_tokens,
                             max(before[2], int(prompt_tokens) + column.max_tokens))
    return out


def work_per_record(facts: ModelFacts, tokens: Tuple[float, float, int]) -> float:
    """A record's cost on this model: tokens x active parameters (billions)."""
    prompt, generated, _ = tokens
    return (generated + PREFILL_WEIGHT * prompt) * facts.active_params / 1e9


# ------------------------------------------------------------------------------------------
# the budget's split


def _shape(dep: Deployment, gpus: int, replicas: int, nodes: int, npr: int,
           aliases: Sequence[str]) -> Shape:
    return Shape(gpus=gpus, replicas=replicas, nodes=nodes, nodes_per_replica=npr,
                 shared_with=aliases.index(dep.shared_node) if dep.shared_node else None)


@dataclass
class _Slot:
    dep: Deployment
    gpus: int  # per replica
    npr: int  # nodes per replica
    replicas: int
    nodes: int
    auto: bool  # replicas chosen
    work: float = 1.0
    auto_nodes: bool = True  # nodes chosen (not written)


def _layout_shapes(slots: Sequence[_Slot], aliases: Sequence[str]) -> List[Shape]:
    return [_shape(s.dep, s.gpus, s.replicas, s.nodes, s.npr, aliases) for s in slots]


def _placeable(slots: List[_Slot], aliases: Sequence[str], per_node: int,
               max_nodes: int) -> bool:
    """Place the slots, choosing each automatic one's ``nodes`` (fewest that place);
    False when they need more than ``max_nodes`` nodes."""
    for index, slot in enumerate(slots):
        if not slot.auto_nodes or slot.npr > 1:
            continue
        per = max(1, per_node // slot.gpus)
        first = -(-slot.replicas // per)
        for nodes in range(first, slot.replicas + 1):
            slot.nodes = nodes
            try:
                placed = place(_layout_shapes(slots[:index + 1], aliases), per_node, 20000)
            except PlacementError:
                continue
            if placed.nodes <= max_nodes:
                break
        else:
            return False
    try:
        placed = place(_layout_shapes(slots, aliases), per_node, 20000)
    except PlacementError:
        return False
    return placed.nodes <= max_nodes


def split_budget(slots: List[_Slot], aliases: Sequence[str], budget: int,
                 per_node: int) -> None:
    """Replicas of the automatic slots (in place): one each, then one more at a time to
    the slot with the fewest GPUs per unit of work, while budget and nodes allow."""
    max_nodes = max(1, -(-budget // per_node)) if per_node else 1
    for slot in slots:
        if slot.auto:
            slot.replicas = 1
    used = sum(s.gpus * s.replicas for s in slots)
    if used > budget or not _placeable(slots, aliases, per_node, max_nodes):
        need = sum(s.gpus * s.replicas for s in slots)
        raise LayoutError("resources.gpus", f"{budget} GPUs cannot hold the deployments: "
                          f"they need at least {need} GPUs ("
                          + ", ".join(f"{s.dep.alias} {s.replicas} x {s.gpus}" for s in slots)
                          + f") on {per_node}-GPU nodes")
    open_slots = [s for s in slots if s.auto]
    while open_slots:
        open_slots.sort(key=lambda s: (s.replicas * s.gpus / s.work, s.gpus))
        grown = False
        for slot in list(open_slots):
            if used + slot.gpus > budget or slot.replicas >= MAX_REPLICAS:
                open_slots.remove(slot)
                continue
            slot.replicas += 1
            if _placeable(slots, aliases, per_node, max_nodes):
                used += slot.gpus
                grown = True
                break
            slot.replicas -= 1
            open_slots.remove(slot)
        if not grown:
            break
    _placeable(slots, aliases, per_node, max_nodes)  # settle each slot's nodes


# ------------------------------------------------------------------------------------------
# the whole run


def _context(tokens: Optional[Tuple[float, float, int]]) -> int:
    return max(MIN_CONTEXT, tokens[2] if tokens else 0)


def _parallel(auto: _Auto, gpu: Gpu, tokens: Optional[Tuple[float, float, int]]) -> None:
    dep, facts = auto.dep, auto.facts
    assert facts is not None
    where = f"deployments[{auto.index}]"
    if dep.engine not in PARALLEL + ("llamacpp",):
        raise LayoutError(f"{where}.gpus", f"'auto' needs engine vllm, sglang or llamacpp "
                          f"(engine {dep.engine!r} runs your command: write gpus)")
    if gpu.memory_gb is None:
        raise LayoutError("gpu_memory_gb", "the automatic layout needs the GPUs' memory: "
                          "set gpu_memory_gb (e.g. 80 for A100/H100 80 GB, 141 for H200)",
                          source="profile")
    if gpu.per_node <= 0:
        raise LayoutError("gpus_per_node", "the automatic layout needs the GPUs per node",
                          source="profile")
    if dep.engine == "llamacpp":
        context = llamacpp_context(facts, dep.extra_args)
        try:
            count = llamacpp_gpus(facts, gpu.memory_gb, gpu.per_node, context)
        except LayoutError as err:
            raise LayoutError(f"{where}.{err.where}", f"{dep.alias}: {err}") from err
        auto.chosen["gpus"] = count
        kv_gb = context * facts.kv_bytes_per_token / GB
        auto.why.append(f"{facts.describe()} + KV for {context} tokens ({kv_gb:.1f} GB, "
                        f"{facts.layers} layers x {facts.kv_heads} KV heads from the GGUF "
                        f"header) -> {count} GPU(s) of {gpu.memory_gb:g} GB hold them")
        return
    context = _context(tokens)
    kv_tokens = KV_SEQUENCES * context
    try:
        shape = choose_parallel(facts, gpu.memory_gb, gpu.per_node, kv_tokens,
                                tp=dep.tensor_parallel, pp=dep.pipeline_parallel)
    except LayoutError as err:
        raise LayoutError(f"{where}.{err.where}", f"{dep.alias}: {err}") from err
    written = dep.model_fields_set
    if "tensor_parallel" not in written:
        auto.chosen["tensor_parallel"] = shape.tp
    if "pipeline_parallel" not in written:
        auto.chosen["pipeline_parallel"] = shape.pp
    auto.chosen["gpus"] = shape.gpus
    if shape.nodes_per_replica > 1 and "nodes_per_replica" not in written:
        auto.chosen["nodes_per_replica"] = shape.nodes_per_replica
    kv_gb = kv_tokens * facts.kv_bytes_per_token / GB
    span = (f", {shape.nodes_per_replica} nodes per replica"
            if shape.nodes_per_replica > 1 else "")
    auto.why.append(f"{facts.describe()} + KV for {KV_SEQUENCES} sequences of {context} "
                    f"tokens ({kv_gb:.0f} GB) -> TP {shape.tp}"
                    f"{f' x PP {shape.pp}' if shape.pp > 1 else ''} on {gpu.memory_gb:g} GB "
                    f"GPUs{span} ({shape.why})")


def _replica_gpus(dep: Deployment, chosen: Mapping[str, int]) -> int:
    if "gpus" in chosen:
        return chosen["gpus"]
    if dep.gpus is not None and dep.gpus != "auto":
        return int(dep.gpus)
    return dep.gpus_per_replica


Measured = Mapping[str, Tuple[float, str]]  # alias -> (work per record, where it is from)


def resolve_layout(run: RunConfig, gpu: Gpu, budget: Optional[int],
                   facts: Mapping[int, ModelFacts], measured: Optional[Measured] = None
                   ) -> Tuple[RunConfig, List[Choice]]:
    """The run with every automatic field filled in, and what was chosen and why.

    ``facts`` holds the model facts of the deployments ``automatic`` names (by index);
    LayoutError names the field to write by hand when one is missing. ``measured`` (a
    pilot, ``control/planning/pilot.py``) replaces the estimated work per record.
    """
    autos = []
    for index, dep in enumerate(run.deployments):
        auto = _Auto(index, dep, wants_parallel(dep, budget), wants_replicas(dep, budget),
                     facts.get(index))
        if (auto.parallel or auto.replicas) and auto.facts is None and (
                auto.parallel or len(run.deployments) > 1):
            raise LayoutError(f"deployments[{index}].model",
                              f"{dep.alias}: no model facts to choose its layout from; write "
                              "gpus or tensor_parallel/pipeline_parallel, and replicas, by "
                              "hand")
        autos.append(auto)
    if not any(a.parallel or a.replicas for a in autos):
        used = sum(d.gpus_per_replica * d.replicas for d in run.deployments)
        if budget is not None and used > budget:
            raise LayoutError("resources.gpus", f"the deployments as written use {used} "
                              f"GPUs per allocation, more than the budget of {budget}")
        return run, []
    tokens = alias_tokens(run.client)
    for auto in autos:
        if auto.parallel:
            _parallel(auto, gpu, tokens.get(auto.dep.alias))
    if budget is not None:
        _replicas(run, autos, gpu, budget, tokens, measured or {})
    deployments = []
    for auto in autos:
        if not auto.chosen:
            deployments.append(auto.dep)
            continue
        data = auto.dep.model_dump(by_alias=True, exclude_unset=True)
        data.update(auto.chosen)
        try:
            deployments.append(Deployment.model_validate(data))
        except ValidationError as err:
            problem = err.errors()[0]
            field_name = ".".join(str(p) for p in problem["loc"]) or "gpus"
            raise LayoutError(f"deployments[{auto.index}].{field_name}",
                              f"{auto.dep.alias}: with the chosen {auto.chosen}: "
                              f"{problem['msg'].removeprefix('Value error, ')}") from err
    filled = run.model_copy(update={"deployments": deployments})
    choices = [Choice(a.dep.alias, dict(a.chosen), "; ".join(a.why))
               for a in autos if a.chosen]
    return filled, choices


def _replicas(run: RunConfig, autos: List[_Auto], gpu: Gpu, budget: int,
              tokens: Mapping[str, Tuple[float, float, int]], measured: Measured) -> None:
    aliases = [d.alias for d in run.deployments]
    per_node = gpu.per_node
    if per_node <= 0:
        raise LayoutError("gpus_per_node", "a GPU budget needs the GPUs per node",
                          source="profile")
    slots = []
    for auto in autos:
        dep = auto.dep
        gpus = _replica_gpus(dep, auto.chosen)
        if gpus <= 0:
            raise LayoutError(f"deployments[{auto.index}].gpus",
                              f"{dep.alias}: a GPU budget splits GPUs; this deployment uses "
                              "none (write gpus)")
        npr = auto.chosen.get("nodes_per_replica", dep.nodes_per_replica or _span(gpus,
                                                                                 per_node))
        work = 1.0
        if dep.alias in measured:
            work = measured[dep.alias][0]
        elif auto.facts is not None:
            work = work_per_record(auto.facts, tokens.get(dep.alias, (0.0, 1.0, 0)))
        slots.append(_Slot(dep, gpus, npr, dep.replicas, dep.nodes, auto.replicas,
                           max(work, 1e-9), "nodes" not in dep.model_fields_set))
    split_budget(slots, aliases, budget, per_node)
    total = sum(s.gpus * s.replicas for s in slots)
    share_total = sum(s.work for s in slots)
    for auto, slot in zip(autos, slots):
        if slot.auto_nodes and slot.npr == 1 and slot.nodes != auto.dep.nodes:
            auto.chosen["nodes"] = slot.nodes
            if not auto.replicas:
                auto.why.append(f"its {slot.replicas} replica(s) spread over {slot.nodes} "
                                "node(s)")
        if not auto.replicas:
            continue
        auto.chosen["replicas"] = slot.replicas
        share = ""
        if len(slots) > 1 and auto.dep.alias in measured:
            share = (f"; work share {slot.work / share_total:.2f}, "
                     f"{measured[auto.dep.alias][1]}")
        elif len(slots) > 1 and auto.facts is not None:
            share = (f"; work share {slot.work / share_total:.2f} of the recipe's "
                     f"(tokens per record x {auto.facts.active_params / 1e9:.1f} B active "
                     f"parameters)")
        auto.why.append(f"{slot.replicas} replica(s) of {slot.gpus} GPU(s) "
                        f"({slot.replicas * slot.gpus} of the {budget}-GPU budget, "
                        f"{total} used){share}")


# ------------------------------------------------------------------------------------------
# the profile's GPU memory against the cluster's GRES type names

# the largest memory (GB) of each GPU model a GRES type name may stand for
GRES_MEMORY_GB = {"a100": 80, "h100": 94, "h200": 141, "gh200": 144, "b200": 192,
                  "l40s": 48, "l40": 48, "a40": 48, "a10": 24, "l4": 24, "v100": 32,
                  "a6000": 48, "mi250": 128, "mi300x": 192}
_GRES_TYPE = re.compile(r"(?:^|,)gpu:([A-Za-z][A-Za-z0-9_.-]*):\d+")
_SIZE = re.compile(r"(\d+)g(?:b)?\b")


def gres_memory_gb(type_name: str) -> Optional[float]:
    """The most memory a GRES type name allows (``h100``: 94; ``a100_40g``: 40), or None
    for a name this table does not know."""
    name = type_name.lower()
    size = _SIZE.search(name)
    if size:
        return float(size.group(1))
    for model in sorted(GRES_MEMORY_GB, key=len, reverse=True):
        if name.startswith(model) or name.replace("nvidia_", "").startswith(model):
            return float(GRES_MEMORY_GB[model])
    return None


def memory_conflict(memory_gb: float, gres: Sequence[str]) -> Optional[str]:
    """Why the profile's ``gpu_memory_gb`` is more than the partition's GPUs have (their
    GRES type names, ``gpu:h100:8``), or None when no known name says so."""
    for text in gres:
        for type_name in _GRES_TYPE.findall(re.sub(r"\([^)]*\)", "", text)):
            most = gres_memory_gb(type_name)
            if most is not None and memory_gb > most:
                return (f"{memory_gb:g} GB per GPU, but the partition's GRES type "
                        f"{type_name!r} has at most {most:g} GB: the automatic layout may "
                        "choose a layout that does not fit")
    return None
