#!/usr/bin/env python3
"""Build and check the agent zipapp ``agent-<sha256>.pyz``.

Usage::

    python build_zipapp.py [--out-dir dist]          # build, print the path
    python build_zipapp.py --check [PYZ]             # build (or take PYZ) and import-check it
    python build_zipapp.py --check [PYZ] --image IMG [--runtime charliecloud|apptainer]
                                                     # ... with the python3 inside image IMG

The check extracts the archive and imports every module listed in its manifest with
``python -I -S`` (standard library only); with ``--image`` the check runs inside that image
with its ``python3`` (the extracted bundle bound at ``/synthbatch/scratch``, the runtime's
flags as for a step). Exit status: 0 OK, 1 check failed, 2 build error.
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

from synthbatch.control.bundle import (  # noqa: E402 - needs the sys.path entry above
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
        default=None,
        help="interpreter used for the import check (default: this one, or the image's "
        "python3 with --image)",
    )
    parser.add_argument("--image", default=None, help="run the check inside this image")
    parser.add_argument("--runtime", default="charliecloud", choices=("charliecloud", "apptainer"),
                        help="container runtime for --image (default: %(default)s)")
    parser.add_argument("--runtime-executable", default="",
                        help="ch-run / apptainer binary (default: found on PATH)")
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

    if args.image:
        from synthbatch.control.images.inspect import agent_check, runtime_executable

        exe = runtime_executable(args.runtime, args.runtime_executable)
        if exe is None:
            print(f"error: {args.runtime_executable or args.runtime}: not installed here",
                  file=sys.stderr)
            return 2
        errors = list(agent_check(args.runtime, exe, args.image, pyz,
                                  python=args.python or "python3")["errors"])
        python = f"{args.python or 'python3'} in {args.image}"
    else:
        python = args.python or sys.executable
        errors = check_agent_bundle(pyz, python=python)
    if errors:
        for error in errors:
            print(f"FAIL {error}", file=sys.stderr)
        print(f"{pyz}: {len(errors)} error(s)", file=sys.stderr)
        return 1
    print(f"OK {pyz}: all manifest modules import with {python} -I -S")
    return 0


if __name__ == "__main__":
    sys.exit(main())
