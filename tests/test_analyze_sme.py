"""The SME static model (tilegen/analysis/sme.py): counting rule, block expansion, the
KleidiAI-source reader, and the CLI rows for SME kernels."""
import json
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tilegen.analysis.sme import (KAI_RECIPES, accumulators, count, count_kleidiai, expand,
                                 kleidiai_lines, kleidiai_report, kleidiai_version, load_vectors,
                                 macs_of, mem_bytes, memory, sme_report)
import tilegen
from tilegen.emulate.provision import ensure_kleidiai_source

REPO = Path(__file__).resolve().parents[1]
#: KleidiAI's release tarballs next to the repository (read, extracted into the tilegen cache)
KAI_TARBALLS = REPO.parent / "shared" / "thirdparty" / "kleidiai"


@pytest.mark.parametrize("insn, macs", [
    ("fmopa za0.s, p0/m, p1/m, z0.s, z4.s", 16),
    ("bfmopa za1.s, p0/m, p0/m, z0.h, z4.h", 32),
    ("smopa za3.s, p0/m, p0/m, z8.b, z7.b", 64),
    ("fmla za.s[w8, 0, vgx4], {z0.s-z3.s}, z4.s", 16),
    ("fmla za.s[x9, 2], { z16.s-z19.s }, z3.s[0]", 16),       # no vgx: the list's length
    ("fmla za.s[w8, 1, vgx2], {z0.s-z1.s}, z4.s", 8),
    ("sdot za.s[w8, 0, vgx4], {z4.b - z7.b}, z0.b[0]", 64),
    ("sdot za.s[w8, 0, vgx2], {z4.b-z5.b}, z0.b[1]", 32),
    ("sdot z1.s, z2.b, z3.b[0]", 16),
    ("fmla z24.s, p0/m, z8.s, z28.s", 0),                     # scale work, not a MAC
    ("luti4 {z4.b - z5.b}, zt0, z2[0]", 0),
])
def test_counting_rule(insn, macs):
    assert macs_of(insn) == macs


def test_load_vectors():
    assert load_vectors("ld1w {z0.s-z3.s}, pn8/z, [x1]") == 4
    assert load_vectors("ld1w { z7.s, z15.s }, pn9.b/Z, [x28]") == 2
    assert load_vectors("ld1rqw { z3.s }, p0/Z, [x22]") == 1
    assert load_vectors("ldr x5, [x0, #8]") == 0
    assert count(["ld1w {z0.s-z3.s}, pn8/z, [x1]", "add x1, x1, #4"]).loads == 1


def test_block_loops_run_their_trips():
    lines = ["mov w12, #0", "fold:   // tilegen:trips svl/32", "mova z1.s, p0/m, za0h.s[w12, 0]",
             "add w12, w12, #1", "b.lt fold", "zero {za}"]
    assert len(expand(lines, 128)) == 2 + 3 * 4
    assert len(expand(lines, 512)) == 2 + 3 * 16


def test_kleidiai_reader_takes_mnemonics_from_inst_comments():
    # a made-up loop in the shape of KleidiAI's inline assembly
    text = '\n'.join([
        '        "3:"  // loop',
        '        ".inst 0x00000000  // smopa za0.s, p0/M, p0/M, z8.b, z4.b\\n"',
        '        "subs x11, x11, #4\\n"',
        '        "b.gt 3b\\n"'])
    assert kleidiai_lines(text)[1].startswith("smopa")
    r = count_kleidiai("x", text, "3", 4)
    assert (r.loop.insns, r.loop.mac_insns, r.loop.macs) == (3, 1, 64)


def test_tilegen_sme_reports():
    q4 = sme_report("q4_0:sme:1vlx2vl")
    assert q4.k_per_iter == 32 and q4.loop.macs == 16 * 64
    assert q4.block is not None and q4.block.insns > q4.loop.insns
    f = sme_report("f32:sme2:2vlx2vl")
    assert f.loop.macs == f.loop.mac_insns * 16
    # no marked block: the hot loop x 32 / k per iteration
    assert f.block_derived and f.block.insns == f.loop.insns * 32 // f.k_per_iter


