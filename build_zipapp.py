#!/usr/bin/env python3
"""Build and check the agent zipapp ``agent-<sha256>.pyz``.

Usage::

    python build_zipapp.py [--out-dir dist]          # build, print the path
    python build_zipapp.py --check [PYZ]             # build (or take PYZ) and import-check it

The check extracts the archive and imports every module listed in its manifest with
``python -I -S`` (standard library only). Exit status: 0 OK, 1 check failed, 2 build error.
This script only needs the standard library and shiv; it never imports pydantic or click.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import List, Optional

REPO_ROOT = Path(__file__).resolve().parent
if str(REPO_ROOT) not in sys.path:
    sys.path.insert(0, str(REPO_ROOT))

from control.bundle import (  # noqa: E402 - needs the sys.path entry above
    BundleError,
    build_agent_bundle,
    check_agent_bundle,
)


def main(argv: Optional[List[str]] = None) -> int:
    """Run the command line; return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--out-dir",
        type=Path,
        default=REPO_ROOT / "dist",
        help="directory for the built agent-<sha256>.pyz (default: %(default)s)",
    )
    parser.add_argument(
        "--source-dir",
        type=Path,
        default=None,
        help="agent_stdlib package directory to bundle (default: the checkout's)",
    )
    parser.add_argument(
        "--check",
        nargs="?",
        const="",
        default=None,
        metavar="PYZ",
        help="import-check PYZ (or a freshly built bundle) with python -I -S",
    )
    parser.add_argument(
        "--python",
        default=sys.executable,
        help="interpreter used for the import check (default: %(default)s)",
    )
    args = parser.parse_args(argv)

    if args.check:
        pyz = Path(args.check)
        if not pyz.is_file():
            print(f"error: {pyz}: no such file", file=sys.stderr)
            return 2
    else:
        try:
            pyz = build_agent_bundle(args.out_dir, args.source_dir)
        except BundleError as exc:
            print(f"error: {exc}", file=sys.stderr)
            return 2
        if args.check is None:
            print(pyz)
            return 0

    errors = check_agent_bundle(pyz, python=args.python)
    if errors:
        for error in errors:
            print(f"FAIL {error}", file=sys.stderr)
        print(f"{pyz}: {len(errors)} error(s)", file=sys.stderr)
        return 1
    print(f"OK {pyz}: all manifest modules import with {args.python} -I -S")
    return 0


if __name__ == "__main__":
    sys.exit(main())
