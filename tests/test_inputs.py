"""Bad input, read strictly: every case ends with exit status 2 (CLI) or a specific exception
(Python) whose message names the file, the field and the value — never a traceback, never a
silent default.

The workload cases edit one line of a valid workload file; each was misread or crashed before
the schema layer (``ir/errors.py``): ``ac_sharing = "no"`` was read as true, ``quantiles = []``
as the default, ``95.7`` as 95, a misspelt key was ignored.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest

import rpeg
from rpeg.cli import main
from rpeg.ir.errors import InputError
from rpeg.ir.workload import load_workload

BASE = """\
name = "t"
algorithm = "ppo"

[batch]
prompts = 64
prompt_len = 128
response_len = 256

[models]
actor = "llama2-7b"
critic = "llama2-7b"
reward = "llama2-7b"

[structure]
ac_sharing = true

[cluster]
shape = "1x2x4"
hardware = "h100"
k_eval = 2
"""


def edited(old: str, new: str) -> str:
    assert old in BASE, old
    return BASE.replace(old, new, 1)


# (id, workload text, pattern the one-line message must match)
WORKLOAD_CASES = [
    ("misspelt key", edited("ac_sharing = true", "ac_shareing = true"), r"unknown key 'ac_shareing'.*did you mean 'ac_sharing'"),
    ("unknown top-level key", "foo = 1\n" + BASE, r"unknown key 'foo'"),
    ("unknown table", BASE + "\n[clutser]\nshape = '1x1x8'\n", r"unknown key 'clutser'.*did you mean 'cluster'"),
    ("misspelt batch key", edited("prompt_len", "promt_len"), r"unknown key 'promt_len' in \[batch\], did you mean 'prompt_len'"),
    ("bool as string", edited("ac_sharing = true", 'ac_sharing = "no"'), r"structure\.ac_sharing.*boolean.*'no'"),
    ("bool as int", edited("ac_sharing = true", "ac_sharing = 0"), r"structure\.ac_sharing"),
    ("k_eval bool", edited("k_eval = 2", "k_eval = true"), r"cluster\.k_eval.*integer.*True"),
    ("k_eval zero", edited("k_eval = 2", "k_eval = 0"), r"cluster\.k_eval.*greater than or equal to 1"),
    ("k_eval float", edited("k_eval = 2", "k_eval = 2.5"), r"cluster\.k_eval"),
    ("quantiles empty", edited("response_len = 256", "response_len = 256\nquantiles = []"), r"batch\.quantiles.*at least 1"),
    ("quantile length float", edited("response_len = 256", "response_len = 256\nquantiles = [[0.5, 95.7], [1.0, 256]]"), r"batch\.quantiles\[0\]\[1\].*integer.*95\.7"),
    ("quantile pair short", edited("response_len = 256", "response_len = 256\nquantiles = [[0.5], [1.0, 256]]"), r"batch\.quantiles\[0\]\[1\]"),
    ("quantile fraction > 1", edited("response_len = 256", "response_len = 256\nquantiles = [[1.5, 96], [1.0, 256]]"), r"batch\.quantiles\[0\]\[0\]"),
    ("quantiles not ending at Lr", edited("response_len = 256", "response_len = 256\nquantiles = [[0.5, 96], [1.0, 200]]"), r"quantiles must end with \(1\.0, Lr=256\)"),
    ("quantiles decreasing", edited("response_len = 256", "response_len = 256\nquantiles = [[0.5, 196], [0.7, 96], [1.0, 256]]"), r"quantiles\[1\]"),
    ("quantile nan", edited("response_len = 256", "response_len = 256\nquantiles = [[nan, 96], [1.0, 256]]"), r"batch\.quantiles\[0\]\[0\]"),
    ("batch not a table", BASE.replace("[batch]\nprompts = 64\nprompt_len = 128\nresponse_len = 256\n", "batch = 5\n").replace('name = "t"', 'name = "t"'), r"field 'batch'.*table.*5"),
    ("staleness scalar", edited("ac_sharing = true", "staleness = 3"), r"structure\.staleness.*table.*3"),
    ("staleness not a list", edited("ac_sharing = true", "staleness = {actor = 1}"), r"structure\.staleness\.actor.*list.*1"),
    ("staleness negative", edited("ac_sharing = true", "staleness = {actor = [-1]}"), r"structure\.staleness\.actor\[0\]"),
    ("staleness empty", edited("ac_sharing = true", "staleness = {actor = []}"), r"structure\.staleness\.actor"),
    ("staleness of a frozen model", edited("ac_sharing = true", "staleness = {reward = [0]}"), r"'reward' is not a trainable model"),
    ("prompts huge", edited("prompts = 64", "prompts = 1000000000000000"), r"batch\.prompts.*less than or equal to 1000000"),
    ("prompts zero", edited("prompts = 64", "prompts = 0"), r"batch\.prompts"),
    ("prompts string", edited("prompts = 64", 'prompts = "64"'), r"batch\.prompts.*integer.*'64'"),
    ("missing response_len", edited("response_len = 256\n", ""), r"missing field 'batch\.response_len'"),
    ("missing models", BASE.split("[models]")[0] + "[cluster]\nshape = '1x2x4'\n", r"missing field 'models'"),
    ("unknown algorithm", edited('algorithm = "ppo"', 'algorithm = "ppo2"'), r"field 'algorithm'.*'ppo2'"),
    ("unknown role", edited('reward = "llama2-7b"', 'reward = "llama2-7b"\nrewrd = "llama2-7b"'), r"unknown key 'rewrd' in \[models\], did you mean 'reward'"),
    ("role the algorithm lacks", edited('algorithm = "ppo"', 'algorithm = "grpo"'), r"'grpo' has no 'critic' model"),
    ("unknown preset", edited('actor = "llama2-7b"', 'actor = "llama2-7"'), r"models\.actor: unknown model preset 'llama2-7'"),
    ("missing config.json", edited('actor = "llama2-7b"', 'actor = "nowhere/config.json"'), r"models\.actor: model config .*nowhere/config\.json' does not exist"),
    ("missing checkpoint folder", edited('actor = "llama2-7b"', 'actor = "./ckpt-dir/"'), r"models\.actor: model config .*ckpt-dir.*does not exist"),
    ("model table bad field", edited('actor = "llama2-7b"', 'actor = { name = "x", layers = 2, hidden = 64, ffn_hidden = 128, vocab = 100, heads = 4, kv_heads = 4, heds = 4 }'), r"unknown key 'heds'.*did you mean 'heads'"),
    ("model table wrong type", edited('actor = "llama2-7b"', 'actor = { name = "x", layers = "2", hidden = 64, ffn_hidden = 128, vocab = 100, heads = 4, kv_heads = 4 }'), r"models\.actor\.\w*\.?layers"),
    ("model table inconsistent", edited('actor = "llama2-7b"', 'actor = { name = "x", layers = 2, hidden = 66, ffn_hidden = 128, vocab = 100, heads = 4, kv_heads = 4 }'), r"models\.actor: .*hidden=66 is not divisible by heads=4"),
    ("model table huge", edited('actor = "llama2-7b"', 'actor = { name = "x", layers = 9223372036854775807, hidden = 9223372036854775807, ffn_hidden = 9223372036854775807, vocab = 9223372036854775807, heads = 9223372036854775807, kv_heads = 9223372036854775807, head_dim = 9223372036854775807 }'), r"models\.actor: ModelSpec 'x': layers = 9223372036854775807 is above MAX_LAYERS = 4,096"),
    ("bad shape", edited('shape = "1x2x4"', 'shape = "1x2"'), r"cluster\.shape.*'1x2'"),
    ("shape zero", edited('shape = "1x2x4"', 'shape = "0x2x4"'), r"cluster\.shape.*at least 1"),
    ("shape too large", edited('shape = "1x2x4"', 'shape = "1000x1000x8"'), r"cluster\.shape.*at most 65,536"),
    ("hardware number", edited('hardware = "h100"', "hardware = 100"), r"cluster\.hardware.*100"),
    ("dpo rollouts", edited('algorithm = "ppo"', 'algorithm = "dpo"').replace('critic = "llama2-7b"\nreward = "llama2-7b"\n', "").replace("prompts = 64", "prompts = 64\nrollouts = 3"), r"rollouts must be 2 for dpo"),
    ("not toml", "name = \n", r"not valid TOML"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "pattern"), [c[1:] for c in WORKLOAD_CASES], ids=[c[0] for c in WORKLOAD_CASES]
)
def test_bad_workload_file_is_named_in_python_and_cli(tmp_path, capsys, text, pattern):
    path = tmp_path / "w.toml"
    path.write_text(text)
    with pytest.raises(InputError, match=pattern) as info:
        load_workload(path)
    assert str(path) in str(info.value)
    status, err = cli(capsys, "solve", str(path), "--method", "greedy")
    assert status == 2
    assert str(path) in err


def test_the_base_workload_is_valid():
    # the cases above differ from a file that loads, so each error is the edited field's
    path = Path(__file__).parent / "base.toml"
    try:
        path.write_text(BASE)
        wf = load_workload(path)
    finally:
        path.unlink(missing_ok=True)
    assert wf.workload.batch == 64 and wf.k_eval == 2 and wf.workload.ac_sharing is True


def test_ac_sharing_false_is_read_as_false(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(edited("ac_sharing = true", "ac_sharing = false"))
    assert load_workload(path).workload.ac_sharing is False


def cli(capsys, *argv: str) -> tuple[int, str]:
    """``rpeg ARGV`` in-process → (exit status, stderr); argparse's own errors exit 2 too."""
    try:
        status = main(list(argv))
    except SystemExit as exc:
        status = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in err + out
    if status == 2:
        assert err.strip(), "exit 2 without a message"
        assert (
            err.strip()
            .splitlines()[-1]
            .startswith(
                ("rpeg: error:", "rpeg solve: error:", "rpeg project: error:", "rpeg evaluate: error:")
            )
        ), err
    return status, err


