"""Published pre-training throughput against rpeg's prediction of the same layout (issue 31).

The rows are NVIDIA's Megatron-Bridge performance summaries (``docs/performance-summary.md``
and ``docs/performance-summary-archive.md`` of NVIDIA-NeMo/Megatron-Bridge, copied with every
configuration field into ``benchmarks/data/megatron_bridge_performance.json`` with the commit
and path they came from). For each row rpeg can express, a pre-training step is one training
vertex: :func:`rpeg.costmodel.time.op_time` with ``Role.TRAINING`` prices the row's exact
layout on the matching hardware preset, and

    predicted tokens/s/GPU = GBS·ℓ / (T_step · N_GPU),

``T_step`` the op's total, ``GBS`` the global batch in sequences, ``ℓ`` the sequence length.
The layout (:func:`row_strategy`): ``Pt = TP``, ``Pp = PP``, ``Pc = CP``, ``Pe = EP``,
``Pd = N_GPU/(TP·PP·CP)``, ``mb = GBS/(Pd·MBS)`` microbatches of ``MBS`` sequences, ZeRO stage 1
(Megatron's distributed optimizer; stage 3 where the row publishes FSDP), sequence parallelism
when ``TP > 1``, no activation recomputation, full-length unpacked sequences (the tables do not
publish the recomputation or sequence-parallel settings: these are Megatron-Bridge's usual
performance settings, an assumption). Link tiers follow Megatron-core's rank order, as the
published runs laid their ranks out (``parallel_state``'s default ``order="tp-cp-ep-dp-pp"``:
tensor innermost, then context, data, pipeline outermost; expert groups ``etp-ep-dp-pp`` with
``ETP`` the row's expert-TP) on nodes of the preset's ``gpus_per_node`` and "racks" of
32 DGX nodes (a DGX SuperPOD scalable unit) or 18 GB200 compute trays (one NVL72 rack).

A mixture of experts' routed experts run whole on one rank, ``etp = 1`` (:data:`RECIPE_ETP`:
Megatron-Bridge's MoE recipes set ``expert_tensor_parallel_size = 1``; the tables do not
publish it), so its ``Pe`` expert-parallel ranks are drawn from the ``TP·DP·CP`` ranks
(Megatron-core's MoE parallel folding) and EP must divide ``TP·DP·CP``; its router balances
exactly, ``λ = 1`` (:data:`RECIPE_LOAD_IMBALANCE`: the recipes force load balancing).

A mixture of experts runs the token dispatcher and the AlltoAll overlap its performance recipe
sets: the newest table's from Megatron-Bridge's ``perf_recipes`` at the data commit
(:data:`RECIPES`, :func:`row_recipe`, ``--refresh-recipes GIT_DIR``), an archived table's from
the ``scripts/performance/configs`` workload config of its release with the row's layout
(:data:`RELEASE_RECIPES`, :func:`release_recipe`, ``--refresh-release-recipes GIT_DIR``; the
release tag nearest in time to the commit that published the table, an assumption), or the data
commit's recipe where that release has no config with the row's layout. A row its table marks
as measured under a known performance regression (:func:`regression_note`) is priced and shown
but kept out of every statistic and fit. Two figures are fitted to these rows, as
issue 31 allows (one efficiency per operation class and GPU generation, fitted on one table and
reported on the others): the expert-layer efficiency of MoE training (:data:`EXPERT_EFFICIENCY`,
:func:`fit_expert_efficiency`, on the newest table; reported on the older tables and on
Megatron-Bridge's controlled H100 runs, :data:`BRIDGE_MOE_RUNS`) and the NVFP4 GEMMs' efficiency
on Blackwell (:data:`FP4_EFFICIENCY`, :func:`fit_fp4_efficiency`). The rest is the baseline of
the presets as they are.

Precision (:data:`PRECISIONS`): BF16 rows run with ``precision = "bf16"``; the FP8 recipes
(``FP8`` delayed scaling, ``FP8-CS`` current scaling, ``FP8-MX``/``MXFP8`` block scaling on
Blackwell) are all Transformer Engine FP8 GEMMs and run with ``precision = "fp8"``
(``docs/cost-model.md`` §11: the FP8 peak for the blocks' weight GEMMs, 1-byte weights and
inputs in the roofline, BF16 weights and optimizer state); the NVFP4 recipe (TE's
``NVFP4BlockScaling``) runs with ``precision = "nvfp4"`` (the same GEMMs at the presets' NVFP4
peak with 0.5625-byte operands). Statistics are reported per precision and per published recipe.

Rows it cannot express are listed with the reason: a precision its table does not publish, a
cell that publishes two configurations, a layout that does not divide. Every published system has a preset
(:data:`SYSTEMS`; DGX-B300 and DGX-GB300 since issue 31's Blackwell Ultra presets). An interleaved virtual pipeline (``VP`` > 1) is priced with rpeg's ``vp``
(``docs/cost-model.md`` §12), also where the row's layer count needs Megatron's custom pipeline
layout (DeepSeek-V3's 61 layers, Qwen3-235B's 94): ``L/Pp`` layers per stage in ``vp`` chunks. ``--refresh GIT_DIR`` rebuilds the data file from a Megatron-Bridge git directory.

``--generation`` is the generation half: GPUStack's performance-lab vLLM serving results
(``benchmarks/data/vllm_serving.json``, rebuilt by ``--refresh-vllm GIT_DIR`` from a
gpustack/gpustack git directory) against :func:`rpeg.costmodel.time.generation_times` of the
same run (:func:`vllm_predict`), section ``gpu-fidelity-generation``; nothing is fitted there
either.

``--megatron-lm`` is the held-out A100 comparison: Table 1 of Narayanan et al. (SC'21), ten GPT
models from 1.7B to 1T parameters on up to 3072 A100s (``benchmarks/data/megatron_lm_a100.json``,
every configuration field from the authors' ``examples/sc21/run_table_1.sh``), each row's exact
layout priced on ``a100-80gb`` with link tiers from Megatron's rank order
(:func:`megatron_lm_strategy`) and converted to teraFLOP/s per GPU with the paper's own FLOP
count (:func:`megatron_lm_flops`); section ``gpu-fidelity-a100``; nothing is fitted to it.
"""

from __future__ import annotations

import argparse
import functools
import json
import math
import re
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATA = HERE / "data" / "megatron_bridge_performance.json"
REPO = "NVIDIA-NeMo/Megatron-Bridge"
DOCS = ("docs/performance-summary.md", "docs/performance-summary-archive.md")

#: Published model name → rpeg model preset (``None``: built here, :func:`model_spec`).
MODELS = {
    "LLAMA3_70B": "llama3.3-70b",  # Llama-3 70B and 3.3 70B share the shape
    "LLAMA3.1_405B": None,
    "Qwen3_30B_a3B": "qwen3-30b-a3b",
    "Qwen3_235B_a22B": "qwen3-235b-a22b",
    "DeepSeekV3": "deepseek-v3",
    "GPT OSS 120B": "gpt-oss-120b",
}
#: Published system → (rpeg hardware preset, nodes per "rack" for the link tiers).
SYSTEMS = {
    "DGX-H100": ("h100", 32),
    "DGX-B200": ("b200", 32),
    "DGX-B300": ("b300", 32),
    "DGX-GB200": ("gb200-nvl72", 18),
    "DGX-GB300": ("gb300-nvl72", 18),
}
#: The routed experts' tensor-parallel degree the rows ran with, which the tables do not publish:
#: Megatron-Bridge's MoE recipes set ``expert_tensor_parallel_size = 1`` (at the data file's commit
#: 067f987: ``src/megatron/bridge/recipes/qwen/h100/qwen3_moe.py`` for every Qwen3-MoE layout,
#: ``perf_recipes/deepseek/common.py`` for DeepSeek-V3, ``perf_recipes/gpt_oss/*/gpt_oss.py``), so
#: each expert is whole on one rank and the EP group folds into the TP·DP·CP ranks.
RECIPE_ETP = 1
#: The expert-parallel load imbalance ``λ`` the MoE rows run with: 1, the router balanced exactly
#: (Megatron-Bridge's performance recipes set ``moe_router_force_load_balancing = True``, read at
#: the data commit in ``src/megatron/bridge/perf_recipes/{qwen,deepseek,gpt_oss}``, and its
#: ``scripts/performance`` sets it whenever tokens are not dropped), not the model's default
#: (SPEC's 1.2, :attr:`~rpeg.ir.models.ModelSpec.load_imbalance`).
RECIPE_LOAD_IMBALANCE = 1.0
#: Published training precision → rpeg's :attr:`~rpeg.ir.models.ModelSpec.precision`. Megatron-Bridge's
#: FP8 recipes (``--fp8-recipe`` delayed, tensorwise = "CS" current scaling, mxfp8 = "MX" block
#: scaling) differ in their scaling factors, not in what runs in FP8 (TE's linear layers' GEMMs).
#: NVFP4 is Megatron-Bridge's ``bf16_with_nvfp4_mixed`` (TE's ``NVFP4BlockScaling``: the same
#: GEMMs in NVFP4), rpeg's ``"nvfp4"``.
PRECISIONS = {
    "BF16": "bf16",
    "NVFP4": "nvfp4",
    "FP8": "fp8",
    "FP8-CS": "fp8",
    "FP8-MX": "fp8",
    "MXFP8": "fp8",
    "FP8-CS (FP8-MX)": "fp8",
}
REQUIRED = ("release", "model", "system", "gpus", "precision", "gbs", "mbs", "seq_len", "tp", "pp")
REQUIRED += ("cp", "vp", "ep", "tokens_per_s_per_gpu", "source")

_COLUMNS = {
    "System": "system",
    "Model": "model",
    "#-GPUs": "gpus",
    "Precision": "precision",
    "GBS": "gbs",
    "MBS": "mbs",
    "Sequence Length": "seq_len",
    "FSDP": "fsdp",
    "TP": "tp",
    "PP": "pp",
    "CP": "cp",
    "VP": "vp",
    "EP": "ep",
    "ETP": "etp",
    "GA": "ga",
    "Tokens / sec / GPU": "tokens_per_s_per_gpu",
    "Model TFLOP / sec / GPU": "model_tflops_per_gpu",
}


def _cell(text: str) -> int | float | str | None:
    """A table cell: an int or float when it is one plain number, ``None`` for ``n/a``, else the
    text as published (``"37556 (36108)"``: two configurations in one cell)."""
    text = text.strip()
    if text.lower() == "n/a":
        return None
    text = re.sub(r"\[\^[^\]]*\]", "", text).strip()  # footnote markers
    if re.fullmatch(r"-?\d+", text):
        return int(text)
    if re.fullmatch(r"-?\d+\.\d*", text):
        return float(text)
    return text


def _canonical_model(name: str) -> str | None:
    """The :data:`MODELS` key a published model name (``"DeepSeekV3 (w/o MTP)"``) is, or ``None``."""
    base = name.split("(")[0].strip()
    return base if base in MODELS else None


def parse_summary(text: str, path: str, commit: str) -> list[dict[str, Any]]:
    """The pre-training rows of one performance-summary markdown file, every column kept.

    Tables sit under ``## <release> NeMo Container`` / ``### Pre-Training Performance`` and a
    ``#### Model: <name>`` or ``#### System: <name>`` heading; SFT and LoRA tables are skipped,
    and so are models outside :data:`MODELS`. A row whose cells carry footnote markers
    (``661[^gpt-oss-note]``) keeps the footnotes' text, as published, in ``notes``.
    """
    footnotes = dict(re.findall(r"^\[\^([^\]]+)\]:\s*(.+?)\s*$", text, flags=re.M))
    rows: list[dict[str, Any]] = []
    release = section = heading = None
    header: list[str] | None = None
    for line in text.splitlines():
        if m := re.match(r"^## (.+?) NeMo Container", line):
            release, section, header = m.group(1), None, None
        elif m := re.match(r"^### (.+)", line):
            section, header = m.group(1).strip(), None
        elif m := re.match(r"^#### (Model|System): (.+)", line):
            heading, header = (m.group(1).lower(), m.group(2).strip()), None
        elif line.startswith("|") and section == "Pre-Training Performance" and heading:
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if header is None:
                header = cells
                unknown = [c for c in cells if c not in _COLUMNS]
                if unknown:
                    raise ValueError(f"{path}: unknown column(s) {unknown} in release {release}")
                continue
            if set(line) <= set("|- "):
                continue
            row: dict[str, Any] = {"release": release}
            row[heading[0]] = heading[1]
            for name, value in zip(header, cells, strict=True):
                row[_COLUMNS[name]] = _cell(value)
            model = _canonical_model(str(row["model"]))
            if model is None:
                continue
            row["model_key"] = model
            marks = re.findall(r"\[\^([^\]]+)\]", line)
            if marks:
                row["notes"] = [footnotes[m] for m in dict.fromkeys(marks)]
            row.setdefault("precision", None)  # 25.09's tables have no precision column
            row.setdefault("etp", None)  # no table publishes ETP
            row["source"] = {
                "repo": REPO,
                "commit": commit,
                "path": path,
                "table": f"{release} / {heading[1]}",
            }
            rows.append(row)
    return rows


def refresh(git_dir: str) -> None:
    """Rebuild :data:`DATA` from the ``HEAD`` of a Megatron-Bridge git directory."""
    git = ["git", "-C", git_dir]
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    rows = []
    for path in DOCS:
        text = subprocess.run(
            [*git, "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
        ).stdout
        rows += parse_summary(text, path, commit)
    doc = {
        "source": f"https://github.com/{REPO}/blob/{commit}/ ({', '.join(DOCS)})",
        "commit": commit,
        "note": "Pre-training rows of the listed models, every column as published; n/a is null; a cell "
        "with two configurations is kept as text. precision is null where the table has no column for it.",
        "rows": rows,
    }
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(rows)} rows to {DATA}")


#: How each mixture-of-experts row's recipe ran its experts' communication:
#: ``benchmarks/data/megatron_bridge_moe_recipes.json``, rebuilt by ``--refresh-recipes GIT_DIR``
#: (:func:`refresh_recipes`) from Megatron-Bridge's performance recipes at the data file's commit.
RECIPES = HERE / "data" / "megatron_bridge_moe_recipes.json"
#: Published model, system and precision → the names of Megatron-Bridge's performance recipes
#: (``src/megatron/bridge/perf_recipes/<family>/<system>/*.py``:
#: ``<model>_pretrain_<N>gpu_<system>_<precision>_config``). The tables' plain "FP8" is the
#: current-scaling recipe (``fp8cs``; the H100 delayed-scaling ``fp8ds`` recipes call it and
#: change nothing this benchmark reads).
RECIPE_MODELS = {
    "Qwen3_30B_a3B": "qwen3_30b_a3b",
    "Qwen3_235B_a22B": "qwen3_235b_a22b",
    "DeepSeekV3": "deepseek_v3",
    "GPT OSS 120B": "gpt_oss_120b",
}
RECIPE_SYSTEMS = {
    "DGX-H100": "h100",
    "DGX-B200": "b200",
    "DGX-B300": "b300",
    "DGX-GB200": "gb200",
    "DGX-GB300": "gb300",
}
RECIPE_PRECISIONS = {
    "BF16": "bf16",
    "FP8": "fp8cs",
    "FP8-CS": "fp8cs",
    "FP8-MX": "fp8mx",
    "MXFP8": "fp8mx",
    "NVFP4": "nvfp4",
}
#: The recipe settings read: the token dispatcher (``alltoall`` unless a recipe sets it: every
#: model bridge of these four models sets ``provider.moe_token_dispatcher_type = "alltoall"``),
#: its flex backend, the AlltoAll overlap (``comm_overlap.overlap_moe_expert_parallel_comm``),
#: recomputation and CUDA graphs (recorded, not priced).
RECIPE_KEYS = (
    "moe_token_dispatcher_type",
    "moe_flex_dispatcher_backend",
    "overlap_moe_expert_parallel_comm",
    "recompute_granularity",
    "recompute_modules",
    "cuda_graph_impl",
    "expert_model_parallel_size",
)


def recipe_name(row: dict[str, Any]) -> str | None:
    """The Megatron-Bridge performance recipe a MoE row's configuration names, or ``None``."""
    model = RECIPE_MODELS.get(row["model_key"])
    prec = RECIPE_PRECISIONS.get(row["precision"] or "")
    system = RECIPE_SYSTEMS.get(row["system"])
    if model is None or prec is None or system is None:
        return None
    return f"{model}_pretrain_{row['gpus']}gpu_{system}_{prec}_config"


def _literal(node: Any) -> Any:
    """A recipe's value as Python data where it is a literal, else its source text."""
    import ast

    try:
        return ast.literal_eval(node)
    except ValueError:
        return ast.unparse(node)


