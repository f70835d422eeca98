"""A workload that names a local Hugging Face checkpoint (``actor = "path/to/dir"``) plans with
its shape and runs with its weights, at full size; a directory that no longer matches the plan
is refused before any worker starts, naming the model, the directory and the field."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("ray")

from rpeg import solve  # noqa: E402
from rpeg.costmodel import hardware_preset  # noqa: E402
from rpeg.ir import Cluster  # noqa: E402
from rpeg.ir.cluster import NO_SPLITS  # noqa: E402
from rpeg.ir.errors import InputError  # noqa: E402
from rpeg.ir.workload import load_workload  # noqa: E402
from rpeg.runtime.config import RLConfig  # noqa: E402
from rpeg.runtime.driver.runner import run  # noqa: E402
from rpeg.solvers.result import Result  # noqa: E402
from tests.runtime.engines.conftest import TINY_LLAMA  # noqa: E402

#: so small a learning rate that one Adam step moves no weight by more than ~1e-12
STILL = RLConfig(lr=1e-12, critic_lr=1e-12)


@pytest.fixture(scope="module", autouse=True)
def ray_instance(ray_session):
    """The session's local Ray instance (tests/runtime/conftest.py)."""


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory) -> tuple[Path, dict[str, torch.Tensor]]:
    """A tiny seeded LlamaForCausalLM saved with ``save_pretrained``, and its state."""
    import transformers

    directory = tmp_path_factory.mktemp("user-llama")
    torch.manual_seed(1)
    model = transformers.LlamaForCausalLM(transformers.LlamaConfig(**TINY_LLAMA)).float()
    model.save_pretrained(directory, safe_serialization=True)
    return directory, {k: v.detach().clone() for k, v in model.state_dict().items()}


def workload_file(tmp_path: Path, algorithm: str, models: dict[str, str]) -> Path:
    lines = [
        'name = "user-checkpoint"',
        f'algorithm = "{algorithm}"',
        "[batch]",
        "prompts = 16",
        f"rollouts = {4 if algorithm == 'grpo' else 1}",
        "prompt_len = 8",
        "response_len = 8",
        "[models]",
        *(f'{role} = "{path}"' for role, path in models.items()),
    ]
    path = tmp_path / "workload.toml"
    path.write_text("\n".join(lines) + "\n")
    return path


def plan(tmp_path: Path, algorithm: str, models: dict[str, str], shape: str = "1x1x2") -> Result:
    wl = load_workload(workload_file(tmp_path, algorithm, models)).workload
    return solve(
        wl,
        Cluster.from_shape(shape, hardware_preset("gh200"), max_zero_stage=2, **NO_SPLITS),
        "greedy",
    )


def test_the_workload_keeps_the_checkpoint_and_the_result_file_too(checkpoint, tmp_path):
    directory, _ = checkpoint
    result = plan(tmp_path, "grpo", {"actor": str(directory), "reward": str(directory)})
    spec = result.workload.models["actor"]
    assert spec.checkpoint == str(directory.resolve()) and spec.layers == TINY_LLAMA["num_hidden_layers"]
    again = Result.from_json(result.to_json())
    assert again.workload.models["actor"].checkpoint == spec.checkpoint
    # a config.json without weights plans the same shape and runs scaled, as before
    bare = tmp_path / "bare"
    bare.mkdir()
    shutil.copy(directory / "config.json", bare / "config.json")
    assert (
        plan(tmp_path, "grpo", {"actor": str(bare), "reward": str(bare)}).workload.models["actor"].checkpoint
        == ""
    )


def test_a_run_starts_from_the_checkpoint_weights(checkpoint, tmp_path):
    directory, state = checkpoint
    result = plan(
        tmp_path, "ppo", {"actor": str(directory), "reward": str(directory), "critic": str(directory)}
    )
    report = run(result, steps=1, rl=STILL, return_weights=True)
    assert report.problems == []
    actor = report.weights["actor"]
    for name, tensor in state.items():  # full size, the user's weights (one ~1e-12 Adam step)
        assert actor[name].shape == tensor.shape
        assert (actor[name] - tensor).abs().max().item() < 1e-9, name
    critic = report.weights["critic"]  # the backbone from the checkpoint, a seeded value head
    assert (critic["model.norm.weight"] - state["model.norm.weight"]).abs().max().item() < 1e-9
    assert critic["value_head.weight"].shape == (1, TINY_LLAMA["hidden_size"])


def test_a_changed_or_incomplete_directory_is_refused_before_any_worker(checkpoint, tmp_path):
    directory, _ = checkpoint
    copy = tmp_path / "copy"
    shutil.copytree(directory, copy)
    result = plan(tmp_path, "grpo", {"actor": str(copy), "reward": str(directory)})
    config = json.loads((copy / "config.json").read_text())
    (copy / "config.json").write_text(json.dumps(config | {"num_hidden_layers": 3}))
    with pytest.raises(InputError, match=r"model 'actor'.*layers is 3 in the directory, 2 in the plan"):
        run(result, steps=1)
    (copy / "config.json").write_text(json.dumps(config))
    for f in copy.glob("*.safetensors"):
        f.unlink()
    with pytest.raises(InputError, match=r"model 'actor'.*no \*\.safetensors"):
        run(result, steps=1)
    shutil.rmtree(copy)
    with pytest.raises(InputError, match=r"model 'actor'.*is not a directory"):
        run(result, steps=1)


def test_checkpoints_of_one_run_share_a_vocabulary(checkpoint, tmp_path):
    import transformers

    directory, _ = checkpoint
    other = tmp_path / "other-vocab"
    transformers.LlamaForCausalLM(
        transformers.LlamaConfig(**(TINY_LLAMA | {"vocab_size": 128}))
    ).save_pretrained(other, safe_serialization=True)
    result = plan(tmp_path, "grpo", {"actor": str(directory), "reward": str(other)})
    with pytest.raises(ValueError, match=r"actor \(vocab 256\) and reward \(vocab 128\)"):
        run(result, steps=1)