# ---------------------------------------------------------------------------- other files
HW = rpeg.hardware_preset("h100").to_dict()


def _hw(**changes: object) -> str:
    data = json.loads(json.dumps(HW))
    for key, value in changes.items():
        if key.startswith("collective_"):
            data["collective"][int(key[-1])]["beta"] = value
        else:
            data[key] = value
    return json.dumps(data)


def _hw_every_figure(value: float) -> str:
    """The hardware file with every float figure (links and engine terms too) set to ``value``."""

    def walk(node: object) -> object:
        if isinstance(node, dict):
            return {k: walk(v) for k, v in node.items()}
        if isinstance(node, list):
            return [walk(v) for v in node]
        return value if isinstance(node, float) else node

    return json.dumps(walk(HW))


FILE_CASES = [
    ("hardware string number", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], _hw(peak_flops="fast"), r"hw\.json: field 'peak_flops'.*'fast'"),
    ("hardware negative bandwidth", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], _hw(collective_1=-1e-11), r"hw\.json: field 'collective\[1\]\.beta'"),
    ("hardware unknown key", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], _hw(peak_flop=1.0), r"unknown key 'peak_flop', did you mean 'peak_flops'"),
    ("hardware not json", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], "{", r"hw\.json.*not valid JSON"),
    ("hardware list", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], "[]", r"hw\.json: field '\(top level\)'"),
    ("hardware nan", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], _hw().replace('"b_cal": 8.0', '"b_cal": NaN'), r"NaN is not a number JSON allows"),
    ("hardware every figure 1e308", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], _hw_every_figure(1e308), r"hw\.json: field 'gpu_memory_bytes': must be a number in \[1e6, 1e14\] bytes \(got 1e\+308\)"),
    ("hardware 1e-300 flops and bandwidth", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], _hw(peak_flops=1e-300, mem_bandwidth=1e-300), r"hw\.json: field 'peak_flops': must be a number in \[1e9, 1e18\] FLOP/s \(got 1e-300\)"),
    ("hardware slow link", ["solve", "ppo-7b-16gpu", "--hardware", "{hw}"], _hw(collective_2=1e308), r"hw\.json: field 'collective\[2\]\.beta': must be a number in \[0, 1e-6\] s/byte"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("argv", "content", "pattern"), [c[1:] for c in FILE_CASES], ids=[c[0] for c in FILE_CASES]
)
def test_bad_hardware_file(tmp_path, capsys, argv, content, pattern):
    hw = tmp_path / "hw.json"
    hw.write_text(content)
    status, err = cli(capsys, *(a.format(hw=hw) for a in argv))
    assert status == 2
    assert __import__("re").search(pattern, err), err


