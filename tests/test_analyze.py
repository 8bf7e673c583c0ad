import json
import subprocess
import sys

import pytest

import tilegen
from tilegen.analysis.mca import AnalyzeError, analyze, hot_loop


def test_hot_loop_is_found_from_markers():
    insns, macs = hot_loop(tilegen.generate(tilegen.parse_spec("f32:neon:6x16")))
    assert macs == 4 * 6 * 16
    assert sum(i.startswith("fmla") for i in insns) == 96


def test_f32_gemm_model_efficiency():
    r = analyze(tilegen.parse_spec("f32:neon:6x16"), "neoverse-v2")
    assert r.efficiency >= 0.98 and r.macs_per_iter == 384
    assert r.block32_cycles == pytest.approx(8 * r.cycles_per_iter)


def test_q4_block_cost_includes_scale_handling():
    r = analyze(tilegen.parse_spec("q4_0:dotprod:16x4"), "neoverse-n2")
    assert r.block32_cycles > r.cycles_per_iter > 0


def test_kquant_super_block_is_reported_per_32_k():
    """The K-quant kernels mark one 256-k super-block (``block-begin k=256``, the hot loop):
    analyze reports its cycles and MACs per 32 k, and tune scores it the same way."""
    from tilegen.analysis.tune import Candidate, Score
    spec = tilegen.parse_spec("q4_K:i8mm:8x4")
    r = analyze(spec, "neoverse-v2")
    assert r.macs_per_iter == 256 * 8 * 4 and r.block32_macs == 32 * 8 * 4
    assert r.block32_cycles < r.cycles_per_iter
    assert r.block32_macs_per_cycle == pytest.approx(r.block32_macs / r.block32_cycles)
    s = Score(Candidate(spec, 0, 8, 0.0), r)
    assert s.value == pytest.approx(r.block32_macs_per_cycle)