def test_cli_reports_sme_rows():
    p = subprocess.run([sys.executable, "-m", "tilegen", "analyze", "--kernel", "f32:sme2:2vlx2vl",
                        "--json"], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    row = json.loads(p.stdout)[0]
    assert row["model"] == "sme-static" and row["macs_per_insn_128"] > 0
    # the SME-unit model of its block: FMOPA-bound on the M4 table, 128 f32 FMOPA per 32 k
    assert row["m4"]["binding"] == "mopa.f32" and row["m4"]["classes"]["mopa.f32"] == 128
    p = subprocess.run([sys.executable, "-m", "tilegen", "analyze", "--kernel", "q8_0:sme2:1vlx4vl"],
                       capture_output=True, text=True)
    assert p.returncode == 0, p.stderr
    from tilegen.analysis.sme import UNIT_HEADER
    lines = p.stdout.splitlines()
    unit = lines[lines.index(UNIT_HEADER) + 1].split()
    assert unit[:6] == ["matmul_clamp_f32_qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa", "32", "42",
                        "5", "64.0", "512.0"] and unit[8] == "mopa.i8", unit


@pytest.mark.parametrize("insn, svl, nbytes", [
    ("ld1w {z0.s-z3.s}, pn8/z, [x15, #8, mul vl]", 512, 256),
    ("ld1h {z8.s}, p0/z, [x11, #0, mul vl]", 512, 32),         # widening: halfwords into .s
    ("st1w {z28.s-z31.s}, pn9, [x14]", 256, 128),
    ("ld1rw {z4.s}, p0/z, [sp, #16]", 512, 4),
    ("ld1rqb { z0.b }, p1/z, [x21, x23]", 2048, 16),
    ("ldr zt0, [x9]", 512, 64),
    ("ldr x24, [x0, #0x18]", 512, 8),
    ("ldp x19, x20, [sp], 96", 512, 16),
    ("ld1 {v0.4s, v1.4s}, [x13], #32", 512, 32),
    ("st1 {v0.s}[2], [x14], x10", 512, 4),
    ("add x1, x1, #4", 512, 0),
])
def test_mem_bytes(insn, svl, nbytes):
    assert mem_bytes(insn, svl) == nbytes


def test_block_memory_sees_the_dst_round_trip():
    """tilegen's int8 q4 SME2 gemm folds ZA into dst every 32-k block (ld1w + st1w of the tile's
    16 rows x 4 VL at SVL 512: 8 KiB); the bf16 and f32 gemms move only packed operands."""
    q4 = sme_report("q4_0_s1s0:sme2:1vlx4vl")
    dst = q4.block_mem["dst"]
    assert (dst.load_bytes, dst.store_bytes, dst.stores) == (4096, 4096, 16)
    bf = sme_report("bf16:sme2:2vlx2vl")
    # 16 k-pairs of a 32-row LHS block and a 32-column RHS panel at SVL 512, bf16 pairs
    assert bf.block_mem["packed"].load_bytes == 2 * 16 * 32 * 4
    assert bf.block_mem.total.stores == 0 and bf.block_mem["dst"].load_bytes == 0


def test_memory_roles():
    m = memory(["ld1w {z0.s}, p0/z, [x3]", "ld1w {z1.s}, p0/z, [x6]", "st1w {z1.s}, p0, [x6]",
                "ldr x5, [x0, #8]", "ldr zt0, [sp]"], 128)
    assert (m["packed"].load_bytes, m["dst"].load_bytes, m["dst"].store_bytes,
            m["scalar"].load_bytes, m["stack"].load_bytes) == (16, 16, 16, 8, 64)


def test_accumulator_chains():
    """One ZA-array group in the luti4 gemv and the f32 1x4vl gemv: one dependency chain."""
    assert sme_report("q4_0_s1s0:sme2:1x4vl").accumulators == 1
    assert sme_report("f32:sme2:1x4vl").accumulators == 1
    assert sme_report("bf16:sme2:2vlx2vl").accumulators == 4
    assert accumulators(["fmopa za1.s, p0/m, p0/m, z0.s, z1.s",
                         "fmla za.s[w8, 0, vgx4], {z0.s-z3.s}, z4.s",
                         "fmla za.s[w8, 1, vgx4], {z0.s-z3.s}, z4.s",
                         "sdot z1.s, z2.b, z3.b[0]"]) == 4


def test_expand_takes_listed_forward_branches():
    lines = ["cmp x1, x2", "b.ne 6f", "fmul z0.s, z0.s, z1.s", "b 7f", "6:", "fmla z0.s, p0/m, z1.s, z2.s",
             "7:", "st1w {z0.s}, p0, [x3]"]
    assert expand(lines, 512, taken=("6",)) == ["cmp x1, x2", "b.ne 6f", "fmla z0.s, p0/m, z1.s, z2.s",
                                               "st1w {z0.s}, p0, [x3]"]
    assert len(expand(lines, 512)) == 6


@pytest.fixture(scope="module", params=["1.24.0", "1.30.0"])
def kai_tree(request):
    """A real KleidiAI source tree, extracted once into the tilegen cache."""
    tree = ensure_kleidiai_source(KAI_TARBALLS / f"kleidiai-v{request.param}.tar.gz", quiet=True)
    assert kleidiai_version(tree) == request.param
    return tree


def test_every_kleidiai_recipe_reads_its_kernel(kai_tree):
    for name, r in KAI_RECIPES.items():
        rep = kleidiai_report(kai_tree, name)
        assert rep.loop.mac_insns > 0 and rep.block_macs_per_insn > 0, name
        assert rep.block_derived == (r.block is None), name


def test_kleidiai_figures_of_issue_23(kai_tree):
    """The figures of issue #23, counted on the real trees: f32 FMOPA 24 instructions / 16
    FMOPA; the f32 gemv llama.cpp runs (f32p2vlx1b_1x16vl) 0.186, f32p16vlx1b_1x16vl 0.381;
    bf16 0.667 (21.3 MACs per instruction per granule); the f16-LHS q4 gemm 151.0 per block."""
    def rep(name):
        return kleidiai_report(kai_tree, "matmul_clamp_f32_" + name)
    f32 = rep("f32p2vlx1_f32p2vlx1biasf32_sme2_mopa")
    assert (f32.loop.insns, f32.loop.mac_insns) == (24, 16)
    assert round(rep("f32_f32p2vlx1b_1x16vl_sme2_mla").mac_per_insn, 3) == 0.186
    assert round(rep("f32_f32p16vlx1b_1x16vl_sme2_mla").mac_per_insn, 3) == 0.381
    bf = rep("bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa")
    assert round(bf.mac_per_insn, 3) == 0.667 and round(bf.macs_per_insn, 1) == 21.3
    assert round(rep("f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa").block_macs_per_insn, 1) == 151.0
    assert round(rep("qsi8d32p1vlx4_qsi4c32p4vlx4_1vlx4vl_sme2_mopa").block_macs_per_insn, 1) == 67.6


def test_bf16_sme2_gemm_at_or_above_kleidiai(kai_tree):
    """Issue #23 item 4: tilegen's bf16 SME2 gemm scores at least KleidiAI's by the static rule
    (MAC instructions per hot-loop instruction, MACs per instruction per 32-k block at SVL 512)."""
    t = sme_report("bf16:sme2:2vlx2vl")
    k = kleidiai_report(kai_tree, "matmul_clamp_f32_bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa")
    assert t.mac_per_insn >= k.mac_per_insn and t.block_macs_per_insn >= k.block_macs_per_insn
    assert t.block_mem.total.load_bytes <= k.block_mem.total.load_bytes


def test_recorded_sme_mix_is_current(tmp_path):
    """bench/results/sme_mix.{json,md} are what its recorded command prints now (the real
    KleidiAI trees, tilegen's kernels of this tree): re-record with that command otherwise."""
    rec = json.loads((REPO / "bench" / "results" / "sme_mix.json").read_text())
    assert rec["command"] == "python bench/sme_mix.py --out bench/results/sme_mix"
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sme_mix.py"), "--out",
                        str(tmp_path / "mix")], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    now = json.loads((tmp_path / "mix.json").read_text())
    assert (now["rows"], now["packers"], now["m4_units"]) == \
        (rec["rows"], rec["packers"], rec["m4_units"]), \
        f"stale bench/results/sme_mix: run `{rec['command']}`"
    # every row carries the SME-unit model of its block
    assert all("m4" in d for r in now["rows"] for d in [r["tilegen"], *r["kleidiai"].values()])
    names = {r["name"] for r in now["rows"] if r["group"] == "exported"}
    from tilegen.export.kleidiai import KERNELS
    assert names == {k.name for k in KERNELS if "_sme" in k.name}