@pytest.fixture(scope="module")
def plan_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("plan") / "p.json"
    assert main(["solve", "ppo-7b-16gpu", "--method", "greedy", "--k-eval", "2", "--json", str(path)]) == 0
    return path


def _edit_result(plan_file: Path, tmp_path: Path, edit) -> Path:
    doc = json.loads(plan_file.read_text())
    edit(doc)
    path = tmp_path / "edited.json"
    path.write_text(json.dumps(doc))
    return path


RESULT_CASES = [
    ("other format", lambda d: d.update(format="rpeg.result/9"), r"field 'format' must be one of 'rpeg\.result/1', 'rpeg\.result/2', got 'rpeg\.result/9'"),
    ("no format", lambda d: d.pop("format"), r"field 'format' must be one of 'rpeg\.result/1', 'rpeg\.result/2', got None"),
    ("workload reward unknown", lambda d: d["workload"].update(reward="human"), r"field 'workload\.reward'"),
    ("workload kl_coef negative", lambda d: d["workload"].update(kl_coef=-0.1), r"field 'workload\.kl_coef'"),
    ("workload mini_batches zero", lambda d: d["workload"].update(mini_batches=0), r"field 'workload\.mini_batches'"),
    ("workload old_logprob unknown", lambda d: d["workload"].update(old_logprob="cache"), r"field 'workload\.old_logprob'"),
    ("plan entry zero string", lambda d: d["plan"][0].update(zero="3"), r"plan entry for 'actor_gen': field 'zero' must be int, got '3'"),
    ("plan entry packing int", lambda d: d["plan"][0].update(packing=1), r"plan entry for 'actor_gen': field 'packing' must be bool, got 1"),
    ("plan entry zero illegal", lambda d: d["plan"][0].update(zero=3), r"plan entry for 'actor_gen' is illegal: Z1"),
    ("plan entry chunk on a generation", lambda d: d["plan"][0].update(logits_chunk=4096), r"plan entry for 'actor_gen' is illegal: Z2"),
    ("k_eval string", lambda d: d.update(k_eval="8"), r"field 'k_eval'"),
    ("workload B float", lambda d: d["workload"].update(B=512.0), r"field 'workload\.B'"),
    ("model layers string", lambda d: d["workload"]["models"]["actor"].update(layers="32"), r"field 'workload\.models\.actor\.layers'"),
    ("status unknown", lambda d: d.update(status="great"), r"field 'status'"),
    ("structure staleness string", lambda d: d["structure"].update(staleness={"actor": "1"}), r"field 'structure\.staleness\.actor'"),
    ("hardware in result", lambda d: d["cluster"]["hardware"].update(peak_flops=-1.0), r"cluster\.hardware: field 'peak_flops'"),
    ("plan entry tp string", lambda d: d["plan"][0].update(tp="1"), r"field 'tp' must be an integer"),
    ("plan entry unknown vertex", lambda d: d["plan"][0].update(vertex="nobody"), r"unknown vertex 'nobody'"),
    ("plan entry dp illegal", lambda d: d["plan"][0].update(dp=3), r"is illegal"),
    ("plan entry misspelt key", lambda d: d["plan"][-1].update(recomput="none"), r"plan entry for '\w+': unknown key 'recomput', did you mean 'recompute'\?"),
    ("plan entry unknown key", lambda d: d["plan"][0].update(colour="red"), r"plan entry for 'actor_gen': unknown key 'colour'; known keys: vertex, origin"),
    ("structure staleness 5", lambda d: d["structure"]["staleness"].update(actor=5), r"field 'structure': structure\.staleness\.actor is 5, but the workload allows \[0, 1\]"),
    ("structure staleness 1000", lambda d: d["structure"]["staleness"].update(actor=1000), r"structure\.staleness\.actor is 1000, but the workload allows \[0, 1\]"),
    ("workload misspelt key", lambda d: d["workload"].update(kl_coeff=0.0), r"unknown key 'kl_coeff' in \[workload\], did you mean 'kl_coef'\?"),
    ("structure misspelt key", lambda d: d["structure"].update(stalenes={}), r"unknown key 'stalenes' in \[structure\], did you mean 'staleness'\?"),
]  # fmt: skip


