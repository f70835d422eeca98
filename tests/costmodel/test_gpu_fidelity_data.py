"""The published Megatron-Bridge rows of ``benchmarks/gpu_fidelity.py`` (issue 31): the data file
parses, every row carries its configuration and its source, and a row's layout translates to the
Strategy the benchmark prices."""

import dataclasses

import pytest

from rpeg.ir.plan import Strategy
from tests.conftest import load_benchmark


@pytest.fixture(scope="module")
def fid():
    return load_benchmark("gpu_fidelity")


def test_every_row_has_its_fields_and_a_source(fid):
    rows = fid.load_rows()
    assert len(rows) > 100
    for row in rows:
        src = row["source"]
        assert src["repo"] == "NVIDIA-NeMo/Megatron-Bridge" and len(src["commit"]) == 40
        assert src["path"] in fid.DOCS and src["table"]
        assert row["model_key"] in fid.MODELS
        for f in ("gpus", "gbs", "mbs", "seq_len", "tp", "pp"):
            assert isinstance(row[f], (int, str)), (f, row)
    # every model the issue names is present, and some BF16 rows exist for each DGX/GB200 preset
    assert {r["model_key"] for r in rows} == set(fid.MODELS)
    bf16 = {r["system"] for r in rows if r["precision"] == "BF16"}
    assert {"DGX-H100", "DGX-B200", "DGX-GB200"} <= bf16


def test_a_missing_field_is_named(fid, tmp_path):
    bad = tmp_path / "rows.json"
    bad.write_text('{"rows": [{"release": "x"}]}')
    with pytest.raises(ValueError, match=r"row 0 lacks \['model'"):
        fid.load_rows(bad)


def test_parser_keeps_every_column_and_the_alternatives_as_text(fid):
    text = "\n".join(
        [
            "## 25.11 NeMo Container",
            "### Pre-Training Performance",
            "#### System: DGX-H100",
            "| Model | #-GPUs | Precision | GBS | MBS | Sequence Length | FSDP | TP | PP | CP | VP | EP | GA"
            " | Tokens / sec / GPU | Model TFLOP / sec / GPU |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            "| GPT OSS 120B | 64 | BF16 | 512 | 4 | 4096 | 0 | 1 | 4 | 1 | 1 | 8 | 2 | 5630 | 153 |",
            "| LLAMA3_8B | 8 | FP8-CS | 128 | 1 | 8192 | 8 | 1 | 1 | 1 | n/a | 1 | 16 | 14451 | 744 |",
            "| LLAMA3.1_405B | 128 | FP8-CS (FP8-MX) | 64 | 1 | 8192 | 0 | 4 | 8 | 2 | 8 | 1 | 32"
            " | 661 (624) | 1667 (1576) |",
            "### SFT Performance",
            "#### Model: LLAMA3_70B",
            "| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP"
            " | Tokens / sec / GPU | Model TFLOP / sec / GPU |",
            "| DGX-H100 | 32 | FP8 | 32 | 1 | 4096 | 4 | 4 | 1 | 5 | n/a | 1638 | 710 |",
        ]
    )
    rows = fid.parse_summary(text, "docs/x.md", "0" * 40)
    assert [r["model"] for r in rows] == ["GPT OSS 120B", "LLAMA3.1_405B"]  # 8B and SFT skipped
    oss, big = rows
    assert (oss["system"], oss["ga"], oss["fsdp"], oss["vp"], oss["tokens_per_s_per_gpu"]) == (
        "DGX-H100",
        2,
        0,
        1,
        5630,
    )
    assert big["tokens_per_s_per_gpu"] == "661 (624)"
    assert fid.why_not(big) == "a cell publishes two configurations"  # both FP8: the cell refuses it
    assert fid.why_not(oss) is None


