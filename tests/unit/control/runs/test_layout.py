"""The automatic layout through ``plan``: the example plans, written values win, the
budget is split by work, and every refusal is one line naming the file and field."""

from __future__ import annotations

from pathlib import Path

import pytest

from synthbatch.control.config.deployment import Deployment
from synthbatch.control.errors import InvalidInput
from synthbatch.control.planning.layout import LayoutError, _Slot, split_budget
from synthbatch.control.runs.plan import dry_run, resolve
from tests.conftest import REPO

EXAMPLE = REPO / "examples" / "auto-layout.toml"


def profile(tmp_path: Path, memory: str = "gpu_memory_gb = 80\n", per_node: int = 8) -> Path:
    path = tmp_path / "h100.toml"
    path.write_text("schema_version = 1\nbackend = \"slurm\"\n"
                    f"workspace = \"{tmp_path / 'ws'}\"\ngpus_per_node = {per_node}\n"
                    + memory + "mem_mb = 65536\n")
    return path


def run_file(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text.replace("{config_dir}/../fixtures", str(REPO / "fixtures")))
    return path


def layout_of(resolved):
    return {d.alias: (d.tensor_parallel, d.pipeline_parallel, d.replicas, d.nodes_per_replica,
                      d.nodes) for d in resolved.plan.deployments}


def test_the_example_plans_within_its_budget_and_says_why(tmp_path: Path) -> None:
    out = dry_run(EXAMPLE, str(profile(tmp_path)))
    deployments = {d["alias"]: d for d in out["plan"]["deployments"]}
    writer, judge = deployments["writer"], deployments["judge"]
    assert (writer["tensor_parallel"], judge["tensor_parallel"]) == (4, 1)
    used = sum(d["gpus_per_replica"] * d["replicas"] for d in deployments.values())
    assert used <= 64 and out["plan"]["resources"]["nodes"] <= 8
    # the writer does ~30x the judge's work a record: it gets most of the budget
    assert writer["replicas"] * 4 > 8 * judge["replicas"] >= 8
    assert [c["alias"] for c in out["layout"]] == ["writer", "judge"]
    assert out["layout"][0]["chosen"]["tensor_parallel"] == 4
    assert "layout: writer: 141 GB of bf16 weights + KV for 16 sequences of 4096 tokens" \
        in out["summary"]
    assert "TP 2 needs 83 GB per GPU > 72 GB usable of 80 GB" in out["summary"]


def test_the_plan_records_the_choice_like_a_written_layout(tmp_path: Path) -> None:
    prof = str(profile(tmp_path))
    auto = resolve(EXAMPLE, prof, run_id="r-1")
    written = EXAMPLE.read_text().replace('gpus = "auto"', "").replace("gpus = 64", "")
    for alias, (tp, pp, replicas, _, nodes) in layout_of(auto).items():
        extra = (f"tensor_parallel = {tp}\npipeline_parallel = {pp}\nreplicas = {replicas}\n"
                 f"nodes = {nodes}\n")
        written = written.replace(f'alias = "{alias}"\n', f'alias = "{alias}"\n' + extra)
    by_hand = resolve(run_file(tmp_path, written), prof, run_id="r-1")
    assert layout_of(by_hand) == layout_of(auto)
    assert [d.placement for d in by_hand.plan.deployments] == \
        [d.placement for d in auto.plan.deployments]
    assert by_hand.layout == ()


