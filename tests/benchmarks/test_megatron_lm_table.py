"""The held-out A100 training rows of ``benchmarks/gpu_fidelity.py --megatron-lm`` (issue 31):
Megatron-LM's Table 1 (Narayanan et al., SC'21) loads with every configuration field and its
source, every row is expressible and priced, the link tiers follow Megatron's rank order, and
the FLOP count is the paper's eq. (3)."""

import json
import math
import sys
from pathlib import Path

import pytest

from tests.conftest import load_benchmark

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"


@pytest.fixture(scope="module")
def fid():
    return load_benchmark("gpu_fidelity")


def test_rows_load_with_their_configuration_and_source(fid):
    doc = json.loads(fid.MLM_DATA.read_text())
    assert "2104.04473" in doc["source"] and "run_table_1.sh" in doc["source"]
    assert len(doc["commit"]) == 40
    rows = fid.load_megatron_lm_rows()
    assert [r["model"] for r in rows] == [
        "1.7B",
        "3.6B",
        "7.5B",
        "18B",
        "39B",
        "76B",
        "145B",
        "310B",
        "530B",
        "1T",
    ]
    for r in rows:
        assert r["tp"] * r["pp"] * r["dp"] == r["gpus"]
        assert r["recompute"] == "full" and r["seq_len"] == 2048 and r["vocab"] == 51200
        # the published aggregate is the per-GPU figure times the GPUs (the table is self-consistent)
        assert r["tflops_per_gpu"] * r["gpus"] / 1000 == pytest.approx(r["aggregate_pflops"], rel=0.02)


def test_every_row_is_expressible_and_priced(fid):
    for r in fid.load_megatron_lm_rows():
        assert fid.megatron_lm_why_not(r) is None, r["model"]
        s, g = fid.megatron_lm_strategy(r)
        assert (s.dp, s.pp, s.tp, s.mb) == (r["dp"], r["pp"], r["tp"], r["gbs"] // (r["dp"] * r["mbs"]))
        assert g == 8 and s.recompute.value == "full" and not s.sp
        t, tflops = fid.megatron_lm_predict(r)
        assert t > 0 and math.isfinite(tflops)
        # within a factor of two of the published figure: a broken pricing would not be
        assert 0.5 < tflops / r["tflops_per_gpu"] < 2.0, r["model"]


def test_link_tiers_follow_megatrons_rank_order(fid):
    # 40 nodes, TP 8, PP 2, DP 20. Megatron (tp-dp-pp, pipeline outermost): the two stages sit
    # 20 nodes apart (two racks of 20), a data-parallel group spans the 20 nodes of one rack.
    # rpeg's own order (pipeline inside data) would give pp tier 1 and dp tier 2.
    row = {"gpus": 320, "tp": 8, "pp": 2, "gbs": 40, "mbs": 1, "recompute": "full"}
    s, _ = fid.megatron_lm_strategy(row, nodes_per_rack=20)
    assert (s.pp_tier, s.dp_tier) == (2, 1)
    one_node = {"gpus": 8, "tp": 8, "pp": 1, "gbs": 8, "mbs": 1, "recompute": "full"}
    s, _ = fid.megatron_lm_strategy(one_node)
    assert s.extent == (1, 1, 8) and (s.pp_tier, s.dp_tier) == (0, 0)


def test_flops_are_the_papers_eq_3(fid):
    # eq. (3) from its parts: per layer and forward pass 24·B·s·h² (QKV, projection, 4h FFN) plus
    # 4·B·s²·h (scores and context), four passes with recomputation; the logits 2·B·s·h·V, three
    # passes.
    for r in fid.load_megatron_lm_rows():
        b, s, layers, h, v = r["gbs"], r["seq_len"], r["layers"], r["hidden"], r["vocab"]
        parts = 4 * layers * (24 * b * s * h * h + 4 * b * s * s * h) + 3 * 2 * b * s * h * v
        assert fid.megatron_lm_flops(r) == pytest.approx(parts, rel=1e-12)


def test_a_missing_field_names_the_file_and_the_field(fid, tmp_path):
    bad = tmp_path / "megatron_lm_a100.json"
    doc = json.loads(fid.MLM_DATA.read_text())
    del doc["rows"][3]["mbs"]
    bad.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"megatron_lm_a100\.json: row 3 lacks \['mbs'\]"):
        fid.load_megatron_lm_rows(bad)


def test_report_prints_every_row_and_both_summaries(fid, capsys):
    sys.path.insert(0, str(BENCH))
    lines = fid.megatron_lm_report(["--megatron-lm", "--no-write"], write=False)
    rows = [ln for ln in lines if ln.startswith("| ") and not ln.startswith("| model")]
    assert len(rows) == 10
    assert any(ln.startswith("- all: 10 rows, MAPE") for ln in lines)
    assert any(ln.startswith("- vp = 1 (no interleaving): 6 rows") for ln in lines)
