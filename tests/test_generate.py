import re
import shutil
import subprocess
from pathlib import Path

import pytest

import tilegen
from tilegen import KernelSpec
from tilegen.generator import allocate, render, validate

from conftest import F32_EXTRA_TILES, F32_TILES

CLANG = shutil.which("clang-19") or shutil.which("clang")
TILES = F32_TILES + F32_EXTRA_TILES


def _spec(tile):
    mr, nr = map(int, tile.split("x"))
    return validate(KernelSpec("f32", "neon", mr, nr))


@pytest.mark.parametrize("tile", TILES)
def test_elf_and_macho_directives(tile):
    s = _spec(tile)
    elf = tilegen.generate(s, "elf")
    macho = tilegen.generate(s, format="macho")
    assert f".globl {s.name}\n" in elf and f".type {s.name}, %function" in elf
    assert f".size {s.name}, .-{s.name}" in elf
    assert f".globl _{s.name}\n" in macho and f"\n_{s.name}:" in macho
    assert ".type" not in macho and ".size" not in macho and ".note.GNU-stack" not in macho
    assert "    .arch armv8-a" in elf


def test_deterministic_render():
    s = _spec("6x16")
    assert tilegen.generate(s) == tilegen.generate(KernelSpec("f32", "neon", 6, 16))


@pytest.mark.parametrize("fmt,triple", [("elf", "aarch64-linux-gnu"), ("macho", "arm64-apple-macos")])
def test_every_tile_assembles(tmp_path, fmt, triple):
    assert CLANG, "needs clang (scripts/setup.sh installs clang-19)"
    for tile in TILES:
        s = _spec(tile)
        src = tmp_path / f"{s.name}.{fmt}.S"
        src.write_text(tilegen.generate(s, fmt))
        p = subprocess.run([CLANG, f"--target={triple}", "-c", str(src), "-o", str(src) + ".o"],
                           capture_output=True, text=True)
        assert p.returncode == 0, p.stderr


_REG = re.compile(r"\b([xwvqdsb])(\d+)\b")


@pytest.mark.parametrize("tile", TILES)
def test_aapcs64_callee_saved_registers_are_saved(tile):
    """Every callee-saved register the body touches is stored in the prologue and restored
    in the epilogue; the frame keeps sp 16-byte aligned."""
    s = _spec(tile)
    regs = allocate(s)
    text = render(s).text
    body = text.split(":\n", 1)[1]
    touched_x, touched_v = set(), set()
    for kind, num in _REG.findall(body):
        n = int(num)
        if kind in "xw" and 19 <= n <= 28:
            touched_x.add(n)
        if kind in "vqdsb" and 8 <= n <= 15:
            touched_v.add(n)
    assert touched_x == set(regs.saved_x)
    assert touched_v == set(regs.saved_d)
    assert regs.frame_bytes % 16 == 0
    assert f"sub sp, sp, #{regs.frame_bytes}" in text and f"add sp, sp, #{regs.frame_bytes}" in text
    for r in regs.saved_x:
        assert re.search(rf"st[rp] [^\n]*\bx{r}\b[^\n]*\[sp", text) and \
            re.search(rf"ld[rp] [^\n]*\bx{r}\b[^\n]*\[sp", text)
    for r in regs.saved_d:
        assert re.search(rf"st[rp] [^\n]*\bd{r}\b[^\n]*\[sp", text) and \
            re.search(rf"ld[rp] [^\n]*\bd{r}\b[^\n]*\[sp", text)
    assert "x18" not in body and "x29" not in body and "x30" not in body


def test_hot_loop_is_marked():
    text = tilegen.generate(_spec("6x16"))
    assert "tilegen:hot-loop-begin" in text and "tilegen:hot-loop-end" in text
    loop = text.split("tilegen:hot-loop-begin")[1].split("tilegen:hot-loop-end")[0]
    assert loop.count("fmla") == 4 * 6 * 4