@pytest.mark.parametrize(("edit", "pattern"), [c[1:] for c in RESULT_CASES], ids=[c[0] for c in RESULT_CASES])
def test_bad_result_file(plan_file, tmp_path, capsys, edit, pattern):
    path = _edit_result(plan_file, tmp_path, edit)
    with pytest.raises(InputError, match=pattern) as info:
        rpeg.Result.from_json(path)
    assert str(path) in str(info.value)
    status, _ = cli(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path))
    assert status == 2


def test_a_result_file_reads_back(plan_file):
    again = rpeg.Result.from_json(plan_file)
    assert again.feasible and again.k_eval == 2
    assert json.loads(plan_file.read_text())["format"] == "rpeg.result/2"


def _as_v1(doc: dict) -> None:
    """``doc`` as an ``rpeg.result/1`` file: no engine fields in the plan entries, none of
    SPEC §14's fields in the workload block."""
    doc["format"] = "rpeg.result/1"
    for key in ("reward", "reward_cost_s", "kl_coef", "old_logprob", "mini_batches"):
        del doc["workload"][key]
    for e in doc["plan"]:
        for key in ("zero", "mem_fraction", "logits_chunk", "packing"):
            del e[key]


def test_a_v1_result_file_reads_back(plan_file, tmp_path):
    path = _edit_result(plan_file, tmp_path, _as_v1)
    again = rpeg.Result.from_json(path)
    assert again.plan is not None and again.k_eval == 2
    assert all(c.strategy.zero == 2 and c.strategy.mem_fraction == 0.0 for c in again.plan.choices)
    assert json.loads(again.to_json())["format"] == "rpeg.result/2"


def test_evaluate_reads_a_v1_plan_file(plan_file, tmp_path, capsys):
    path = _edit_result(plan_file, tmp_path, _as_v1)
    out_path = tmp_path / "again.json"
    status, err = cli(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(path), "--json", str(out_path))
    assert status == 0, err
    assert json.loads(out_path.read_text())["format"] == "rpeg.result/2"


