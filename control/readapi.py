"""What the CLI's read-only commands use besides ``control.api``: state words and the
renderers' helpers, re-exported so that ``control/cli`` imports nothing of ``control`` but
``api``, ``readapi`` and ``errors`` (tests/packaging/test_boundaries.py).

Only the state words (``norm``) and two renderers are imported with this module; every
other name is imported when first asked for (``LAZY``), so ``synthbatch status`` starts
as quickly as before and imports no pydantic.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Tuple

from synthbatch.control.runs.cachestats import cache_line
from synthbatch.control.runs.status import verdict as norm
from synthbatch.control.runs.telemetry import shard_lines

_RUNS = "synthbatch.control.runs."
# name here -> (module, attribute in it; "" for the module itself)
LAZY: Dict[str, Tuple[str, str]] = {
    "cost_lines": (_RUNS + "cost", "lines"),
    "reuse_line": (_RUNS + "reusecount", "line"),
    "unreachable": (_RUNS + "status.refresh", "unreachable"),
    "outcome": (_RUNS + "status.watch", "outcome"),
    "Backoff": (_RUNS + "status.watch", "Backoff"),
    "watch_loop": (_RUNS + "status.watch", "watch"),
    "logs": (_RUNS + "logs", ""),
    "committed_run_ids": (_RUNS + "store", "committed_run_ids"),
    "NODE_ONLY": (_RUNS + "checks", "NODE_ONLY"),
    "array_spec": ("synthbatch.control.slurm.scheduler", "array_spec"),
    "PROFILE_DIR": ("synthbatch.control.config.workspace", "PROFILE_DIR"),
    "load_workspace_profile": ("synthbatch.control.config.workspace",
                               "load_workspace_profile"),
    "report_text": ("synthbatch.control.benchmark.report", "text"),
    "describe_image": ("synthbatch.control.images.inspect", "describe"),
}

__all__ = ["norm", "cache_line", "shard_lines", *LAZY]


def lazy(table: Dict[str, Tuple[str, str]], name: str, owner: str) -> Any:
    """``table[name]`` imported now (a module's ``__getattr__``, PEP 562); AttributeError
    naming ``owner`` for a name the table lacks."""
    if name not in table:
        raise AttributeError(f"module {owner!r} has no attribute {name!r}")
    module, attribute = table[name]
    found = importlib.import_module(module)
    return getattr(found, attribute) if attribute else found


def __getattr__(name: str) -> Any:
    return lazy(LAZY, name, __name__)
