"""Refusing hostile authored files: CPU time of ``synthbatch plan`` that rejects them.

    python benchmarks/rejection.py [--repeat 3]

Issue 28 item 7: a 30,000-character invalid ``name`` cost 4 s of CPU, 300,000 characters
in ``client.columns[12].scores[0].name`` did not finish in 180 s (the messages quoted the
whole value and the redaction of secrets in them was quadratic). Each case below is a file
of up to 1 MiB (the largest the loader reads); ``plan`` runs in process (click's runner),
its CPU time (``time.process_time``, best of ``--repeat``) is printed next to the goal
(under 0.5 s each), with the length of the one-line message. Also timed: the redaction
alone (``control.errors.redact``) over 1,000,000 characters of the shapes that were
quadratic (one long word; repeated ``eyJ``; ``a.`` repeated), against the same goal.
Reports, never asserts (tests/unit/control/config/test_hostile_inputs.py checks the
messages).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, Callable, Dict, List, Tuple

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib

GOAL_S = 0.5


def _run(name: str, change: Callable[[Dict[str, Any]], None]) -> Tuple[str, str]:
    base = REPO / "examples" / name
    data = tomllib.loads(base.read_text(encoding="utf-8"))
    change(data)
    return json.dumps(data), ".json"


def _long_name(data: Dict[str, Any]) -> None:
    data["name"] = "a!" * 15_000


def _long_score(data: Dict[str, Any]) -> None:
    columns = data["client"]["columns"]
    judge = columns.pop()
    while len(columns) < 12:
        columns.append({"name": f"n{len(columns)}", "type": "integer", "low": 1, "high": 2})
    judge["scores"][0]["name"] = "x" * 300_000
    columns.append(judge)


def cases() -> List[Tuple[str, str, str]]:
    """(label, file text, suffix) of each hostile run file."""
    deep = '{"schema_version": 1, "x": ' + "[" * 500_000 + "]" * 500_000 + "}"
    toml = (REPO / "examples" / "fake-server.toml").read_text(encoding="utf-8")
    return [
        ("name of 30,000 characters", *_run("fake-server.toml", _long_name)),
        ("columns[12].scores[0].name of 300,000", *_run("qa-fake.toml", _long_score)),
        ("unknown key of 1,000,000 characters",
         *_run("fake-server.toml", lambda d: d.update({"k" * 1_000_000: 1}))),
        ("JSON nested 500,000 deep (1 MB)", deep, ".json"),
        ("TOML array nested 600 deep",
         toml.replace("schema_version = 1", "schema_version = 1\nx = " + "[" * 600 + "1"
                      + "]" * 600, 1), ".toml"),
    ]


def measure(fn: Callable[[], Any], repeat: int) -> Tuple[float, Any]:
    best, result = float("inf"), None
    for _ in range(repeat):
        started = time.process_time()
        result = fn()
        best = min(best, time.process_time() - started)
    return best, result


def verdict(seconds: float) -> str:
    return "ok" if seconds < GOAL_S else "OVER"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    from click.testing import CliRunner

    from synthbatch.control.cli.main import cli
    from synthbatch.control.errors import redact

    print(f"goal: each rejection and each redaction under {GOAL_S:g} s of CPU")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        (root / "ws").mkdir()
        (root / "data").symlink_to(REPO / "examples" / "data")
        profile = tomllib.loads((REPO / "examples" / "profiles" / "testbed.toml").read_text())
        profile["workspace"] = str(root / "ws")
        (root / "profile.json").write_text(json.dumps(profile))
        for label, text, suffix in cases():
            run = root / f"run{suffix}"
            run.write_text(text, encoding="utf-8")

            argv = ["plan", str(run), "--profile", str(root / "profile.json")]
            seconds, result = measure(lambda a=argv: CliRunner().invoke(cli, a), args.repeat)
            print(f"plan, {label} ({len(text):,} bytes): {seconds * 1000:.0f} ms, exit "
                  f"{result.exit_code}, message {len(result.stderr)} characters "
                  f"{verdict(seconds)}")
    for label, text in (("one word", "a" * 1_000_000), ("'eyJ' repeated", "eyJ" * 333_333),
                        ("'a.' repeated", "a." * 500_000)):
        message = f"name: {text!r} is not a name"
        seconds, _ = measure(lambda m=message: redact(m), args.repeat)
        print(f"redact, {label} (1,000,000 characters): {seconds * 1000:.0f} ms "
              f"{verdict(seconds)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