def test_evaluate_refuses_a_plan_made_for_another_problem(plan_file, capsys):
    status, err = cli(capsys, "evaluate", "ppo-13b-64gpu", "--plan", str(plan_file))
    assert status == 2 and "made for another problem: workload.B is 512 in the plan file but 1024" in err
    status, err = cli(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(plan_file), "--cluster", "1x2x8")
    assert status == 2 and "cluster is 1x4x4, not 1x2x8" in err
    status, err = cli(capsys, "evaluate", "grpo-8b-16gpu", "--plan", str(plan_file))
    assert status == 2 and "workload.algorithm is 'ppo'" in err
    # the same problem is scored; another hardware only when asked for
    assert cli(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(plan_file))[0] == 0
    assert cli(capsys, "evaluate", "ppo-7b-16gpu", "--plan", str(plan_file), "--hardware", "h100")[0] == 0


# ---------------------------------------------------------------------------- CLI flags
FLAG_CASES = [
    ("k-eval zero", ["solve", "ppo-7b-16gpu", "--k-eval", "0"], r"--k-eval: must be a positive integer, got '0'"),
    ("k-eval text", ["solve", "ppo-7b-16gpu", "--k-eval", "many"], r"--k-eval"),
    ("time-limit negative", ["solve", "ppo-7b-16gpu", "--time-limit", "-1"], r"--time-limit: must be a positive"),
    ("time-limit inf", ["solve", "ppo-7b-16gpu", "--time-limit", "inf"], r"--time-limit: must be a positive finite"),
    ("time-limit nan", ["solve", "ppo-7b-16gpu", "--time-limit", "nan"], r"--time-limit"),
    ("project time-limit negative", ["project", "x.sm", "--time-limit", "-1"], r"--time-limit: must be a positive"),
    ("project threads zero", ["project", "x.sm", "--threads", "0"], r"--threads"),
    ("project missing", ["project", "{tmp}/x.sm"], r"instance file '.*x\.sm' does not exist"),
    ("json into a folder", ["solve", "ppo-7b-16gpu", "--json", "{tmp}"], r"--json '.*' is a directory"),
    ("json into a missing folder", ["solve", "ppo-7b-16gpu", "--json", "{tmp}/no/such/p.json"], r"--json .*folder .* does not exist"),
    ("json not json", ["solve", "ppo-7b-16gpu", "--json", "{tmp}/p.txt"], r"--json .*must end in \.json"),
    ("json unwritable", ["solve", "ppo-7b-16gpu", "--json", "/proc/rpeg.json"], r"--json '/proc/rpeg\.json' cannot be written"),
    ("gantt into a folder", ["solve", "ppo-7b-16gpu", "--gantt", "{tmp}"], r"--gantt .* is a directory"),
    ("gantt suffix", ["solve", "ppo-7b-16gpu", "--gantt", "{tmp}/g.txt"], r"--gantt .*must end in \.png"),
    ("evaluate json folder", ["evaluate", "ppo-7b-16gpu", "--plan", "{tmp}/p.json", "--json", "{tmp}"], r"--json .* is a directory"),
    ("hardware missing", ["solve", "ppo-7b-16gpu", "--hardware", "missing.json"], r"hardware file 'missing\.json' does not exist"),
    ("hardware folder", ["solve", "ppo-7b-16gpu", "--hardware", "{tmp}/"], r"is a directory"),
    ("hardware unknown", ["solve", "ppo-7b-16gpu", "--hardware", "tpu9"], r"unknown hardware preset 'tpu9'"),
    ("cluster malformed", ["solve", "ppo-7b-16gpu", "--cluster", "4x4"], r"--cluster: cluster shape must look like"),
    ("cluster zero", ["solve", "ppo-7b-16gpu", "--cluster", "0x4x4"], r"--cluster: .*at least 1"),
    ("cluster huge", ["solve", "ppo-7b-16gpu", "--cluster", "999x999x8"], r"--cluster: .*at most 65,536"),
    ("method unknown", ["solve", "ppo-7b-16gpu", "--method", "magic"], r"--method: unknown method 'magic'"),
    ("workload unknown", ["solve", "ppo-7b-17gpu"], r"unknown example 'ppo-7b-17gpu'"),
    ("workload folder", ["solve", "{tmp}/"], r"is a directory"),
    ("delta zero", ["solve", "ppo-7b-16gpu", "--objective", "throughput-util", "--delta", "0"], r"delta must be in \(0, 1\]"),
    # issue 33: a flag that only matters with another one is refused, naming both
    ("delta without its objective", ["solve", "ppo-7b-16gpu", "--delta", "0.5"], r"--delta only applies with --objective throughput-util, not --objective throughput$"),
    ("no-progress without sa", ["solve", "ppo-7b-16gpu", "--method", "greedy", "--no-progress"], r"--no-progress only applies with --method sa, not --method greedy"),
    ("no-compare without sa", ["solve", "ppo-7b-16gpu", "--no-compare"], r"--no-compare only applies with --method sa, not --method concurrent"),
    ("project solver without milp", ["project", "x.sm", "--solver", "cbc"], r"--solver only applies with --method milp, not --method cpsat"),
    ("project threads with list", ["project", "x.sm", "--method", "list", "--threads", "2"], r"--threads only applies with --method cpsat or milp, not --method list"),
    ("in-situ-steps without in-situ", ["calibrate", "--out", "{tmp}/hw.json", "--in-situ-steps", "4"], r"--in-situ-steps only applies with --in-situ$"),
    ("alone without engines", ["calibrate", "--out", "{tmp}/hw.json", "--engines", "none", "--alone"], r"--alone only applies with --engines torch or torch,vllm, not --engines none"),
    ("workers zero", ["solve", "ppo-7b-16gpu", "--method", "sa", "--workers", "0"], r"--workers must be a positive integer"),
    ("flag for another method", ["solve", "ppo-7b-16gpu", "--method", "greedy", "--workers", "2"], r"--workers only applies to --method sa"),
    ("ablate unknown", ["solve", "ppo-7b-16gpu", "--method", "sa", "--ablate", "polsh"], r"unknown ablation\(s\) 'polsh'"),
    ("threads zero", ["solve", "ppo-7b-16gpu", "--method", "cpsat", "--threads", "0"], r"--threads must be a positive integer"),
    ("plan missing", ["evaluate", "ppo-7b-16gpu", "--plan", "{tmp}/none.json"], r"--plan file '.*none\.json' does not exist"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "pattern"), [c[1:] for c in FLAG_CASES], ids=[c[0] for c in FLAG_CASES])
