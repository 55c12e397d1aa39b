"""``synthbatch preview``: the real agent bundle's generator, run here on a planned run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from fixtures.fake_openai_server import serve_in_thread
from tests.fakes import invoke

RUN = """schema_version = 1
name = "qa"
records = 1000
[shards]
count = 10

[client]
seed = 3

[client.seed_data]
path = "{config_dir}/topics.csv"
order = "shuffle"

[[client.columns]]
name = "level"
type = "category"
values = ["beginner", "expert"]

[[client.columns]]
name = "question"
type = "llm-text"
model = "gen"
prompt = "Write one {level} question about {topic}."
max_tokens = 5

[[client.columns]]
name = "grade"
type = "llm-judge"
model = "judge"
prompt = "{question}"
scores = [{ name = "clear", options = { "1" = "clear", "0" = "unclear" } }]

[[deployments]]
alias = "gen"
model = "fake-model"
command = ["{python}", "server.py", "--port", "{port}"]

[[deployments]]
alias = "judge"
model = "fake-model"
command = ["{python}", "server.py", "--port", "{port}"]
"""


@pytest.fixture
def run_file(tmp_path: Path, monkeypatch, agent_pyz: Path) -> Path:
    monkeypatch.setenv("SYNTHBATCH_AGENT_PYZ", str(agent_pyz))
    (tmp_path / "topics.csv").write_text("topic,source\ntides,a\nmoons,b\nstars,c\n")
    path = tmp_path / "run.toml"
    path.write_text(RUN)
    return path


def test_preview_with_an_endpoint_and_without(run_file: Path, profile_file: Path) -> None:
    with serve_in_thread(model="fake-model") as server:
        result = invoke("preview", str(run_file), "-n", "3", "--endpoint",
                        f"gen={server.url}", "--profile", str(profile_file), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["index"] for r in data["records"]] == [0, 1, 2]
    first = data["records"][0]
    assert first["topic"] in ("tides", "moons", "stars") and first["question"]
    assert "grade" not in first  # the judge has no endpoint
    assert any("no endpoint for judge: columns grade left out" in line for line in data["log"])
    text = invoke("preview", str(run_file), "-n", "2", "--profile", str(profile_file))
    assert text.exit_code == 0, text.output
    lines = text.output.splitlines()  # rows as they come; the generator's notes after
    assert lines[0].split() == ["index", "topic", "source", "level"]
    assert "no endpoint for gen, judge" in lines[3]
    assert '"question"' not in text.output  # no endpoint at all: samplers and seed data


@pytest.mark.parametrize("args,message", [
    (["--endpoint", "gen"], "--endpoint 'gen': expected ALIAS=http[s]://host"),
    (["--endpoint", "writer=http://127.0.0.1:1"], "--endpoint writer: not a deployment alias"),
    (["--api-key-env", "SYNTHBATCH_NO_SUCH_VARIABLE"], "that variable is not set"),
])
def test_bad_preview_arguments(run_file: Path, profile_file: Path, args, message) -> None:
    result = invoke("preview", str(run_file), *args, "--profile", str(profile_file))
    assert result.exit_code == 2 and message in result.output


def test_a_seed_file_problem_fails_the_preview_like_the_plan(run_file: Path,
                                                            profile_file: Path) -> None:
    (run_file.parent / "topics.csv").write_text("topic,source\ntides\n")
    result = invoke("preview", str(run_file), "--profile", str(profile_file))
    assert result.exit_code == 2
    assert "client.seed_data.path: " in result.output and "topics.csv:2: 1 fields" in \
        result.output


def test_a_v1_base_url_and_another_served_name_work(run_file: Path,
                                                    profile_file: Path) -> None:
    """Issue 35: ``--endpoint gen=http://host:port/v1`` (the way OpenAI clients write it)
    and an endpoint serving another model name (``--model gen=NAME``) gave a 404 on every
    record."""
    with serve_in_thread(model="other-name") as server:
        result = invoke("preview", str(run_file), "-n", "2", "--endpoint",
                        f"gen={server.url}/v1/", "--model", "gen=other-name",
                        "--profile", str(profile_file), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["endpoints"] == {"gen": server.url}
    assert all("_error" not in r and r["question"] for r in data["records"]), data
    assert {r["_meta"]["columns"]["question"]["served_model"] for r in data["records"]} == \
        {"other-name"}
    bad = invoke("preview", str(run_file), "--model", "writer=x", "--profile",
                 str(profile_file))
    assert bad.exit_code == 2 and "--model writer: not a deployment alias" in bad.output


def test_the_text_view_is_one_row_per_record(run_file: Path, profile_file: Path) -> None:
    with serve_in_thread(model="fake-model") as server:
        result = invoke("preview", str(run_file), "-n", "3", "--endpoint",
                        f"gen={server.url}", "--profile", str(profile_file))
    assert result.exit_code == 0, result.output
    lines = result.output.splitlines()
    header = next(i for i, line in enumerate(lines) if line.startswith("index"))
    assert lines[header].split() == ["index", "topic", "source", "level", "question"]
    rows = lines[header + 1:header + 4]
    assert [r.split()[0] for r in rows] == ["0", "1", "2"]
    assert lines[-1].startswith("3 records; the first after ")
    assert "_meta" not in result.output and all(len(r) < 200 for r in rows)


def test_a_long_value_is_cut_and_control_characters_escaped() -> None:
    from synthbatch.control.cli.preview_table import cell_text, table

    assert cell_text("x" * 100) == "x" * 37 + "..."
    assert cell_text("a\x1b[31mb\nc") == "a\\x1b[31mb c"
    assert cell_text({"s": 1}) == '{"s":1}' and cell_text(None) == "-"
    lines = table([{"index": 0, "a": "y", "_meta": {}},
                   {"index": 1, "a": None, "_error": {"column": "a", "message": "HTTP 500"}}])
    assert lines == ["index  a  error", "0      y  -", "1      -  a: HTTP 500"]


def test_rows_stream_as_records_arrive(tmp_path: Path) -> None:
    """Issue 35: preview printed every record at the end. A stand-in generator prints one
    record, then waits until the caller has seen it before it prints the next: only a
    preview that hands over each record as it comes gets the second one in time."""
    import sys

    from synthbatch.control.cli.preview_table import Rows
    from synthbatch.control.runs.preview import _stream

    seen = tmp_path / "seen"
    script = ("import json, os, sys, time\n"
              "print(json.dumps({'index': 0, 'a': 'x'}), flush=True)\n"
              f"deadline = time.time() + 60\n"
              f"while not os.path.exists({str(seen)!r}) and time.time() < deadline:\n"
              "    time.sleep(0.01)\n"
              f"print(json.dumps({{'index': 1, 'a': os.path.exists({str(seen)!r})}}))\n")
    shown: list = []
    rows = Rows(shown.append)

    def on_record(record: dict) -> None:
        rows(record)
        seen.touch()
    records, first_s, status, timed_out, _ = _stream(
        [sys.executable, "-c", script], {}, tmp_path, 120, on_record)
    assert (status, timed_out) == (0, False) and first_s is not None
    assert records[1]["a"] is True  # the first record was handed over before the second
    assert shown == ["index  a", "0      x", "1      true"]


def test_preview_needs_no_profile_with_an_endpoint(run_file: Path, tmp_path: Path,
                                                   monkeypatch) -> None:
    """Issue 35: ``--endpoint`` without ``--profile`` (and no default profile) failed
    with "profile ...: no such file"; it plans with a stand-in profile now."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("SYNTHBATCH_PROFILE", raising=False)
    with serve_in_thread(model="fake-model") as server:
        result = invoke("preview", str(run_file), "-n", "2", "--endpoint",
                        f"gen={server.url}", "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert [r["index"] for r in data["records"]] == [0, 1]
    assert all(r["question"] for r in data["records"])
    assert data["first_record_s"] is not None and data["first_record_s"] >= 0
