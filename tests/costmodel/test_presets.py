"""The GPU presets' figures are the vendors' published node designs, derated by one rule, and
every figure says where it comes from (``sources``; docs/cost-model.md §5, issue 14)."""

import pytest

from rpeg.costmodel import HARDWARE_PRESETS, hardware_preset
from rpeg.ir.hardware import TIER_NAMES

FIGURES = ("peak_flops", "mem_bandwidth", "gpu_memory_bytes")
#: Presets whose memory is the driver's total as a public ``nvidia-smi`` listing shows it (MiB);
#: the others keep the vendor's figure (``docs/cost-model.md`` §5).
MIB = 2**20
LINKS = tuple(f"{kind}.{tier}" for kind in ("collective", "p2p") for tier in TIER_NAMES)

# The published node designs (see each preset's ``sources``): dense BF16 peak, HBM bandwidth and
# size, GPUs per node, the NVLink rate one GPU reaches one peer with per direction, and the node's
# compute NICs (count × line rate in bits/s).
PUBLISHED = {
    # DGX A100: NVLink 3 600 GB/s bidirectional through NVSwitch; 8 × 200 Gb/s HDR ConnectX-6
    "a100-40gb": {
        "dense": 312e12,
        "hbm": 1555e9,
        "memory": 40960 * MIB,
        "gpus": 8,
        "nvlink": 300e9,
        "nics": (8, 200e9),
    },
    # DGX A100 (80 GB): the same node with the 80 GB HBM2e GPU
    "a100-80gb": {
        "dense": 312e12,
        "hbm": 2039e9,
        "memory": 81920 * MIB,
        "gpus": 8,
        "nvlink": 300e9,
        "nics": (8, 200e9),
    },
    # DGX B200: NVLink 5 1.8 TB/s bidirectional through NVSwitch; 8 × 400 Gb/s NDR ConnectX-7
    "b200": {
        "dense": 2250e12,
        "hbm": 8e12,
        "memory": 183359 * MIB,
        "gpus": 8,
        "nvlink": 900e9,
        "nics": (8, 400e9),
    },
    # DGX B300: the same NVLink 5 node with the Blackwell Ultra GPU (288 GB, the B200's dense BF16
    # rate) and 8 × 800 Gb/s ConnectX-8 SuperNICs (HGX AI Factory RA: "2-8-9-800")
    "b300": {
        "dense": 2250e12,
        "hbm": 8e12,
        "memory": 288e9,
        "gpus": 8,
        "nvlink": 900e9,
        "nics": (8, 800e9),
    },
    # DGX H100 / H200: NVLink 4 900 GB/s bidirectional through NVSwitch; 8 × 400 Gb/s NDR ConnectX-7
    "h100": {
        "dense": 989.4e12,
        "hbm": 3.35e12,
        "memory": 81559 * MIB,
        "gpus": 8,
        "nvlink": 450e9,
        "nics": (8, 400e9),
    },
    "h200": {
        "dense": 989.4e12,
        "hbm": 4.8e12,
        "memory": 143771 * MIB,
        "gpus": 8,
        "nvlink": 450e9,
        "nics": (8, 400e9),
    },
    # HGX H20: the H100's 8-GPU NVSwitch node with NVLink 4 900 GB/s kept; 148 TFLOP/s dense BF16,
    # 96 GB HBM3 at 4.0 TB/s; 8 × 400 Gb/s compute NICs assumed (as DGX H100: no vendor figure)
    "h20": {
        "dense": 148e12,
        "hbm": 4.0e12,
        "memory": 97871 * MIB,
        "gpus": 8,
        "nvlink": 450e9,
        "nics": (8, 400e9),
    },
    # JUPITER Booster quad-GH200 node: 150 GB/s per direction per GPU pair (no NVSwitch); 4 × NDR200
    "gh200": {
        "dense": 989.4e12,
        "hbm": 4.0e12,
        "memory": 96e9,
        "gpus": 4,
        "nvlink": 150e9,
        "nics": (4, 200e9),
    },
}