def test_cli_json():
    p = subprocess.run([sys.executable, "-m", "tilegen", "analyze", "--kernel", "f32:neon:4x16",
                        "--cpu-model", "neoverse-n2", "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    rows = json.loads(p.stdout)
    assert rows[0]["model"] == "neoverse-n2" and 0 < rows[0]["efficiency"] <= 1.0


def test_missing_llvm_mca(monkeypatch):
    monkeypatch.setattr("tilegen.analysis.mca.shutil.which", lambda name: None)
    with pytest.raises(AnalyzeError, match="apt-get install llvm-19"):
        analyze(tilegen.parse_spec("f32:neon:4x16"), "neoverse-v2")


def test_sve_loops_scale_with_the_model_vl_and_sme_by_instruction_mix():
    from tilegen.analysis.mca import AnalyzeError, analyze, instruction_mix
    from tilegen.generator import parse_spec
    s = parse_spec("f32:sve:6x4vl")
    n2, v1 = analyze(s, "neoverse-n2"), analyze(s, "neoverse-v1")
    assert v1.macs_per_iter == 2 * n2.macs_per_iter == 2 * 4 * 6 * 4 * 4   # 256 vs 128 bits
    assert n2.efficiency > 0.98 and v1.efficiency > 0.98
    with pytest.raises(AnalyzeError, match="no SVE"):
        analyze(s, "apple-m4")
    sme = parse_spec("f32:sme2:2vlx2vl")
    with pytest.raises(AnalyzeError, match="no useful SME model"):
        analyze(sme, "neoverse-v2")
    mix = instruction_mix(sme)
    assert (mix.mac_insns, mix.insns) == (32, 44)     # 8 k steps x 4 FMOPA, 8 four-vector loads
    assert instruction_mix(parse_spec("f32:sme:2vlx2vl")).ratio < mix.ratio


def test_plain_neon_q4_kernels_are_modelled():
    # SMULL/SMULL2 + SADALP are the plain-NEON kernels' multiply-accumulates
    r = analyze(tilegen.parse_spec("q4_0:neon:4x4"), "neoverse-n2")
    assert r.macs_per_iter == 32 * 4 * 4 and 0 < r.efficiency <= 1.0
    assert r.block32_cycles > r.cycles_per_iter


def test_plot_writes_a_png(tmp_path):
    from tilegen.cli import main
    from tilegen.analysis.plot import efficiency_chart
    png = tmp_path / "eff.png"
    assert main(["analyze", "--kernel", "f32:neon:4x16", "--kernel", "f32:neon:6x16",
                 "--cpu-model", "neoverse-n2", "--cpu-model", "neoverse-v2",
                 "--plot", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    reports = [analyze(tilegen.parse_spec("f32:neon:4x16"), "neoverse-n2")]
    efficiency_chart(reports, ["neoverse-n2", "apple-m4"], tmp_path / "one.png")  # no apple-m4 row
    assert (tmp_path / "one.png").read_bytes()[:4] == b"\x89PNG"


def test_plot_without_matplotlib_is_a_user_error(tmp_path, monkeypatch, capsys):
    from tilegen.cli import main
    monkeypatch.setitem(sys.modules, "matplotlib", None)      # import matplotlib fails
    rc = main(["analyze", "--kernel", "f32:neon:4x16", "--cpu-model", "neoverse-n2",
               "--plot", str(tmp_path / "x.png")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith("tilegen analyze: error: ") and "tilegen[plot]" in err, err


def test_matplotlib_is_in_the_plot_and_test_extras():
    import tomllib
    from pathlib import Path
    extras = tomllib.loads((Path(__file__).parents[1] / "pyproject.toml").read_text())[
        "project"]["optional-dependencies"]
    for extra in ("plot", "test"):
        assert any(d.startswith("matplotlib") for d in extras.get(extra, ())), extra


def test_per_k_q4_is_eight_blocks_per_super_block():
    """per_k over 256 k of a bl = 32 family: its 32-k block region eight times."""
    from tilegen.analysis.mca import per_k
    r, s = analyze("q4_0:i8mm:12x4", "neoverse-v2"), per_k("q4_0:i8mm:12x4", "neoverse-v2", 256)
    assert s.unit_k == 32 and s.macs == 8 * r.block32_macs == 12 * 4 * 256
    assert s.cycles == pytest.approx(8 * r.block32_cycles)
    f = per_k("f32:neon:6x16", "neoverse-n2", 256)      # no block: the 4-k hot loop x 64
    assert f.unit_k == 4 and f.macs == 6 * 16 * 256
    assert f.cycles == pytest.approx(64 * analyze("f32:neon:6x16", "neoverse-n2").cycles_per_iter)
    with pytest.raises(AnalyzeError, match="not a multiple of 32"):
        per_k("q4_0:i8mm:12x4", "neoverse-v2", 48)


def test_per_k_expands_marked_trips_in_the_block(monkeypatch):
    """A block marked ``tilegen:block-begin k=64`` whose chunk loop says ``tilegen:trips 2``:
    the loop body is modelled twice per block, the block once per 64 k (the K-quant
    super-block convention, ``k=256``)."""
    import re

    import tilegen.analysis.mca as an
    spec = tilegen.parse_spec("q4_0:i8mm:8x4")
    text = tilegen.generate(spec)
    hot, _ = hot_loop(text)
    marked = re.sub(r"^(\S*chunk_loop:)", r"\1  // tilegen:trips 2", text, count=1, flags=re.M)
    marked = marked.replace("tilegen:block-begin (", "tilegen:block-begin k=64 (", 1)
    assert marked.count("trips 2") == 1 and marked.count("k=64") == 1
    monkeypatch.setattr(an, "render", lambda s: type("R", (), {"text": marked})())
    one = an.per_k(spec, "neoverse-v2", 64)
    plain = an._branchless(an._region(text, "tilegen:block-begin", "tilegen:block-end"))
    assert one.unit_k == 64 and one.macs == 8 * 4 * 64
    assert one.insns == len(plain) + len(an._branchless(hot))
    assert an.per_k(spec, "neoverse-v2", 256).cycles == pytest.approx(4 * one.cycles)
    with pytest.raises(AnalyzeError, match="not a multiple of 64"):
        an.per_k(spec, "neoverse-v2", 96)