def test_a_footnoted_regression_is_kept_with_its_note_and_out_of_the_statistics(fid):
    """A cell's footnote marker keeps the footnote's text with the row; a row its table marks as a
    known performance regression is expressible but not compared (no statistic or fit sees it);
    in the data file, exactly 26.06.01's two GPT-OSS 120B rows are so marked."""
    text = "\n".join(
        [
            "## 26.06.01 NeMo Container",
            "### Pre-Training Performance",
            "#### Model: GPT OSS 120B",
            "| System | #-GPUs | Precision | GBS | MBS | Sequence Length | TP | PP | CP | VP | EP"
            " | Tokens / sec / GPU | Model TFLOP / sec / GPU |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
            "| DGX-GB300 | 64 | MXFP8 | 1280 | 4 | 4096 | 1 | 1 | 1 | n/a | 16 | 20288 | 661[^slow] |",
            "| DGX-GB200 | 64 | MXFP8 | 1280 | 4 | 4096 | 1 | 1 | 1 | n/a | 64 | 18304 | 597[^other] |",
            "",
            "[^slow]: Performance regression in this model is a known issue.",
            "[^other]: Measured with a new cluster.",
        ]
    )
    slow, other = fid.parse_summary(text, "docs/x.md", "0" * 40)
    assert slow["notes"] == ["Performance regression in this model is a known issue."]
    assert slow["model_tflops_per_gpu"] == 661  # the marker is not part of the figure
    assert fid.why_not(slow) is None and not fid.compared(slow)
    assert fid.regression_note(slow) == slow["notes"][0]
    assert other["notes"] == ["Measured with a new cluster."] and fid.compared(other)
    marked = [r for r in fid.load_rows() if fid.regression_note(r)]
    assert [(r["release"], r["model"]) for r in marked] == [("26.06.01", "GPT OSS 120B")] * 2
    assert not any(r in fid.moe_rows(fid.load_rows()) for r in marked)


def test_a_rows_layout_is_the_strategy_the_benchmark_prices(fid):
    # 26.04 GPT-OSS-120B on 64 DGX-H100 GPUs: TP 1, PP 4, EP 8, GBS 1280, MBS 1 -> Pd = 16,
    # 80 microbatches; 8 GPUs per node. Megatron's rank order (tp-cp-ep-dp-pp, pipeline
    # outermost): a stage holds 16 consecutive GPUs, so stages are two nodes apart (inter-node
    # pipeline), DP spans the stage's two nodes, and the EP group is 8 consecutive GPUs: one node
    row = {
        "system": "DGX-H100",
        "precision": "BF16",
        "gpus": 64,
        "gbs": 1280,
        "mbs": 1,
        "seq_len": 4096,
        "tp": 1,
        "pp": 4,
        "cp": 1,
        "vp": None,
        "ep": 8,
        "fsdp": 0,
        "model_key": "GPT OSS 120B",
        "tokens_per_s_per_gpu": 5810,
    }
    assert fid.why_not(row) is None
    strategy, g = fid.row_strategy(row)
    assert g == 8
    assert strategy == Strategy(
        (1, 8, 8), dp=16, pp=4, tp=1, mb=80, pp_tier=1, dp_tier=1, recompute="none", zero=1, ep=8, ep_tier=0
    )
    # the recipes' expert-TP of 1 (the tables do not publish it): EP ranks folded into TP·DP·CP
    assert fid.RECIPE_ETP == 1 and strategy.expert_tp == 1
    # a published expert-TP other than 1 or TP is not expressible (rpeg splits experts like the FFN or not at all)
    assert fid.why_not({**row, "etp": 2}) == "ETP=2: rpeg splits experts over 1 or TP=1 ranks"
    # TP 2 with EP 32 over 16 data-parallel ranks: the EP group folds into TP·DP
    folded = {**row, "tp": 2, "pp": 2, "ep": 32}
    assert fid.why_not(folded) is None
    s, _ = fid.row_strategy(folded)
    assert (s.tp, s.dp, s.ep, s.etp, s.sp) == (2, 16, 32, 1, True) and s.ep_tier == 1
    assert fid.why_not({**folded, "ep": 64}) == "EP does not divide TP·DP·CP"
    assert fid.predict(row) > 0
    assert fid.why_not({**row, "vp": 4}) is None  # Megatron's interleaved schedule, priced with vp
    assert fid.row_strategy({**row, "vp": 4})[0] == dataclasses.replace(strategy, vp=4)
    assert fid.why_not({**row, "system": "DGX-GB300"}) is None  # the Blackwell Ultra presets
    assert fid.why_not({**row, "system": "DGX-B300"}) is None
    assert fid.why_not({**row, "system": "DGX-A100"}) == "no hardware preset for DGX-A100"