def test_kleidiai_sme_packers_read(kai_tree):
    """KleidiAI's SME LHS packers (v1.24.0 has no bf16 _sme2: its _sme one is that code) give a
    positive count per element that halves when SVL doubles (one VL of work per instruction)."""
    from tilegen.analysis.sme import KAI_PACKERS, kleidiai_packer_mix
    found = set()
    for name in KAI_PACKERS:
        try:
            a, b = (kleidiai_packer_mix(kai_tree, name, s) for s in (512, 1024))
        except FileNotFoundError:
            assert name.endswith("_sme2") and kleidiai_version(kai_tree) == "1.24.0", name
            continue
        found.add(name)
        assert a.per_element > 0 and a.per_element == 2 * b.per_element, name
    assert {"lhs_pack_f32p2vlx1_f32_sme", "lhs_pack_bf16p2vlx2_f32_sme"} <= found

# KleidiAI's release trees (../shared/thirdparty/kleidiai, README there), read in memory
KAI_TREES = Path(__file__).resolve().parents[2] / "shared" / "thirdparty" / "kleidiai"
_F16_GEMM = ("matmul_clamp_f32_f16p_qsi4c32p/"
             "kai_matmul_clamp_f32_f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa_asm.S")


def _kai_source(version: str, rel: str) -> str:
    tar = KAI_TREES / f"kleidiai-v{version}.tar.gz"
    assert tar.is_file(), f"{tar}: KleidiAI's release tree (check out ../shared next to the repo)"
    with tarfile.open(tar) as t:
        return t.extractfile(f"kleidiai-{version}/kai/ukernels/matmul/{rel}").read().decode()


