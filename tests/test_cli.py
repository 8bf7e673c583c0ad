"""The `tilegen` command line: tile syntax, the error convention, help texts, pipes."""
from __future__ import annotations

import pytest

import tilegen
from tilegen import SpecError, parse_spec
from tilegen.cli import main
from tilegen.generator import allocate, render


@pytest.mark.parametrize("tile,spec", [
    ("6x16", ("f32", "neon", "6x16")), ("4x4vl", ("f32", "sve", "4x4vl")),
    ("5x3vl", ("f32", "sve", "5x3vl")), ("1vlx4vl", ("f32", "sme", "1vlx4vl"))])
def test_generate_tile_in_vl_units(tile, spec, tmp_path, capsys):
    family, isa, _ = spec
    assert main(["generate", "--family", family, "--isa", isa, "--tile", tile,
                 "-o", str(tmp_path)]) == 0
    name = capsys.readouterr().out.strip()
    assert name == parse_spec(":".join(spec)).name
    assert (tmp_path / f"{name}.S").read_text() == tilegen.generate(":".join(spec))


def test_parse_tile_is_the_spec_grammar():
    from tilegen.generator.spec import parse_tile
    assert parse_tile("4x4vl") == (4, False, 4, True)
    assert parse_tile("1vlx2vl") == (1, True, 2, True)
    for bad in ("4X16", "4x", "x4", "4vx4", "4x4vlx", " 4x4"):
        with pytest.raises(SpecError, match="MRxNR"):
            parse_tile(bad)


def test_entry_points_accept_spec_strings():
    s = parse_spec("f32:neon:6x16")
    assert tilegen.generate("f32:neon:6x16") == tilegen.generate(s)
    assert render("f32:sve:4x4vl", "macho").text == render(parse_spec("f32:sve:4x4vl"), "macho").text
    assert allocate("f32:neon:6x16") == allocate(s)
    with pytest.raises(SpecError, match="cannot parse kernel spec"):
        tilegen.generate("f32-neon-6x16")
    with pytest.raises(SpecError, match="KernelSpec or a spec string"):
        tilegen.generate(6)