@pytest.mark.parametrize("name", HARDWARE_PRESETS)
def test_every_preset_says_where_each_figure_comes_from(name):
    sources = dict(hardware_preset(name).sources)
    for key in FIGURES + LINKS:
        assert isinstance(sources.get(key), str) and len(sources[key]) > 20, f"{name}: no source for {key}"
    for kind in ("collective", "p2p"):
        # no vendor publishes an inter-rack figure: the source must say it is an assumption
        assert "assumption" in sources[f"{kind}.inter-rack"]


@pytest.mark.parametrize("name", [*sorted(PUBLISHED), "gb200-nvl72", "gb300-nvl72"])
def test_gpu_sources_cite_a_document(name):
    sources = dict(hardware_preset(name).sources)
    for key in FIGURES + tuple(k for k in LINKS if not k.endswith("inter-rack")):
        assert "https://" in sources[key], f"{name}: {key} cites no document"
        assert "derated" in sources[key] or key == "gpu_memory_bytes"


def test_cpu_sources_say_the_figures_are_nominal():
    for key, text in hardware_preset("cpu").sources:
        if key == "host_bandwidth":  # no host link: it says so, and what it stands for
            assert "no host link" in text and "nominal memory bandwidth" in text
            continue
        assert "nominal assumption" in text, key


@pytest.mark.parametrize(
    "name",
    ["h100", "h200", "h20", "a100-40gb", "a100-80gb", "gh200", "b200", "b300", "gb200-nvl72", "gb300-nvl72"],
)
def test_host_bandwidth_is_the_host_links_line_rate_derated(name):
    """``BW_host`` (SPEC §14.4): PCIe 5.0 ×16 for Hopper boards, DGX B200 and DGX B300 (Gen5
    hosts), PCIe 4.0 ×16 for A100, NVLink-C2C for GH200 and (shared by a Grace CPU's two GPUs)
    GB200 and GB300,
    each at 0.8 of its per-direction line rate, with its document."""
    hw = hardware_preset(name)
    pcie4 = 16e9 * 16 * 128 / 130 / 8
    c2c = {"gh200": 450e9, "gb200-nvl72": 450e9 / 2, "gb300-nvl72": 450e9 / 2}
    line = {"a100-40gb": pcie4, "a100-80gb": pcie4, **c2c}.get(name, 32e9 * 16 * 128 / 130 / 8)
    assert hw.host_bandwidth == pytest.approx(0.8 * line, rel=0.01)
    text = dict(hw.sources)["host_bandwidth"]
    assert "https://" in text and "derated" in text


def test_a100_inter_node_is_eight_hdr_nics_per_eight_gpus():
    """DGX A100 has 8 × 200 Gb/s HDR compute NICs for its 8 GPUs: 25 GB/s line rate per GPU,
    20 GB/s after the 0.8 derating (the preset once counted 4 NICs: 10 GB/s)."""
    hw = hardware_preset("a100-40gb")
    per_gpu = 8 * 200e9 / 8 / 8  # bytes/s of line rate per GPU
    for links in (hw.collective, hw.p2p):
        assert 1.0 / links[1].beta == pytest.approx(0.8 * per_gpu) == pytest.approx(20e9)
        assert 1.0 / links[2].beta == pytest.approx(0.6 * 0.8 * per_gpu)


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_gpu_presets_are_the_published_figures_derated(name):
    pub = PUBLISHED[name]
    hw = hardware_preset(name)
    assert hw.gpus_per_node == pub["gpus"]
    assert hw.gpu_memory_bytes == pub["memory"]
    memory_source = dict(hw.sources)["gpu_memory_bytes"]
    if pub["memory"] % MIB == 0:  # the driver's total, cited to a listing
        assert f"{pub['memory'] // MIB:,} MiB" in memory_source and "nvidia-smi" in memory_source
    else:
        assert "the vendor's figure" in memory_source
    assert hw.peak_flops == pytest.approx(0.70 * pub["dense"])
    assert hw.mem_bandwidth == pytest.approx(0.85 * pub["hbm"])
    count, bits = pub["nics"]
    nic_share = count * bits / 8 / pub["gpus"]  # bytes/s of the node's compute NICs per GPU
    for links in (hw.collective, hw.p2p):  # one derating for collectives and P2P alike
        assert 1.0 / links[0].beta == pytest.approx(0.8 * pub["nvlink"])
        assert 1.0 / links[1].beta == pytest.approx(0.8 * nic_share)
        assert 1.0 / links[2].beta == pytest.approx(0.6 * 0.8 * nic_share)