def test_q4_f16_gemm_at_least_kleidiai():
    """Issue #23 item 4: the SME2 Q4_0 gemm llama.cpp runs, KleidiAI v1.30.0's
    f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa (block loop label_3, its 4-k loop label_4 run
    bl/4 = 8 times), scores 151.0 MACs per instruction per 32-k block at SVL 512; tilegen's
    q4_0_f16:sme2:1vlx4vl (the kernel behind that name in the export) scores at least as much,
    with the same 64 FMOPA per block and nothing stored in the block (ZA holds the sums over
    all of k)."""
    kai = count_kleidiai("f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa",
                         _kai_source("1.30.0", _F16_GEMM), "label_4", 4, "label_3",
                         {"label_4": "32//4"})
    assert (kai.block.insns, kai.block.mac_insns) == (217, 64)
    assert round(kai.block_macs_per_insn, 1) == 151.0
    ours = sme_report("q4_0_f16:sme2:1vlx4vl")
    assert ours.block.mac_insns == 64 and ours.block_macs_at_svl == kai.block_macs_at_svl
    assert ours.block_macs_per_insn >= kai.block_macs_per_insn
    from tilegen.generator.render import render
    text = render("q4_0_f16:sme2:1vlx4vl").text
    block = text[text.index("tilegen:block-begin"):text.index("tilegen:block-end")]
    assert not [ln for ln in block.splitlines() if ln.split() and ln.split()[0].startswith("st")]


@pytest.mark.parametrize("spec, mr, nr", [("q4_K:sme2:1vlx2vl", 16, 32), ("q4_K:sme2:1vlx1vl", 16, 16),
                                          ("q4_K:sme2:1x2vl", 1, 32), ("q4_K:sme2:1x4vl", 1, 64),
                                          ("q6_K:sme2:1vlx4vl", 16, 64), ("q6_K:sme2:1x4vl", 1, 64)])
def test_kquant_sme2_block_is_a_superblock(spec, mr, nr):
    """The K-quant SME2 kernels mark one 256-k super-block (``block-begin k=256``): at SVL 512
    the hot loop (32 k) run its 8 trips carries exactly the tile's 256*mr*nr MACs, the block
    adds only the q4_K min term's (bsum x mins: at most 1/16 more; q6_K has none)."""
    r = sme_report(spec, block_svl=512)
    assert r.block_k == 256 and r.as_dict()["block_k"] == 256 and not r.block_derived
    g = 512 // 128
    hot_macs = r.loop.macs * (g * g if not tilegen.parse_spec(spec).is_gemv else g)
    assert r.k_per_iter == 32 and 8 * hot_macs == 256 * mr * nr
    if spec.startswith("q6_K"):
        assert r.block_macs_at_svl == 256 * mr * nr
    else:
        assert 256 * mr * nr < r.block_macs_at_svl <= 256 * mr * nr * 17 // 16