def recipe_settings(sources: dict[str, str]) -> dict[str, dict[str, Any]]:
    """:data:`RECIPE_KEYS` of every function of the recipe modules ``sources`` (dotted module →
    Python source), read without importing them (they need Megatron-core and a GPU stack): each
    function's statements in order, a call to another function of these modules (its own, an
    imported one under its alias, ``cfg = base_config()``) replayed where it stands, an assignment
    ``cfg.<…>.<key> = literal`` recorded, and ``cfg.comm_overlap = CommOverlapConfig(...)``
    resetting the overlap to its keyword (``False`` without one). Statements under ``if`` are
    not read (none of the four models' recipes sets these keys under one at the data commit)."""
    import ast

    trees = {mod: ast.parse(src) for mod, src in sources.items()}
    defs: dict[tuple[str, str], ast.FunctionDef] = {}
    alias: dict[tuple[str, str], tuple[str, str]] = {}
    for mod, tree in trees.items():
        for node in tree.body:
            if isinstance(node, ast.FunctionDef):
                defs[mod, node.name] = node
            elif isinstance(node, ast.ImportFrom) and node.module:
                for a in node.names:
                    alias[mod, a.asname or a.name] = (node.module, a.name)

    def target(mod: str, name: str, depth: int = 0) -> tuple[str, str] | None:
        if (mod, name) in defs:
            return mod, name
        if (mod, name) in alias and depth < 8:
            return target(*alias[mod, name], depth=depth + 1)
        return None

    def run(key: tuple[str, str], state: dict[str, Any], depth: int) -> None:
        mod = key[0]

        def call(node: ast.expr) -> None:
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and depth < 12:
                callee = target(mod, node.func.id)
                if callee is not None:
                    run(callee, state, depth + 1)

        for stmt in defs[key].body:
            if isinstance(stmt, ast.Expr):
                call(stmt.value)
            elif isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                dest = ast.unparse(stmt.targets[0])
                leaf = dest.rsplit(".", 1)[-1]
                if dest == "cfg":
                    call(stmt.value)
                elif dest == "cfg.comm_overlap" and isinstance(stmt.value, ast.Call):
                    given = {k.arg: _literal(k.value) for k in stmt.value.keywords}
                    state["overlap_moe_expert_parallel_comm"] = given.get(
                        "overlap_moe_expert_parallel_comm", False
                    )
                elif leaf in RECIPE_KEYS:
                    state[leaf] = _literal(stmt.value)

    out = {}
    for mod, name in defs:
        if name.endswith("_config") and "_pretrain_" in name and ".perf_recipes." in f".{mod}.":
            state: dict[str, Any] = {}
            run((mod, name), state, 0)
            out[name] = {"module": mod, **state}
    return out


def refresh_recipes(git_dir: str) -> None:
    """Rebuild :data:`RECIPES` from a Megatron-Bridge git directory at the training data file's
    commit: the settings (:func:`recipe_settings`) of the recipe every MoE row names
    (:func:`recipe_name`), and which rows name none."""
    commit = json.loads(DATA.read_text())["commit"]
    git = ["git", "-C", git_dir]
    listing = subprocess.run(
        [
            *git,
            "ls-tree",
            "-r",
            "--name-only",
            commit,
            "src/megatron/bridge/perf_recipes",
            "src/megatron/bridge/recipes",
        ],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    sources = {}
    for path in listing:
        if path.endswith(".py"):
            text = subprocess.run(
                [*git, "show", f"{commit}:{path}"], check=True, capture_output=True, text=True
            ).stdout
            sources[path[len("src/") : -len(".py")].replace("/", ".").removesuffix(".__init__")] = text
    settings = recipe_settings(sources)
    wanted = {recipe_name(r) for r in load_rows() if r["model_key"] in RECIPE_MODELS} - {None}
    recipes = {
        name: {"path": "src/" + settings[name].pop("module").replace(".", "/") + ".py", **settings[name]}
        for name in sorted(wanted & settings.keys())
    }
    doc = {
        "source": f"https://github.com/{REPO}/tree/{commit}/src/megatron/bridge/perf_recipes",
        "commit": commit,
        "note": "Settings of the performance recipes the mixture-of-experts rows name, read from the recipe "
        "functions and the helpers and base recipes they call (benchmarks/gpu_fidelity.py recipe_settings). "
        "A key a recipe does not set is absent: the dispatcher is then the model bridge's alltoall and the "
        "AlltoAll overlap off.",
        "missing": sorted(wanted - settings.keys()),
        "recipes": recipes,
    }
    RECIPES.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"wrote {len(recipes)} recipes ({len(doc['missing'])} named but absent) to {RECIPES}")


#: The older tables' recipes: ``benchmarks/data/megatron_bridge_release_recipes.json``, rebuilt by
#: ``--refresh-release-recipes GIT_DIR`` (:func:`refresh_release_recipes`) from the
#: performance-workload configs of the Megatron-Bridge release that ran each archived table.
RELEASE_RECIPES = HERE / "data" / "megatron_bridge_release_recipes.json"
#: Published model → the prefix of its workload configs' names in ``scripts/performance/configs``
#: (``QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1``): the recipe names' model, upper-cased.
WORKLOAD_MODELS = {key: name.upper() for key, name in RECIPE_MODELS.items()}
#: Published precision → the workload configs' precision token. The tables' plain "FP8" is the
#: current-scaling recipe, as in :data:`RECIPE_PRECISIONS`.
WORKLOAD_PRECISIONS = {
    "BF16": "BF16",
    "FP8": "FP8_CS",
    "FP8-CS": "FP8_CS",
    "FP8-MX": "FP8_MX",
    "MXFP8": "FP8_MX",
    "NVFP4": "NVFP4",
}
#: A workload config's layout fields and the row fields they must equal for the config to be the
#: one a row ran (``WorkloadBaseConfig``'s defaults fill what a config does not set).
WORKLOAD_LAYOUT = {
    "num_gpus": "gpus",
    "tensor_model_parallel_size": "tp",
    "pipeline_model_parallel_size": "pp",
    "context_parallel_size": "cp",
    "virtual_pipeline_model_parallel_size": "vp",
    "expert_model_parallel_size": "ep",
    "global_batch_size": "gbs",
    "micro_batch_size": "mbs",
}


def release_tags(git_dir: str) -> dict[str, dict[str, str]]:
    """For each release the archive publishes a table of: the Megatron-Bridge release tag
    (``vX.Y.Z``) nearest in time to the commit that first published the table, with both
    dates. NVIDIA's container of a release packages the Megatron-Bridge release cut beside it
    (the v0.6.0 README: Megatron-Bridge "serves as the packaging layer for the NeMo 26.06
    training stack"), and each table went in within days of a tag (26.04: 2026-04-17, v0.4.0
    2026-04-16); which commit ran each benchmark is not published, so the nearest tag is an
    assumption, stated in the data file."""
    import datetime

    git = ["git", "-C", git_dir]

    def out(*args: str) -> str:
        return subprocess.run([*git, *args], check=True, capture_output=True, text=True).stdout

    tags = {}
    for tag in out("tag", "--list", "v*").split():
        if re.fullmatch(r"v\d+\.\d+\.\d+", tag):
            tags[tag] = out("log", "-1", "--format=%cs", tag).strip()
    commit = json.loads(DATA.read_text())["commit"]
    found = {}
    for release in sorted(
        {r["release"] for r in load_rows() if r["source"]["path"] != DOCS[0]}, key=release_key
    ):
        first = out(
            "log", "--reverse", "--format=%H %cs", f"-S## {release} NeMo Container", commit, "--", DOCS[0]
        )
        sha, date = first.split("\n", 1)[0].split()
        day = datetime.date.fromisoformat(date)
        tag = min(tags, key=lambda t: (abs((datetime.date.fromisoformat(tags[t]) - day).days), t))
        found[release] = {"tag": tag, "tag_date": tags[tag], "published": date, "published_commit": sha}
    return found