def test_h20_is_the_h100_node_with_the_h20_gpu():
    """HGX H20 keeps the DGX H100's links (NVLink 4 through NVSwitch, one 400 Gb/s NIC per GPU, the
    NICs an assumption) and its alphas; only the GPU differs: 0.70 × 148 = 103.6 TFLOP/s dense BF16
    (about 15 % of the H100's 692.6), 0.85 × 4.0 = 3.4 TB/s HBM3, 96 GB (97,871 MiB to the driver)."""
    h20, h100 = hardware_preset("h20"), hardware_preset("h100")
    assert h20.peak_flops == pytest.approx(1.036e14)
    assert h20.mem_bandwidth == pytest.approx(3.4e12)
    assert h20.gpu_memory_bytes == 97871 * MIB  # nvidia-smi's total of the 96 GB part
    assert 1.0 / h20.collective[0].beta == pytest.approx(360e9)
    assert 1.0 / h20.collective[1].beta == pytest.approx(40e9)
    assert 1.0 / h20.collective[2].beta == pytest.approx(24e9)
    assert h20.collective == h100.collective and h20.p2p == h100.p2p
    for field in ("gpus_per_node", "gamma_m", "gamma_k", "b_cal", "memory_headroom"):
        assert getattr(h20, field) == getattr(h100, field), field
    sources = dict(h20.sources)
    for kind in ("collective", "p2p"):
        assert "assumption" in sources[f"{kind}.inter-node"]  # no vendor figure for the H20 node's NICs


def test_a100_80gb_is_the_40gb_node_with_the_80gb_gpu():
    """DGX A100 80GB keeps the 40 GB node's links, alphas and GEMM constants; only the memory
    (80 GB HBM2e) and its bandwidth (0.85 × 2,039 GB/s = 1.733 TB/s) differ."""
    a80, a40 = hardware_preset("a100-80gb"), hardware_preset("a100-40gb")
    assert a80.mem_bandwidth == pytest.approx(1.73315e12)
    assert a80.collective == a40.collective and a80.p2p == a40.p2p
    assert a80.peak_flops == a40.peak_flops == pytest.approx(218.4e12)
    for field in ("gpus_per_node", "gamma_m", "gamma_k", "b_cal", "memory_headroom", "host_bandwidth"):
        assert getattr(a80, field) == getattr(a40, field), field


