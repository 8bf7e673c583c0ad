"""One record per calling convention (tilegen.callconv): the manifest, the C header, the
export, the packers and the plan driver's C all take a routine's parameters from it."""
from __future__ import annotations

import re

import pytest

from tilegen.build import cheader, driver as build_driver
from tilegen.callconv import ABIS, PACKER_ABIS, Abi, Param
from tilegen.export.kleidiai import ABIS as KAI_ABIS
from tilegen.generator.manifest import kernel_entry, packer_entry
from tilegen.generator.packers import PackerSpec
from tilegen.generator.validate import parse_spec
from tilegen.families import FAMILIES, abi_for
from tilegen.runtime import driver as D


def test_every_family_has_a_convention_and_the_manifest_records_it():
    assert all(f.abi in ABIS.values() for f in FAMILIES.values())
    for text in ("f32:neon:6x16", "q4_0:dotprod:4x4", "q4_0_dx:i8mm:4x4", "q8_0:neon:4x4",
                 "bf16:bf16:8x4"):
        spec = parse_spec(text)
        abi = abi_for(spec.family)
        assert kernel_entry(spec, spec.name)["params"] == [
            {"name": p.name, "ctype": p.ctype} for p in abi.params]
        assert abi.prototype(spec.name) + ";" in cheader.header([spec], [])


def test_packers_take_their_convention():
    for fmt, abi in (("qsi8d32p", PACKER_ABIS["lhs_bl"]), ("qai8dxp", PACKER_ABIS["lhs_rows"])):
        p = PackerSpec(fmt, 4, 8, 2)
        assert p.abi is abi and p.signature == [(q.name, q.ctype) for q in abi.params]
        assert packer_entry(p, p.name)["params"][2]["name"] == ("bl" if abi.takes_bl else "mr")
        assert p.c_signature == abi.prototype(p.name)


def test_arguments_by_role():
    q4 = ABIS["q4"]
    vals = {r: r.upper() for r in q4.roles}
    assert q4.arguments(vals) == tuple(r.upper() for r in q4.roles)
    assert ABIS["bf16"].roles == ABIS["q8"].roles       # clamp_* and scalar_*: same roles
    assert ABIS["f32"].lhs_rows and not ABIS["q8"].lhs_rows
    assert ABIS["q4"].takes_bl and not ABIS["bf16"].takes_bl
    # every KleidiAI run function passes every argument of the tilegen kernel it calls
    for kai in KAI_ABIS.values():
        args = kai.tilegen_args.split(", ")
        assert len(args) == len(kai.calls.params)
        assert all(re.fullmatch(r"\w+|4 \* k", a) for a in args), kai.key


def test_driver_kinds_come_from_the_conventions():
    src = build_driver.source()
    assert D.KERNEL_KINDS == {"K_F32": 0, "K_Q4": 1, "K_Q8": 2}
    assert D.PACK_KINDS == {"P_NONE": 0, "P_QSI8D32P": 1, "P_ROWS": 2, "P_GIVEN": 3}
    for name, value in D.CONSTANTS.items():
        assert f"\n#define {name} {value}\n" in src
    for abi in [*ABIS.values(), *PACKER_ABIS.values()]:
        assert f"typedef void (*{abi.driver_fn})(" in src
        assert f"(({abi.driver_fn})p->" in src
    for line in src.splitlines():
        assert len(line) <= 100
    # two conventions of one kind must take the same arguments
    odd = Abi("odd", ABIS["q8"].params[:-1] + (Param("x", "float"),), "K_Q8", "q8_fn")
    with pytest.raises(ValueError, match="share driver kind K_Q8"):
        build_driver.driver_kinds([ABIS["q8"], odd])