@pytest.mark.parametrize("text", ["f32:neon:6x16", "q4_0:dotprod:1x4", "q4_0:i8mm:8x4",
                                  "q4_0_dx:dotprod:1x8:k16:s2", "q4_0_dx:dotprod:16x4"])
def test_comments_never_swallow_instructions(text):
    """Template whitespace control must not join an instruction onto a comment line."""
    for line in tilegen.generate(tilegen.parse_spec(text)).splitlines():
        if "//" in line:
            assert line.strip().startswith("//"), line


@pytest.mark.parametrize("text", ["f32:sme:2vlx2vl", "f32:sme2:1vlx4vl", "f32:sme2:1x4vl",
                                  "q4_0:sme2:1x4vl", "q4_0:sme:1vlx2vl", "q4_0_dx:sme:1vlx1vl"])
def test_sme_kernels_keep_za_index_registers_free(text):
    """w8 (ZA-array vector select) and w12 (tile slice select) are the templates' own: the
    allocator must not give x8/x12 a role, and only SVE/SME code may run in streaming mode."""
    from tilegen.generator.regalloc import allocate
    import re
    spec = tilegen.parse_spec(text)
    regs = allocate(spec)
    assert not {8, 12} & set(regs.gpr.values()), regs.gpr
    asm = tilegen.generate(spec)
    body = asm[asm.index("smstart"):asm.index("smstop")]
    # no Advanced SIMD register operand (v0.4s, q3, d1, s2 ...) between smstart and smstop
    code = "\n".join(l.split("//")[0] for l in body.splitlines())
    assert not re.search(r"\b(v\d+\.\d+[bhsd]|[qdsh]\d+)\b", code), text


def _kquant_templates():
    """(template, skeleton) of every K-quant family's kernels (the families whose activations
    are q8kp): NEON and SVE kernels on kquant/neon and kquant/sve, the SME2 gemm and gemv on
    kquant/sme2_gemm and kquant/sme2_gemv."""
    from tilegen.families import FAMILIES
    out = set()
    for fam in FAMILIES.values():
        if fam.lhs != "q8kp":
            continue
        for isa, impl in fam.impls.items():
            strategy = "sme2_gemm" if isa == "sme2" else "sve" if isa.startswith("sve") else "neon"
            out.add((impl.template, strategy))
            if impl.gemv_template:
                out.add((impl.gemv_template, "sme2_gemv"))
    return sorted(out)


@pytest.mark.parametrize("template,strategy", _kquant_templates())
def test_kquant_templates_fill_in_one_skeleton_per_strategy(template, strategy):
    """A K-quant family's kernel template is its part of one skeleton per strategy
    (templates/kquant/): it extends that skeleton (or, a family built on another's kernels such
    as q5_K on q4_K's, that family's template of the same strategy, which extends it) and
    writes nothing outside its blocks and macros (text there would be dropped silently by
    Jinja2's inheritance)."""
    from jinja2 import nodes
    from tilegen.generator.render import template_env
    env = template_env()
    name, chain = f"{template}.S.j2", []
    while not name.startswith("kquant/"):
        tree = env.parse(env.loader.get_source(env, name)[0])
        ext = [n for n in tree.body if isinstance(n, nodes.Extends)]
        assert len(ext) == 1, (template, chain)
        stray = [n for n in tree.body if isinstance(n, nodes.Output)
                 and any(not isinstance(x, nodes.TemplateData) or x.data.strip() for x in n.nodes)]
        assert not stray, f"{name}: output outside a block: {stray[0]}"
        chain.append(name)
        name = ext[0].template.value
    assert name == f"kquant/{strategy}.S.j2" and len(chain) <= 2, (template, chain, name)
    assert len(_kquant_templates()) >= 8


NEON_HOOKS = {"lead", "guards", "decode_setup", "decode", "scale_widen", "min_cols", "min_rows",
              "min_unit", "min_apply", "planes", "decode_vector"}