def test_spearman_is_rank_correlation(fid):
    assert fid.spearman([1, 2, 3, 4], [10, 20, 30, 400]) == pytest.approx(1.0)
    assert fid.spearman([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0)
    assert fid.spearman([1, 2, 2, 3], [1, 3, 2, 4]) == pytest.approx(0.9486832980505138)


def test_every_vllm_row_has_its_fields_and_a_source(fid):
    rows = fid.load_vllm_rows()
    assert len(rows) > 100
    for row in rows:
        src = row["source"]
        assert src["repo"] == "gpustack/gpustack" and len(src["commit"]) == 40
        assert src["path"].startswith(fid.VLLM_DOCS_DIR + "/") and src["section"]
        assert row["engine"] == "vllm" and row["serve_command"].startswith("vllm serve " + row["model"])
        assert row["gpu"] in fid.VLLM_GPUS and row["gpus"] == row["tp"] * row["pp"] * row["dp"]
        for f in ("requests", "total_input_tokens", "total_generated_tokens"):
            assert isinstance(row[f], int) and row[f] > 0, (f, row)
        assert row["duration_s"] > 0
        # the rows rpeg prices: the published output throughput is the generated tokens over
        # the duration (the comparison rests on it)
        if fid.vllm_why_not(row) is None:
            # the page names the part ("A single NVIDIA H100 SXM GPU.", "8 × NVIDIA H200 SXM GPUs ..."):
            # the SXM boards the presets model
            assert f"NVIDIA {row['gpu']} SXM" in row["gpu_text"], row["gpu_text"]
            rate = row["total_generated_tokens"] / row["duration_s"]
            assert row["output_tokens_per_s"] == pytest.approx(rate, rel=0.01)
        assert row["dataset"] in ("random", "sharegpt", None)
        if row["dataset"] == "random":
            assert row["input_len"] > 0 and row["output_len"] > 0
    assert sum(fid.vllm_why_not(r) is None for r in rows) >= 20


def test_each_vllm_row_is_priced_with_its_published_mean_under_its_cap(fid):
    """Only the mean generated tokens and the cap of a request are published: the law a row is
    priced with has exactly that mean, ends at the cap (a random case's requested output, a
    ShareGPT completion's ``2048 − Lp``), and is a point mass at the cap only when every request
    ran to it."""
    rows = [r for r in fid.load_vllm_rows() if fid.vllm_why_not(r) is None]
    seen = set()
    for row in rows:
        buckets = fid.vllm_buckets(row)
        mean = row["total_generated_tokens"] / row["requests"]
        cap = fid.vllm_length_cap(row)
        assert buckets[-1].hi == cap
        if row["dataset"] == "sharegpt":
            assert cap == 2048 - fid.vllm_lengths(row)[0]
        else:
            assert cap == row["output_len"]
        got = sum(b.share * b.mean for b in buckets)
        if len(buckets) == 2 and buckets[0].share == 0.0:  # ran to the cap
            assert got == cap - 0.5 and mean >= cap - 0.5
            seen.add("point")
        else:
            assert got == pytest.approx(mean, rel=1e-6)
            seen.add(row["dataset"])
    assert seen == {"point", "random", "sharegpt"}


def test_a_missing_vllm_field_is_named(fid, tmp_path):
    bad = tmp_path / "rows.json"
    bad.write_text('{"rows": [{"model": "x"}]}')
    with pytest.raises(ValueError, match=r"row 0 lacks \['precision'"):
        fid.load_vllm_rows(bad)


def test_perf_lab_parser_reads_server_case_and_figures(fid):
    text = "\n".join(
        [
            "# Optimizing X",
            "8 × NVIDIA H100 SXM GPUs on a single node.",
            "- vLLM: v0.11.0",
            "    - Long prompt: 4000 input tokens, 200 output tokens",
            "### Other Benchmark Cases",
            "    ```bash",
            "    vllm serve Qwen/Qwen3-235B-A22B-Instruct-2507-FP8 -tp 4 \\",
            "      --enable-expert-parallel",
            "    ```",
            "    # random 4K input",
            "    ============ Serving Benchmark Result ============",
            "    Successful requests:                     500",
            "    Benchmark duration (s):                  98.99",
            "    Total input tokens:                      1997942",
            "    Total generated tokens:                  92185",
            "    Output token throughput (tok/s):         931.21",
            "    Total Token throughput (tok/s):          21113.53",
            "    ==================================================",
            "    python3 -m sglang.launch_server --model-path X --tp-size 8",
            "    ============ Serving Benchmark Result ============",
            "    Successful requests:                     1",
            "    ==================================================",
        ]
    )
    (row,) = fid.parse_perf_lab(text, "docs/performance-lab/x/h100.md", "0" * 40)
    assert (row["gpu"], row["tp"], row["expert_parallel"], row["precision"]) == ("H100", 4, True, "FP8")
    assert (row["dataset"], row["input_len"], row["output_len"], row["requests"]) == (
        "random",
        4000,
        200,
        500,
    )
    assert row["total_generated_tokens"] == 92185 and row["duration_s"] == 98.99
    assert row["source"]["section"] == "Other Benchmark Cases"
    # FP8 weights are expressible (precision fp8); this run's expert parallelism is not
    assert fid.vllm_why_not(row) == "pipeline-, data- or expert-parallel serving not translated"
    bf16 = {**row, "model": "Qwen/Qwen3-235B-A22B-Instruct-2507", "precision": "BF16", "tp": 8, "gpus": 8}
    bf16["expert_parallel"] = False
    assert fid.vllm_why_not(bf16) is None
    assert fid.vllm_lengths(bf16) == (3996, 184)
    t, tokens_per_s = fid.vllm_predict(bf16)
    assert t > 0 and tokens_per_s == pytest.approx(92185 / t)


def test_rows_are_summarised_per_published_table_newest_first(fid):
    """Each release's table is one group per precision (BF16; the FP8 recipes pooled), newest
    release first by its numeric version (26.04.01 after 26.06, 26.10 after 26.08)."""
    priced = [
        ({"release": "26.04.01", "precision": "MXFP8"}, 100.0, 110.0),
        ({"release": "26.10", "precision": "BF16"}, 50.0, 40.0),
        ({"release": "26.04.01", "precision": "BF16"}, 80.0, 80.0),
        ({"release": "26.06", "precision": "FP8-CS"}, 10.0, 12.0),
        ({"release": "26.04.01", "precision": "FP8"}, 200.0, 180.0),
    ]
    groups = fid.release_breakdown(priced)
    assert list(groups) == [
        "release 26.10, BF16",
        "release 26.06, FP8 recipes",
        "release 26.04.01, FP8 recipes",
        "release 26.04.01, BF16",
    ]
    assert groups["release 26.04.01, FP8 recipes"] == [(100.0, 110.0), (200.0, 180.0)]
    assert sum(len(pairs) for pairs in groups.values()) == len(priced)


def test_nvfp4_rows_are_priced_and_the_presets_carry_the_fitted_efficiency(fid):
    """Every NVFP4 row is expressible; the pairs the NVFP4 efficiency is fitted on are one
    table's same-layout FP8/NVFP4 rows; refitting it on the presets as they are gives 1.00 × their
    NVFP4 peak — a cost-model change that moves the fit fails here until the presets are refitted
    (``docs/decisions.md``, "NVFP4")."""
    rows = fid.load_rows()
    nvfp4 = [r for r in rows if r["precision"] == "NVFP4"]
    assert len(nvfp4) >= 10 and all(fid.why_not(r) is None for r in nvfp4)
    pairs = fid.nvfp4_pairs(rows)
    fit = [p for p in pairs if p[0]["release"] == fid.FP4_FIT_RELEASE]
    assert len(fit) >= 2 and len(pairs) > len(fit)
    same = ("release", "model", "system", "gpus", "gbs", "mbs", "tp", "pp", "vp", "cp", "ep")
    for fp8, fp4 in pairs:
        assert all(fp8.get(k) == fp4.get(k) for k in same)
        assert (fid.PRECISIONS[fp8["precision"]], fp4["precision"]) == ("fp8", "NVFP4")
    r, mape = fid.fit_fp4_efficiency(pairs)
    assert r == pytest.approx(1.0, abs=0.01)
    assert mape == pytest.approx(fid._mape(fid.speedup_pairs(fit, r)))


def test_the_h100_and_h200_presets_carry_the_fitted_vllm_prefill_efficiency(fid):
    """The serving table's one fitted figure: refitting vLLM's prefill efficiency on its page
    gives 1.00 × what the h100 and h200 presets carry; a cost-model change that moves the fit
    fails here until the presets are refitted (``docs/cost-model.md`` §8, "vLLM's prefill on
    Hopper"). The page's rows and the held-out ones are both served by it."""
    from rpeg.costmodel.hardware import hardware_preset

    for name in ("h100", "h200"):
        assert hardware_preset(name).terms("prefill").efficiency == fid.HOPPER_PREFILL_EFFICIENCY
    rows = fid.load_vllm_rows()
    r, fit_mape = fid.fit_prefill_efficiency(rows)
    assert r == pytest.approx(1.0, abs=0.01) and fit_mape < 10.0
    held = fid.prefill_held_out(rows)
    assert len(held) >= 10
    # held out, it beats the roofline (scale 1/η undoes it)
    assert fid.prefill_mape(held) < fid.prefill_mape(held, 1.0 / fid.HOPPER_PREFILL_EFFICIENCY)


def test_the_mxfp4_rows_are_priced_and_the_mislabelled_one_is_not(fid):
    """gpt-oss's MXFP4 checkpoints run with precision mxfp4; the one block whose command names
    another model than its figures show is listed, not priced."""
    rows = fid.load_vllm_rows()
    mx = [r for r in rows if fid.vllm_precision(r) == "mxfp4"]
    assert mx and all(r["model"].startswith("openai/gpt-oss-") for r in mx)
    assert sum(fid.vllm_why_not(r) is None for r in mx) >= 40
    bad = [r for r in rows if (fid.vllm_page(r), r["source"]["section"]) in fid.VLLM_MISLABELLED]
    assert len(bad) == 1 and bad[0]["model"] == "openai/gpt-oss-120b"
    assert fid.vllm_page(bad[0]).startswith("gpt-oss-20b/") and "uncertain" in fid.vllm_why_not(bad[0])


def test_the_hopper_and_ampere_presets_carry_the_fitted_weight_only_efficiency(fid):
    """One weight-only (MXFP4) GEMM efficiency per GPU generation, fitted on one page: refitting
    gives what the presets carry, and on the other pages of that GPU it beats ``ε_w = 1``. A
    cost-model change that moves a fit fails here until the presets are refitted."""
    from rpeg.costmodel.hardware import hardware_preset

    rows = fid.load_vllm_rows()
    for gpu, page, presets, eps in fid.WEIGHT_ONLY_FITS:
        for name in presets:
            assert hardware_preset(name).rollout_step.weight_only_efficiency == eps
        fit, _ = fid.fit_weight_only_efficiency(rows, gpu, page)
        assert fit == pytest.approx(eps, abs=0.01)
        held = [x for x in fid.weight_only_rows(rows, gpu) if fid.vllm_page(x) != page]
        assert len(held) >= 5
        assert fid.weight_only_mape(held) < fid.weight_only_mape(held, 1.0)


def test_the_ampere_presets_carry_the_fitted_sink_attention_efficiency(fid):
    """gpt-oss (attention sinks) is served on Ampere by vLLM's Triton attention kernel: one
    efficiency ``ε_s`` fitted on one page, carried by the Ampere presets alone (Hopper and later
    serve sinks with FlashAttention-3 or FlashInfer). Refitting gives what the presets carry; on the
    other A100 page it beats ``ε_s = 1`` and brings the longest prompts, where the kernel's share is
    largest, within 15 % (at ``ε_s = 1`` they are twice too fast). A cost-model change that moves the
    fit fails here until the presets are refitted."""
    from rpeg.costmodel.hardware import HARDWARE_PRESETS, hardware_preset

    gpu, page, presets, eps = fid.SINK_ATTENTION_FIT
    for name in HARDWARE_PRESETS:
        step = hardware_preset(name).rollout_step
        want = eps if name in presets else 1.0
        assert step is None or step.sink_attention_efficiency == want, name
    rows = fid.load_vllm_rows()
    fit, _ = fid.fit_sink_attention_efficiency(rows)
    assert fit == pytest.approx(eps, abs=0.01)
    held = [x for x in fid.sink_rows(rows, gpu) if fid.vllm_page(x) != page]
    assert len(held) >= 5 and all(fid.vllm_spec(x).attention_sinks for x in held)
    assert fid.sink_mape(held) < fid.sink_mape(held, 1.0)
    longest = [x for x in held if fid.vllm_lengths(x)[0] >= 32000]
    assert len(longest) >= 2
    for x in longest:
        pub = float(x["output_tokens_per_s"])
        assert fid.vllm_predict(x)[1] / pub == pytest.approx(1.0, abs=0.15)
        assert fid.vllm_predict(x, sink_attention=1.0)[1] / pub > 1.5


def test_the_a100_fp8_rows_are_priced_weight_only_and_held_out(fid):
    """FP8 checkpoints on A100 (no FP8 tensor cores) are served as weight-only W8A16 GEMMs: the
    rows are priced with the Ampere ``ε_w`` fitted on the MXFP4 rows of another page, and it
    beats ``ε_w = 1`` on them."""
    rows = fid.load_vllm_rows()
    fp8 = fid.served_weight_only_rows(rows, "A100")
    assert len(fp8) >= 5 and all(fid.vllm_precision(x) == "fp8" for x in fp8)
    assert fid.weight_only_mape(fp8) < fid.weight_only_mape(fp8, 1.0)


def test_the_gpu_presets_carry_the_fitted_unhidden_host_seconds(fid):
    """``c_w``, the host seconds per step asynchronous scheduling leaves exposed, is one host
    figure fitted on one page's pairs of runs with and without ``--async-scheduling``: refitting
    gives what every GPU preset carries, and on the other pages' pairs the fitted figure predicts
    the flag's speed-up better than ``c_w = 0`` (everything hidden). A cost-model change that moves
    the fit fails here until the presets are refitted."""
    from rpeg.costmodel.hardware import HARDWARE_PRESETS, hardware_preset

    for name in HARDWARE_PRESETS:
        step = hardware_preset(name).rollout_step
        assert step is None or step.async_host_s == fid.ASYNC_HOST_FIT, name
    rows = fid.load_vllm_rows()
    pairs = fid.async_pairs(rows)
    mine = [p for p in pairs if fid.vllm_page(p[0]) == fid.ASYNC_FIT_PAGE]
    held = [p for p in pairs if fid.vllm_page(p[0]) != fid.ASYNC_FIT_PAGE]
    assert len(mine) >= 3 and len(held) >= 5
    for flagged, plain in pairs:  # a pair differs in the flag only
        assert flagged["serve_command"].replace(" --async-scheduling", "") == plain["serve_command"]
        assert (flagged["dataset"], flagged["requests"]) == (plain["dataset"], plain["requests"])
    host, _ = fid.fit_async_host(rows)
    assert host == pytest.approx(fid.ASYNC_HOST_FIT, abs=2e-4)
    assert fid.async_pair_error(held) < fid.async_pair_error(held, 0.0)


def test_every_moe_row_names_a_recipe_whose_dispatcher_and_overlap_were_read(fid):
    """Each expressible mixture-of-experts row names a Megatron-Bridge performance recipe the data
    file holds (read at the training data's commit), with a dispatcher the engines have; the
    benchmark prices the row with it (flex ⇔ the recipe's flex; overlap where Megatron-core allows)."""
    import json

    doc = json.loads(fid.RECIPES.read_text())
    assert doc["commit"] == json.loads(fid.DATA.read_text())["commit"] and doc["missing"] == []
    recipes = fid.load_recipes()
    rows = fid.moe_rows(fid.load_rows())
    assert len(rows) >= 100
    for row in rows:
        recipe = fid.row_recipe(row, recipes)
        assert recipe is not None, fid.recipe_name(row)
        assert recipe.get("moe_token_dispatcher_type", "alltoall") in ("alltoall", "flex")
        assert recipe["path"].startswith("src/megatron/bridge/perf_recipes/")
    flex = [r for r in rows if fid.row_recipe(r, recipes).get("moe_token_dispatcher_type") == "flex"]
    a2a = [r for r in rows if r not in flex]
    assert flex and a2a
    r = next(
        r
        for r in flex
        if (r["ep"] or 1) > 1 and not fid.row_recipe(r, recipes).get("overlap_moe_expert_parallel_comm")
    )
    assert fid.predict(r) == pytest.approx(fid.predict(r, flex=True, ep_overlap=False), rel=1e-12)
    assert fid.predict(r) != pytest.approx(fid.predict(r, flex=False, ep_overlap=False), rel=1e-6)


WORKLOAD_SOURCE = """
from dataclasses import replace
BASE = WorkloadBaseConfig(expert_model_parallel_size=8, global_batch_size=512)
QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1 = replace(BASE, num_gpus=8, micro_batch_size=4,
    moe_flex_dispatcher_backend="hybridep", moe_a2a_overlap=True, cuda_graph_scope=SCOPES)
QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V2 = replace(QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1,
    micro_batch_size=8)
QWEN3_30B_A3B_PRETRAIN_CONFIG_H100_FP8_CS_V1 = replace(BASE, num_gpus=16, expert_model_parallel_size=16,
    global_batch_size=1024, moe_flex_dispatcher_backend="deepep")
QWEN3_30B_A3B_PRETRAIN_CONFIG_GB300_FP8_MX_V1 = QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V2
"""
WORKLOAD_DEFAULTS = {
    "num_gpus": 1,
    "tensor_model_parallel_size": 1,
    "pipeline_model_parallel_size": 1,
    "context_parallel_size": 1,
    "virtual_pipeline_model_parallel_size": None,
    "expert_model_parallel_size": 1,
    "global_batch_size": 1,
    "micro_batch_size": 1,
    "moe_flex_dispatcher_backend": None,
    "moe_a2a_overlap": False,
}


def test_workload_configs_are_read_through_replace_and_aliases(fid):
    """An older release's workload configs: ``WorkloadBaseConfig`` on its defaults, ``replace`` on
    the base's settings, an alias as its target; a non-literal value kept as its text."""
    cfgs = fid.workload_settings({"q.py": WORKLOAD_SOURCE}, WORKLOAD_DEFAULTS)
    v1 = cfgs["QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V1"]
    assert (v1["num_gpus"], v1["expert_model_parallel_size"], v1["micro_batch_size"]) == (8, 8, 4)
    assert (v1["moe_a2a_overlap"], v1["cuda_graph_scope"], v1["pipeline_model_parallel_size"]) == (
        True,
        "SCOPES",
        1,
    )
    assert cfgs["QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V2"]["micro_batch_size"] == 8
    assert (
        cfgs["QWEN3_30B_A3B_PRETRAIN_CONFIG_GB300_FP8_MX_V1"]
        == cfgs["QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V2"]
    )
    assert cfgs["BASE"]["moe_flex_dispatcher_backend"] is None


def test_a_release_recipe_is_the_config_with_the_rows_layout_and_the_backend_the_release_runs(fid):
    """The row's model, system and precision name the configs; its layout picks the variant; the
    backend is flex only where that release's ``apply_flex_dispatcher_backend`` turns it on for
    the system (HybridEP on GB200/GB300 only, to v0.3.x; DeepEP never on GB200/GB300)."""
    cfgs = fid.workload_settings({"q.py": WORKLOAD_SOURCE}, WORKLOAD_DEFAULTS)
    old = fid.flex_systems(
        'if name in ["NVIDIA GB200", "NVIDIA GB300"] major in [8, 9] "NVIDIA B200", "NVIDIA B300"'
    )
    new = fid.flex_systems('major in [8, 9, 10] major in [8, 9] "NVIDIA B200", "NVIDIA B300"')
    assert "DGX-H100" not in old["hybridep"] and "DGX-H100" in new["hybridep"]
    assert "DGX-GB200" not in new["deepep"]
    with pytest.raises(ValueError, match="HybridEP"):
        fid.flex_systems("no device check")
    releases = {"26.04": {"tag": "v0.4.0", "flex_systems": new, "configs": cfgs}}
    row = {"release": "26.04", "model_key": "Qwen3_30B_a3B", "system": "DGX-GB200", "precision": "MXFP8",
           "gpus": 8, "tp": 1, "pp": 1, "cp": 1, "vp": None, "ep": 8, "gbs": 512, "mbs": 8}  # fmt: skip
    rec = fid.release_recipe(row, releases)
    assert rec["config"].endswith("_V2") and rec["tag"] == "v0.4.0"
    assert rec["moe_token_dispatcher_type"] == "flex" and rec["overlap_moe_expert_parallel_comm"] is True
    assert fid.release_recipe({**row, "mbs": 2}, releases) is None  # no config has the layout
    assert fid.release_recipe({**row, "release": "26.08"}, releases) is None  # the newest table
    h100 = {**row, "system": "DGX-H100", "precision": "FP8", "gpus": 16, "ep": 16, "gbs": 1024, "mbs": 1}
    assert fid.release_recipe(h100, releases)["moe_token_dispatcher_type"] == "flex"  # DeepEP on H100
    gb = {**row, "system": "DGX-GB200"}
    releases["26.04"]["configs"]["QWEN3_30B_A3B_PRETRAIN_CONFIG_GB200_FP8_MX_V2"][
        "moe_flex_dispatcher_backend"
    ] = "deepep"
    assert fid.release_recipe(gb, releases)["moe_token_dispatcher_type"] == "alltoall"  # DeepEP skipped there


def test_the_archived_moe_rows_are_priced_with_their_releases_configs(fid):
    """The data file maps every archived table to a release tag; most archived MoE rows find the
    config of their layout there, whose layout is the row's; a row so priced uses its release's
    dispatcher and overlap, not the data commit's."""
    rows = [r for r in fid.moe_rows(fid.load_rows()) if r["source"]["path"] != fid.DOCS[0]]
    releases = fid._release_recipes()
    assert {r["release"] for r in rows} <= releases.keys()
    own = [(r, fid.release_recipe(r)) for r in rows if fid.release_recipe(r) is not None]
    assert len(own) >= 0.8 * len(rows)
    for r, rec in own:
        cfg = releases[r["release"]]["configs"][rec["config"]]
        assert all((cfg.get(k) or 1) == (r.get(f) or 1) for k, f in fid.WORKLOAD_LAYOUT.items())
    differ = [
        (r, rec) for r, rec in own
        if (rec["overlap_moe_expert_parallel_comm"], rec["moe_token_dispatcher_type"]) != (
            fid.row_recipe(r).get("overlap_moe_expert_parallel_comm") is True,
            fid.row_recipe(r).get("moe_token_dispatcher_type", "alltoall"))
        and fid.overlappable(r)
    ]  # fmt: skip
    assert differ
    r, rec = differ[0]
    flex = rec["moe_token_dispatcher_type"] == "flex"
    assert fid.predict(r) == pytest.approx(
        fid.predict(r, flex=flex, ep_overlap=rec["overlap_moe_expert_parallel_comm"]), rel=1e-12
    )


def test_recipe_settings_replay_calls_in_order_without_importing(fid):
    """A recipe's settings are its assignments and those of the functions it calls, in the order it
    runs them (a later helper overrides an earlier assignment), through import aliases;
    ``cfg.comm_overlap = CommOverlapConfig(...)`` resets the overlap to its keyword."""
    base = (
        "def base_config():\n"
        "    cfg = make()\n"
        "    cfg.model.moe_token_dispatcher_type = 'alltoall'\n"
        "    return cfg\n"
    )
    helpers = (
        "def _flex(cfg):\n"
        "    cfg.model.moe_token_dispatcher_type = 'flex'\n"
        "    cfg.model.moe_flex_dispatcher_backend = 'hybridep'\n"
        "    cfg.comm_overlap.overlap_moe_expert_parallel_comm = True\n"
    )
    recipe = (
        "from megatron.bridge.recipes.m import base_config as cfg_base\n"
        "from megatron.bridge.perf_recipes.h import _flex\n"
        "def m_pretrain_8gpu_h100_bf16_config():\n"
        "    cfg = cfg_base()\n"
        "    _flex(cfg)\n"
        "    cfg.comm_overlap = CommOverlapConfig(tp_comm_overlap=False)\n"
        "    return cfg\n"
        "def m_pretrain_8gpu_b200_bf16_config():\n"
        "    cfg = m_pretrain_8gpu_h100_bf16_config()\n"
        "    cfg.model.recompute_modules = ['moe_act']\n"
        "    cfg.comm_overlap = CommOverlapConfig(overlap_moe_expert_parallel_comm=True)\n"
        "    return cfg\n"
    )
    got = fid.recipe_settings(
        {
            "megatron.bridge.recipes.m": base,
            "megatron.bridge.perf_recipes.h": helpers,
            "megatron.bridge.perf_recipes.m.r": recipe,
        }
    )
    assert set(got) == {"m_pretrain_8gpu_h100_bf16_config", "m_pretrain_8gpu_b200_bf16_config"}
    h100 = got["m_pretrain_8gpu_h100_bf16_config"]
    assert h100["moe_token_dispatcher_type"] == "flex" and h100["moe_flex_dispatcher_backend"] == "hybridep"
    assert h100["overlap_moe_expert_parallel_comm"] is False
    b200 = got["m_pretrain_8gpu_b200_bf16_config"]
    assert b200["overlap_moe_expert_parallel_comm"] is True and b200["recompute_modules"] == ["moe_act"]


def test_the_gpu_presets_carry_the_fitted_expert_efficiency(fid):
    """ε_e, the expert layer's efficiency in training, is one figure fitted on the newest table's
    MoE rows priced as their recipes ran: refitting gives what every GPU preset carries; held out,
    on the older tables' rows and on Megatron-Bridge's controlled H100 runs, it predicts better than
    ε_e = 1. A cost-model change that moves the fit fails here until the presets are refitted."""
    from rpeg.costmodel.hardware import HARDWARE_PRESETS, hardware_preset

    for name in HARDWARE_PRESETS:
        hw = hardware_preset(name)
        assert hw.expert_efficiency == (1.0 if hw.rollout_step is None else fid.EXPERT_EFFICIENCY), name
    rows = fid.load_rows()
    eps, _ = fid.fit_expert_efficiency(rows)
    assert eps == pytest.approx(fid.EXPERT_EFFICIENCY, abs=2e-3)
    held = [r for r in fid.moe_rows(rows) if r["release"] != fid.EXPERT_FIT_RELEASE]
    assert len(held) >= 100
    assert fid.expert_mape(held) < fid.expert_mape(held, 1.0)

    def error(steps):
        return sum(abs(t / pub - 1) for _, pub, t in steps) / len(steps)

    assert error(fid.bridge_run_steps()) < error(fid.bridge_run_steps(1.0))