def workload_settings(sources: dict[str, str], defaults: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every module-level workload config of the ``*workload_base_configs.py`` sources (path →
    Python source), read without importing them: ``NAME = WorkloadBaseConfig(k=v, ...)`` on
    ``defaults`` (``WorkloadBaseConfig``'s field defaults), ``NAME = replace(BASE, k=v, ...)`` on
    ``BASE``'s settings and ``NAME = OTHER`` as ``OTHER``'s; non-literal values are kept as
    their source text."""
    import ast

    out: dict[str, dict[str, Any]] = {}
    for src in sources.values():
        for node in ast.parse(src).body:
            if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
                continue
            name, value = node.targets[0], node.value
            if not isinstance(name, ast.Name):
                continue
            if isinstance(value, ast.Name) and value.id in out:
                out[name.id] = dict(out[value.id])
            elif isinstance(value, ast.Call) and isinstance(value.func, ast.Name):
                kw = {k.arg: _literal(k.value) for k in value.keywords if k.arg}
                if value.func.id == "WorkloadBaseConfig":
                    out[name.id] = {**defaults, **kw}
                elif value.func.id == "replace" and value.args and isinstance(value.args[0], ast.Name):
                    base = value.args[0].id
                    if base in out:
                        out[name.id] = {**out[base], **kw}
    return out


def _workload_defaults(source: str) -> dict[str, Any]:
    """``WorkloadBaseConfig``'s field defaults, read from ``scripts/performance/utils/utils.py``."""
    import ast

    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "WorkloadBaseConfig":
            return {
                stmt.target.id: ast.literal_eval(stmt.value)
                for stmt in node.body
                if isinstance(stmt, ast.AnnAssign)
                and isinstance(stmt.target, ast.Name)
                and stmt.value is not None
            }
    raise ValueError("no WorkloadBaseConfig class in scripts/performance/utils/utils.py")


def flex_systems(source: str) -> dict[str, list[str]]:
    """The systems on which ``apply_flex_dispatcher_backend`` (``src/megatron/bridge/training/
    flex_dispatcher_backend.py`` at one release) turns each flex backend on; elsewhere it skips
    it and the AlltoAll dispatcher stays. Read from the two device checks the releases have had:
    HybridEP on GB200/GB300 only (``device_properties.name in ["NVIDIA GB200", "NVIDIA GB300"]``,
    to v0.2.x) or on every compute capability 8–10 (``major in [8, 9, 10]``, since v0.3.0);
    DeepEP on capability 8–9 and the B200/B300 by name (every release)."""
    deepep = ["DGX-H100", "DGX-B200", "DGX-B300"]
    if '["NVIDIA GB200", "NVIDIA GB300"]' in source:
        hybridep = ["DGX-GB200", "DGX-GB300"]
    elif "major in [8, 9, 10]" in source:
        hybridep = ["DGX-H100", "DGX-B200", "DGX-B300", "DGX-GB200", "DGX-GB300"]
    else:
        raise ValueError("apply_flex_dispatcher_backend: neither known HybridEP device check found")
    if "major in [8, 9]" not in source or '"NVIDIA B200", "NVIDIA B300"' not in source:
        raise ValueError("apply_flex_dispatcher_backend: the known DeepEP device check was not found")
    return {"hybridep": hybridep, "deepep": deepep}


def release_recipe_report(priced: list[tuple[dict[str, Any], float, float]]) -> list[str]:
    """Summary lines of the archived tables' MoE rows: how many were priced with their release's
    workload config (:func:`release_recipe`) and how many with the data commit's recipe, and
    their MAPE priced each way."""
    archived = [
        (r, pub)
        for r, pub, _ in priced
        if model_spec(r["model_key"]).is_moe and r["source"]["path"] != DOCS[0]
    ]
    own = [(r, pub) for r, pub in archived if release_recipe(r) is not None]
    if not archived:
        return []

    def mape(items: list[tuple[dict[str, Any], float]], recipe: Callable[[dict[str, Any]], Any]) -> str:
        return f"{_mape([(pub, predict(r, recipe=recipe(r))) for r, pub in items]):.1f} %"

    tags = sorted({release_recipe(r)["tag"] for r, _ in own})  # type: ignore[index]
    return [
        "",
        f"Archived tables' mixture-of-experts rows, priced with the recipes of their release: {len(own)} of "
        f"{len(archived)} have a workload config with their layout at their release's tag ({', '.join(tags)}); "
        f"the other {len(archived) - len(own)} are priced with the data commit's recipe.",
        "",
        f"- the {len(own)} rows: MAPE {mape(own, release_recipe)} with their release's config, "
        f"{mape(own, row_recipe)} with the data commit's recipe (the pricing before 2026-12-07)",
    ]


def refresh_release_recipes(git_dir: str) -> None:
    """Rebuild :data:`RELEASE_RECIPES`: for each archived table, its release tag
    (:func:`release_tags`), that tag's pre-training workload configs of the four MoE models
    (:func:`workload_settings`) and its flex backends' systems (:func:`flex_systems`)."""
    git = ["git", "-C", git_dir]

    def show(ref: str, path: str) -> str:
        return subprocess.run(
            [*git, "show", f"{ref}:{path}"], check=True, capture_output=True, text=True
        ).stdout

    releases = {}
    for release, info in release_tags(git_dir).items():
        tag = info["tag"]
        listing = subprocess.run(
            [*git, "ls-tree", "-r", "--name-only", tag, "scripts/performance/configs"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.split()
        sources = {p: show(tag, p) for p in listing if p.endswith("workload_base_configs.py")}
        settings = workload_settings(
            sources, _workload_defaults(show(tag, "scripts/performance/utils/utils.py"))
        )
        keep = ("moe_flex_dispatcher_backend", "moe_a2a_overlap", "cuda_graph_impl", *WORKLOAD_LAYOUT)
        configs = {
            name: {k: v[k] for k in keep if k in v}
            for name, v in sorted(settings.items())
            if any(name.startswith(m + "_") for m in WORKLOAD_MODELS.values())
            and ("_PRETRAIN_CONFIG_" in name or name.endswith("_BASE_CONFIG"))
        }
        flex = flex_systems(show(tag, "src/megatron/bridge/training/flex_dispatcher_backend.py"))
        releases[release] = {**info, "flex_systems": flex, "configs": configs}
    doc = {
        "source": f"https://github.com/{REPO} (scripts/performance/configs at each release tag)",
        "note": "For each table of the performance-summary archive: the Megatron-Bridge release tag nearest in "
        "time to the commit that first published it (an assumption: which commit ran each benchmark is not "
        "published), that tag's pre-training workload configs of the four mixture-of-experts models "
        "(WorkloadBaseConfig defaults filled in; benchmarks/gpu_fidelity.py workload_settings), and the "
        "systems on which its apply_flex_dispatcher_backend turns each flex backend on.",
        "releases": releases,
    }
    RELEASE_RECIPES.write_text(json.dumps(doc, indent=1) + "\n")
    n = sum(len(r["configs"]) for r in releases.values())
    print(f"wrote {len(releases)} releases ({n} workload configs) to {RELEASE_RECIPES}")


def release_recipe(row: dict[str, Any], releases: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """The recipe settings an archived table's MoE row ran with, from its release's workload
    config (:data:`RELEASE_RECIPES`): the config of the row's model, system and precision
    (``<MODEL>_PRETRAIN_CONFIG_<SYSTEM>_<PRECISION>[_<variant>]``, v0.2.x's
    ``<MODEL>_<SYSTEM>_<PRECISION>_BASE_CONFIG``) whose
    layout (:data:`WORKLOAD_LAYOUT`) is the row's, as :func:`row_recipe`'s keys — the flex
    dispatcher where the config names a backend that release turns on for the system, the
    AlltoAll overlap where it sets ``moe_a2a_overlap`` (the performance scripts'
    ``_set_moe_a2a_overlap_overrides`` sets ``overlap_moe_expert_parallel_comm``), and
    ``"config"``, ``"tag"``. ``None`` when the row's release has no entry (the newest table) or
    no config has its layout."""
    releases = releases if releases is not None else _release_recipes()
    entry = releases.get(row.get("release", ""))
    model = WORKLOAD_MODELS.get(row["model_key"])
    prec = WORKLOAD_PRECISIONS.get(row["precision"] or "")
    system = RECIPE_SYSTEMS.get(row["system"])
    if entry is None or model is None or prec is None or system is None:
        return None
    # the names since v0.3.0, and v0.2.x's (pre-training implied)
    names = rf"{model}_PRETRAIN_CONFIG_{system.upper()}_{prec}(_[A-Z0-9]+)?|{model}_{system.upper()}_{prec}_BASE_CONFIG"
    matches = [
        (name, cfg)
        for name, cfg in entry["configs"].items()
        if re.fullmatch(names, name)
        and all((cfg.get(k) or 1) == (row.get(f) or 1) for k, f in WORKLOAD_LAYOUT.items())
    ]
    if not matches:
        return None
    name, cfg = matches[0]
    backend = cfg.get("moe_flex_dispatcher_backend")
    flex = backend in entry["flex_systems"] and row["system"] in entry["flex_systems"][backend]
    return {
        "moe_token_dispatcher_type": "flex" if flex else "alltoall",
        "moe_flex_dispatcher_backend": backend,
        "overlap_moe_expert_parallel_comm": cfg.get("moe_a2a_overlap") is True,
        "config": name,
        "tag": entry["tag"],
    }


@functools.cache
def _release_recipes() -> dict[str, Any]:
    """:data:`RELEASE_RECIPES`' releases, read once."""
    return json.loads(RELEASE_RECIPES.read_text())["releases"]


def load_recipes(path: Path = RECIPES) -> dict[str, dict[str, Any]]:
    """The MoE rows' recipe settings (:data:`RECIPES`), by recipe name."""
    return json.loads(path.read_text())["recipes"]


def row_recipe(
    row: dict[str, Any], recipes: dict[str, dict[str, Any]] | None = None
) -> dict[str, Any] | None:
    """The settings of the recipe a MoE row names, or ``None`` (a dense row, or no such recipe
    at the data commit)."""
    name = recipe_name(row)
    return None if name is None else (recipes if recipes is not None else _recipes()).get(name)


@functools.cache
def _recipes() -> dict[str, dict[str, Any]]:
    """:func:`load_recipes`, read once."""
    return load_recipes()


def _load(path: Path, required: tuple[str, ...] | list[str]) -> list[dict[str, Any]]:
    """A data file's rows, each checked for the ``required`` fields.

    Raises
    ------
    ValueError
        Naming the row and the missing field.
    """
    doc = json.loads(path.read_text())
    for i, row in enumerate(doc["rows"]):
        missing = [f for f in required if f not in row]
        if missing:
            raise ValueError(f"{path.name}: row {i} lacks {missing}")
    return doc["rows"]


def load_rows(path: Path = DATA) -> list[dict[str, Any]]:
    """The training data file's rows, each checked for :data:`REQUIRED` fields (:func:`_load`)."""
    return _load(path, REQUIRED)


def model_spec(key: str) -> Any:
    """The rpeg :class:`~rpeg.ir.models.ModelSpec` of a :data:`MODELS` key. Llama 3.1 405B has
    no preset: its shape is the published config (meta-llama/Llama-3.1-405B config.json: 126
    layers, hidden 16384, FFN 53248, 128 heads, 8 KV heads, vocabulary 128256)."""
    from rpeg.ir.models import ModelSpec, model_preset

    name = MODELS[key]
    if name is not None:
        return model_preset(name)
    return ModelSpec(
        name="llama3.1-405b", layers=126, hidden=16384, ffn_hidden=53248, vocab=128256, heads=128, kv_heads=8
    )


def _tier(ranks: list[int], gpus_per_node: int, nodes_per_rack: int) -> int:
    """0 when the ranks share a node, 1 a rack, else 2 (ranks laid out node by node)."""
    nodes = {r // gpus_per_node for r in ranks}
    if len(nodes) <= 1:
        return 0
    return 1 if len({n // nodes_per_rack for n in nodes}) == 1 else 2


def why_not(row: dict[str, Any]) -> str | None:
    """Why rpeg cannot express ``row``, or ``None`` when it can."""
    if row["precision"] is None:
        return "precision not published in its table"
    if row["precision"] not in PRECISIONS:
        return f"precision {row['precision']}: rpeg has no such setting (its precisions: BF16, FP8, NVFP4)"
    if row["system"] not in SYSTEMS:
        return f"no hardware preset for {row['system']}"
    fields = ("gpus", "gbs", "mbs", "seq_len", "tp", "pp", "cp", "ep", "vp", "fsdp", "tokens_per_s_per_gpu")
    if any(isinstance(row.get(f), str) for f in fields):
        return "a cell publishes two configurations"
    tp, pp, cp = row["tp"], row["pp"], row["cp"] or 1
    if row["gpus"] % (tp * pp * cp):
        return "GPUs not divisible by TP·PP·CP"
    dp = row["gpus"] // (tp * pp * cp)
    if row["gbs"] % (dp * row["mbs"]):
        return "GBS not divisible by DP·MBS"
    if row.get("etp") not in (None, 1, tp):
        return f"ETP={row['etp']}: rpeg splits experts over 1 or TP={tp} ranks"
    if (tp * dp * cp) % (row["ep"] or 1):
        return "EP does not divide TP·DP·CP"
    return None


def regression_note(row: dict[str, Any]) -> str | None:
    """The footnote with which the table marks ``row`` as measured under a known performance
    regression of its software (26.06.01's GPT-OSS 120B rows: "Performance regression in GPT-OSS
    120B pre-training is a known issue ... It will be resolved with the next container
    release."), or ``None``. Such a row is priced and shown, but kept out of every statistic and
    fit: it measures a defect the publisher names, not the configuration."""
    return next((note for note in row.get("notes", ()) if "regression" in note.lower()), None)


def compared(row: dict[str, Any]) -> bool:
    """Whether ``row`` enters the statistics and fits: rpeg can express it (:func:`why_not`) and
    its table does not mark it as a known regression (:func:`regression_note`)."""
    return why_not(row) is None and regression_note(row) is None


def release_key(release: str) -> tuple[int, ...]:
    """``"26.06.01"`` → ``(26, 6, 1)``: releases in the order NVIDIA published them."""
    return tuple(int(part) for part in release.split("."))


def configuration(row: dict[str, Any]) -> tuple:
    """What one configuration is across releases: model, system, published precision, GPUs,
    batch, sequence length and every parallel degree."""
    keys = ("model_key", "system", "precision", "gpus", "gbs", "mbs", "seq_len", "tp", "pp", "vp", "cp", "ep")
    return tuple(row.get(k) or 1 if k in ("vp", "cp", "ep") else row.get(k) for k in keys)


def breakdown(priced: list[tuple[dict[str, Any], float, float]]) -> dict[str, list[tuple[float, float]]]:
    """``(published, predicted)`` pairs of the priced rows ``(row, published, predicted)`` by model
    kind (dense, mixture of experts), each also restricted to the newest release of every
    configuration (the same layout re-measured by a later Megatron-Bridge release replaces the
    earlier row: the software changed, the hardware did not)."""
    newest: dict[tuple, dict[str, Any]] = {}
    for r, _, _ in priced:
        key = configuration(r)
        if key not in newest or release_key(r["release"]) > release_key(newest[key]["release"]):
            newest[key] = r
    out: dict[str, list[tuple[float, float]]] = {}
    for kind, moe in (("dense", False), ("mixture of experts", True)):
        mine = [(r, pub, pred) for r, pub, pred in priced if model_spec(r["model_key"]).is_moe == moe]
        out[kind] = [(pub, pred) for _, pub, pred in mine]
        out[f"{kind}, newest release of each configuration"] = [
            (pub, pred) for r, pub, pred in mine if newest[configuration(r)] is r
        ]
    return out


def release_breakdown(
    priced: list[tuple[dict[str, Any], float, float]],
) -> dict[str, list[tuple[float, float]]]:
    """``(published, predicted)`` pairs of the priced rows by published table, newest release
    first, and within it by precision (BF16; the FP8 recipes pooled; NVFP4). Each Megatron-Bridge
    release publishes its own table, measured with that release's software: the same layout on
    the same system runs up to 1.8x faster in a later release (Qwen3-30B-A3B, 16 H100), so a
    table is the unit a fixed cost model is compared with."""
    out: dict[str, list[tuple[float, float]]] = {}
    for r, pub, pred in sorted(priced, key=lambda item: release_key(item[0]["release"]), reverse=True):
        prec = {"bf16": "BF16", "fp8": "FP8 recipes", "nvfp4": "NVFP4"}[PRECISIONS[r["precision"]]]
        out.setdefault(f"release {r['release']}, {prec}", []).append((pub, pred))
    return out


#: Megatron-Bridge's controlled runs of one MoE shape on 16 H100 (at the data file's commit
#: 067f987): Qwen3-30B-A3B, BF16, sequence 4096, TP 1, PP 1, CP 1, EP 16, MBS 1, GBS 1024,
#: forced-balanced routing (``skills/nemo-mbridge-perf-moe-comm-overlap/SKILL.md``, "HybridEP
#: production-shape validation", which publishes the shape; its "Correctness-first alltoall smoke"
#: ran the same 16-GPU shape, its command ``-c bf16 -ng 16``; ``docs/training/communication-overlap.md``
#: publishes the same two AlltoAll steps). The runs change only the dispatcher and the AlltoAll
#: overlap, the model and shape stay: :data:`BRIDGE_MOE_RUNS`.
BRIDGE_MOE_CHECK = {
    "release": "main 2026-05/07",
    "model": "Qwen3-30B-A3B (controlled runs)",
    "model_key": "Qwen3_30B_a3B",
    "system": "DGX-H100",
    "gpus": 16,
    "precision": "BF16",
    "gbs": 1024,
    "mbs": 1,
    "seq_len": 4096,
    "tp": 1,
    "pp": 1,
    "cp": 1,
    "vp": None,
    "ep": 16,
    "fsdp": 0,
}
#: ``(label, flex dispatcher, AlltoAll overlap, published steady step s)`` of
#: :data:`BRIDGE_MOE_CHECK`'s runs: the AlltoAll smoke (2026-05-18; CUDA graphs off, permutation
#: unfused) and the HybridEP A/B (2026-07-25; TE graphs over the router and pre-processing), each
#: without and with ``overlap_moe_expert_parallel_comm``.
BRIDGE_MOE_RUNS = (
    ("AlltoAll, in line", False, False, 41.25),
    ("AlltoAll, overlapped", False, True, 31.31),
    ("HybridEP, in line", True, False, 24.7138),
    ("HybridEP, overlapped", True, True, 21.0725),
)


def bridge_run_steps(expert_efficiency: float | None = None) -> list[tuple[str, float, float]]:
    """``(label, published s, rpeg s)`` of :data:`BRIDGE_MOE_RUNS`: each run's step priced with
    its dispatcher and overlap (:func:`predict`; ``expert_efficiency`` as there)."""
    row = BRIDGE_MOE_CHECK
    tokens = row["gbs"] * row["seq_len"] / row["gpus"]  # per GPU and step
    return [
        (label, step, tokens / predict(row, ep_overlap=ov, flex=fx, expert_efficiency=expert_efficiency))
        for label, fx, ov, step in BRIDGE_MOE_RUNS
    ]


#: The expert-layer efficiency ``ε_e`` the GPU presets carry (``Hardware.expert_efficiency``,
#: docs/cost-model.md §9): issue 31's grouped-GEMM efficiency for experts, one figure fitted
#: (:func:`fit_expert_efficiency`) on :data:`EXPERT_FIT_RELEASE`'s mixture-of-experts rows, each
#: priced as its recipe ran, and reported on the other tables and on :data:`BRIDGE_MOE_RUNS`.
EXPERT_EFFICIENCY = 0.406
#: The published table ``ε_e`` is fitted on: the newest, measured with the software whose recipes
#: :data:`RECIPES` reads (its eight rows are Blackwell: GB200 and GB300).
EXPERT_FIT_RELEASE = "26.08"


def moe_rows(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The expressible mixture-of-experts rows."""
    return [r for r in rows if compared(r) and model_spec(r["model_key"]).is_moe]


def expert_mape(rows: list[dict[str, Any]], eps: float | None = None) -> float:
    """MAPE of ``rows`` priced as their recipes ran, at ``ε_e = eps`` (the presets' when ``None``)."""
    return _mape([(float(r["tokens_per_s_per_gpu"]), predict(r, expert_efficiency=eps)) for r in rows])


def fit_expert_efficiency(
    rows: list[dict[str, Any]], release: str = EXPERT_FIT_RELEASE
) -> tuple[float, float]:
    """``(ε_e, MAPE)``: the expert-layer efficiency minimising the MAPE of ``release``'s MoE rows
    priced as their recipes ran (golden-section search over ``[0.1, 1]``, 40 steps)."""
    mine = [r for r in moe_rows(rows) if r["release"] == release]
    if not mine:
        raise ValueError(f"no mixture-of-experts row in release {release!r}")
    eps = _golden_min(lambda e: expert_mape(mine, e), 0.1, 1.0, 40)
    return eps, expert_mape(mine, eps)


def expert_report(rows: list[dict[str, Any]]) -> list[str]:
    """Summary lines of the expert-layer efficiency: the refit on :data:`EXPERT_FIT_RELEASE`
    against the presets', the other tables' MoE rows by GPU generation and the controlled H100
    runs, each at the presets' ``ε_e`` and at 1; and the MoE rows priced with the AlltoAll in
    line whatever their recipe (how these rows were priced before the recipes were read)."""
    moe = moe_rows(rows)
    eps, mape = fit_expert_efficiency(rows)
    fit = [r for r in moe if r["release"] == EXPERT_FIT_RELEASE]
    held = [r for r in moe if r["release"] != EXPERT_FIT_RELEASE]
    hopper = [r for r in held if r["system"] == "DGX-H100"]
    blackwell = [r for r in held if r["system"] != "DGX-H100"]
    lines = [
        "",
        f"The expert-layer efficiency (one of the two fitted figures of this table; `Hardware.expert_efficiency`, "
        f"docs/cost-model.md §9): the GPU presets run a training or teacher-forced pass's routed-expert GEMMs at "
        f"ε_e = {EXPERT_EFFICIENCY} × the shape rule's rate, fitted on release {EXPERT_FIT_RELEASE}'s {len(fit)} MoE "
        f"rows ({', '.join(sorted({r['system'].removeprefix('DGX-') for r in fit}))}) priced as their recipes ran:",
        "",
        f"- refit now on release {EXPERT_FIT_RELEASE}: ε_e = {eps:.3f} (the presets carry {EXPERT_EFFICIENCY}); "
        f"MAPE there {expert_mape(fit):.1f} % at the presets' ε_e ({mape:.1f} % at the refit, "
        f"{expert_mape(fit, 1.0):.1f} % at ε_e = 1)",
        f"- held out, the other tables' {len(blackwell)} Blackwell MoE rows: MAPE {expert_mape(blackwell):.1f} % "
        f"(ε_e = 1: {expert_mape(blackwell, 1.0):.1f} %)",
        f"- held out, the tables' {len(hopper)} H100 MoE rows (the Blackwell fit carried over): MAPE "
        f"{expert_mape(hopper):.1f} % (ε_e = 1: {expert_mape(hopper, 1.0):.1f} %)",
        "- held out, Megatron-Bridge's controlled runs of one shape on 16 H100 (Qwen3-30B-A3B BF16, EP 16, "
        "MBS 1, GBS 1024, sequence 4096; only the dispatcher and the overlap change), published step against "
        f"rpeg's at ε_e = {EXPERT_EFFICIENCY} and at 1:",
    ]
    at_one = {label: t for label, _, t in bridge_run_steps(1.0)}
    for label, pub, t in bridge_run_steps():
        lines.append(
            f"  - {label}: published {pub:.2f} s, rpeg {t:.2f} s ({t / pub:.2f} ×; at ε_e = 1 {at_one[label]:.2f} s, "
            f"{at_one[label] / pub:.2f} ×)"
        )
    inline = [(float(r["tokens_per_s_per_gpu"]), predict(r, ep_overlap=False, flex=False)) for r in moe]
    inline_one = [
        (float(r["tokens_per_s_per_gpu"]), predict(r, ep_overlap=False, flex=False, expert_efficiency=1.0))
        for r in moe
    ]
    lines += [
        "",
        "The same MoE rows priced with the AlltoAll in line whatever their recipe (how this table priced them "
        "before the recipes were read):",
        "",
        _summary(f"mixture of experts, AlltoAll in line, ε_e = {EXPERT_EFFICIENCY}", inline),
        _summary("mixture of experts, AlltoAll in line, ε_e = 1 (the previous pricing)", inline_one),
    ]
    return lines


def row_strategy(row: dict[str, Any]) -> tuple[Any, int]:
    """The :class:`~rpeg.ir.plan.Strategy` of an expressible row and its hardware's
    ``gpus_per_node`` (module docstring's translation)."""
    from rpeg.costmodel.hardware import hardware_preset
    from rpeg.ir.plan import Strategy

    preset, per_rack = SYSTEMS[row["system"]]
    g = hardware_preset(preset).gpus_per_node
    n = row["gpus"]
    tp, pp, cp, ep = row["tp"], row["pp"], row["cp"] or 1, row["ep"] or 1
    dp = n // (tp * pp * cp)

    def rank(d: int, p: int, c: int, t: int) -> int:  # Megatron's order tp-cp-dp-pp: pipeline outermost
        return ((p * dp + d) * cp + c) * tp + t

    def tier(ranks: list[int]) -> int:
        return _tier(ranks, g, per_rack)

    is_moe = model_spec(row["model_key"]).is_moe
    etp = row.get("etp") or (RECIPE_ETP if is_moe else tp)  # expert ranks ordered etp-ep-dp-pp
    experts = [e * etp for e in range(ep)]
    nodes = math.ceil(n / g)
    extent = (1, 1, n) if n <= g else (math.ceil(nodes / per_rack), min(nodes, per_rack), g)
    strategy = Strategy(
        extent,
        dp=dp,
        pp=pp,
        tp=tp,
        mb=row["gbs"] // (dp * row["mbs"]),
        pp_tier=tier([rank(0, p, 0, 0) for p in range(pp)]),
        dp_tier=tier([rank(d, 0, 0, 0) for d in range(dp)]),
        recompute="none",
        zero=3 if (row.get("fsdp") or 0) > 0 else 1,
        cp=cp,
        ep=ep,
        sp=tp > 1,
        cp_tier=tier([rank(0, 0, c, 0) for c in range(cp)]),
        ep_tier=tier(experts),
        vp=row["vp"] or 1,
        etp=etp if is_moe else None,
    )
    return strategy, g


def overlappable(row: dict[str, Any]) -> bool:
    """Whether Megatron-core can overlap the row's expert-parallel AlltoAlls
    (``overlap_moe_expert_parallel_comm``; rule E5): EP > 1 with PP = 1 or an interleaved
    pipeline (the rows recompute nothing)."""
    return (row["ep"] or 1) > 1 and (row["pp"] == 1 or (row["vp"] or 1) > 1)


def predict(
    row: dict[str, Any],
    ep_overlap: bool | None = None,
    fp4_scale: float = 1.0,
    flex: bool | None = None,
    expert_efficiency: float | None = None,
    recipe: dict[str, Any] | None = None,
) -> float:
    """rpeg's tokens/s/GPU for an expressible row: ``GBS·ℓ/(T_step·N_GPU)``, the model run at the
    row's precision (:data:`PRECISIONS`). A mixture of experts' tokens go through the dispatcher
    its recipe set and its AlltoAlls overlap another microbatch's compute where the recipe set
    that and Megatron-core allows it (its release's, :func:`release_recipe`, else the data
    commit's, :func:`row_recipe`, or ``recipe`` when given; :func:`overlappable`); ``flex`` and
    ``ep_overlap`` force either (``Strategy.flex_dispatch``, ``Strategy.ep_overlap``).
    ``fp4_scale`` multiplies the preset's NVFP4 peak (:func:`fit_fp4_efficiency`) and
    ``expert_efficiency`` replaces its expert-layer efficiency ``ε_e``
    (:func:`fit_expert_efficiency`)."""
    from dataclasses import replace

    from rpeg.costmodel.hardware import hardware_preset
    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.time import op_time
    from rpeg.ir.types import Role

    strategy, g = row_strategy(row)
    spec = replace(model_spec(row["model_key"]), precision=PRECISIONS[row["precision"]])
    if recipe is None and spec.is_moe:
        recipe = release_recipe(row) or row_recipe(row)
    if flex is None:
        flex = recipe is not None and recipe.get("moe_token_dispatcher_type") == "flex"
    if ep_overlap is None:
        ep_overlap = recipe is not None and recipe.get("overlap_moe_expert_parallel_comm") is True
    if ep_overlap and overlappable(row):
        strategy = replace(strategy, ep_overlap=True)
    if flex and (row["ep"] or 1) > 1:
        strategy = replace(strategy, flex_dispatch=True)
    hw = hardware_preset(SYSTEMS[row["system"]][0])
    if fp4_scale != 1.0 and hw.peak_flops_fp4 is not None:
        hw = replace(hw, peak_flops_fp4=hw.peak_flops_fp4 * fp4_scale)
    if expert_efficiency is not None:
        hw = replace(hw, expert_efficiency=expert_efficiency)
    ell = row["seq_len"]
    if spec.is_moe:
        spec = replace(spec, load_imbalance=RECIPE_LOAD_IMBALANCE)
    t = op_time(
        spec,
        Role.TRAINING,
        Layout(strategy, gpus_per_node=g),
        hw,
        sequences=row["gbs"],
        prompt_len=ell // 2,
        response_len=ell - ell // 2,
        tokens=float(ell),
        tokens_sq=float(ell * ell),
    )
    return row["gbs"] * ell / (t.total * row["gpus"])


#: Two layouts of Qwen3-30B-A3B FP8 on 16 DGX H100 in the tables (not in one release): EP 16 over
#: both nodes, and EP 8 inside a node with PP 2.
H100_EP_LAYOUTS = (("DGX-H100", "Qwen3_30B_a3B", 16, 1), ("DGX-H100", "Qwen3_30B_a3B", 8, 2))


def flex_report(priced: list[tuple[dict[str, Any], float, float]]) -> list[str]:
    """How two layouts of one model compare, published and priced with either dispatcher."""
    newest: dict[tuple, tuple[dict[str, Any], float]] = {}
    for r, pub, _ in priced:
        key = (r["system"], r["model"], r["ep"], r["pp"])
        later = key not in newest or release_key(r["release"]) > release_key(newest[key][0]["release"])
        if key in H100_EP_LAYOUTS and r["precision"] != "BF16" and later:
            newest[key] = (r, pub)
    if len(newest) != 2:
        return []
    (a, pa), (b, pb) = (newest[k] for k in H100_EP_LAYOUTS)
    a2a = [predict(x, flex=False, ep_overlap=False) for x in (a, b)]
    flex = [predict(x, flex=True, ep_overlap=False) for x in (a, b)]
    return [
        "",
        f"- Qwen3-30B-A3B FP8 on 16 DGX H100, the newest row of each layout: EP 16 over two nodes (release "
        f"{a['release']}) against EP 8 with PP 2 ({b['release']}), published {pa:,.0f} / {pb:,.0f} = "
        f"{pa / pb:.2f}; rpeg with the AlltoAll {a2a[0]:,.0f} / {a2a[1]:,.0f} = {a2a[0] / a2a[1]:.2f}, flex "
        f"{flex[0]:,.0f} / {flex[1]:,.0f} = {flex[0] / flex[1]:.2f}",
    ]


#: The NVFP4 GEMMs' efficiency relative to the FP8 GEMMs' on Blackwell, which the Blackwell
#: presets carry in ``peak_flops_fp4`` (0.70 × the dense FP4 peak × this): issue 31's "one
#: efficiency per operation class per GPU generation, fitted on one table and reported on the
#: others" — fitted (:func:`fit_fp4_efficiency`) on the NVFP4-over-FP8 speedups of
#: :data:`FP4_FIT_RELEASE`'s same-layout pairs, reported on the other tables' pairs and rows.
FP4_EFFICIENCY = 0.605
#: The published table the NVFP4 efficiency is fitted on.
FP4_FIT_RELEASE = "26.04.01"


def nvfp4_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(FP8 row, NVFP4 row)`` pairs of expressible rows that one table publishes for the same
    model, system, batch and layout (one of the FP8 recipes against NVFP4): the speedup NVFP4
    gives over FP8 with everything else equal."""
    keys = ("release", "model", "system", "gpus", "gbs", "mbs", "seq_len", "tp", "pp", "vp", "cp", "ep")
    found: dict[tuple, dict[str, dict[str, Any]]] = {}
    for r in rows:
        prec = PRECISIONS.get(r["precision"]) if compared(r) else None
        if prec in ("fp8", "nvfp4"):
            found.setdefault(tuple(r.get(k) for k in keys), {})[prec] = r
    return [(v["fp8"], v["nvfp4"]) for v in found.values() if len(v) == 2]


def speedup_pairs(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]], fp4_scale: float = 1.0
) -> list[tuple[float, float]]:
    """``(published, predicted)`` NVFP4-over-FP8 speedups, ``T_FP8/T_NVFP4``, of ``pairs``."""
    out = []
    for fp8, fp4 in pairs:
        published = fp4["tokens_per_s_per_gpu"] / fp8["tokens_per_s_per_gpu"]
        out.append((published, predict(fp4, fp4_scale=fp4_scale) / predict(fp8)))
    return out


def fit_fp4_efficiency(
    pairs: list[tuple[dict[str, Any], dict[str, Any]]], release: str = FP4_FIT_RELEASE
) -> tuple[float, float]:
    """``(r, MAPE)``: the multiplier ``r`` of the presets' NVFP4 peak that minimises the MAPE of
    the predicted NVFP4-over-FP8 speedups of ``release``'s pairs (golden-section search on
    ``log r`` over ``[1/2, 2]``, 60 steps). ``r = 1`` when the presets carry the fit."""
    mine = [p for p in pairs if p[0]["release"] == release]
    if not mine:
        raise ValueError(f"no NVFP4/FP8 pair in release {release!r}")
    return _fit_multiplier(lambda r: _mape(speedup_pairs(mine, r)))


def _golden_min(loss: Callable[[float], float], lo: float, hi: float, steps: int) -> float:
    """The ``x`` in ``[lo, hi]`` minimising a unimodal ``loss``: golden-section search, ``steps``
    narrowings, the final bracket's midpoint."""
    phi = (math.sqrt(5.0) - 1.0) / 2.0
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = loss(a), loss(b)
    for _ in range(steps):
        if fa <= fb:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = loss(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = loss(b)
    return (lo + hi) / 2.0


def _fit_multiplier(loss: Callable[[float], float]) -> tuple[float, float]:
    """``(r, loss(r))`` with ``r`` minimising ``loss`` over ``[1/2, 2]``: golden-section search on
    ``log r``, 60 steps."""
    r = math.exp(_golden_min(lambda x: loss(math.exp(x)), -math.log(2.0), math.log(2.0), 60))
    return r, loss(r)


def fp4_report(rows: list[dict[str, Any]]) -> list[str]:
    """Summary lines of the NVFP4 efficiency: the refit on :data:`FP4_FIT_RELEASE`'s pairs
    against the presets', the held-out pairs' speedups and the NVFP4 rows, fitted and unfitted."""
    pairs = nvfp4_pairs(rows)
    held = [p for p in pairs if p[0]["release"] != FP4_FIT_RELEASE]
    r, fit_mape = fit_fp4_efficiency(pairs)
    nvfp4 = [x for x in rows if compared(x) and PRECISIONS[x["precision"]] == "nvfp4"]

    def rows_mape(sel: list[dict[str, Any]], scale: float) -> str:
        return f"{_mape([(x['tokens_per_s_per_gpu'], predict(x, fp4_scale=scale)) for x in sel]):.1f} %"

    fit_rows = [x for x in nvfp4 if x["release"] == FP4_FIT_RELEASE]
    other_rows = [x for x in nvfp4 if x["release"] != FP4_FIT_RELEASE]
    shown = speedup_pairs(held)
    unfit = 1.0 / FP4_EFFICIENCY
    return [
        "",
        f"NVFP4 (the other fitted figure of this table): the Blackwell presets run NVFP4 GEMMs at 0.70 × the "
        f"dense FP4 peak × {FP4_EFFICIENCY}, the NVFP4 GEMMs' efficiency relative to the FP8 ones, fitted on "
        f"the NVFP4-over-FP8 speedups of release {FP4_FIT_RELEASE}'s same-layout pairs:",
        "",
        f"- refit now on release {FP4_FIT_RELEASE}'s {len(pairs) - len(held)} pairs: {r:.3f} × the presets' "
        f"NVFP4 peak (1.000: the presets carry the fit); speedup MAPE {fit_mape:.1f} % there",
        f"- held out, the other tables' {len(held)} pairs: speedup MAPE {_mape(shown):.1f} % "
        f"(published {min(p for p, _ in shown):.2f}–{max(p for p, _ in shown):.2f} ×, "
        f"rpeg {min(q for _, q in shown):.2f}–{max(q for _, q in shown):.2f} ×); "
        f"unfitted (0.70 × the dense FP4 peak) {_mape(speedup_pairs(held, unfit)):.1f} %",
        f"- NVFP4 rows: release {FP4_FIT_RELEASE}'s {len(fit_rows)} MAPE {rows_mape(fit_rows, 1.0)}, "
        f"the other tables' {len(other_rows)} {rows_mape(other_rows, 1.0)} "
        f"(unfitted: {rows_mape(fit_rows, unfit)} and {rows_mape(other_rows, unfit)})",
    ]


def _ranks(xs: list[float]) -> list[float]:
    """Ranks 1..n, ties given their average rank."""
    order = sorted(range(len(xs)), key=xs.__getitem__)
    out = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            out[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return out


def spearman(a: list[float], b: list[float]) -> float:
    """Spearman's ρ: Pearson's correlation of the ranks (``nan`` for fewer than 2 rows or a
    constant column)."""
    if len(a) < 2:
        return float("nan")
    ra, rb = _ranks(a), _ranks(b)
    ma, mb = sum(ra) / len(ra), sum(rb) / len(rb)
    cov = sum((x - ma) * (y - mb) for x, y in zip(ra, rb, strict=True))
    va = math.sqrt(sum((x - ma) ** 2 for x in ra))
    vb = math.sqrt(sum((y - mb) ** 2 for y in rb))
    return cov / (va * vb) if va and vb else float("nan")


# ---------------------------------------------------------------------------------------------
# Generation: GPUStack performance-lab vLLM serving benchmarks (issue 31, the generation half)
# ---------------------------------------------------------------------------------------------

VLLM_DATA = HERE / "data" / "vllm_serving.json"
VLLM_REPO = "gpustack/gpustack"
VLLM_DOCS_DIR = "docs/performance-lab"
#: Published GPU (``8 × NVIDIA H100 SXM``, or the page's file name) → rpeg hardware preset.
VLLM_GPUS = {"H100": "h100", "H200": "h200", "A100": "a100-80gb"}
#: vLLM's default ``--gpu-memory-utilization``.
VLLM_MEMORY_FRACTION = 0.9
#: ``vllm serve``'s (V1, ``UsageContext.OPENAI_API_SERVER``) default ``(max_num_batched_tokens,
#: max_num_seqs)`` by GPU: 8192 and 1024 on GPUs with at least 70 GiB other than A100, 2048 and
#: 256 on A100 and smaller GPUs (``vllm/engine/arg_utils.py``, ``EngineArgs._set_default_args``;
#: asserted by vLLM's ``tests/engine/test_arg_utils.py::test_defaults_with_usage_context``).
VLLM_SERVE_DEFAULTS = {"H100": (8192, 1024), "H200": (8192, 1024), "A100": (2048, 256)}
#: The random case whose rows are listed apart: 128 prompt tokens and 4 output tokens per request
#: (:func:`vllm_front_end_bound`).
FRONT_END_CASE = (128, 4)
#: ``vllm bench serve``'s ShareGPT sampling keeps a conversation only when its prompt has at most
#: 1,024 tokens and prompt plus completion at most 2,048 (``is_valid_sequence`` in
#: vllm/benchmarks/datasets.py, ``max_prompt_len = 1024``, ``max_total_len = 2048``): the
#: completion, which is the request's ``max_tokens``, is at most ``2048 − Lp``.
SHAREGPT_MAX_TOTAL = 2048
#: Pieces of the response-length law of one row (:func:`vllm_buckets`): one generation, not a
#: workload's phases, so as many as the cap has tokens up to this.
VLLM_LENGTH_PIECES = 128
#: Served model (quantization suffix removed) → rpeg model preset, or ``None``: built here
#: (:func:`vllm_model_spec`). Models outside this table have no rpeg model.
VLLM_MODELS = {
    "Qwen/Qwen3-235B-A22B-Instruct-2507": "qwen3-235b-a22b",
    "Qwen/Qwen3-32B": None,
    "Qwen/Qwen3-14B": None,
    "openai/gpt-oss-20b": "gpt-oss-20b",
    "openai/gpt-oss-120b": "gpt-oss-120b",
    "deepseek-ai/DeepSeek-R1-0528": "deepseek-v3",
}
#: Checkpoints whose published weights are not BF16 whatever their name says.
_NATIVE_PRECISION = {
    "openai/gpt-oss-20b": "MXFP4 (native MoE weights)",
    "openai/gpt-oss-120b": "MXFP4 (native MoE weights)",
    "deepseek-ai/DeepSeek-R1-0528": "FP8 (native block-scaled weights)",
    "deepseek-ai/DeepSeek-V3.2": "FP8 (native block-scaled weights)",
}
VLLM_REQUIRED = (
    "model",
    "precision",
    "gpu",
    "gpus",
    "tp",
    "pp",
    "dp",
    "expert_parallel",
    "engine",
    "engine_version",
    "serve_command",
    "dataset",
    "input_len",
    "output_len",
    "requests",
    "total_input_tokens",
    "total_generated_tokens",
    "duration_s",
    "output_tokens_per_s",
    "total_tokens_per_s",
    "source",
)
_RESULT_FIELDS = {
    "Successful requests": "requests",
    "Benchmark duration (s)": "duration_s",
    "Total input tokens": "total_input_tokens",
    "Total generated tokens": "total_generated_tokens",
    "Output token throughput (tok/s)": "output_tokens_per_s",
    "Total Token throughput (tok/s)": "total_tokens_per_s",
    "Peak concurrent requests": "peak_concurrent_requests",
    "Mean TTFT (ms)": "mean_ttft_ms",
    "Mean TPOT (ms)": "mean_tpot_ms",
}
#: ``# random 32K input`` labels → the "Benchmark Dataset" line that defines the case.
_RANDOM_LABELS = {"32K": "Very long", "4K": "Long", "2K": "Medium", "128": "Short"}


def _serve_flags(command: str) -> dict[str, Any]:
    """Parallel degrees and the flags that matter to the comparison, from a ``vllm serve`` line."""

    def value(*names: str) -> str | None:
        for name in names:
            if m := re.search(rf"(?:^|\s){re.escape(name)}[ =](\S+)", command):
                return m.group(1)
        return None

    return {
        "tp": int(value("-tp", "--tensor-parallel-size") or 1),
        "pp": int(value("-pp", "--pipeline-parallel-size") or 1),
        "dp": int(value("-dp", "--data-parallel-size") or 1),
        "expert_parallel": "--enable-expert-parallel" in command,
        "gpu_memory_utilization": float(value("--gpu-memory-utilization") or VLLM_MEMORY_FRACTION),
        "speculative": "--speculative-config" in command or "speculative" in command,
        "kv_cache_dtype": value("--kv-cache-dtype"),
    }


def _precision(model: str) -> str:
    """The served checkpoint's weight precision."""
    if model.endswith("-FP8"):
        return "FP8"
    if model.endswith("-AWQ"):
        return "AWQ (INT4 weights)"
    return _NATIVE_PRECISION.get(model, "BF16")


def parse_perf_lab(text: str, path: str, commit: str) -> list[dict[str, Any]]:
    """The vLLM serving results of one GPUStack performance-lab page, every figure kept.

    A result is a ``Serving Benchmark Result`` block; its server is the last ``vllm serve``
    command above it (blocks under an SGLang or TensorRT-LLM command are skipped). A block
    labelled ``# random 32K input`` (``4K``, ``2K``, ``128``) is the random-dataset case the
    page's "Benchmark Dataset" list defines; an unlabelled one is the ShareGPT run of the page's
    benchmark script (``vllm bench serve``, all requests sent at once); any other label (``# ShareGPT
    batch size 4``, ``# --max-num-batched-tokens 4096``) is kept as ``result_label`` with
    ``dataset`` null. A label is a ``# ...`` line right above a result block.
    """
    gpu_file = re.search(r"/(h100|h200|a100)[^/]*\.md$", path)
    hw = re.search(r"^(?:(\d+) ×|A single) NVIDIA (\S+)(.*)$", text, re.M)
    version = re.search(r"^- vLLM: (\S+)", text, re.M)
    cases = {
        m.group(1): (int(m.group(2)), int(m.group(3)))
        for m in re.finditer(
            r"^\s*- (Very long|Long|Medium|Short) prompt: (\d+) input tokens, (\d+) output tokens", text, re.M
        )
    }
    lines = text.splitlines()
    rows: list[dict[str, Any]] = []
    serve = heading = label = None
    i = 0
    while i < len(lines):
        s = lines[i].strip()
        if re.match(r"^#{1,6} ", lines[i]):
            heading, label = s.lstrip("#").strip(), None
        elif s.startswith("# ") and lines[i].startswith(" "):
            after = next((x for x in lines[i + 1 :] if x.strip()), "")
            label = s[2:].strip() if "Serving Benchmark Result" in after else None
        if s.startswith("vllm serve") or "sglang" in s or s.startswith("trtllm-serve"):
            command = s
            while command.endswith("\\") and i + 1 < len(lines):
                i += 1
                command = command[:-1].rstrip() + " " + lines[i].strip()
            serve = command if command.startswith("vllm serve") else None
        if "Serving Benchmark Result" in s and serve:
            block: dict[str, Any] = {}
            for line in lines[i + 1 : i + 40]:
                if line.strip().startswith("=" * 10):
                    break
                m = re.match(r"\s*(.+?):\s+(-?[\d.]+)\s*$", line)
                if m and m.group(1) in _RESULT_FIELDS:
                    block[_RESULT_FIELDS[m.group(1)]] = float(m.group(2))
            model = serve.split()[2]
            dataset, in_len, out_len = "sharegpt", None, None
            if label:
                m = re.fullmatch(r"random (\S+) input", label)
                case = cases.get(_RANDOM_LABELS.get(m.group(1).upper(), "")) if m else None
                dataset, (in_len, out_len) = ("random", case) if case else (None, (None, None))
            flags = _serve_flags(serve)
            row = {
                "model": model,
                "precision": _precision(model),
                "gpu": (hw.group(2) if hw else gpu_file.group(1).upper()) if gpu_file else None,
                "gpu_text": hw.group(0).strip() if hw else None,
                "gpus": flags["tp"] * flags["pp"] * flags["dp"],
                **flags,
                "engine": "vllm",
                "engine_version": version.group(1) if version else None,
                "serve_command": serve,
                "dataset": dataset,
                "input_len": in_len,
                "output_len": out_len,
                "result_label": label,
                "request_rate": "inf (vllm bench serve default: every request sent at once)",
                **{
                    k: (int(v) if float(v).is_integer() and k != "duration_s" else v)
                    for k, v in block.items()
                },
                "source": {"repo": VLLM_REPO, "commit": commit, "path": path, "section": heading},
            }
            rows.append(row)
            label = None
        i += 1
    return rows


def refresh_vllm(git_dir: str) -> None:
    """Rebuild :data:`VLLM_DATA` from the ``HEAD`` of a gpustack git directory: every H100, H200
    and A100 throughput page (``*/h100.md``, ``h200.md``, ``a100.md``; the ``-latency`` pages
    run at limited concurrency and are left out)."""
    git = ["git", "-C", git_dir]
    commit = subprocess.run(
        [*git, "rev-parse", "HEAD"], check=True, capture_output=True, text=True
    ).stdout.strip()
    names = subprocess.run(
        [*git, "ls-tree", "-r", "--name-only", "HEAD", VLLM_DOCS_DIR],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.split()
    pages = sorted(p for p in names if re.search(r"/(h100|h200|a100)\.md$", p))
    rows = []
    for path in pages:
        text = subprocess.run(
            [*git, "show", f"HEAD:{path}"], check=True, capture_output=True, text=True
        ).stdout
        rows += parse_perf_lab(text, path, commit)
    doc = {
        "source": f"https://github.com/{VLLM_REPO}/tree/{commit}/{VLLM_DOCS_DIR} ({len(pages)} pages)",
        "commit": commit,
        "pages": pages,
        "note": "Every vLLM 'Serving Benchmark Result' block of GPUStack's H100/H200/A100 throughput pages, "
        "figures as published (vllm bench serve, request rate inf). requests = successful requests; "
        "output_tokens_per_s = total_generated_tokens / duration_s, total_tokens_per_s adds the input "
        "tokens. input_len/output_len are the random dataset's requested lengths (null for ShareGPT); "
        "generation may stop early at EOS, so total_generated_tokens can be below requests x output_len.",
        "rows": rows,
    }
    VLLM_DATA.write_text(json.dumps(doc, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(rows)} rows from {len(pages)} pages to {VLLM_DATA}")


def load_vllm_rows(path: Path = VLLM_DATA) -> list[dict[str, Any]]:
    """The vLLM data file's rows, each checked for :data:`VLLM_REQUIRED` fields (:func:`_load`)."""
    return _load(path, VLLM_REQUIRED)


def _base_model(model: str) -> str:
    return re.sub(r"-(FP8|AWQ)$", "", model)


def vllm_model_spec(model: str) -> Any:
    """The rpeg :class:`~rpeg.ir.models.ModelSpec` of a served model in :data:`VLLM_MODELS`.
    Qwen3-32B and Qwen3-14B have no preset: their shapes are the published ``config.json``
    (Qwen/Qwen3-32B: 64 layers, hidden 5120, FFN 25600, 64 heads, 8 KV heads of 128, vocabulary
    151936, untied; Qwen/Qwen3-14B: 40 layers, hidden 5120, FFN 17408, 40 heads, 8 KV heads of
    128, vocabulary 151936, untied)."""
    from rpeg.ir.models import ModelSpec, model_preset

    base = _base_model(model)
    name = VLLM_MODELS[base]
    if name is not None:
        return model_preset(name)
    if base == "Qwen/Qwen3-32B":
        return ModelSpec(
            name="qwen3-32b",
            layers=64,
            hidden=5120,
            ffn_hidden=25600,
            vocab=151936,
            heads=64,
            kv_heads=8,
            head_dim=128,
        )
    return ModelSpec(
        name="qwen3-14b",
        layers=40,
        hidden=5120,
        ffn_hidden=17408,
        vocab=151936,
        heads=40,
        kv_heads=8,
        head_dim=128,
    )


def vllm_spec(row: dict[str, Any]) -> Any:
    """The :class:`~rpeg.ir.models.ModelSpec` a row is priced with: :func:`vllm_model_spec` with
    the checkpoint's precision (:func:`vllm_precision`)."""
    from dataclasses import replace

    return replace(vllm_model_spec(row["model"]), precision=vllm_precision(row))


def vllm_precision(row: dict[str, Any]) -> str | None:
    """rpeg's precision of a served checkpoint: ``"bf16"`` for BF16 weights, ``"fp8"`` for FP8
    ones (a ``-FP8`` checkpoint's per-tensor or block-scaled weights, or DeepSeek's native
    block-scaled FP8: vLLM runs each as W8A8 FP8 GEMMs on Hopper, weights stored in 1 byte),
    ``"mxfp4"`` for gpt-oss's native MXFP4 experts (vLLM's ``Mxfp4Config``: weight-only expert
    GEMMs, Marlin on A100 and OpenAI's Triton kernels on H100); ``None`` for AWQ's INT4."""
    prec = row["precision"].split(" (")[0]
    return {"BF16": "bf16", "FP8": "fp8", "MXFP4": "mxfp4"}.get(prec)


#: Result blocks whose published serve command names another model than the one whose figures
#: they show, ``(page, section) → why``: kept in the data file as published, not priced.
VLLM_MISLABELLED = {
    ("gpt-oss-20b/h100.md", "5. Tuning number of batched tokens in vLLM"): (
        "the gpt-oss-20b page's command names openai/gpt-oss-120b, but its figures are the 20b's "
        "(9,027 output tok/s and 4.96 s mean TTFT on one H100, against the page's 9,064 and 4.93 s "
        "with async scheduling; the 120b page's best single-GPU run has 2,943): the model that ran "
        "is uncertain"
    ),
}


def vllm_why_not(row: dict[str, Any]) -> str | None:
    """Why rpeg cannot express a vLLM row, or ``None`` when it can."""
    mislabelled = VLLM_MISLABELLED.get((vllm_page(row), row["source"]["section"]))
    if mislabelled is not None:
        return mislabelled
    base = _base_model(row["model"])
    if base not in VLLM_MODELS:
        return f"no rpeg model for {base}"
    prec = vllm_precision(row)
    if prec is None:
        return f"{row['precision'].split(' (')[0]} weights: rpeg has no such quantized-weight setting"
    if row["gpu"] not in VLLM_GPUS:
        return f"no hardware preset for {row['gpu']}"
    if row["speculative"]:
        return "speculative decoding not modelled"
    if row["kv_cache_dtype"] not in (None, "auto"):
        return f"KV cache dtype {row['kv_cache_dtype']} not modelled"
    if row["pp"] > 1 or row["dp"] > 1 or row["expert_parallel"]:
        return "pipeline-, data- or expert-parallel serving not translated"
    if row["dataset"] is None:
        return "result labelled with a case or flag its page does not define"
    peak = row.get("peak_concurrent_requests")
    if peak is not None and peak < row["requests"]:
        return "concurrency-limited run (peak concurrent requests below requests)"
    return None


def vllm_lengths(row: dict[str, Any]) -> tuple[int, int]:
    """``(Lp, Lr)``: the published mean input and generated tokens per request."""
    n = row["requests"]
    return max(1, round(row["total_input_tokens"] / n)), max(1, round(row["total_generated_tokens"] / n))


def vllm_length_cap(row: dict[str, Any]) -> int:
    """The most tokens a request of the row may generate: the random dataset's requested output
    length (its ``max_tokens``; ``vllm bench serve`` does not set ``ignore_eos``, so a response
    may end sooner), or a ShareGPT completion's bound ``2048 − Lp`` (:data:`SHAREGPT_MAX_TOTAL`)."""
    if row["dataset"] == "random":
        return int(row["output_len"])
    return SHAREGPT_MAX_TOTAL - vllm_lengths(row)[0]


def vllm_buckets(row: dict[str, Any]) -> tuple[Any, ...]:
    """The response-length law a row is priced with: only the mean ``Ē`` (published generated
    tokens per request) and the cap (:func:`vllm_length_cap`) are known, so the maximum-entropy
    law on ``[0, cap]`` with that mean (:func:`rpeg.ir.workload.max_entropy_quantiles`, in
    ``min(cap, 128)`` pieces); a point mass at the cap when ``Ē`` is within half a piece of it
    (every response ran to its ``max_tokens``)."""
    from rpeg.ir.workload import max_entropy_quantiles, quantile_buckets

    cap = vllm_length_cap(row)
    mean = row["total_generated_tokens"] / row["requests"]
    try:
        return quantile_buckets(max_entropy_quantiles(mean, cap, min(cap, VLLM_LENGTH_PIECES)))
    except ValueError:
        if mean < cap / 2:  # within half a piece of 0 tokens: no serving row has such a mean
            raise
        # within half a piece of the cap: every response ran to it
        return quantile_buckets(((0.0, cap - 1), (1.0, cap)) if cap > 1 else ((1.0, 1),))


def vllm_engine_step(row: dict[str, Any], hw: Any) -> Any:
    """The :class:`~rpeg.ir.hardware.EngineStep` of the row's ``vllm serve``: the preset's
    per-step seconds with the server's token budget and sequence cap, its
    ``--max-num-batched-tokens`` and ``--max-num-seqs`` or else :data:`VLLM_SERVE_DEFAULTS` for
    the GPU, no CUDA graphs under ``--enforce-eager``, and asynchronous scheduling under
    ``--async-scheduling`` (off by default in the pages' vLLM v0.10.2 and v0.11.0)."""
    from dataclasses import replace

    command = row["serve_command"]

    def flag(name: str) -> int | None:
        m = re.search(rf"(?:^|\s){re.escape(name)}[ =](\d+)", command)
        return int(m.group(1)) if m else None

    budget, seqs = VLLM_SERVE_DEFAULTS[row["gpu"]]
    return replace(
        hw.rollout_step,
        token_budget=flag("--max-num-batched-tokens") or budget,
        max_seqs=flag("--max-num-seqs") or seqs,
        cuda_graphs="--enforce-eager" not in command.split(),
        async_scheduling="--async-scheduling" in command.split(),
    )


def vllm_front_end_bound(row: dict[str, Any]) -> bool:
    """Whether the row is the 128-in/4-out random case (:data:`FRONT_END_CASE`): a thousand
    requests sent at once with 4 output tokens each, whose duration is the HTTP front end's, not
    the engine's. vLLM's API server tokenizes each prompt, detokenizes and streams each output
    in one process, and ``vllm bench serve`` is one asyncio client; the published mean TTFT is
    0.63-0.81 of the run although the GPU's prefill of all 128k prompt tokens is 16 steps of
    8192 tokens (63 of 2048 on A100; section ``gpu-fidelity-generation`` prints the ratio). An RL rollout engine called
    in-process pays none of that, so rpeg's engine model has no term for it and these rows are
    listed apart."""
    return (row["dataset"], row["input_len"], row["output_len"]) == ("random", *FRONT_END_CASE)


#: vLLM's prefill efficiency on Hopper, which the h100 and h200 presets carry as
#: their ``vllm`` engine's prefill ``efficiency`` (docs/cost-model.md §8, "The engine step"):
#: issue 31's one efficiency per operation class per GPU generation, fitted
#: (:func:`fit_prefill_efficiency`) on the engine-bound rows of :data:`PREFILL_FIT_PAGE` and
#: reported on the other H100 and H200 pages. The A100 rows, priced at the preset's roofline, fit
#: without one (section ``gpu-fidelity-generation``).
HOPPER_PREFILL_EFFICIENCY = 0.484
#: The published table (one GPUStack page) the Hopper prefill efficiency is fitted on.
PREFILL_FIT_PAGE = "qwen3-14b/h100.md"


def vllm_page(row: dict[str, Any]) -> str:
    """The row's page, ``model/gpu.md``, under :data:`VLLM_DOCS_DIR`."""
    return row["source"]["path"].removeprefix(VLLM_DOCS_DIR + "/")


def _scaled_prefill(hw: Any, scale: float) -> Any:
    """``hw`` with its generation engine's prefill efficiency times ``scale`` (unchanged without
    such an engine: a preset priced at its roofline)."""
    from dataclasses import replace

    eng = hw.engine("generation")
    if eng is None or eng.prefill is None or scale == 1.0:
        return hw
    prefill = replace(eng.prefill, efficiency=eng.prefill.efficiency * scale)
    return hw.with_engine(replace(eng, prefill=prefill))


def fit_prefill_efficiency(rows: list[dict[str, Any]], page: str = PREFILL_FIT_PAGE) -> tuple[float, float]:
    """``(r, MAPE)``: the multiplier ``r`` of the presets' vLLM prefill efficiency that minimises
    the output-throughput MAPE of ``page``'s engine-bound rows (:func:`vllm_front_end_bound`
    excluded; golden-section search on ``log r`` over ``[1/2, 2]``). ``r = 1`` when the presets
    carry the fit."""
    mine = [
        r for r in rows if vllm_page(r) == page and vllm_why_not(r) is None and not vllm_front_end_bound(r)
    ]
    if not mine:
        raise ValueError(f"no engine-bound row on page {page!r}")
    return _fit_multiplier(lambda k: prefill_mape(mine, k))


def prefill_held_out(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The rows the Hopper prefill efficiency is reported on: the expressible engine-bound rows
    of the H100 and H200 pages other than :data:`PREFILL_FIT_PAGE`."""
    return [
        x
        for x in rows
        if vllm_why_not(x) is None
        and not vllm_front_end_bound(x)
        and x["gpu"] != "A100"
        and vllm_page(x) != PREFILL_FIT_PAGE
    ]


def prefill_mape(rows: list[dict[str, Any]], scale: float = 1.0) -> float:
    """Output-throughput MAPE of ``rows`` with the presets' vLLM prefill efficiency times ``scale``."""
    return _mape([(float(x["output_tokens_per_s"]), vllm_predict(x, prefill_scale=scale)[1]) for x in rows])


def prefill_report(rows: list[dict[str, Any]]) -> list[str]:
    """Summary lines of the Hopper prefill efficiency: the refit on :data:`PREFILL_FIT_PAGE`
    against the presets', and the other H100 and H200 pages' engine-bound rows fitted and unfitted."""
    r, fit_mape = fit_prefill_efficiency(rows)
    held = prefill_held_out(rows)
    unfit = 1.0 / HOPPER_PREFILL_EFFICIENCY

    def held_mape(scale: float) -> str:
        return f"{prefill_mape(held, scale):.1f} %"

    return [
        "",
        f"Hopper prefill efficiency (a fitted figure): the h100 and h200 presets' vLLM engine "
        f"runs a prefill at {HOPPER_PREFILL_EFFICIENCY} × the roofline, fitted on the engine-bound rows of "
        f"{PREFILL_FIT_PAGE}:",
        "",
        f"- refit now on {PREFILL_FIT_PAGE}: {r:.3f} × the presets' efficiency (1.000: the presets carry the "
        f"fit); MAPE {fit_mape:.1f} % there",
        f"- held out, the other H100 and H200 pages' {len(held)} engine-bound rows: MAPE {held_mape(1.0)} "
        f"(unfitted, at the roofline: {held_mape(unfit)})",
    ]


def vllm_predict(
    row: dict[str, Any],
    prefill_scale: float = 1.0,
    weight_only: float | None = None,
    async_scheduling: bool | None = None,
    async_host: float | None = None,
    sink_attention: float | None = None,
) -> tuple[float, float]:
    """rpeg's ``(T_gen, output tokens/s)`` of an expressible row.

    The run is one generation on a continuously batching engine
    (:func:`rpeg.costmodel.time.generation_times`): ``n`` = the requests (all sent at once),
    prompt ``Lp`` (the published mean) and responses drawn from :func:`vllm_buckets` (the
    maximum-entropy law with the published mean under the row's cap), tensor parallelism
    ``TP`` on one node of the GPU's preset, memory fraction ``--gpu-memory-utilization``
    (vLLM's 0.9 unless the command sets it), the checkpoint's precision (:func:`vllm_precision`),
    the engine step of the server's flags and defaults (:func:`vllm_engine_step`), and the
    preset's vLLM prefill efficiency times ``prefill_scale`` (:func:`fit_prefill_efficiency`
    varies it), the engine's weight-only GEMM efficiency ``ε_w`` of the preset, or
    ``weight_only`` when given (:func:`fit_weight_only_efficiency` varies it; rows served
    weight-only), and asynchronous scheduling as the command sets it, or ``async_scheduling``
    when given (:func:`async_report` prices the flagged rows without it), with the preset's
    unhidden host seconds ``c_w``, or ``async_host`` when given (:func:`fit_async_host` varies it),
    and the engine's attention-sink kernel efficiency ``ε_s`` of the preset, or ``sink_attention``
    when given (:func:`fit_sink_attention_efficiency` varies it; gpt-oss's rows).
    Predicted output tokens/s =
    published generated tokens / ``T_gen``, so rpeg/published is the published duration over
    ``T_gen`` and the same for total tokens/s.
    """
    from dataclasses import replace

    from rpeg.costmodel.hardware import hardware_preset
    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.time import generation_times
    from rpeg.ir.plan import Strategy

    hw = hardware_preset(VLLM_GPUS[row["gpu"]])
    step = vllm_engine_step(row, hw)
    if weight_only is not None:
        step = replace(step, weight_only_efficiency=weight_only)
    if async_scheduling is not None:
        step = replace(step, async_scheduling=async_scheduling)
    if async_host is not None:
        step = replace(step, async_host_s=async_host)
    if sink_attention is not None:
        step = replace(step, sink_attention_efficiency=sink_attention)
    hw = _scaled_prefill(replace(hw, rollout_step=step), prefill_scale)
    tp = row["tp"]
    strategy = Strategy((1, 1, tp), dp=1, pp=1, tp=tp, mb=1, mem_fraction=row["gpu_memory_utilization"])
    lp, _ = vllm_lengths(row)
    buckets = vllm_buckets(row)
    (t,) = generation_times(
        vllm_spec(row),
        Layout(strategy, gpus_per_node=hw.gpus_per_node),
        hw,
        sequences=row["requests"],
        prompt_len=lp,
        buckets=buckets,
    )
    return t.total, row["total_generated_tokens"] / t.total


#: vLLM's weight-only (MXFP4, W4A16) MoE GEMM efficiency ``ε_w`` per GPU generation, which the
#: presets of that generation carry as their rollout step's ``weight_only_efficiency``
#: (docs/cost-model.md §11, "MXFP4 experts"): issue 31's one efficiency per operation class per
#: GPU generation, each fitted (:func:`fit_weight_only_efficiency`) on the engine-bound rows of
#: one page and reported on the other pages of that GPU. ``(GPU, fit page, presets, ε_w)``.
WEIGHT_ONLY_FITS = (
    ("H100", "gpt-oss-20b/h100.md", ("h100", "h200"), 0.724),
    ("A100", "gpt-oss-20b/a100.md", ("a100-80gb", "a100-40gb"), 0.67),
)


def engine_bound_rows(
    rows: list[dict[str, Any]], gpu: str, keep: Callable[[dict[str, Any]], bool]
) -> list[dict[str, Any]]:
    """The expressible engine-bound (:func:`vllm_front_end_bound` excluded) rows of one GPU that
    ``keep`` selects."""
    return [
        x
        for x in rows
        if x["gpu"] == gpu and vllm_why_not(x) is None and not vllm_front_end_bound(x) and keep(x)
    ]


def weight_only_rows(rows: list[dict[str, Any]], gpu: str) -> list[dict[str, Any]]:
    """The expressible engine-bound MXFP4 rows of one GPU (:func:`engine_bound_rows`)."""
    return engine_bound_rows(rows, gpu, lambda x: vllm_precision(x) == "mxfp4")


def weight_only_mape(rows: list[dict[str, Any]], eps: float | None = None) -> float:
    """Output-throughput MAPE of ``rows`` with ``ε_w = eps`` (``None``: the presets')."""
    return _mape([(float(x["output_tokens_per_s"]), vllm_predict(x, weight_only=eps)[1]) for x in rows])


def fit_weight_only_efficiency(rows: list[dict[str, Any]], gpu: str, page: str) -> tuple[float, float]:
    """``(ε_w, MAPE)``: the weight-only GEMM efficiency in ``[0.1, 1]`` that minimises the
    output-throughput MAPE of ``page``'s engine-bound MXFP4 rows on ``gpu`` (golden-section
    search, 40 steps)."""
    mine = [x for x in weight_only_rows(rows, gpu) if vllm_page(x) == page]
    if not mine:
        raise ValueError(f"no engine-bound MXFP4 row on page {page!r}")
    eps = _golden_min(lambda e: weight_only_mape(mine, e), 0.1, 1.0, 40)
    return eps, weight_only_mape(mine, eps)


#: vLLM's attention kernel for models with attention sinks where FlashAttention-2 cannot run
#: them (``TRITON_ATTN``: gpt-oss on Ampere), as a share ``ε_s`` of the kernel rate the preset
#: otherwise uses (``F_peak`` on A100), which the Ampere presets carry as their rollout step's
#: ``sink_attention_efficiency`` (docs/cost-model.md §8, "Attention sinks on the engine"): issue
#: 31's one efficiency per operation class per GPU generation, fitted
#: (:func:`fit_sink_attention_efficiency`) on the engine-bound rows of one page and reported on the
#: other pages of that GPU. Hopper and Blackwell serve sinks with FlashAttention-3 and FlashInfer
#: and keep 1. ``(GPU, fit page, presets, ε_s)``.
SINK_ATTENTION_FIT = ("A100", "gpt-oss-20b/a100.md", ("a100-80gb", "a100-40gb"), 0.162)


def sink_rows(rows: list[dict[str, Any]], gpu: str) -> list[dict[str, Any]]:
    """The expressible engine-bound rows of one GPU whose model has attention sinks
    (:attr:`~rpeg.ir.models.ModelSpec.attention_sinks`; :func:`engine_bound_rows`)."""
    return engine_bound_rows(rows, gpu, lambda x: vllm_spec(x).attention_sinks)


def sink_mape(rows: list[dict[str, Any]], eps: float | None = None) -> float:
    """Output-throughput MAPE of ``rows`` with ``ε_s = eps`` (``None``: the presets')."""
    return _mape([(float(x["output_tokens_per_s"]), vllm_predict(x, sink_attention=eps)[1]) for x in rows])


def fit_sink_attention_efficiency(
    rows: list[dict[str, Any]], gpu: str = SINK_ATTENTION_FIT[0], page: str = SINK_ATTENTION_FIT[1]
) -> tuple[float, float]:
    """``(ε_s, MAPE)``: the attention-sink kernel efficiency in ``[0.02, 1]`` that minimises the
    output-throughput MAPE of ``page``'s engine-bound rows of models with sinks on ``gpu``
    (golden-section search, 40 steps)."""
    mine = [x for x in sink_rows(rows, gpu) if vllm_page(x) == page]
    if not mine:
        raise ValueError(f"no engine-bound row of a model with attention sinks on page {page!r}")
    eps = _golden_min(lambda e: sink_mape(mine, e), 0.02, 1.0, 40)
    return eps, sink_mape(mine, eps)


def sink_report(rows: list[dict[str, Any]]) -> list[str]:
    """Summary lines of the attention-sink kernel's fitted efficiency: the refit on its page
    against the presets', and the GPU's other pages' rows of models with sinks, fitted and at
    ``ε_s = 1``, with their longest-prompt rows (where the kernel's share is largest) apart."""
    gpu, page, presets, eps = SINK_ATTENTION_FIT
    fit, fit_mape = fit_sink_attention_efficiency(rows)
    on_gpu = sink_rows(rows, gpu)
    mine = [x for x in on_gpu if vllm_page(x) == page]
    held = [x for x in on_gpu if vllm_page(x) != page]
    longest = max(vllm_lengths(x)[0] for x in held)
    long_held = [x for x in held if vllm_lengths(x)[0] == longest]
    return [
        "",
        'Attention sinks on Ampere (one fitted figure; docs/cost-model.md §8, "Attention sinks on the '
        'engine"): FlashAttention-2 has no sinks, so vLLM serves gpt-oss on A100 with its Triton '
        "attention kernel (TRITON_ATTN), which the presets' rollout step runs at ε_s × the rate they "
        "otherwise give the attention kernel (F_peak on A100):",
        "",
        f"- {gpu} ({', '.join(presets)} carry ε_s = {eps}): refit now on {page}: {fit:.3f}; MAPE "
        f"{fit_mape:.1f} % there ({sink_mape(mine, 1.0):.1f} % at ε_s = 1)",
        f"  - held out, the other {gpu} pages' {len(held)} engine-bound rows of models with sinks: MAPE "
        f"{sink_mape(held):.1f} % (at ε_s = 1: {sink_mape(held, 1.0):.1f} %); their {len(long_held)} "
        f"rows of {longest}-token prompts: {_ratios_at(long_held, None)} × published (at ε_s = 1: "
        f"{_ratios_at(long_held, 1.0)})",
    ]


def _ratios_at(rows: list[dict[str, Any]], eps: float | None) -> str:
    """rpeg/published of ``rows`` at ``ε_s = eps``, as ``lo–hi``."""
    ratios = sorted(vllm_predict(x, sink_attention=eps)[1] / float(x["output_tokens_per_s"]) for x in rows)
    return f"{ratios[0]:.2f}–{ratios[-1]:.2f}"


#: The page whose pairs of runs with and without ``--async-scheduling`` fit ``c_w``, the host
#: seconds per step asynchronous scheduling leaves exposed (``EngineStep.async_host_s``, every
#: GPU preset's: a host figure, like ``c_step``); the other pages' pairs are held out
#: (:func:`fit_async_host`, :func:`async_report`). The presets carry :data:`ASYNC_HOST_FIT`.
ASYNC_FIT_PAGE = "gpt-oss-20b/h100.md"
ASYNC_HOST_FIT = 0.00325


def async_pairs(rows: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """``(with the flag, without)``: the expressible engine-bound rows of one page published
    twice, with and without ``--async-scheduling``, everything else (GPU, the rest of the
    command, data set, lengths, request rate, requests) the same."""

    def key(x: dict[str, Any]) -> tuple[Any, ...]:
        command = " ".join(w for w in x["serve_command"].split() if w != "--async-scheduling")
        return (vllm_page(x), x["gpu"], command, x["dataset"], x["input_len"], x["output_len"],
                x["request_rate"], x["requests"])  # fmt: skip

    found: dict[tuple[Any, ...], dict[bool, list[dict[str, Any]]]] = {}
    for x in rows:
        if vllm_why_not(x) is None and not vllm_front_end_bound(x):
            flagged = "--async-scheduling" in x["serve_command"].split()
            found.setdefault(key(x), {True: [], False: []})[flagged].append(x)
    return [(g[True][0], g[False][0]) for g in found.values() if len(g[True]) == len(g[False]) == 1]


def async_pair_error(pairs: list[tuple[dict[str, Any], dict[str, Any]]], host: float | None = None) -> float:
    """Mean absolute relative error, in %, of rpeg's speed-up from the flag against the
    published one over ``pairs``: ``|(r_a/r_s)/(p_a/p_s) − 1|``, ``r`` rpeg's output tokens/s
    with ``c_w = host`` (``None``: the presets'), ``p`` the published. The rest of the model's
    error on a configuration cancels in the ratio."""
    errors = []
    for flagged, plain in pairs:
        ours = vllm_predict(flagged, async_host=host)[1] / vllm_predict(plain, async_host=host)[1]
        theirs = float(flagged["output_tokens_per_s"]) / float(plain["output_tokens_per_s"])
        errors.append(abs(ours / theirs - 1.0))
    return 100.0 * sum(errors) / len(errors)


def fit_async_host(rows: list[dict[str, Any]], page: str = ASYNC_FIT_PAGE) -> tuple[float, float]:
    """``(c_w, error)``: the unhidden host seconds per step in ``[0, c_step]`` that minimise
    :func:`async_pair_error` over ``page``'s pairs (golden-section search, 40 steps)."""
    from rpeg.costmodel.hardware import hardware_preset

    mine = [p for p in async_pairs(rows) if vllm_page(p[0]) == page]
    if not mine:
        raise ValueError(f"no pair of runs with and without --async-scheduling on page {page!r}")
    step_s = hardware_preset(VLLM_GPUS[mine[0][0]["gpu"]]).rollout_step.step_s
    host = _golden_min(lambda c: async_pair_error(mine, c), 0.0, step_s, 40)
    return host, async_pair_error(mine, host)


def async_report(rows: list[dict[str, Any]]) -> list[str]:
    """Summary lines of the expressible engine-bound rows served with ``--async-scheduling``:
    priced with the engine's asynchronous scheduling (:func:`vllm_engine_step`) and, beside them,
    as if the flag were absent; then the pairs of runs with and without the flag, rpeg's
    speed-up beside the published one, with the presets' fitted ``c_w`` and with ``c_w = 0``."""
    served = [
        x
        for x in rows
        if vllm_why_not(x) is None
        and not vllm_front_end_bound(x)
        and "--async-scheduling" in x["serve_command"]
    ]
    if not served:
        return []

    def pairs(async_scheduling: bool) -> list[tuple[float, float]]:
        return [
            (float(x["output_tokens_per_s"]), vllm_predict(x, async_scheduling=async_scheduling)[1])
            for x in served
        ]

    lines = [
        "",
        "Rows served with `--async-scheduling` (the host's per-step seconds hidden behind the GPU's "
        "but `c_w`, `EngineStep.async_scheduling` and `async_host_s`; docs/cost-model.md §8, "
        '"The engine step"):',
        "",
        _summary("engine-bound rows with the flag, priced asynchronous", pairs(True)),
        _summary("the same rows priced synchronous", pairs(False)),
    ]
    both = async_pairs(rows)
    if not both:
        return lines
    host, err = fit_async_host(rows)
    mine = [p for p in both if vllm_page(p[0]) == ASYNC_FIT_PAGE]
    held = [p for p in both if vllm_page(p[0]) != ASYNC_FIT_PAGE]
    lines += [
        "",
        f"Pairs of runs published with and without `--async-scheduling`, all else the same ({len(both)} "
        "engine-bound pairs; the front-end-bound 128/4 pairs aside): the flag's speed-up, published "
        "and rpeg's. The presets' `c_w` (the host seconds per step asynchronous scheduling leaves "
        f"exposed) is {ASYNC_HOST_FIT * 1e3:.2f} ms, fitted on {ASYNC_FIT_PAGE}'s {len(mine)} pairs "
        f"(refit now: {host * 1e3:.2f} ms, mean error of the speed-up {err:.1f} % there, "
        f"{async_pair_error(mine, 0.0):.1f} % at `c_w = 0`); held out, the other pages' {len(held)} "
        f"pairs: {async_pair_error(held):.1f} % ({async_pair_error(held, 0.0):.1f} % at `c_w = 0`).",
        "",
        "| page | data set | in / out | published speed-up | rpeg, fitted c_w | rpeg, c_w = 0 |",
        "|---|---|---|---:|---:|---:|",
    ]
    for flagged, plain in both:
        theirs = float(flagged["output_tokens_per_s"]) / float(plain["output_tokens_per_s"])
        fitted = vllm_predict(flagged)[1] / vllm_predict(plain)[1]
        bare = vllm_predict(flagged, async_host=0.0)[1] / vllm_predict(plain, async_host=0.0)[1]
        lengths = "—" if plain["input_len"] is None else f"{plain['input_len']} / {plain['output_len']}"
        lines.append(
            f"| {vllm_page(plain)}{' (fit)' if vllm_page(plain) == ASYNC_FIT_PAGE else ''} | "
            f"{plain['dataset']} | {lengths} | {theirs:.3f} | {fitted:.3f} | {bare:.3f} |"
        )
    return lines


def weight_only_report(rows: list[dict[str, Any]]) -> list[str]:
    """Summary lines of the weight-only GEMM efficiencies: per GPU generation, the refit on its
    page against the presets', and the other pages' engine-bound MXFP4 rows fitted and at
    ``ε_w = 1``."""
    lines = [
        "",
        "Weight-only MXFP4 expert GEMMs (one fitted figure per GPU generation; docs/cost-model.md §11): "
        "the presets' vLLM rollout step runs them at ε_w × F_peak once compute-bound:",
        "",
    ]
    for gpu, page, presets, eps in WEIGHT_ONLY_FITS:
        fit, fit_mape = fit_weight_only_efficiency(rows, gpu, page)
        on_gpu = weight_only_rows(rows, gpu)
        mine = [x for x in on_gpu if vllm_page(x) == page]
        held = [x for x in on_gpu if vllm_page(x) != page]
        others = served_weight_only_rows(rows, gpu)
        lines += [
            f"- {gpu} ({', '.join(presets)} carry ε_w = {eps}): refit now on {page}: {fit:.3f}; MAPE "
            f"{fit_mape:.1f} % there ({weight_only_mape(mine, 1.0):.1f} % at ε_w = 1)",
            f"  - held out, the other {gpu} pages' {len(held)} engine-bound MXFP4 rows: MAPE "
            f"{weight_only_mape(held):.1f} % (at ε_w = 1: {weight_only_mape(held, 1.0):.1f} %)",
        ]
        if others:
            lines.append(
                f"  - held out, the {len(others)} engine-bound {gpu} rows of FP8 checkpoints, which vLLM serves "
                f"there as weight-only W8A16 Marlin GEMMs (no FP8 tensor cores): MAPE {weight_only_mape(others):.1f} % "
                f"(at ε_w = 1: {weight_only_mape(others, 1.0):.1f} %)"
            )
    return lines


def served_weight_only_rows(rows: list[dict[str, Any]], gpu: str) -> list[dict[str, Any]]:
    """The expressible engine-bound rows of one GPU whose FP8 or NVFP4 checkpoint it serves
    weight-only (:func:`rpeg.costmodel.precision.served_weight_only`): FP8 on A100."""
    from rpeg.costmodel.hardware import hardware_preset
    from rpeg.costmodel.precision import served_weight_only

    hw = hardware_preset(VLLM_GPUS[gpu])
    return [
        x
        for x in rows
        if x["gpu"] == gpu
        and vllm_why_not(x) is None
        and not vllm_front_end_bound(x)
        and vllm_precision(x) in ("fp8", "nvfp4")
        and served_weight_only(vllm_spec(x), hw)
    ]


#: Published vLLM start-up logs of gpt-oss-120b on one H100 (``gpu_model_runner.py``: "Model
#: loading took X GiB"): ``(GiB, vLLM version and MoE backend, source)``.
GPT_OSS_120B_LOADED = (
    (65.9651, "of 2025-08-20 (Marlin)", "https://github.com/vllm-project/vllm/issues/23278"),
    (64.38, "v0.14.1 (Triton)", "https://github.com/vllm-project/vllm/issues/33155"),
)


def _ratios(rows: list[dict[str, Any]], less: float) -> str:
    """rpeg/published of ``rows``, their memory fraction lowered by ``less``: ``"lo–hi"``."""
    r = [
        vllm_predict({**x, "gpu_memory_utilization": x["gpu_memory_utilization"] - less})[1]
        / x["output_tokens_per_s"]
        for x in rows
    ]
    return f"{min(r):.2f}–{max(r):.2f}"


def served_memory_report(rows: list[dict[str, Any]]) -> list[str]:
    """rpeg's resident weights of gpt-oss-120b served whole on one H100
    (:func:`~rpeg.costmodel.memory.served_weight_bytes`, precision mxfp4) against the published
    vLLM logs of :data:`GPT_OSS_120B_LOADED`, and the one-H100 ShareGPT rows of ``rows`` priced
    with the KV cache the smaller of those loads leaves."""
    from dataclasses import replace

    from rpeg.costmodel.hardware import hardware_preset
    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.memory import kv_budget_tokens, kv_bytes_per_token, served_weight_bytes
    from rpeg.ir.models import model_preset
    from rpeg.ir.plan import Strategy

    spec = replace(model_preset("gpt-oss-120b"), precision="mxfp4")
    hw = hardware_preset("h100")
    lay = Layout(Strategy((1, 1, 1), dp=1, pp=1, tp=1, mb=1, mem_fraction=VLLM_MEMORY_FRACTION))
    gib = served_weight_bytes(spec, lay) / 2**30
    kv = kv_budget_tokens(spec, lay, hw) * kv_bytes_per_token(spec, lay) / 2**30
    logged = "; ".join(f"{v:.2f} GiB with vLLM {what} ({src})" for v, what, src in GPT_OSS_120B_LOADED)
    more = sorted(v - gib for v, _, _ in GPT_OSS_120B_LOADED)
    sharegpt = [
        x
        for x in rows
        if vllm_why_not(x) is None
        and x["model"] == "openai/gpt-oss-120b"
        and x["gpu"] == "H100"
        and x["tp"] == 1
        and x["dataset"] == "sharegpt"
    ]
    return [
        "",
        f"gpt-oss-120b's weights on one H100: rpeg {gib:.2f} GiB (MXFP4 experts at 0.53125 bytes, the rest "
        f"BF16), vLLM logged {logged}. The difference, which rpeg does not model, is the MoE kernels' padded "
        "and swizzled weight layouts (vLLM rounds the experts' widths up to the kernel's tile: "
        "`mxfp4_round_up_hidden_size_and_intermediate_size`). At memory fraction 0.9 rpeg leaves the KV cache "
        f"{kv:.1f} GiB where those loads leave {kv - more[-1]:.1f}–{kv - more[0]:.1f} GiB. Priced with the "
        f"{more[0]:.2f} GiB less that the Triton load leaves (the memory fraction lowered by as much), the "
        "120b's one-H100 ShareGPT rows go from "
        f"{_ratios(sharegpt, 0.0)} to {_ratios(sharegpt, more[0] * 2**30 / hw.gpu_memory_bytes)} × published: "
        "the missing layout accounts for part of their over-prediction.",
    ]


def _mape(pairs: list[tuple[float, float]]) -> float:
    return 100 * sum(abs(q - p) / p for p, q in pairs) / len(pairs)


def _summary(name: str, pairs: list[tuple[float, float]]) -> str:
    """One summary line of ``(published, predicted)`` pairs: rows, MAPE, Spearman ρ, median ratio."""
    pub, pred = [p for p, _ in pairs], [q for _, q in pairs]
    return (
        f"- {name}: {len(pairs)} rows, MAPE {_mape(pairs):.1f} %, Spearman ρ {spearman(pub, pred):.2f}, "
        f"rpeg/published median {sorted(q / p for p, q in pairs)[len(pairs) // 2]:.2f}"
    )


def generation_report(argv: list[str] | None, write: bool) -> None:
    """Predict every expressible vLLM row, print the side-by-side table and the MAPE, and write
    the ``gpu-fidelity-generation`` section of RESULTS.md (unless ``write`` is false)."""
    import _bench

    doc = json.loads(VLLM_DATA.read_text())
    rows = load_vllm_rows()
    head = (
        "| page | model | GPU | TP | prec | dataset | n | Lp | Lr | published out tok/s | rpeg out tok/s "
        "| published s | mean TTFT / published s | rpeg T_gen s | rpeg/pub |"
    )
    table = [head, "|" + "---|" * 15]
    skipped: dict[str, int] = {}
    by_set: dict[str, list[tuple[float, float]]] = {}
    engine: list[tuple[float, float]] = []
    for row in rows:
        reason = vllm_why_not(row)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        t, pred = vllm_predict(row)
        pub = float(row["output_tokens_per_s"])
        by_set.setdefault(row["dataset"], []).append((pub, pred))
        by_set.setdefault(f"precision {vllm_precision(row).upper()}", []).append((pub, pred))  # type: ignore[union-attr]
        if row["dataset"] == "random":
            by_set.setdefault(f"random {row['input_len']}/{row['output_len']}", []).append((pub, pred))
        if not vllm_front_end_bound(row):
            engine.append((pub, pred))
        lp, lr = vllm_lengths(row)
        page = vllm_page(row)
        ttft = row["mean_ttft_ms"] / 1e3 / row["duration_s"] if row.get("mean_ttft_ms") else float("nan")
        table.append(
            f"| {page} | {row['model']} | {row['gpu']} | {row['tp']} | {vllm_precision(row)} | "
            f"{row['dataset']} | {row['requests']} | "
            f"{lp} | {lr} | {pub:,.1f} | {pred:,.1f} | {row['duration_s']:.2f} | {ttft:.2f} | {t:.2f} | "
            f"{pred / pub:.2f} |"
        )
    stats = []
    every = [
        pair for key, pairs in by_set.items() if "/" not in key and "precision" not in key for pair in pairs
    ]
    case = "random {}/{}".format(*FRONT_END_CASE)
    groups = [*sorted(by_set.items()), ("all", every), (f"all but {case} (front-end bound)", engine)]
    for name, pairs in groups:
        if not pairs:
            continue
        stats.append(_summary(name, pairs))
    lines = [
        "## GPU fidelity: vLLM serving throughput (GPUStack performance lab) vs rpeg generation (issue 31)",
        "",
        f"Command: `{_bench.command('gpu_fidelity.py', argv)}`. Machine: {_bench.machine()}.",
        "",
        f"Published rows: {doc['source']}, `benchmarks/data/vllm_serving.json` (every vLLM result block of "
        "the H100/H200/A100 throughput pages, figures as published: `vllm bench serve`, request rate inf, "
        "so all requests are queued at once). Each expressible row is one generation on rpeg's continuously "
        "batching engine (`generation_times`, SPEC §14.5): n = the successful requests, prompt Lp (the "
        "published mean per request) and responses whose lengths only the mean Lr (published) and the cap "
        "are known of: the cap is a random case's requested output (its `max_tokens`; `vllm bench serve` "
        "does not set `ignore_eos`, so a response may end sooner) or a ShareGPT completion's 2048 − Lp "
        "(vLLM's ShareGPT sampling keeps prompt + completion ≤ 2,048 tokens), and the law is the "
        "maximum-entropy one with that mean under the cap (`vllm_buckets`, `max_entropy_quantiles`: a "
        "truncated exponential in up to 128 pieces; a point mass at the cap when every response ran to it: "
        "the longest responses set how long the engine drains, which a point mass at the mean hides), "
        "TP on one node of the GPU's "
        "preset (H100 → h100, H200 → h200, A100 → a100-80gb, each with the memory its driver reports), "
        "memory fraction 0.9 (vLLM's default "
        "`--gpu-memory-utilization`); FP8 checkpoints run with precision fp8 (FP8 GEMMs for the blocks, "
        "their weights in 1 byte, BF16 KV cache: docs/cost-model.md §11; on A100, which has no FP8 tensor "
        "cores, vLLM serves them as weight-only W8A16 Marlin GEMMs, and so does rpeg), gpt-oss's MXFP4 checkpoints "
        "with precision mxfp4 (the routed experts stored in 0.53125 bytes per weight and run as "
        'weight-only GEMMs at the BF16 peak, everything else BF16: docs/cost-model.md §11, "MXFP4 '
        'experts"); '
        "predicted output tokens/s = published generated tokens / T_gen, so "
        "rpeg/published is the same for output and total tokens/s. "
        "Each engine step costs the roofline of its weight GEMMs (over the engine's prefill efficiency, "
        "where the preset has one), then its attention kernel (the preset's "
        "fused-attention rate or F_peak, times the engine's ε_s for gpt-oss, whose attention sinks "
        "vLLM serves on A100 with its Triton kernel; a decode step's bound by its KV reads: "
        'docs/cost-model.md §8, "The attention core on the engine", "Attention sinks on the engine"), plus the preset\'s cited fixed seconds per step, '
        "the prompts are prefilled in chunks of the token budget, and the budget and sequence cap are "
        "`vllm serve`'s defaults for the GPU (8192 tokens and 1024 sequences; 2048 and 256 on A100) unless "
        'the command sets them (`vllm_engine_step`; docs/cost-model.md §8, "The engine step"); a '
        "server started with `--async-scheduling` hides each step's host seconds behind its GPU "
        "seconds. "
        f"The random {FRONT_END_CASE[0]}/{FRONT_END_CASE[1]} rows (4 output tokens per request) measure the "
        "HTTP front end and the benchmark client more than the engine (their mean TTFT is most of the run "
        "although their prefill is a few dozen steps; `vllm_front_end_bound`): an in-process rollout engine "
        "pays none of it, so they are kept in the table and in 'all' but also summarised without them. "
        f"**Four kinds of figure are fitted**: the h100 and h200 presets' vLLM prefill efficiency "
        f"({HOPPER_PREFILL_EFFICIENCY}, on {PREFILL_FIT_PAGE}), per GPU generation the weight-only "
        "MXFP4 expert GEMMs' efficiency (Hopper on "
        f"{WEIGHT_ONLY_FITS[0][1]}, Ampere on {WEIGHT_ONLY_FITS[1][1]}), the Ampere presets' "
        f"attention-sink kernel efficiency ε_s ({SINK_ATTENTION_FIT[3]}, on {SINK_ATTENTION_FIT[1]}, "
        "jointly with Ampere's ε_w: each refitted at the other's value until neither moves), and the "
        "host seconds per step asynchronous scheduling leaves exposed (below); each is reported on "
        "the pages it was not fitted on, below the table; nothing else is fitted to these rows. "
        "Acceptance target of issue 31: MAPE ≤ 20 %.",
        "",
        f"{len(rows)} rows; {len(every)} expressible, {len(rows) - len(every)} not:",
        "",
        *[f"- {n} × {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1])],
        "",
        *table,
        "",
        *stats,
        *prefill_report(rows),
        *async_report(rows),
        *weight_only_report(rows),
        *sink_report(rows),
        *served_memory_report(rows),
    ]
    print("\n".join(lines))
    if write:
        _bench.write_section("gpu-fidelity-generation", lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument(
        "--refresh", metavar="GIT_DIR", help="rebuild the data file from a Megatron-Bridge git dir"
    )
    ap.add_argument(
        "--refresh-recipes",
        metavar="GIT_DIR",
        help="rebuild the MoE rows' recipe settings from a Megatron-Bridge git dir (at the data commit)",
    )
    ap.add_argument(
        "--refresh-release-recipes",
        metavar="GIT_DIR",
        help="rebuild the archived tables' workload configs from a Megatron-Bridge git dir (its release tags)",
    )
    ap.add_argument("--no-write", action="store_true", help="print only; leave RESULTS.md alone")
    ap.add_argument(
        "--generation", action="store_true", help="the vLLM serving rows (generation) instead of training"
    )
    ap.add_argument(
        "--refresh-vllm", metavar="GIT_DIR", help="rebuild the vLLM data file from a gpustack git dir"
    )
    ap.add_argument(
        "--megatron-lm",
        action="store_true",
        help="the held-out A100 rows (Megatron-LM SC'21 Table 1) instead of Megatron-Bridge",
    )
    args = ap.parse_args(argv)
    if args.refresh:
        refresh(args.refresh)
        return
    if args.refresh_vllm:
        refresh_vllm(args.refresh_vllm)
        return
    if args.refresh_recipes:
        refresh_recipes(args.refresh_recipes)
        return
    if args.refresh_release_recipes:
        refresh_release_recipes(args.refresh_release_recipes)
        return
    sys.path.insert(0, str(HERE))
    if args.generation:
        generation_report(argv, not args.no_write)
        return
    if args.megatron_lm:
        megatron_lm_report(argv, not args.no_write)
        return
    import _bench

    doc = json.loads(DATA.read_text())
    rows = load_rows()
    head = "| release | model | system | GPUs | prec | GBS | MBS | ℓ | TP | PP | VP | CP | EP | published | rpeg | rpeg/pub |"
    table = [head, "|" + "---|" * 16]
    skipped: dict[str, int] = {}
    by_prec: dict[str, list[tuple[float, float]]] = {}
    priced: list[tuple[dict[str, Any], float, float]] = []
    apart: dict[str, list[str]] = {}
    for row in rows:
        reason = why_not(row)
        if reason:
            skipped[reason] = skipped.get(reason, 0) + 1
            continue
        pub, pred = float(row["tokens_per_s_per_gpu"]), predict(row)
        note = regression_note(row)
        label = f"{row['release']} {row['model']} {row['system']} {row['precision']}: {pred / pub:.2f}"
        if note is not None:
            apart.setdefault(note, []).append(label)
        else:
            priced.append((row, pub, pred))
            by_prec.setdefault(row["precision"], []).append((pub, pred))
            if PRECISIONS[row["precision"]] == "fp8":  # an FP8 recipe (plain FP8 too): also pooled
                by_prec.setdefault("all FP8 recipes", []).append((pub, pred))
        table.append(
            f"| {row['release']} | {row['model']} | {row['system']} | {row['gpus']} | {row['precision']} | "
            f"{row['gbs']} | {row['mbs']} | {row['seq_len']} | {row['tp']} | {row['pp']} | {row['vp'] or 1} | {row['cp']} | "
            f"{row['ep'] or 1} | {pub:,.0f} | {pred:,.0f} | {pred / pub:.2f}{' (apart)' if note else ''} |"
        )
    stats = []
    for prec, pairs in sorted(by_prec.items()):
        stats.append(_summary(prec, pairs))
    stats += ["", "By model kind and release (every precision's recipes, the same rows as above):", ""]
    stats += [_summary(name, pairs) for name, pairs in breakdown(priced).items() if pairs]
    stats += ["", "By published table (one per release, newest first; the same rows as above):", ""]
    stats += [_summary(name, pairs) for name, pairs in release_breakdown(priced).items()]
    stats += release_recipe_report(priced)
    stats += expert_report(rows)
    stats += flex_report(priced)
    stats += fp4_report(rows)
    n_ok, n_apart = len(priced), sum(len(labels) for labels in apart.values())
    lines = [
        "## GPU fidelity: Megatron-Bridge pre-training throughput vs rpeg (issue 31)",
        "",
        f"Command: `{_bench.command('gpu_fidelity.py', argv)}`. Machine: {_bench.machine()}.",
        "",
        f"Published rows: {doc['source']}. Each expressible row's layout is priced as one training "
        "vertex (`op_time`, Role.TRAINING) on the matching preset (DGX-H100 → h100, DGX-B200 → b200, "
        "DGX-B300 → b300, DGX-GB200 → gb200-nvl72, DGX-GB300 → gb300-nvl72); predicted tokens/s/GPU = GBS·ℓ/(T_step·GPUs). ZeRO-1, SP when TP > 1, "
        "no recomputation are assumptions (the tables do not publish them); a mixture of experts' experts "
        "run whole on one rank (etp = 1: Megatron-Bridge's MoE recipes set expert_tensor_parallel_size = 1), "
        "their EP ranks folded into the TP·DP·CP ranks, and their router balances exactly (load imbalance "
        "λ = 1: the recipes set moe_router_force_load_balancing), and its tokens go through the dispatcher "
        "its performance recipe sets (AlltoAll or flex: DeepEP, HybridEP), its AlltoAlls overlapped where the "
        "recipe sets overlap_moe_expert_parallel_comm: the newest table's from the recipes at the data commit "
        "(`benchmarks/data/megatron_bridge_moe_recipes.json`), an archived table's from the workload config of "
        "its release with the row's layout (`benchmarks/data/megatron_bridge_release_recipes.json`: the "
        "release tag nearest in time to the commit that published the table, an assumption; its config's "
        "moe_flex_dispatcher_backend where that release turns the backend on for the system, and "
        "moe_a2a_overlap), or where no config of that release has the row's layout, the data commit's "
        "(the lines below the table count them). "
        "The FP8 recipes (FP8, FP8-CS, FP8-MX, MXFP8) run with precision fp8 (docs/cost-model.md §11: "
        "the presets' FP8 peak for the blocks' weight GEMMs, attention core and LM head at the BF16 peak, "
        "1-byte weights and GEMM inputs in the roofline, Transformer Engine's quantize kernels as "
        "memory-bound work); NVFP4 rows run with precision nvfp4 (the same GEMMs at the presets' NVFP4 peak, "
        "0.5625-byte operands); statistics per published precision and pooled. "
        "**Two figures are fitted to this table, each on one release and reported on the others: the "
        "expert-layer efficiency of mixture-of-experts training, on release 26.08, and the NVFP4 GEMMs' "
        "efficiency on Blackwell, on release 26.04.01 (the lines below the table). Nothing else is fitted: "
        "the rest is the baseline of the current presets.**",
        "",
        f"{len(rows)} rows of the six models; {n_ok + n_apart} expressible, {len(rows) - n_ok - n_apart} not:",
        "",
        *[f"- {n} × {reason}" for reason, n in sorted(skipped.items(), key=lambda kv: -kv[1])],
        "",
        *(
            [
                f"{n_apart} expressible rows are priced and shown ('apart') but kept out of every statistic "
                "and fit below, because their table marks them as measured under a known performance "
                "regression (`regression_note`):",
                "",
                *[f'- {", ".join(labels)} — the footnote: "{note}"' for note, labels in apart.items()],
                "",
            ]
            if apart
            else []
        ),
        *table,
        "",
        *stats,
    ]
    print("\n".join(lines))
    if not args.no_write:
        _bench.write_section("gpu-fidelity", lines)


# ---------------------------------------------------------------------------------------------
# Held-out A100 training: Megatron-LM's Table 1 (Narayanan et al., SC'21), ``--megatron-lm``
# ---------------------------------------------------------------------------------------------

MLM_DATA = HERE / "data" / "megatron_lm_a100.json"
#: The A100 preset the Selene rows are priced on (DGX A100 80 GB nodes).
MLM_PRESET = "a100-80gb"
#: Nodes per "rack" for the link tiers: the DGX SuperPOD (DGX A100) scalable unit of 20 nodes that
#: Selene is built of (an assumption of this comparison: the paper publishes no rack layout).
MLM_NODES_PER_RACK = 20
MLM_REQUIRED = (
    "model",
    "hidden",
    "layers",
    "heads",
    "seq_len",
    "vocab",
    "tp",
    "pp",
    "gpus",
    "gbs",
    "mbs",
    "vp",
    "recompute",
    "precision",
    "tflops_per_gpu",
)


def load_megatron_lm_rows(path: Path = MLM_DATA) -> list[dict[str, Any]]:
    """The Megatron-LM Table 1 rows (``benchmarks/data/megatron_lm_a100.json``), each checked
    for :data:`MLM_REQUIRED` fields (:func:`_load`)."""
    return _load(path, MLM_REQUIRED)


def megatron_lm_spec(row: dict[str, Any]) -> Any:
    """The GPT model of a Table 1 row as a :class:`~rpeg.ir.models.ModelSpec`: ``L`` layers of
    width ``h``, a ``4h`` FFN of two projections (GELU), multi-head attention (``kv_heads =
    heads``), vocabulary ``V``, the LM head tied to the input embedding (Megatron-LM's GPT shares
    them). The learned position embedding (``s·h`` parameters, no GEMM) has no field in
    ``ModelSpec`` and is left out."""
    from rpeg.ir.models import ModelSpec

    return ModelSpec(
        name=f"gpt-{row['model'].lower()}",
        layers=row["layers"],
        hidden=row["hidden"],
        ffn_hidden=4 * row["hidden"],
        vocab=row["vocab"],
        heads=row["heads"],
        kv_heads=row["heads"],
        ffn_projections=2,
        tied_embeddings=True,
    )


def megatron_lm_why_not(row: dict[str, Any]) -> str | None:
    """Why rpeg cannot express a Table 1 row, or ``None`` when it can (``vp > 1``: Megatron's
    interleaved schedule, :attr:`Strategy.vp <rpeg.ir.plan.Strategy.vp>`)."""
    tp, pp = row["tp"], row["pp"]
    if row["gpus"] % (tp * pp):
        return "GPUs not divisible by TP·PP"
    dp = row["gpus"] // (tp * pp)
    if row["gbs"] % (dp * row["mbs"]):
        return "batch not divisible by DP·MBS"
    if row["layers"] % pp:
        return "layers not divisible by PP"
    if row["recompute"] not in ("none", "selective", "full"):
        return f"recomputation {row['recompute']!r} unknown"
    return None


def megatron_lm_strategy(row: dict[str, Any], nodes_per_rack: int = MLM_NODES_PER_RACK) -> tuple[Any, int]:
    """The :class:`~rpeg.ir.plan.Strategy` of a Table 1 row and its preset's ``gpus_per_node``.

    ``Pt = TP``, ``Pp = PP``, ``Pd = N_GPU/(TP·PP)``, ``mb = B/(Pd·MBS)`` microbatches of ``MBS``
    sequences, the row's recomputation, no sequence parallelism (not yet in Megatron-LM then),
    ZeRO stage 1 (Megatron's DDP all-reduces the gradients: the same bytes as rpeg's
    ReduceScatter + AllGather; its memory is not compared here). Link tiers follow Megatron's rank
    order (``megatron.core.parallel_state``, order ``tp-cp-ep-dp-pp``: tensor fastest, pipeline
    outermost), rank ``(p·Pd + d)·Pt + t``, on nodes of ``gpus_per_node`` ranks and racks of
    ``nodes_per_rack`` nodes: a pipeline group strides ``Pd·Pt`` ranks, a data-parallel group
    ``Pt``.
    """
    from rpeg.costmodel.hardware import hardware_preset
    from rpeg.ir.plan import Strategy

    g = hardware_preset(MLM_PRESET).gpus_per_node
    n, tp, pp = row["gpus"], row["tp"], row["pp"]
    dp = n // (tp * pp)

    def rank(p: int, d: int) -> int:
        return (p * dp + d) * tp

    def tier(ranks: list[int]) -> int:
        return _tier(ranks, g, nodes_per_rack)

    nodes = math.ceil(n / g)
    extent = (1, 1, n) if n <= g else (math.ceil(nodes / nodes_per_rack), min(nodes, nodes_per_rack), g)
    strategy = Strategy(
        extent,
        dp=dp,
        pp=pp,
        tp=tp,
        mb=row["gbs"] // (dp * row["mbs"]),
        pp_tier=tier([rank(p, 0) for p in range(pp)]),
        dp_tier=tier([rank(0, d) for d in range(dp)]),
        recompute=row["recompute"],
        zero=1,
        sp=False,
        vp=row.get("vp") or 1,
    )
    return strategy, g


def megatron_lm_flops(row: dict[str, Any]) -> float:
    """FLOPs of one iteration as the paper counts them (its eq. (3), with recomputation):
    ``F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))``, ``B`` the batch in sequences, ``s`` the
    sequence length, ``l`` the layers, ``h`` the width, ``V`` the vocabulary."""
    b, s, layers, h, v = row["gbs"], row["seq_len"], row["layers"], row["hidden"], row["vocab"]
    return 96.0 * b * s * layers * h * h * (1 + s / (6 * h) + v / (16 * layers * h))


def megatron_lm_predict(row: dict[str, Any]) -> tuple[float, float]:
    """rpeg's step time of a Table 1 row (one training vertex, :func:`~rpeg.costmodel.time.op_time`
    on the ``a100-80gb`` preset, :func:`megatron_lm_strategy`) and the teraFLOP/s per GPU it
    implies under the paper's own count: ``F/(T_step·N_GPU)`` (:func:`megatron_lm_flops`)."""
    from rpeg.costmodel.hardware import hardware_preset
    from rpeg.costmodel.layout import Layout
    from rpeg.costmodel.time import op_time
    from rpeg.ir.types import Role

    strategy, g = megatron_lm_strategy(row)
    ell = row["seq_len"]
    t = op_time(
        megatron_lm_spec(row),
        Role.TRAINING,
        Layout(strategy, gpus_per_node=g),
        hardware_preset(MLM_PRESET),
        sequences=row["gbs"],
        prompt_len=ell // 2,
        response_len=ell - ell // 2,
        tokens=float(ell),
        tokens_sq=float(ell * ell),
    )
    return t.total, megatron_lm_flops(row) / (t.total * row["gpus"]) / 1e12


def megatron_lm_report(argv: list[str] | None, write: bool) -> list[str]:
    """Price every Table 1 row, print the side-by-side table, MAPE and Spearman ρ (all rows, and
    the rows without the interleaved schedule), and write the ``gpu-fidelity-a100`` section of
    RESULTS.md when ``write``. Returns the lines."""
    import _bench

    doc = json.loads(MLM_DATA.read_text())
    rows = load_megatron_lm_rows()
    head = (
        "| model | h | l | heads | GPUs | TP | PP | DP | B | MBS | mb | vp | tiers dp/pp "
        "| published TFLOP/s/GPU | rpeg T_step s | rpeg TFLOP/s/GPU | rpeg/pub |"
    )
    table = [head, "|" + "---|" * 17]
    skipped: list[str] = []
    pairs: dict[str, list[tuple[float, float]]] = {"all": [], "vp = 1 (no interleaving)": []}
    for row in rows:
        reason = megatron_lm_why_not(row)
        if reason:
            skipped.append(f"- {row['model']}: {reason}")
            continue
        s, _ = megatron_lm_strategy(row)
        t, pred = megatron_lm_predict(row)
        pub = float(row["tflops_per_gpu"])
        pairs["all"].append((pub, pred))
        if row["vp"] == 1:
            pairs["vp = 1 (no interleaving)"].append((pub, pred))
        table.append(
            f"| {row['model']} | {row['hidden']} | {row['layers']} | {row['heads']} | {row['gpus']} | {s.tp} | "
            f"{s.pp} | {s.dp} | {row['gbs']} | {row['mbs']} | {s.mb} | {row['vp']} | {s.dp_tier}/{s.pp_tier} | "
            f"{pub:.0f} | {t:.2f} | {pred:.1f} | {pred / pub:.2f} |"
        )
    stats = []
    for name, ps in pairs.items():
        if not ps:
            continue
        stats.append(_summary(name, ps))
    lines = [
        "## GPU fidelity, held out: Megatron-LM Table 1 on A100 (Narayanan et al., SC'21) vs rpeg (issue 31)",
        "",
        f"Command: `{_bench.command('gpu_fidelity.py', argv)}`. Machine: {_bench.machine()}.",
        "",
        f"Published rows: {doc['source']} Data file `benchmarks/data/megatron_lm_a100.json`. Each row's "
        f"layout is one training vertex (`op_time`, Role.TRAINING) on the `{MLM_PRESET}` preset: TP, PP, "
        "DP = GPUs/(TP·PP), mb = B/(DP·MBS), full recomputation, no sequence parallelism, link tiers from "
        f"Megatron's rank order (tensor, data, pipeline outermost) on 8-GPU nodes and {MLM_NODES_PER_RACK}-node "
        "racks (tier 0 node, 1 rack, 2 beyond). rpeg's teraFLOP/s per GPU = the paper's eq. (3) FLOPs "
        "96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)) / (T_step·GPUs), so both sides count the same FLOPs. "
        "vp > 1 rows ran Megatron's interleaved schedule and are priced with it (docs/cost-model.md §12: "
        "bubble (PP−1)/(vp·mb), vp times the pipeline's messages). "
        "**Held out: no term is fitted to these rows.**",
        "",
        *(["Not expressible:", "", *skipped, ""] if skipped else []),
        *table,
        "",
        *stats,
    ]
    print("\n".join(lines))
    if write:
        _bench.write_section("gpu-fidelity-a100", lines)
    return lines


if __name__ == "__main__":
    main()