# -- the SME unit and the core: the per-class Apple M4 table (issue #34 item 1) ---------------

from tilegen.analysis.sme import M4_DATA, M4_UNITS, unit_class, unit_mix  # noqa: E402

#: the public M4 measurements (../shared/thirdparty/m4-sme, README there)
M4_DIR = REPO.parent / "shared" / "thirdparty" / "m4-sme"


@pytest.mark.parametrize("insn, cls, vectors", [
    ("fmopa za0.s, p0/m, p1/m, z0.s, z4.s", "mopa.f32", 1),
    ("fmopa za1.s, p0/m, p0/m, z0.h, z4.h", "mopa.f16", 1),
    ("bfmopa za1.s, p0/m, p0/m, z0.h, z4.h", "mopa.f16", 1),
    ("smopa za3.s, p0/m, p0/m, z8.b, z7.b", "mopa.i8", 1),
    ("usmopa za3.s, p0/m, p0/m, z8.b, z7.b", "mopa.i8", 1),
    ("smopa za1.s, p2/m, p2/m, z4.h, z8.h", "mopa.i16", 1),
    ("fmla za.s[w8, 0, vgx4], {z0.s-z3.s}, z4.s", "za.f32", 4),
    ("sdot za.s[w8, 0, vgx2], {z4.b-z5.b}, z0.b[1]", "za.int", 2),
    ("bfdot za.s[w8, 1, vgx4], {z0.h-z3.h}, z4.h", "za.f16", 4),
    ("fmul z24.s, z8.s, z28.s", "z.fp", 1),
    ("scvtf z1.s, p0/m, z1.s", "z.fp", 1),
    ("sunpklo z1.h, z2.b", "z.int", 1),
    ("sdot z1.s, z2.b, z3.b[0]", "z.int", 1),
    ("luti4 {z4.b - z5.b}, zt0, z2[0]", "luti", 2),
    ("mova z1.s, p0/m, za0h.s[w12, 0]", "za.move", 1),
    ("mov {z0.s-z3.s}, za0h.s[w12, 0:3]", "za.move", 4),
    ("zero {za}", "za.move", 1),
    ("ld1b {z0.b-z3.b}, pn8/z, [x20, #4, mul vl]", "load:b.x4", 4),
    ("ld1h { z8.h, z9.h }, pn8/z, [x11]", "load:h.x2", 2),
    ("ld1w {z4.s}, p0/z, [x10]", "load:w.x1", 1),
    ("ld1rw {z4.s}, p0/z, [sp, #16]", "load:rw.x1", 1),
    ("ld1rqb { z0.b }, p1/z, [x21, x23]", "load:rqb.x1", 1),
    ("ldr zt0, [x9]", "load:zt0.x1", 1),
    ("st1w {z28.s-z31.s}, pn9, [x14]", "store:w.x4", 4),
    ("whilelt p1.s, xzr, x6", "pred", 1),
    ("ptrue pn8.b", "pred", 1),
    ("addvl x10, x10, #4", "core", 1),
    ("ldr x5, [x0, #8]", "core", 1),
    ("subs x14, x14, #1", "core", 1),
    ("b.ne .Lk_loop", "core", 1),
    ("cntw x9", "core", 1),
])
def test_unit_classes(insn, cls, vectors):
    """Instructions that touch Z, ZA, ZT0 or a predicate run on the SME unit, in one class of
    the M4 table; general-register-only instructions on the core."""
    assert unit_class(insn) == (cls, vectors)
    assert M4_UNITS[cls.split(":")[0]].unit == ("core" if cls == "core" else "sme")


def _median(xs):
    import statistics
    return statistics.median(xs)


