"""setuptools hook: ship one prebuilt agent zipapp inside the wheel.

All metadata lives in ``pyproject.toml``; this file only adds a ``build_py`` step that, for
regular (non-editable) builds, writes ``<build_lib>/control/_bundle/agent-<sha256>.pyz``
built from the ``agent_stdlib`` sources being packaged. The source tree is never written to.
Editable installs skip the step; the control plane then builds the bundle on demand
(``control.bundle.locate_agent_bundle``).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent


def _load_bundle_module() -> ModuleType:
    """Load ``control/bundle.py`` by path, without importing the ``control`` package."""
    name = "_synthbatch_build_bundle"
    if name in sys.modules:
        return sys.modules[name]
    spec = importlib.util.spec_from_file_location(name, HERE / "control" / "bundle.py")
    if spec is None or spec.loader is None:
        raise RuntimeError("cannot load control/bundle.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


class BuildPyWithAgentBundle(build_py):
    """``build_py`` that also builds the agent zipapp into ``control/_bundle/``."""

    def run(self) -> None:
        """Build the Python packages, then the bundle (not for editable installs)."""
        super().run()
        if getattr(self, "editable_mode", False):
            return
        bundle = _load_bundle_module()
        build_lib = Path(self.build_lib)
        source_dir = build_lib / "agent_stdlib"
        if not (source_dir / "__init__.py").is_file():
            source_dir = HERE / "agent_stdlib"
        out_dir = build_lib / "control" / "_bundle"
        # build/lib may be reused between builds: never ship a stale bundle.
        shutil.rmtree(out_dir, ignore_errors=True)
        pyz = bundle.build_agent_bundle(out_dir, source_dir)
        errors = bundle.check_agent_bundle(pyz)
        if errors:
            raise RuntimeError("agent bundle check failed:\n  " + "\n  ".join(errors))
        self.announce(f"built agent bundle {pyz}", level=2)

    def get_outputs(self, include_bytecode: bool = True) -> list:
        """Include the bundle in the outputs (used by ``install --record``)."""
        outputs = list(super().get_outputs(include_bytecode))
        out_dir = Path(self.build_lib) / "control" / "_bundle"
        outputs.extend(str(p) for p in sorted(out_dir.glob("agent-*.pyz")))
        return outputs


setup(cmdclass={"build_py": BuildPyWithAgentBundle})
