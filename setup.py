"""setuptools hook: the ``synthbatch`` import name, and one prebuilt agent zipapp in the wheel.

The metadata lives in ``pyproject.toml``. This file does two things pyproject cannot say:

* it installs the checkout's ``control/`` and ``agent_stdlib/`` folders as
  ``synthbatch.control`` and ``synthbatch.agent_stdlib`` (``synthbatch`` is a namespace
  package): the distribution's only top-level name is ``synthbatch``, so it can collide with
  no other package (PyPI's ``control`` is python-control);
* a ``build_py`` step that, for regular (non-editable) builds, writes
  ``<build_lib>/synthbatch/control/_bundle/agent-<sha256>.pyz`` built from the
  ``agent_stdlib`` sources being packaged. The source tree is never written to. Editable
  installs skip the step; the control plane then builds the bundle on demand
  (``synthbatch.control.bundle.locate_agent_bundle``).
"""

from __future__ import annotations

import importlib.util
import shutil
import sys
from pathlib import Path
from types import ModuleType

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
NAME = "synthbatch"
FOLDERS = ("control", "agent_stdlib")  # the checkout's folders, installed under NAME


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
        source_dir = build_lib / NAME / "agent_stdlib"
        if not (source_dir / "__init__.py").is_file():
            source_dir = HERE / "agent_stdlib"
        out_dir = build_lib / NAME / "control" / "_bundle"
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
        out_dir = Path(self.build_lib) / NAME / "control" / "_bundle"
        outputs.extend(str(p) for p in sorted(out_dir.glob("agent-*.pyz")))
        return outputs


def packages() -> list:
    """``synthbatch.control``, ``synthbatch.control.cli``, ... for every package of FOLDERS."""
    found = find_packages(where=str(HERE), include=[f"{f}{s}" for f in FOLDERS for s in ("", ".*")])
    return sorted(f"{NAME}.{name}" for name in found)


setup(
    packages=packages(),
    package_dir={f"{NAME}.{folder}": folder for folder in FOLDERS},
    cmdclass={"build_py": BuildPyWithAgentBundle},
)