def test_m4_table_is_the_public_data():
    """Each measured row of the M4 table follows from the rows it cites in the m4-sme data: the
    cycles per instruction (or vector) are the f32 FMOPA 4-tile rate over the cited rate, the
    latency the same over the one-chain row's rate (rounded to the half cycle); the cited rows
    are the class's opcode and types; every other row is flagged as an assumption."""
    assert M4_DIR.is_dir(), f"{M4_DIR}: the public M4 data (check out ../shared next to the repo)"
    data = {f: json.loads((M4_DIR / f).read_text()) for f in M4_DATA}
    f32 = data["outer-products.json"][27]
    assert (f32["opcode"], f32["input"], f32["tiles"], f32["threads"]) == ("fmopa", "f32", 4, 1)
    clock = _median(f32["flops"]) / 512              # G instructions per second: 1 per cycle
    assert 3.8 < clock < 4.0
    want = {"mopa.f32": ("fmopa", "f32"), "mopa.f16": ("fmopa", "f16"),
            "mopa.i8": ("smopa", "i8"), "mopa.i16": ("smopa", "i16"), "za.f32": ("fmla", "f32"),
            "za.f16": ("fdot", "f16"), "z.fp": ("fmla", "f32")}
    measured = set()
    for u in M4_UNITS.values():
        if u.assumed:
            assert u.source.startswith("assumption: ") and len(u.note) > 20, u.cls
            continue
        measured.add(u.cls)
        f, tput, lat, flop = u.data
        rows = data[f]
        for r in (tput, lat):
            assert (rows[r]["opcode"], rows[r]["input"], rows[r]["threads"]) == (*want[u.cls], 1)
        assert round(2 * clock * flop / _median(rows[tput]["flops"])) / 2 == u.cycles, u.cls
        per_insn = flop * rows[lat].get("vgSize", 1) if u.per == "vector" else flop
        if u.per == "vector":      # one ZA-array group: the latency row chains one instruction
            assert rows[lat]["slices"] == rows[lat]["vgSize"], u.cls
        assert round(2 * clock * per_insn / _median(rows[lat]["flops"])) / 2 == u.latency, u.cls
    assert measured == set(want)


def test_chain_bound_one_tile_against_four():
    """Eight int8 SMOPA into one tile wait for each other (8 x latency 4 = 32 cycles, above
    their 16 cycles of throughput): the chain binds; rotated over four tiles the pipe does."""
    one = [f"smopa za0.s, p0/m, p0/m, z{i}.b, z8.b" for i in range(8)]
    four = [f"smopa za{i % 4}.s, p0/m, p0/m, z{i}.b, z8.b" for i in range(8)]
    a, b = unit_mix(one), unit_mix(four)
    assert (a.chain, a.bound, a.binding) == (32, 32, "chain mopa.i8 on za0")
    assert (b.chain, b.bound, b.binding) == (8, 16, "mopa.i8")
    assert a.sme_insns == b.sme_insns == 8 and a.core_insns == 0
    f16 = unit_mix(["bfmopa za0.s, p0/m, p0/m, z0.h, z4.h"] * 4 + ["subs x1, x1, #1"])
    assert (f16.chain, f16.bound, f16.core_insns) == (32, 32, 1)


#: issue #34's table: SME-unit / core instructions per 32 k at SVL 512 of the kernel llama.cpp
#: runs (KleidiAI v1.30.0; v1.24.0 the same) and of tilegen's kernel behind that name
ISSUE_34 = [
    ("f16p1vlx2_qsi4c32p4vlx2_1vlx4vl_sme2_mopa", (171, 46), "q4_0_f16:sme2:1vlx4vl", (159, 8)),
    ("bf16p2vlx2_bf16p2vlx2_2vlx2vl_sme2_mopa", (80, 16), "bf16:sme2:2vlx2vl", (80, 8)),
    ("qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa", (56, 32), "q8_0:sme:1vlx4vl", (72, 7)),
]


def test_issue_34_table(kai_tree):
    for name, kai, spec, ours in ISSUE_34:
        k = kleidiai_report(kai_tree, "matmul_clamp_f32_" + name).unit
        t = sme_report(spec).unit
        assert (k.sme_insns, k.core_insns) == kai, name
        assert (t.sme_insns, t.core_insns) == ours, spec


def test_q8_sme2_gemm_at_or_below_kleidiai(kai_tree):
    """Issue #34 item 2: the Q8_0 SME2 gemm behind KleidiAI's qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl
    _sme2_mopa issues at most KleidiAI's SME-unit instructions per 32 k (56 at SVL 512; the
    SME1 tile 72: 40 single-vector LD1B): 32 SMOPA and 10 four-vector LD1B, the same bound
    (SMOPA-bound) and MACs; the export serves that name with it."""
    name = "qai8dxp1vlx4_qsi8cxp4vlx4_1vlx4vl_sme2_mopa"
    k = kleidiai_report(kai_tree, "matmul_clamp_f32_" + name)
    t = sme_report("q8_0:sme2:1vlx4vl")
    assert t.unit.sme_insns <= k.unit.sme_insns and t.unit.core_insns <= k.unit.core_insns
    assert dict(t.unit.classes) == {"mopa.i8": 32, "load:b.x4": 10, "core": 5}
    assert t.block_macs_at_svl == k.block_macs_at_svl and t.unit.bound <= k.unit.bound
    assert t.unit.binding == "mopa.i8"
    from tilegen.export.kleidiai import KERNELS
    assert {kk.name: kk.spec for kk in KERNELS}["matmul_clamp_f32_" + name] == "q8_0:sme2:1vlx4vl"