def test_bad_flag_exits_2_naming_it(tmp_path, capsys, argv, pattern):
    status, err = cli(capsys, *(a.format(tmp=tmp_path) for a in argv))
    assert status == 2
    assert __import__("re").search(pattern, err), err


def test_output_paths_are_checked_before_any_work(tmp_path, capsys, monkeypatch):
    calls = []
    monkeypatch.setattr("rpeg.cli.solve", lambda *a, **k: calls.append(1))
    status, _ = cli(capsys, "solve", "ppo-7b-16gpu", "--json", str(tmp_path), "--method", "greedy")
    assert status == 2 and calls == []  # refused before planning, not after


# ---------------------------------------------------------------------------- Python API
WF = rpeg.load_workload(rpeg.example_path("ppo-7b-16gpu")).workload
CLUSTER = rpeg.Cluster.from_shape("1x4x4", rpeg.hardware_preset("gh200"))

API_CASES = [
    ("time_limit inf", lambda: rpeg.solve(WF, CLUSTER, time_limit=math.inf), ValueError, r"time_limit must be a positive finite"),
    ("time_limit string", lambda: rpeg.solve(WF, CLUSTER, time_limit="3"), TypeError, r"time_limit .*got str '3'"),
    ("time_limit zero", lambda: rpeg.solve(WF, CLUSTER, time_limit=0), ValueError, r"time_limit"),
    ("ablate string", lambda: rpeg.solve(WF, CLUSTER, method="sa", ablate="polish"), TypeError, r"ablate must be a list .*ablate=\['polish'\]"),
    ("threads zero", lambda: rpeg.solve(WF, CLUSTER, method="cpsat", threads=0), ValueError, r"threads must be a positive integer, got 0"),
    ("workers float", lambda: rpeg.solve(WF, CLUSTER, method="sa", workers=1.5), TypeError, r"workers must be a positive integer"),
    ("k_eval zero", lambda: rpeg.solve(WF, CLUSTER, k_eval=0), ValueError, r"k_eval must be a positive integer"),
    ("k_eval bool", lambda: rpeg.solve(WF, CLUSTER, k_eval=True), TypeError, r"k_eval"),
    ("seed float", lambda: rpeg.solve(WF, CLUSTER, seed=0.5), TypeError, r"seed must be an integer"),
    ("objective", lambda: rpeg.solve(WF, CLUSTER, objective="speed"), ValueError, r"objective must be one of"),
    ("method unknown", lambda: rpeg.solve(WF, CLUSTER, method="fast"), ValueError, r"unknown method 'fast'"),
    ("method None", lambda: rpeg.solve(WF, CLUSTER, method=None), TypeError, r"method must be"),
    ("workload None", lambda: rpeg.solve(None, CLUSTER), TypeError, r"workload must be a rpeg\.Workload, got NoneType"),
    ("cluster string", lambda: rpeg.solve(WF, "1x4x4"), TypeError, r"cluster must be a rpeg\.Cluster, got str"),
    ("Workload models None", lambda: rpeg.Workload(algorithm="ppo", models=None, batch=1, rollouts=1, prompt_len=1, response_len=1), TypeError, r"workload\.models must be a mapping"),
    ("Workload batch float", lambda: rpeg.Workload(algorithm="grpo", models={"actor": rpeg.model_preset("7b"), "reward": rpeg.model_preset("7b")}, batch=2.5, rollouts=1, prompt_len=1, response_len=1), TypeError, r"workload\.batch"),
    ("Workload ac_sharing string", lambda: rpeg.Workload(algorithm="grpo", models={"actor": rpeg.model_preset("7b"), "reward": rpeg.model_preset("7b")}, batch=2, rollouts=1, prompt_len=1, response_len=4, ac_sharing="no"), TypeError, r"workload\.ac_sharing"),
    ("Workload quantile length float", lambda: rpeg.Workload(algorithm="grpo", models={"actor": rpeg.model_preset("7b"), "reward": rpeg.model_preset("7b")}, batch=2, rollouts=1, prompt_len=1, response_len=4, quantiles=((0.5, 1.5), (1.0, 4))), ValueError, r"quantiles\[0\]: length must be a whole number"),
    ("hardware_preset None", lambda: rpeg.hardware_preset(None), TypeError, r"hardware preset name must be a string"),
    ("load_hardware number", lambda: rpeg.load_hardware(3), TypeError, r"hardware must be a preset name"),
    ("model_preset None", lambda: rpeg.model_preset(None), TypeError, r"model preset name must be a string"),
    ("Cluster from bad shape", lambda: rpeg.Cluster.from_shape("4x4", rpeg.hardware_preset("h100")), ValueError, r"cluster shape must look like"),
    ("Cluster hardware string", lambda: rpeg.Cluster(1, 1, 8, "h100"), TypeError, r"hardware must be a Hardware"),
    ("from_json None", lambda: rpeg.Result.from_json(None), TypeError, r"source must be a path or JSON text"),
    ("from_json missing", lambda: rpeg.Result.from_json("/nonexistent/r.json"), InputError, r"result file '/nonexistent/r\.json' does not exist"),
    ("from_json text", lambda: rpeg.Result.from_json('{"format": "rpeg.result/1"}'), InputError, r"result JSON text: missing field 'workload'"),
    ("plan_transition None", lambda: rpeg.plan_transition(None, None, CLUSTER), TypeError, r"current must be a Plan or a sequence of EMUs, got NoneType"),
    ("plan_transition cluster", lambda: rpeg.plan_transition([], [], "1x4x4"), TypeError, r"cluster must be a rpeg\.Cluster"),
    ("plan_transition time_limit", lambda: rpeg.plan_transition([], [], CLUSTER, time_limit=-1), ValueError, r"time_limit"),
    ("plan_transition method", lambda: rpeg.plan_transition([], [], CLUSTER, method="fast"), ValueError, r"unknown transition method 'fast'"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "exc", "pattern"), [c[1:] for c in API_CASES], ids=[c[0] for c in API_CASES]
)
def test_bad_python_argument_names_it(call, exc, pattern):
    with pytest.raises(exc, match=pattern):
        call()


