"""``synthbatch plan`` checks a Data Designer config on the login node, when it can.

The check is the agent's own (``python -I agent.pyz dd --validate --plan -``), run as a
subprocess under the client environment's Python with the plan on stdin: the control
plane never imports ``data_designer`` or the agent's ``dd`` role. It runs when that Python
exists here and the client runs on the host (not in an image); otherwise preflight runs
the same check before any server starts, and the plan says so.
"""

from __future__ import annotations

import os
import subprocess
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional

from synthbatch.agent_stdlib.contracts import Plan, dd_check_report
from synthbatch.agent_stdlib.layout import bundle_cache
from synthbatch.control import bundle
from synthbatch.control.errors import InvalidInput

CHECK_TIMEOUT_S = 300.0
LATER = "preflight checks it before any server starts"


def check_on_login_node(plan: Plan, plan_bytes: bytes, run_file: Path, workspace: Path,
                        ambient: Optional[Mapping[str, str]] = None) -> Dict[str, Any]:
    """``{"checked": bool, "python": ..., "notes": [...]}``; InvalidInput (one detail line
    per problem) when Data Designer or the adapter rejects the run."""
    spec = plan.client_data_designer
    assert spec is not None
    ambient = os.environ if ambient is None else ambient
    out: Dict[str, Any] = {"checked": False, "python": spec.python, "notes": []}
    if spec.container is not None:
        out["notes"] = [f"not checked here: the client runs in image {spec.container.image}; "
                        + LATER]
        return out
    if not (os.path.isfile(spec.python) and os.access(spec.python, os.X_OK)):
        out["notes"] = [f"not checked here: {spec.python} is not on this node; " + LATER]
        return out
    with tempfile.TemporaryDirectory(prefix="synthbatch-plan-") as scratch:
        cache = bundle_cache(workspace)  # a dry run creates no workspace
        try:
            pyz = bundle.locate_agent_bundle(cache if cache.is_dir() else Path(scratch))
        except bundle.BundleError as err:
            out["notes"] = [f"not checked here: no agent bundle ({err}); " + LATER]
            return out
        return _run_check(plan, plan_bytes, run_file, pyz, ambient, out, scratch)


def _run_check(plan: Plan, plan_bytes: bytes, run_file: Path, pyz: Path,
               ambient: Mapping[str, str], out: Dict[str, Any], scratch: str) -> Dict[str, Any]:
    spec = plan.client_data_designer
    assert spec is not None
    env = dict(ambient, SHIV_ROOT=scratch)  # the bundle unpacks here, not in ~/.shiv
    env.update(spec.env)
    env.update({var: ambient[job] for var, job in spec.secret_env.items() if job in ambient})
    try:
        done = subprocess.run([spec.python, "-I", str(pyz), "dd", "--plan", "-", "--validate"],
                              input=plan_bytes.decode("utf-8"), env=env, capture_output=True,
                              text=True, timeout=CHECK_TIMEOUT_S, check=False)
    except (OSError, subprocess.TimeoutExpired) as err:
        out["notes"] = [f"not checked here: {spec.python} did not run the check ({err}); "
                        + LATER]
        return out
    problems, notes = dd_check_report(done.stdout, done.stderr, done.returncode)
    if problems:
        raise InvalidInput(f"{run_file}: client.data_designer: {spec.config}: "
                           f"{_count(problems)} (checked with {spec.python})",
                           details=problems)
    return {**out, "checked": True, "notes": notes}


def _count(problems: List[str]) -> str:
    return f"{len(problems)} problem" + ("s" if len(problems) != 1 else "")