def test_m4_table_documented():
    """docs/tuning.md's M4 table is M4_UNITS row for row (cycles, per, latency, source)."""
    doc = (REPO / "docs" / "tuning.md").read_text()
    sec = doc[doc.index("### The SME unit and the core (Apple M4)"):]
    rows = [ln for ln in sec.splitlines() if ln.startswith("| `")]
    assert rows[:len(M4_UNITS)] == [u.table_row() for u in M4_UNITS.values()]
    assert rows[0] == ("| `mopa.f32` | sme | 1 | insn | 4 | m4-sme outer-products.json row 27, "
                       "latency row 0 (FMOPA f32: 2004 GFLOPS with 4 tiles, 498 with 1) |")


# -- every SME/SME2 kernel on the M4 model, recorded (issue #34 item 4) ----------------------

def test_counted_mix_is_the_instruction_mix():
    """A block given by its class counts and chains (a kernel kept as figures: PR29219_GEMM)
    gets the same UnitMix as its instructions: the same cycles per class, chain and bound."""
    from tilegen.analysis.sme import unit_mix_counted
    insns = (["ld1b {z0.b-z3.b}, pn8/z, [x20, #4, mul vl]", "ld1h { z8.h, z9.h }, pn8/z, [x11]",
              "luti4 {z8.h - z11.h}, zt0, z4[0]", "mov z16.d, z24.d",
              "fmla z16.h, p2/m, z8.h, z0.h", "whilelt p1.s, xzr, x6", "subs x11, x11, #4"]
             + [f"fmopa za{i % 4}.s, p2/m, p2/m, z6.h, z{16 + i % 4}.h" for i in range(7)])
    want = unit_mix(insns)
    got = unit_mix_counted(dict(want.classes), {"za0": ("mopa.f16", 2), "za1": ("mopa.f16", 2),
                                                "za2": ("mopa.f16", 2), "za3": ("mopa.f16", 1)})
    assert got == want and want.chain == 16 and want.bound == 16
    with pytest.raises(ValueError, match="per-vector"):
        unit_mix_counted({"za.f32": 1}, {})