@pytest.mark.parametrize("template", ["q4k_neon", "q6k_neon"])
def test_kquant_neon_family_templates_are_small_overrides(template):
    """The K-quant NEON skeleton holds the strategies (dot products, scales, passes, epilogue,
    stores); a family's NEON template re-defines only its override points (decode, scale
    widening, min term, planes, guards) and stays well under 100 lines."""
    from tilegen.generator.render import template_env
    env = template_env()
    src = env.loader.get_source(env, f"{template}.S.j2")[0]
    assert len(src.splitlines()) < 100, (template, len(src.splitlines()))
    blocks = set(env.get_template(f"{template}.S.j2").blocks)
    assert blocks <= NEON_HOOKS, blocks - NEON_HOOKS
    assert NEON_HOOKS <= set(env.get_template("kquant/neon.S.j2").blocks)


# --- the override points of q4_K's NEON / SVE templates (what a Q5_K-like family overrides) ---

TEST_TEMPLATES = Path(__file__).parent / "data" / "templates"


@__import__("functools").cache
def _grid():
    from tilegen.analysis.tune import grid_specs
    return sorted(grid_specs().items())


def _q4k_specs(sve: bool):
    """Every q4_K NEON (or SVE) kernel the tuner's grid accepts (tilegen.analysis.tune)."""
    out = [s for _, s in _grid()
           if s.family == "q4_K" and s.isa != "sme2" and s.isa.startswith("sve") == sve]
    assert len(out) >= 8, out
    return out


def _test_env():
    """The kernels' environment, its loader searching tests/data/templates first."""
    import jinja2
    from tilegen.generator.render import template_env
    env = template_env()
    return env.overlay(loader=jinja2.ChoiceLoader([jinja2.FileSystemLoader(str(TEST_TEMPLATES)),
                                                    env.loader]))


def _hot_loop(text):
    head, rest = text.split("tilegen:hot-loop-begin", 1)
    loop, tail = rest.split("tilegen:hot-loop-end", 1)
    return head, loop, tail


@pytest.mark.parametrize("sve", [False, True], ids=["neon", "sve"])
def test_q4k_override_points_with_parent_content_are_byte_identical(sve):
    """A child of q4k_neon / q4k_sve re-defining every override point (decode, decode_setup /
    planes) as {{ super() }} renders every accepted q4_K tile byte for byte as q4_K."""
    from tilegen.generator.render import template_context
    env = _test_env()
    points = {"decode", "decode_setup", "planes"} if sve else {"decode", "decode_setup"}
    assert points <= set(env.get_template(f"q4k_{'sve' if sve else 'neon'}.S.j2").blocks)
    child = env.get_template(f"kquant_super_{'sve' if sve else 'neon'}.S.j2")
    assert set(child.blocks) == points
    for spec in _q4k_specs(sve):
        assert child.render(**template_context(spec, "elf")) == render(spec, "elf").text, spec


def _one_per_mode(sve):
    out = {}
    for s in _q4k_specs(sve):
        out.setdefault(allocate(s).mode, s)
    return out


@pytest.mark.parametrize("sve", [False, True], ids=["neon", "sve"])
def test_q4k_decode_override_changes_only_the_hot_loop(sve):
    """Replacing the decode block by a marker instruction changes the hot loop only: the
    marker stands where each weight load + nibble unpack stood, every other line stays."""
    import difflib
    from tilegen.generator.render import template_context
    env = _test_env()
    child = env.get_template(f"kquant_marker_{'sve' if sve else 'neon'}.S.j2")
    modes = _one_per_mode(sve)
    assert set(modes) == ({"mm", "dot4", "dot8"} if sve else {"mm", "dot4", "dot8", "neon"})
    decode_ops = {"ld1b", "lsr", "and", "addvl"} if sve else {"ldr", "ldur", "add", "and", "ushr"}
    for mode, spec in modes.items():
        ctx = template_context(spec, "elf")
        base, marked = render(spec, "elf").text, child.render(**ctx)
        bh, bl, bt = _hot_loop(base)
        mh, ml, mt = _hot_loop(marked)
        assert (mh, mt) == (bh, bt), spec        # prologue, epilogue: unchanged
        old, new = bl.splitlines(), ml.splitlines()
        n_marks = sum("decode-marker" in line for line in new)
        assert n_marks >= 8, spec
        n_unpacks = 0
        for op, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new, autojunk=False).get_opcodes():
            if op == "equal":
                continue
            assert op == "replace", (spec, op, old[i1:i2], new[j1:j2])
            assert all("decode-marker" in line for line in new[j1:j2]), (spec, new[j1:j2])
            ops = [line.split()[0] for line in old[i1:i2] if line.strip()]
            assert set(ops) <= decode_ops, (spec, old[i1:i2])
            n_unpacks += ops.count("lsr" if sve else "ushr")
        assert n_unpacks == n_marks, (spec, mode)