def test_written_values_win(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace('gpus = "auto"', "tensor_parallel = 8\nreplicas = 2")
    resolved = resolve(run_file(tmp_path, text), str(profile(tmp_path)))
    got = layout_of(resolved)
    assert got["writer"][:3] == (8, 1, 2)  # TP 8 and 2 replicas as written; PP chosen
    assert got["judge"][2] == 64 - 16  # the rest of the budget, one GPU a replica
    chosen = {c.alias: c.chosen for c in resolved.layout}
    assert "tensor_parallel" not in chosen["writer"] and "replicas" not in chosen["writer"]


def test_auto_without_a_budget_chooses_tp_and_keeps_one_replica(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("gpus = 64", "")
    resolved = resolve(run_file(tmp_path, text), str(profile(tmp_path,
                                                          "gpu_memory_gb = 141\n")))
    got = layout_of(resolved)
    assert got["writer"] == (2, 1, 1, 1, 1)  # 70B on H200: TP 2
    assert got["judge"] == (1, 1, 1, 1, 1)  # nothing automatic: as before


def test_a_layout_over_one_node_spans_nodes(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("Llama-3.1-70B-Instruct", "Llama-3.1-405B-Instruct")
    resolved = resolve(run_file(tmp_path, text), str(profile(tmp_path)))
    assert layout_of(resolved)["writer"][:4] == (8, 2, 3, 2)  # 3 replicas of 2 nodes each


@pytest.mark.parametrize("edit,where", [
    (("Llama-3.1-70B-Instruct", "no-such-model"), "run.toml: deployments[0].model: writer:"),
    (("gpus = 64", "gpus = 4"), "run.toml: resources.gpus: 4 GPUs cannot hold the "
                                "deployments: they need at least 5 GPUs (writer 1 x 4, judge "
                                "1 x 1)"),
])
def test_refusals_are_one_line_naming_the_field(tmp_path: Path, edit, where: str) -> None:
    text = EXAMPLE.read_text().replace(*edit)
    with pytest.raises(InvalidInput) as err:
        resolve(run_file(tmp_path, text), str(profile(tmp_path)))
    assert str(err.value).startswith(str(tmp_path / where))
    assert "\n" not in str(err.value)


def test_an_unreadable_model_asks_for_the_layout_by_hand(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace("Llama-3.1-70B-Instruct", "no-such-model")
    with pytest.raises(InvalidInput, match="write gpus/tensor_parallel/pipeline_parallel "
                                           "and replicas by hand"):
        resolve(run_file(tmp_path, text), str(profile(tmp_path)))


def test_without_the_gpus_memory_the_profile_field_is_named(tmp_path: Path) -> None:
    prof = profile(tmp_path, memory="")
    with pytest.raises(InvalidInput) as err:
        resolve(run_file(tmp_path, EXAMPLE.read_text()), str(prof))
    assert str(err.value).startswith(f"{prof}: gpu_memory_gb: the automatic layout needs")


def test_auto_on_a_command_engine_is_refused(tmp_path: Path) -> None:
    model = REPO / "fixtures" / "models" / "Llama-3.1-8B-Instruct"
    text = (REPO / "examples" / "fake-server.toml").read_text().replace(
        "gpus = 1", 'gpus = "auto"').replace(
        'model = "fake-model"', f'model = "{model}"\nserved_name = "fake-model"')
    with pytest.raises(InvalidInput, match=r"deployments\[0\].gpus: 'auto' needs engine vllm"):
        resolve(run_file(tmp_path, text), str(profile(tmp_path)))


def _slot(alias: str, gpus: int, work: float) -> _Slot:
    dep = Deployment.model_validate({"alias": alias, "engine": "vllm", "model": "/m"})
    return _Slot(dep, gpus, 1, 1, 1, True, work)


def test_the_budget_is_split_by_work() -> None:
    slots = [_slot("writer", 1, 3.0), _slot("judge", 1, 1.0)]
    split_budget(slots, ["writer", "judge"], 8, 8)
    assert [s.replicas for s in slots] == [6, 2]
    slots = [_slot("writer", 2, 9.0), _slot("judge", 1, 1.0)]
    split_budget(slots, ["writer", "judge"], 16, 8)
    assert [s.replicas for s in slots] == [7, 2]  # 14 + 2 GPUs on 2 nodes


def test_a_budget_below_one_replica_each_names_what_they_need() -> None:
    slots = [_slot("writer", 4, 1.0), _slot("judge", 1, 1.0)]
    with pytest.raises(LayoutError, match="they need at least 5 GPUs"):
        split_budget(slots, ["writer", "judge"], 4, 8)


def test_the_budget_on_the_command_line_beats_the_run_file(tmp_path: Path) -> None:
    from synthbatch.control.config.overrides import Overrides

    over = Overrides.from_dict(Overrides(gpus="16").to_dict())  # as run.json keeps it
    assert over.gpus == 16 and over.to_dict() == {"gpus": "16"}
    resolved = resolve(EXAMPLE, str(profile(tmp_path)), overrides=over)
    used = sum(d.gpus_per_replica * d.replicas for d in resolved.plan.deployments)
    assert resolved.config.resources.gpus == 16 and 13 <= used <= 16
    with pytest.raises(InvalidInput, match="--gpus: Input should be greater than or equal"):
        Overrides(gpus=0)


def test_plan_takes_gpus_on_the_command_line(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from synthbatch.control.cli.main import cli

    text = EXAMPLE.read_text().replace("gpus = 64", "")
    result = CliRunner().invoke(cli, ["plan", str(run_file(tmp_path, text)), "--profile",
                                      str(profile(tmp_path)), "--gpus", "8", "--json"])
    data = __import__("json").loads(result.stdout)
    assert {c["alias"]: c["chosen"].get("replicas") for c in data["layout"]} == \
        {"writer": 1, "judge": 4}


@pytest.mark.parametrize("gres,memory,warned", [
    (["gpu:a100_40g:8(S:0-1)"], 80.0, True),   # 40 GB A100s, profile says 80
    (["gpu:a100:8"], 80.0, False),
    (["gpu:h100:8", "gpu:h100:4"], 141.0, True),  # an H200's memory on H100 nodes
    (["gpu:h200:8"], 141.0, False),
    (["gpu:4", "(null)"], 141.0, False),        # no type name: nothing to check
    (["gpu:mystery:8"], 500.0, False),          # a name the table does not know
])
def test_gpu_memory_against_the_partitions_gres_type_names(tmp_path: Path, gres, memory,
                                                           warned: bool) -> None:
    from synthbatch.control.config.profile import Profile
    from synthbatch.control.runs.layout import layout_memory
    from synthbatch.control.slurm.parsers import NodeShape

    class Sinfo:
        def partition_nodes(self, name: str):
            assert name == "gpu"
            return [NodeShape(f"n{i}", 64, 512000, 8, g, "idle") for i, g in enumerate(gres)]

    prof = Profile.model_validate({"schema_version": 1, "workspace": str(tmp_path),
                                   "partition": "gpu", "gpu_memory_gb": memory})
    found = layout_memory(prof, tmp_path / "p.toml", Sinfo())
    assert [f.level for f in found] == (["warning"] if warned else [])
    if warned:
        assert found[0].field == f"{tmp_path / 'p.toml'}: gpu_memory_gb"
        assert "the automatic layout may choose a layout that does not fit" in found[0].message


def test_one_command_deployment_fills_the_budget_without_reading_a_model(
        tmp_path: Path) -> None:
    text = (REPO / "examples" / "fake-server.toml").read_text().replace(
        "[resources]", "[resources]\ngpus = 4")
    resolved = resolve(run_file(tmp_path, text), str(profile(tmp_path, per_node=4)))
    assert layout_of(resolved)["tiny"][2] == 4  # 4 replicas of its 1 GPU
    assert "4 replica(s) of 1 GPU(s)" in resolved.layout[0].reason


def test_a_gguf_gets_the_fewest_gpus_of_a_node_that_hold_it(tmp_path: Path) -> None:
    from tests.gguf import write_gguf

    # 100 GB + KV of the example's -c 2048 (0.3 GB): two 80 GB GPUs (72 usable each)
    gguf = write_gguf(tmp_path / "big.gguf", size=100 * 10**9)
    text = (REPO / "examples" / "quickstart.toml").read_text()
    import re

    text = re.sub(r'model = "[^"]*\.gguf"', f'model = "{gguf}"', text)
    text = text.replace('engine = "llamacpp"', 'engine = "llamacpp"\ngpus = "auto"')
    resolved = resolve(run_file(tmp_path, text), str(profile(tmp_path)))
    assert [d.gpus_per_replica for d in resolved.plan.deployments] == [2]
    assert "100 GB of gguf q4_k_m weights + KV for 2048 tokens (0.3 GB, 32 layers x 8 KV " \
        "heads from the GGUF header) -> 2 GPU(s) of 80 GB" in resolved.layout[0].reason


@pytest.mark.parametrize("judge,message", [
    ("tensor_parallel = 1\nreplicas = 8\nnodes = 1\n", "resources.gpus: 64 GPUs cannot hold "
     "the deployments: they need at least 68 GPUs (writer 15 x 4, judge 8 x 1)"),
    ("gpus = 1\nreplicas = 8\nnodes = 1\n", "resources.gpus: the deployments as written use "
     "68 GPUs per allocation, more than the budget of 64"),
])
def test_a_written_layout_over_the_budget_is_refused(tmp_path: Path, judge: str,
                                                     message: str) -> None:
    text = EXAMPLE.read_text().replace('gpus = "auto"', "gpus = 4\ntensor_parallel = 4\n"
                                       "replicas = 15\nnodes = 8").replace(
        '# nothing written', judge + '#')
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        resolve(run_file(tmp_path, text), str(profile(tmp_path)))


def test_a_choice_the_written_fields_refuse_is_one_line(tmp_path: Path) -> None:
    text = EXAMPLE.read_text().replace('gpus = "auto"', 'gpus = "auto"\nnodes_per_replica = 3'
                                       ).replace("Llama-3.1-70B-Instruct",
                                                 "Llama-3.1-405B-Instruct")
    with pytest.raises(InvalidInput) as err:
        resolve(run_file(tmp_path, text), str(profile(tmp_path)))
    assert "deployments[0]" in str(err.value) and "do not split evenly over 3 nodes" in \
        str(err.value) and "\n" not in str(err.value)
