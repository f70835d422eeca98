"""Response lengths from a mean: the maximum-entropy quantiles and ``[batch] response_mean``."""

import math

import pytest

from rpeg import Workload, load_workload, model_preset
from rpeg.ir.errors import InputError
from rpeg.ir.workload import MAX_ENTROPY_PIECES, max_entropy_quantiles, quantile_buckets

M7 = model_preset("llama2-7b")


def _mean(quantiles):
    return sum(b.share * b.mean for b in quantile_buckets(quantiles))


def _shares(quantiles):
    return [b.share for b in quantile_buckets(quantiles)]


@pytest.mark.parametrize(
    ("mean", "cap", "pieces"),
    [
        (200.0, 1831, 128),
        (200.0, 1831, 8),
        (99.3, 100, 100),
        (3000.0, 8192, 8),
        (7000.0, 8192, 8),
        (1.2, 3, 8),
    ],
)
def test_the_quantiles_have_the_stated_mean_and_are_a_valid_workload_law(mean, cap, pieces):
    q = max_entropy_quantiles(mean, cap, pieces)
    # exact up to the slivers a piece with no share keeps (10⁻⁹ each)
    assert _mean(q) == pytest.approx(mean, rel=1e-6)
    assert q[-1] == (1.0, cap) and len(q) == min(pieces, cap)
    w = Workload("grpo", {"actor": M7, "reward": M7}, 8, 2, 64, cap, quantiles=q)
    assert w.mean_response == pytest.approx(mean, rel=1e-6)


def test_equal_pieces_carry_geometric_shares_the_exponential_law():
    # on pieces of equal width w the truncated exponential gives shares in the ratio e^(−θw):
    # a law built some other way (say, uniform inside a few wide steps) would not
    for mean in (120.0, 400.0, 900.0):
        shares = _shares(max_entropy_quantiles(mean, 1024, 16))
        ratios = [b / a for a, b in zip(shares, shares[1:])]
        assert max(ratios) == pytest.approx(min(ratios), rel=1e-6)
        assert (ratios[0] < 1.0) == (mean < 512)


def test_the_middle_is_uniform_and_the_law_mirrors_about_it():
    q = max_entropy_quantiles(512.0, 1024, 8)
    assert [f for f, _ in q] == pytest.approx([i / 8 for i in range(1, 9)])
    low, high = _shares(max_entropy_quantiles(300.0, 1024, 8)), _shares(max_entropy_quantiles(724.0, 1024, 8))
    assert low == pytest.approx(high[::-1], rel=1e-6)


def test_a_mean_near_the_cap_keeps_rising_fractions():
    # θ ≪ 0: the first pieces' shares underflow; each keeps a sliver so the fractions still rise
    q = max_entropy_quantiles(99.3, 100, 100)
    fractions = [f for f, _ in q]
    assert all(a < b for a, b in zip(fractions, fractions[1:]))
    assert fractions[0] > 0.0 and _mean(q) == pytest.approx(99.3)


@pytest.mark.parametrize(
    ("args", "match"),
    [
        ((5.0, 100, 8), r"response_mean must be a number of tokens in \(6, 94\) .* got 5\.0"),
        ((95.0, 100, 8), r"in \(6, 94\) for response_len = 100 in 8 pieces, got 95\.0"),
        ((math.nan, 100, 8), "got nan"),
        ((True, 100, 8), "got True"),
        ((50.0, 0, 8), r"response_len must be an integer in \[1, .*got 0"),
        ((50.0, 100, 0), "pieces must be a positive integer, got 0"),
    ],
)
def test_bad_arguments_are_named(args, match):
    with pytest.raises(ValueError, match=match):
        max_entropy_quantiles(*args)


TOML = (
    'algorithm = "grpo"\n[batch]\nprompts = 4\nrollouts = 2\nprompt_len = 8\nresponse_len = 1024\n{extra}'
    '[models]\nactor = "7b"\nreward = "7b"\n'
)


def test_a_file_gives_the_mean_instead_of_quantiles(tmp_path):
    path = tmp_path / "w.toml"
    path.write_text(TOML.format(extra="response_mean = 300.0\n"))
    w = load_workload(path).workload
    assert w.quantiles == max_entropy_quantiles(300.0, 1024, MAX_ENTROPY_PIECES)
    assert w.mean_response == pytest.approx(300.0)


@pytest.mark.parametrize(
    ("extra", "match"),
    [
        (
            "response_mean = 300.0\nquantiles = [[0.5, 256], [1.0, 1024]]\n",
            r"w\.toml: fields 'batch\.quantiles' and 'batch\.response_mean' both describe",
        ),
        (
            "response_mean = 1000.0\n",
            r"w\.toml: field 'batch\.response_mean' must be a number of tokens in \(64, 960\) for response_len = 1024 in 8 pieces, got 1000\.0",
        ),
        ("response_mean = -3.0\n", r"w\.toml.*batch\.response_mean"),
        ('response_mean = "300"\n', r"w\.toml.*batch\.response_mean"),
    ],
)
def test_a_bad_mean_in_a_file_names_the_file_and_field(tmp_path, extra, match):
    path = tmp_path / "w.toml"
    path.write_text(TOML.format(extra=extra))
    with pytest.raises(InputError, match=match):
        load_workload(path)