class _With:
    """An object's attributes plus some (what a Q5_K allocator or layout would add)."""

    def __init__(self, base, **extra):
        self._base = base
        self.__dict__.update(extra)

    def __getattr__(self, name):
        return getattr(self._base, name)


Q5K_OVERRIDE_LINES = 40     # what a Q5_K-like decode costs per template (the file, comments included)


@pytest.mark.parametrize("sve", [False, True], ids=["neon", "sve"])
def test_q5k_like_override_is_small_and_assembles(tmp_path, sve):
    """A Q5_K-like template (q4_K plus a 5th bit from a high-bit plane) is a small override of
    q4_K's: it renders for one tile per strategy, its decode adds the plane's bit merge to
    every unpack (BIT / ORR) and nothing outside the decode setup, and clang assembles it.
    (Registers and the plane's offsets are stand-ins: no Q5_K allocator or layout exists.)"""
    from tilegen.generator.render import template_context
    assert CLANG, "needs clang (scripts/setup.sh installs clang-19)"
    name = f"q5k_like_{'sve' if sve else 'neon'}.S.j2"
    lines = (TEST_TEMPLATES / name).read_text().splitlines()
    assert len(lines) <= Q5K_OVERRIDE_LINES, len(lines)
    child = _test_env().get_template(name)
    for mode, spec in _one_per_mode(sve).items():
        ctx = template_context(spec, "elf")
        R, RHS = ctx["R"], ctx["RHS"]
        free = next(r for r in range(9, 29) if r not in R.gpr.values() and r != 18)
        ctx["R"] = _With(R, qh=29, qt=30, m10=31, gpr=dict(R.gpr, qh_ptr=free))
        if sve:
            ctx["RHS"] = _With(RHS, qh_offset=RHS.sb_record_bytes)
        else:
            per = RHS.subblocks * (RHS.sub_k // spec.kr)
            ctx["RHS"] = _With(RHS, qh_offset=lambda j, i, col: RHS.sb_record_bytes + (
                (j * (RHS.sub_k // spec.kr) + i) // 4) * RHS.chunk_bytes + col)
            assert per % 4 == 0
        text = child.render(**ctx)
        base = render(spec, "elf").text
        bh, bl, bt = _hot_loop(base)
        qh, ql, qt = _hot_loop(text)
        assert qt == bt, spec
        extra_head = set(qh.splitlines()) - set(bh.splitlines())
        assert extra_head == (set() if sve else {"    movi v31.16b, #0x10"}), (spec, extra_head)
        assert len(qh.splitlines()) == len(bh.splitlines()) + len(extra_head), spec
        merge = "bit v" if not sve else "orr z"
        n_unpack = bl.count("ushr v" if not sve else "lsr z")
        assert n_unpack >= 8 and ql.count(merge) == 2 * n_unpack, (spec, mode)
        src = tmp_path / f"{spec.name}.S"
        src.write_text(text)
        p = subprocess.run([CLANG, "--target=aarch64-linux-gnu", "-c", str(src), "-o", str(src) + ".o"],
                           capture_output=True, text=True)
        assert p.returncode == 0, (spec, p.stderr[:2000])


IQ4XS_SKETCH_LINES = 50     # an IQ4_XS-like family on the SVE skeleton (the file, comments included)


def test_iq4xs_like_family_on_the_sve_skeleton_assembles(tmp_path):
    """The SVE skeleton's hooks for an IQ4_XS-like family (kquant/sve.S.j2's header): block
    setup loads a 16-byte int8 table once per call into an extra Z register (LD1RQB: replicated
    per segment) from block data, the decode (weights) maps every nibble through it by TBL, the
    scale widening is signed (LD1SB), no min term.  One tile per strategy renders, keeps the
    table register untouched, and clang assembles it.  (Layout, registers and the table
    register are a q4_K tile's stand-ins: no IQ4_XS allocator or layout exists.)"""
    import re
    from tilegen.generator.render import template_context
    assert CLANG, "needs clang (scripts/setup.sh installs clang-19)"
    name = "iq4xs_like_sve.S.j2"
    assert len((TEST_TEMPLATES / name).read_text().splitlines()) <= IQ4XS_SKETCH_LINES
    child = _test_env().get_template(name)
    for mode, spec in _one_per_mode(True).items():
        ctx = template_context(spec, "elf")
        base = render(spec, "elf").text
        kv = max(set(range(32)) - {int(r) for r in re.findall(r"\bz(\d+)", base)})
        ctx["R"] = _With(ctx["R"], kv=kv)
        text = child.render(**ctx)
        head, loop, tail = _hot_loop(text)
        # the table: loaded once per call, before the row loop, from the 16 bytes after the code
        assert head.count(f"ld1rqb {{z{kv}.b}}") == 1, spec
        assert head.index(f"ld1rqb {{z{kv}.b}}") < head.index(".Lm_loop:"), spec
        assert re.search(r"\.Lkvalues:\n    \.byte (-?\d+, ){15}-?\d+\n", tail), spec
        # every use of the table register is TBL's table operand
        uses = [line for line in (head + loop + tail).splitlines() if f"z{kv}." in line]
        assert all(line.split()[0] == "tbl" and f"{{z{kv}.b}}" in line for line in uses[1:]), spec
        n_unpack = loop.count("lsr z")
        assert n_unpack >= 16 and loop.count("tbl z") == 2 * n_unpack, (spec, mode)
        # signed scale widening, no min term (no dmin FMLS, no bsum dot products, no mins)
        assert loop.count("ld1sb") >= 8 and not re.search(r"ld1b \{z\d+\.s\}", loop), spec
        assert "fmls" not in text and "min term" not in head + loop, spec
        # the same dot products as q4_K's kernel, less its min term's (per epilogue unit: 2
        # SMMLA, or 4 SDOT by lane)
        s1 = len(ctx["R"].s1) // (2 if mode == "dot8" else 1)
        dots = lambda t: t.count("smmla") + t.count("sdot")
        assert dots(loop) == dots(_hot_loop(base)[1]) - (2 if mode == "mm" else 4) * s1, spec
        src = tmp_path / f"{spec.name}.S"
        src.write_text(text)
        p = subprocess.run([CLANG, "--target=aarch64-linux-gnu", "-march=armv9-a+sve2+i8mm",
                            "-c", str(src), "-o", str(src) + ".o"], capture_output=True, text=True)
        assert p.returncode == 0, (spec, p.stderr[:2000])


IQ4XS_OVERRIDE_LINES = 40   # an IQ4_XS-like NEON template (TBL decode, signed scales, no min)


def _dests(loop: str) -> set[int]:
    """The V registers the loop's instructions write (first operand; not stores)."""
    out = set()
    for line in loop.splitlines():
        m = re.match(r"\s+([a-z0-9.]+)\s+[vqsd](\d+)\b", line)
        if m and not m.group(1).startswith("st"):
            out.add(int(m.group(2)))
    return out


def test_iq4xs_like_override_is_small_and_assembles(tmp_path):
    """An IQ4_XS-like template on the K-quant NEON skeleton (w = d*(ls-32)*kvalues[idx]):
    its allocator asks for a table register by name (extra_v), its decode is q4_K's nibbles
    then TBL into that register, its scale widening signed, its min term absent.  One tile
    per strategy renders, differs from q4_K's (same registers) only in those points, and clang
    assembles it."""
    from tilegen.generator.regalloc.kquant import allocate_kquant_neon
    from tilegen.generator.render import template_context
    assert CLANG, "needs clang (scripts/setup.sh installs clang-19)"
    name = "iq4xs_like_neon.S.j2"
    assert len((TEST_TEMPLATES / name).read_text().splitlines()) <= IQ4XS_OVERRIDE_LINES
    child = _test_env().get_template(name)
    assert {"decode", "decode_setup", "scale_widen", "min_cols", "min_rows", "min_unit",
            "min_apply"} == set(child.blocks)
    for mode, spec in _one_per_mode(False).items():
        ctx = template_context(spec, "elf")
        R = allocate_kquant_neon(spec, "q4_K", extra_v=(("table", 1),))
        tb = R.extra["table"][0]
        assert R.mode == mode and R.mr_reg <= ctx["R"].mr_reg, spec   # (a full tile: fewer rows a pass)
        # the table register is fresh: no other register of the record is it
        others = set(R.t_flat) | set(R.s1) | set(R.lhs) | set(R.rhs) | set(R.sst) | {R.mask}
        others |= {r for regs in R.ep.values() for r in regs} | {r for row in R.out for r in row}
        assert tb not in others, (spec, tb)
        ctx["R"] = R
        text = child.render(**ctx)
        bh, bl, bt = _hot_loop(_test_env().get_template("q4k_neon.S.j2").render(**ctx))
        qh, ql, qt = _hot_loop(text)
        n_unpack = bl.count("ushr v")
        assert n_unpack >= 8 and ql.count("ushr v") == n_unpack, spec
        assert ql.count(f"tbl v") == ql.count(f"{{v{tb}.16b}}") == 2 * n_unpack, spec
        assert tb not in _dests(ql) and f"ldr q{tb}," in qh, spec     # loaded once, read-only
        for u, s in (("usubl", "ssubl"), ("ushll", "sshll")):   # signed scale widening
            assert bl.count(u) >= 1 and ql.count(u) == 0 and ql.count(s) == bl.count(u), (spec, u)
        assert "fmls" in bl and "fmls" not in ql, spec           # no min term
        assert ql.count("fmla") == bl.count("fmla") and ql.count("ldr") < bl.count("ldr"), spec
        assert qt.replace("\n", "") and qt.count("str ") == bt.count("str "), spec
        src = tmp_path / f"{spec.name}.S"
        src.write_text(text)
        p = subprocess.run([CLANG, "--target=aarch64-linux-gnu", "-c", str(src), "-o", str(src) + ".o"],
                           capture_output=True, text=True)
        assert p.returncode == 0, (spec, p.stderr[:2000])


def test_kquant_neon_allocator_extra_registers_leave_q4k_unchanged():
    """allocate_kquant_neon without extras is q4_K's allocation; with extras, every other
    role keeps distinct registers and the extras are counted in the tile's budget."""
    from tilegen.generator.regalloc.kquant import allocate_kquant_neon
    for mode, spec in _one_per_mode(False).items():
        assert allocate_kquant_neon(spec, "q4_K") == allocate(spec), spec
        R = allocate_kquant_neon(spec, "q4_K", extra_v=(("table", 1), ("pair", 2)))
        got = [*R.extra["table"], *R.extra["pair"]]
        assert len(set(got)) == 3 and not set(got) & ({R.mask} | set(R.sst) | set(R.t_flat)), spec
        assert dict(R.needs.parts)["decode extras"] == 3, (spec, R.needs)
