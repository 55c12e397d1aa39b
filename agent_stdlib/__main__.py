"""Entry point of the allocation agent: ``python agent.pyz <role> ...``.

Roles are dispatched lazily so that ``--help`` and each role import only what they need.
Every import inside the package is relative, so it runs both as the zipapp's top-level
``agent_stdlib`` and as ``synthbatch.agent_stdlib`` (the installed wheel, the tests).
"""

from __future__ import annotations

import importlib
import sys
from typing import Callable, Dict, List, Optional

ROLES: Dict[str, str] = {
    "allocation": "agent_stdlib.allocation.controller",
    "proxy": "agent_stdlib.proxy.main",
    "generate": "agent_stdlib.client.generate",
    "dd": "agent_stdlib.client.data_designer",
    "serve-llamacpp": "agent_stdlib.engines.llamacpp",
    "check": "agent_stdlib.allocation.nodecheck",
    "serve": "agent_stdlib.allocation.serve",
}

USAGE = "usage: python agent.pyz {" + "|".join(ROLES) + "} [options]"


def main(argv: Optional[List[str]] = None) -> int:
    """Dispatch to the role's ``main(argv)`` and return its exit status."""
    args = list(sys.argv[1:] if argv is None else argv)
    if not args or args[0] in ("-h", "--help"):
        print(USAGE)
        return 0 if args else 2
    role, rest = args[0], args[1:]
    if role not in ROLES:
        print(f"agent: unknown role {role!r}; {USAGE}", file=sys.stderr)
        return 2
    entry: Callable[[List[str]], int] = importlib.import_module(
        ROLES[role], __package__ or "agent_stdlib").main
    return int(entry(rest) or 0)


if __name__ == "__main__":
    sys.exit(main())