# ---------------------------------------------------------------------------- issue 33: seeds, solve()'s options
def _structure_of_another_workload():
    from rpeg.ir.templates import Structure

    return Structure("grpo", False, (("actor", 0),))


SOLVE_OPTION_CASES = [
    # a seed past OR-Tools' 32-bit random_seed was a TypeError deep in CP-SAT, naming no argument
    ("cpsat seed 2**70", lambda: rpeg.solve(WF, CLUSTER, method="cpsat", seed=2**70), ValueError, r"seed must be an integer in \[0, 2147483647\] .*got 1180591620717411303424"),
    ("sa seed negative", lambda: rpeg.solve(WF, CLUSTER, method="sa", seed=-1), ValueError, r"seed must be an integer in \[0, 2147483647\]"),
    ("dp seed 2**31", lambda: rpeg.solve(WF, CLUSTER, method="dp", seed=2**31), ValueError, r"seed must be an integer in \[0, 2147483647\]"),
    ("plan_transition seed 2**70", lambda: rpeg.plan_transition([], [], CLUSTER, seed=2**70), ValueError, r"seed must be an integer in \[0, 2147483647\]"),
    # options were used before they were checked: AttributeError deep inside, or silently ignored
    ("cpsat structure string", lambda: rpeg.solve(WF, CLUSTER, method="cpsat", structure="sync"), TypeError, r"structure must be a rpeg\.Structure \(one of rpeg\.structures\(workload\)\), got str 'sync'"),
    ("milp structure of another workload", lambda: rpeg.solve(WF, CLUSTER, method="milp", structure=_structure_of_another_workload()), ValueError, r"structure 'grpo ac=0 τ\(actor\)=0' does not fit the workload: structure\.algorithm 'grpo'"),
    ("milp solver int", lambda: rpeg.solve(WF, CLUSTER, method="milp", solver=123), TypeError, r"solver must be a MILP solver name such as 'highs', got int 123"),
    ("cpsat warm_start int", lambda: rpeg.solve(WF, CLUSTER, method="cpsat", warm_start=123), TypeError, r"warm_start must be 'concurrent', 'sa', a rpeg\.Plan or None, got int 123"),
    ("cpsat unit string", lambda: rpeg.solve(WF, CLUSTER, method="cpsat", unit="1"), TypeError, r"unit must be a positive number of seconds or None, got str '1'"),
    ("cpsat unit zero", lambda: rpeg.solve(WF, CLUSTER, method="cpsat", unit=0.0), ValueError, r"unit must be a positive finite number of seconds, got 0\.0"),
    ("dp structure of another workload", lambda: rpeg.solve(WF, CLUSTER, method="dp", structure=_structure_of_another_workload()), ValueError, r"structure 'grpo ac=0 τ\(actor\)=0' does not fit the workload"),
    ("sa structures string", lambda: rpeg.solve(WF, CLUSTER, method="sa", structures="sync"), TypeError, r"structures must be a non-empty list of Structures"),
    ("sa structures of another workload", lambda: rpeg.solve(WF, CLUSTER, method="sa", structures=[_structure_of_another_workload()]), ValueError, r"structures\[0\] 'grpo ac=0 τ\(actor\)=0' does not fit the workload"),
    ("sa backend int", lambda: rpeg.solve(WF, CLUSTER, method="sa", backend=1), TypeError, r"backend must be one of 'local', 'ray', got int 1"),
    ("sa address int", lambda: rpeg.solve(WF, CLUSTER, method="sa", backend="ray", address=6379), TypeError, r"address must be a Ray address \(str\) or None, got int 6379"),
    ("sa proposals zero", lambda: rpeg.solve(WF, CLUSTER, method="sa", proposals=0), ValueError, r"proposals must be a positive integer, got 0"),
    ("sa polish_share string", lambda: rpeg.solve(WF, CLUSTER, method="sa", polish_share="0.1"), TypeError, r"polish_share must be a number in \[0, 1\), got str '0\.1'"),
    ("sa candidates list", lambda: rpeg.solve(WF, CLUSTER, method="sa", candidates=[[]]), TypeError, r"candidates must be a positive integer, got list"),
    ("sa acceptance string", lambda: rpeg.solve(WF, CLUSTER, method="sa", acceptance="metropolis"), TypeError, r"acceptance must be callable or None, got str 'metropolis'"),
    ("sa moves string", lambda: rpeg.solve(WF, CLUSTER, method="sa", moves="single"), TypeError, r"moves must be a non-empty list of \(weight, Move\) pairs or None"),
    ("sa unknown option", lambda: rpeg.solve(WF, CLUSTER, method="sa", polish=False), ValueError, r"method 'sa' takes no option\(s\) polish; known: .*ablate"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("call", "exc", "pattern"), [c[1:] for c in SOLVE_OPTION_CASES], ids=[c[0] for c in SOLVE_OPTION_CASES]
)
def test_bad_solve_option_is_named_before_any_work(call, exc, pattern, monkeypatch):
    import rpeg.scoring.evaluator as evaluator

    def no_work(*args, **kwargs):
        raise AssertionError("an evaluator was built before the options were checked")

    monkeypatch.setattr(evaluator.Evaluator, "__init__", no_work)
    with pytest.raises(exc, match=pattern):
        call()


def test_numpy_integers_are_taken_for_solves_integers():
    np = pytest.importorskip("numpy")
    r = rpeg.solve(WF, CLUSTER, method="greedy", seed=np.int64(3), k_eval=np.int64(2))
    assert r.k_eval == 2 and type(r.k_eval) is int


PSPLIB_J30 = Path(__file__).resolve().parent / "data" / "psplib" / "j30.sm" / "j301_1.sm"

SEED_FLAG_CASES = [
    ("solve cpsat", ["solve", "ppo-1b-4gpu", "--method", "cpsat", "--seed", str(2**70)]),
    ("solve sa negative", ["solve", "ppo-1b-4gpu", "--method", "sa", "--seed", "-1"]),
    ("project cpsat", ["project", str(PSPLIB_J30), "--seed", str(2**70)]),
    ("project milp", ["project", str(PSPLIB_J30), "--method", "milp", "--seed", str(2**31)]),
    ("run", ["run", "{tmp}/r.json", "--seed", str(2**70)]),
]  # fmt: skip


@pytest.mark.parametrize("argv", [c[1] for c in SEED_FLAG_CASES], ids=[c[0] for c in SEED_FLAG_CASES])
def test_a_seed_flag_out_of_every_engines_range_exits_2_naming_it(tmp_path, capsys, argv):
    """issue 33: ``--seed 2**70`` reached OR-Tools, whose 32-bit ``random_seed`` raised a
    ``TypeError`` traceback (``solve --method cpsat``, ``project``)."""
    with pytest.raises(SystemExit) as info:
        main([a.format(tmp=tmp_path) for a in argv])
    out, err = capsys.readouterr()
    assert info.value.code == 2 and "Traceback" not in out + err
    assert re.search(r"error: argument --seed: must be an integer in \[0, 2147483647\]", err), err
