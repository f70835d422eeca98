"""The README's Python example runs as written (docs stay true)."""

import re
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"


def test_readme_python_example_runs(tmp_path, monkeypatch):
    blocks = re.findall(r"```python\n(.*?)```", README.read_text(), flags=re.S)
    assert blocks, "README has no python example"
    monkeypatch.chdir(tmp_path)
    namespace: dict = {}
    exec(compile(blocks[0], "README.md", "exec"), namespace)
    assert namespace["result"].feasible
    assert namespace["again"].throughput == namespace["result"].throughput
    assert (tmp_path / "plan.json").is_file()


def test_readme_gives_exactly_the_two_setup_commands():
    text = README.read_text()
    setup = text[text.index("## Set up") : text.index("## Python")]
    commands = re.findall(r"^make \w+", setup, flags=re.M)
    assert commands == ["make demo", "make test"]
