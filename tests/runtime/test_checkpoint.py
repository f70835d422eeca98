"""``runtime/trace/checkpoint.py``: step directories, file digests and the manifest a run rewrites
after each complete step (the refusals of corrupt checkpoints are in ``test_inputs.py``)."""

from __future__ import annotations

import hashlib
import json

from rpeg.runtime.trace.checkpoint import (
    MANIFEST,
    check_checkpoint,
    file_digest,
    step_dir_name,
    write_manifest,
)


def test_step_dir_name_is_zero_padded_and_sorts_by_step():
    names = [step_dir_name(k) for k in (2, 10, 1)]
    assert names[0] == "step00002"
    assert sorted(names) == [step_dir_name(1), step_dir_name(2), step_dir_name(10)]


def test_file_digest_is_the_sha256_and_size(tmp_path):
    f = tmp_path / "g0-r0.pt"
    f.write_bytes(b"rpeg" * 1000)
    digest = file_digest(f)
    assert digest == {"sha256": hashlib.sha256(b"rpeg" * 1000).hexdigest(), "bytes": 4000}


def test_write_manifest_lists_complete_steps_and_a_resume_takes_the_last(tmp_path):
    trainers = {0: 2, 3: 1}
    steps = {}
    for k in (0, 1):
        d = tmp_path / step_dir_name(k)
        d.mkdir()
        files = {}
        for gid, size in trainers.items():
            for r in range(size):
                f = d / f"g{gid}-r{r}.pt"
                f.write_bytes(bytes([k, gid, r]) * 50)
                files[f.name] = file_digest(f)
        steps[k] = files
    write_manifest(tmp_path, "ab" * 32, sorted(trainers), steps)
    doc = json.loads((tmp_path / MANIFEST).read_text())
    assert doc["complete_steps"] == [0, 1] and doc["plan_hash"] == "ab" * 32
    assert not list(tmp_path.glob("*tmp*"))  # written to a temporary name, then renamed
    resume = check_checkpoint(tmp_path, "ab" * 32, trainers)
    assert resume.global_step == 1 and resume.step_dir == tmp_path / step_dir_name(1) and resume.verified


def test_rewriting_keeps_earlier_steps_of_the_same_plan_only(tmp_path):
    files = {"g0-r0.pt": {"sha256": "0" * 64, "bytes": 1}}
    write_manifest(tmp_path, "a" * 64, [0], {1: files})
    write_manifest(tmp_path, "a" * 64, [0], {2: files})  # a resumed run writing into the same folder
    assert json.loads((tmp_path / MANIFEST).read_text())["complete_steps"] == [1, 2]
    write_manifest(tmp_path, "b" * 64, [0], {3: files})  # another plan starts over
    assert json.loads((tmp_path / MANIFEST).read_text())["complete_steps"] == [3]