def test_gb200_nvl72_is_a_rack_wide_nvlink_domain_of_four_gpu_trays():
    """GB200 NVL72 as rpeg's three tiers: a node is one compute tray of 4 GPUs; the inter-node
    tier is the rest of the rack's NVLink 5 domain (900 GB/s per direction, 720 GB/s derated,
    as inside a tray); the inter-rack tier is each GPU's share of its tray's 4 × 400 Gb/s
    ConnectX-7 NICs (50 GB/s line rate, 40 GB/s derated, no 0.6 factor: that is the
    assumption its source states). 0.70 × 2,500 TFLOP/s dense BF16, 0.85 × 8 TB/s, 186 GB."""
    hw = hardware_preset("gb200-nvl72")
    assert hw.gpus_per_node == 4
    assert hw.gpu_memory_bytes == 186e9
    assert hw.peak_flops == pytest.approx(0.70 * 2500e12)
    assert hw.mem_bandwidth == pytest.approx(0.85 * 8e12)
    nic_share = 4 * 400e9 / 8 / 4
    for links in (hw.collective, hw.p2p):
        assert 1.0 / links[0].beta == pytest.approx(0.8 * 900e9)
        assert 1.0 / links[1].beta == pytest.approx(0.8 * 900e9)  # NVLink between trays of a rack
        assert 1.0 / links[2].beta == pytest.approx(0.8 * nic_share) == pytest.approx(40e9)
        assert links[0].alpha <= links[1].alpha < links[2].alpha
    sources = dict(hw.sources)
    assert "NVLink" in sources["collective.inter-node"] and "ConnectX-7" in sources["collective.inter-rack"]
    assert "72" in hw.notes and "nodes_per_rack = 18" in hw.notes


@pytest.mark.parametrize(("ultra", "base"), [("b300", "b200"), ("gb300-nvl72", "gb200-nvl72")])
def test_blackwell_ultra_is_its_blackwell_node_with_more_memory_and_faster_nics(ultra, base):
    """Blackwell Ultra keeps the dense BF16 and FP8 tensor rates of the Blackwell part it replaces
    (2,250 / 4,500 TFLOP/s in DGX B300, 2,500 / 5,000 in GB300 NVL72; its gain is dense NVFP4,
    13,125 against 9,000 and 15,000 against 10,000 TFLOP/s), its 8 TB/s HBM and NVLink 5; it carries 288 GB and each GPU's
    compute NIC is an 800 Gb/s ConnectX-8 instead of a 400 Gb/s ConnectX-7, so the tier that
    leaves the NVLink domain is twice as fast (80 GB/s derated per GPU; 48 GB/s between DGX B300
    racks after the 0.6 factor)."""
    new, old = hardware_preset(ultra), hardware_preset(base)
    assert new.gpu_memory_bytes == 288e9 > old.gpu_memory_bytes
    for field in (
        "peak_flops",
        "peak_flops_fp8",
        "mem_bandwidth",
        "c_nongemm",
        "gpus_per_node",
        "host_bandwidth",
    ):
        assert getattr(new, field) == getattr(old, field), field
    assert new.rollout_step == old.rollout_step and new.attention == old.attention
    out = 1 if ultra == "b300" else 2  # the first tier outside NVLink
    for links, was in ((new.collective, old.collective), (new.p2p, old.p2p)):
        assert links[:out] == was[:out]
        assert 1.0 / links[out].beta == pytest.approx(80e9) == pytest.approx(2.0 / was[out].beta)
        assert [link.alpha for link in links] == [link.alpha for link in was]
    sources = dict(new.sources)
    assert "ConnectX-8" in sources[f"collective.{TIER_NAMES[out]}"]
    assert "Blackwell Ultra" in new.notes and "NVFP4" in new.notes
    fp4_gain = 13125 / 9000 if ultra == "b300" else 15000 / 10000
    assert new.peak_flops_fp4 / old.peak_flops_fp4 == pytest.approx(fp4_gain, rel=1e-6)


def test_blackwell_presets_outrun_hopper():
    """The Blackwell GPUs' derated figures sit above H100's: 2.27x (B200) and 2.53x (GB200)
    the dense BF16 rate, 2.39x the HBM bandwidth, twice the NVLink rate."""
    h100, b200, gb200 = (hardware_preset(n) for n in ("h100", "b200", "gb200-nvl72"))
    assert b200.peak_flops / h100.peak_flops == pytest.approx(2250 / 989.4)
    assert gb200.peak_flops / h100.peak_flops == pytest.approx(2500 / 989.4)
    assert b200.mem_bandwidth / h100.mem_bandwidth == pytest.approx(8 / 3.35)
    assert h100.collective[0].beta / b200.collective[0].beta == pytest.approx(2.0)