def test_recorded_kernel_recount():
    """RecordedKernel.recount accepts a source whose block counts as recorded and refuses one
    that differs; PR29219_GEMM's record is consistent (its MACs: 64 f16 FMOPA over 4 tiles)."""
    from tilegen.analysis.sme import PR29219_GEMM, KaiRecipe, RecordedKernel
    # a made-up block in the shape of KleidiAI's inline assembly: 16 f16 FMOPA of a 1vl x 1vl
    # tile (32 k at SVL 512), a load and 36 core instructions
    text = "\n".join(['"2:"', '"mov x1, #0\\n"', '"ld1w {z6.s}, p0/z, [x3]\\n"', '"3:"',
                      '"fmopa za0.s, p0/m, p0/m, z6.h, z16.h\\n"', '"subs x11, x11, #4\\n"',
                      '"b.gt 3b\\n"', '"subs x1, x1, #1\\n"', '"b.gt 2b\\n"'])
    rec = RecordedKernel("x", "-", KaiRecipe("3", 2, "2", (("3", "16"),)), 1, 1, 52,
                         (("mopa.f16", 16), ("load:w.x1", 1), ("core", 35)),
                         (("za0", "mopa.f16", 16),))
    rec.recount(text)
    with pytest.raises(ValueError, match="the record says"):
        rec.recount(text.replace('"mov x1, #0\\n"', '"mov x1, #0\\n"\n"add x2, x2, #1\\n"'))
    p = PR29219_GEMM
    classes = dict(p.classes)
    assert sum(n for _, _, n in p.chains) == classes["mopa.f16"] == 64
    assert p.block_macs() == classes["mopa.f16"] * (512 // 128) ** 2 * 32 == 32768
    assert sum(classes.values()) == p.block_insns


def _sme_export():
    """Every exported KleidiAI name with _sme in it (spec per name) and every SME2 spec of the
    export's table of tilegen families (K-quants, IQ4_NL, MXFP4)."""
    from tilegen.export.kleidiai import KERNELS, kquant_entries
    names = {k.name: k.spec for k in KERNELS if "_sme" in k.name}
    kq = {(k.spec, f"tilegen-family {e.family} {role}") for e in kquant_entries() if e.isa == "sme2"
          for k, role in ((e.gemm, "gemm"), (e.gemv, "gemv"))}
    return names, kq


def test_recorded_sme_bound_is_current(tmp_path):
    """bench/results/sme_bound.{json,md} are what its recorded command prints now, and hold a
    row for every SME/SME2 kernel of the default list and of every tuned preset, every exported
    _sme name (with KleidiAI's kernel of that name from both trees) and every SME2 kernel of the
    export's tilegen-family table (with the ratio to PR #29219's gemm for the K-quant gemms)."""
    rec = json.loads((REPO / "bench" / "results" / "sme_bound.json").read_text())
    assert rec["command"] == "python bench/sme_bound.py --out bench/results/sme_bound"
    assert (REPO / "bench" / "results" / "sme_bound.md").read_text().startswith(
        "# Every SME/SME2 kernel on the Apple M4 SME-unit model\n\nCommand: "
        f"`{rec['command']}`\n")
    p = subprocess.run([sys.executable, str(REPO / "bench" / "sme_bound.py"), "--out",
                        str(tmp_path / "bound")], capture_output=True, text=True, cwd=REPO)
    assert p.returncode == 0, p.stderr
    now = json.loads((tmp_path / "bound.json").read_text())
    assert (now["rows"], now["pr29219"], now["m4_units"]) == \
        (rec["rows"], rec["pr29219"], rec["m4_units"]), \
        f"stale bench/results/sme_bound: run `{rec['command']}`"
    assert (tmp_path / "bound.md").read_text().replace(str(tmp_path / "bound"),
                                                       "bench/results/sme_bound") == \
        (REPO / "bench" / "results" / "sme_bound.md").read_text(), \
        f"stale bench/results/sme_bound.md: run `{rec['command']}`"
    from tilegen.build.targets import TARGETS
    from tilegen.build.tuned import tuned_specs, tuned_targets
    from tilegen.families import DEFAULT_KERNELS, KQUANT_FAMILIES
    shipped = {s for s in DEFAULT_KERNELS if tilegen.parse_spec(s).isa in ("sme", "sme2")}
    shipped |= {s.spec_string for t in tuned_targets() for s in tuned_specs(TARGETS[t])
                if s.isa in ("sme", "sme2")}
    names, kq_roles = _sme_export()
    kq = {s for s, _ in kq_roles}
    rows = now["rows"]
    assert {r["spec"] for r in rows} == shipped | set(names.values()) | kq
    assert {(r["spec"], k) for r in rows for k in r["kquant"]} == kq_roles
    assert {(r["spec"], s) for r in rows for s in r["ships"]} >= {(s, "default") for s in
                                                                 shipped}
    assert {r["kleidiai_name"]: r["spec"] for r in rows if r["kleidiai_name"]} == names
    for r in rows:
        assert set(r["kleidiai"]) == ({"1.24.0", "1.30.0"} if r["kleidiai_name"] else set())
        # the ratio to PR #29219's gemm for the K-quant families' SME2 gemms (of the table,
        # and the large-m entries' of the defaults; the table's block-32 entries, IQ4_NL and
        # MXFP4 on q8_0-like activations, have none)
        sp = tilegen.parse_spec(r["spec"])
        kquant_gemm = sp.isa == "sme2" and not sp.is_gemv and sp.family in KQUANT_FAMILIES
        assert (r["vs_pr29219"] is not None) == kquant_gemm, r["spec"]
        for d in [r["tilegen"], *r["kleidiai"].values()]:
            # a figure is marked assumed exactly when the M4 table assumes its binding class
            assert d["assumed"] == M4_UNITS[d["binding_class"]].assumed
            assert d["binding"] == d["binding_class"] or d["binding"].startswith(
                f"chain {d['binding_class']} on ")
        for v, q in r["vs_kleidiai"].items():
            assert q["assumed"] == (r["tilegen"]["assumed"] or r["kleidiai"][v]["assumed"])
