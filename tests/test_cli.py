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


@pytest.mark.parametrize("text", ["q4_K:sme2:4vlx1vl:i16", "q6_K:sme2:4vlx1vl:i16",
                                  "q4_0:i8mm:24x4:am", "q4_0:i8mm:4x4:k16:s2", "f32:sve:5x3vl"])
@pytest.mark.parametrize("fmt", ["elf", "macho"])
def test_generate_takes_a_build_spec(text, fmt, tmp_path, capsys):
    """generate takes the spec string build --kernel / analyze --kernel take, variants included
    (:i16, :am; the --family/--isa/--tile options cannot say them): the same name and text as
    tilegen.generate (was: 'the following arguments are required: --family, --isa, --tile')."""
    assert main(["generate", text, "--format", fmt, "-o", str(tmp_path)]) == 0, \
        capsys.readouterr().err
    name = capsys.readouterr().out.strip()
    assert name == parse_spec(text).name
    assert (tmp_path / f"{name}.S").read_text() == tilegen.generate(text, format=fmt)


@pytest.mark.parametrize("argv,needle", [
    (["generate", "q4_K:sme2:4vlx1vl:i16", "--isa", "neon"], "not both (got --isa)"),
    (["generate", "q4_K:sme2:4vlx1vl", "--kr", "8"], "not both (got --kr)"),
    (["generate", "--family", "f32"], "--isa, --tile required, or one SPEC as build --kernel"),
    (["generate"], "--family, --isa, --tile required"),
    (["generate", "q4_K:sme2:4vlx1vl:i17"], "cannot parse kernel spec 'q4_K:sme2:4vlx1vl:i17'"),
    (["generate", "q4_0:sme2:4vlx1vl:i16"], "i16"),
])
def test_generate_spec_errors_exit_2(argv, needle, tmp_path, capsys):
    """generate's SPEC and its parts exclude each other; without a SPEC the three parts are
    required (the message names the SPEC form); a bad SPEC is refused as build refuses it."""
    rc = main(argv + ["-o", str(tmp_path)])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith("tilegen generate: error: ") and needle in err, err
    assert "Traceback" not in err and not list(tmp_path.iterdir())


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
    assert allocate(parse_spec("f32:neon:6x16")) == allocate(s)
    with pytest.raises(SpecError, match="cannot parse kernel spec"):
        tilegen.generate("f32-neon-6x16")
    with pytest.raises(SpecError, match="KernelSpec or a spec string"):
        tilegen.generate(6)


def _fake_lib(d, fmt: str):
    """A library directory whose manifest names a (non-loadable) library of format ``fmt``."""
    import hashlib
    import json
    d.mkdir()
    (d / "libtilegen.dylib").write_bytes(b"not a library")
    (d / "manifest.json").write_text(json.dumps({
        "library": "libtilegen.dylib", "format": fmt, "kernels": [],
        "sha256": hashlib.sha256(b"not a library").hexdigest()}))
    return d


def _no_emulator(*a, **k):
    raise AssertionError("the emulator (or the tuner) must not start")


@pytest.mark.parametrize("argv,needle", [
    (["info", "--lib", "{tmp}/missing"], "no manifest.json"),
    (["check-abi", "{tmp}/missing"], "no manifest.json"),
    (["check-abi", "{tmp}/macho"], "--format elf"),
    (["check-abi", "{tmp}/elf", "--cpu", "nosuch"], "unknown cpu model 'nosuch'; valid models: "),
    (["build", "--kernel", "f32:neon:4x4", "-o", "{tmp}/file/out"], "file/out"),
    (["generate", "--family", "f32", "--isa", "neon", "--tile", "4X16"], "4X16"),
    (["build", "--isa", "", "-o", "{tmp}/o"], "--isa '' has an empty item: give a comma-separated "
                                               "list of ISAs from sme2, sme, sve2, "),
    (["build", "--isa", ",", "-o", "{tmp}/o"], "--isa ',' has an empty item"),
    (["build", "--isa", "neon,", "-o", "{tmp}/o"], "--isa 'neon,' has an empty item"),
    (["build", "--isa", " , neon", "-o", "{tmp}/o"], "empty item"),
    (["build", "--isa", "neon,nosuch", "-o", "{tmp}/o"], "unknown isa 'nosuch'; known: sme2, "),
    (["tune", "--target", "neoverse-v2"], "--family is required"),
    (["tune", "--target", "neoverse-v2", "--family", "f32", "--m", "0"], "--m must be >= 1"),
    (["tune", "--target", "neoverse-v2", "--family", "f32", "--top", "0"], "--top must be >= 1"),
    (["tune", "--target", "neoverse-v2", "--family", "f32", "--top", "-1"], "got -1"),
    (["tune", "--target", "neoverse-v2", "--family", "f32", "--jobs", "0"], "--jobs must be >= 1"),
    (["tune", "--target", "neoverse-v2", "--family", "f32", "--jobs", "-2"], "--jobs must be >= 1"),
])
def test_user_errors_exit_2(argv, needle, tmp_path, capsys, monkeypatch):
    import tilegen.build.library
    import tilegen.emulate.cli
    import tilegen.analysis.tune
    monkeypatch.setattr(tilegen.emulate.cli, "emulate_main", _no_emulator)
    monkeypatch.setattr(tilegen.analysis.tune, "tune", _no_emulator)     # refused before any work
    if "--isa" in argv:    # refused before the toolchain is looked for (was: build everything)
        monkeypatch.setattr(tilegen.build.library, "discover", _no_emulator)
    _fake_lib(tmp_path / "macho", "macho")
    _fake_lib(tmp_path / "elf", "elf")
    (tmp_path / "file").write_text("")
    rc = main([x.replace("{tmp}", str(tmp_path)) for x in argv])
    err = capsys.readouterr().err
    assert rc == 2, err
    assert err.startswith(f"tilegen {argv[0]}: error: ") and needle in err, err
    assert "Traceback" not in err


@pytest.mark.skipif(__import__("sys").platform == "darwin", reason="macOS loads Mach-O")
def test_macho_library_message_names_macos_and_elf(tmp_path):
    from tilegen.runtime.cpu import CpuInfo
    from tilegen.runtime import Library, LoadError
    with pytest.raises(LoadError) as e:   # an arm64 Linux CPU, as inside `tilegen emulate`
        Library(_fake_lib(tmp_path / "lib", "macho"), cpu=CpuInfo("aarch64", frozenset({"neon"})))
    msg = str(e.value)
    assert "Mach-O" in msg and "macOS" in msg and "--format elf" in msg
    assert "Run under" not in msg


@pytest.mark.parametrize("argv", [["list"], ["targets", "-v"]])
def test_closed_pipe_is_quiet(argv):
    import subprocess
    import sys
    p = subprocess.Popen([sys.executable, "-m", "tilegen", *argv], stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE)
    p.stdout.close()        # a reader that exits at once, like `| head -0`
    err = p.stderr.read().decode()
    p.wait()
    assert "Traceback" not in err and "BrokenPipe" not in err, err


def _walk(parser):
    import argparse
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            yield from ((f"{c.dest} command", c) for c in action._choices_actions)
            for name, sub in action.choices.items():
                yield from ((f"{name} {where}", act) for where, act in _walk(sub))
        else:
            yield action.dest, action


def test_every_option_has_help():
    from tilegen.cli import _parser
    from tilegen.emulate.cli import _parser as emulate_parser
    missing = [where for where, act in list(_walk(_parser())) + list(_walk(emulate_parser()))
               if not act.help]
    assert not missing


def test_emulate_errors_name_the_calling_command(capsys):
    from tilegen.emulate.cli import emulate_main
    assert emulate_main(["--cpu", "nosuch", "--", "true"], prog="tilegen check-abi") == 2
    assert capsys.readouterr().err.startswith("tilegen check-abi: error: unknown cpu model")
    assert emulate_main(["--cpu", "nosuch", "--", "true"]) == 2
    assert capsys.readouterr().err.startswith("tilegen emulate: error: unknown cpu model")


def test_emulate_usage_shows_the_command():
    from tilegen.emulate.cli import _parser as emulate_parser
    assert "-- CMD" in emulate_parser().format_usage()


@pytest.mark.parametrize("argv", [
    ["generate", "--family", "f32", "--isa", "neon", "--tile", "1000000000x16"],
    ["generate", "--family", "f32", "--isa", "neon", "--tile", "99999999999999999999x16"],
    ["generate", "--family", "f32", "--isa", "neon", "--tile", "10000000x16"],
    ["generate", "--family", "q4_0", "--isa", "i8mm", "--tile", "4000000x4"],
    ["generate", "--family", "f32", "--isa", "sme", "--tile", "99999vlx1vl"],
    ["generate", "--family", "q4_0", "--isa", "i8mm", "--tile", "4x4", "--kr", "99999999999999999999"],
    ["generate", "--family", "q8_0", "--isa", "i8mm", "--tile", "4x4", "--sr", "100000"],
    ["build", "--kernel", "q4_0:i8mm:4000000x4"],
    ["build", "--kernel", "f32:neon:1000000000x16"],
    ["build", "--kernel", "f32:sme:99999vlx1vl", "--kernel", "f32:neon:4x4"],
    ["build", "--kernel", "q8_0:neon:4x4:k99999999999999999999:s1"],
], ids=lambda a: " ".join(a[1:])[:50])
def test_huge_tiles_exit_2_at_once(argv, tmp_path, capsys):
    import time
    t = time.perf_counter()
    rc = main(argv + ["-o", str(tmp_path / "out")])
    dt = time.perf_counter() - t
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"tilegen {argv[0]}: error: ") and "out of range" in err, err
    assert dt < 1, dt
    assert not (tmp_path / "out").exists()


_GOOD = {"library": "libtilegen.so", "format": "elf", "kernels": [], "sha256": "0" * 64}


@pytest.mark.parametrize("manifest,needle", [
    ([1, 2], "must hold a JSON object (the fields library, sha256, kernels, ...; `tilegen build` "
             "writes it), got a JSON array"),
    ("libtilegen.so", "got a JSON string"),
    (None, "got a JSON null"),
    (3, "got a JSON number"),
    ({k: v for k, v in _GOOD.items() if k != "sha256"}, "lacks field 'sha256' (a string)"),
    (dict(_GOOD, library=["libtilegen.so"]), "field 'library' must be a string: a file name in "
                                             "that directory, got ["),
    (dict(_GOOD, library=""), "field 'library' must be a string: a file name"),
    (dict(_GOOD, library="."), "field 'library' must be a string: a file name"),
    (dict(_GOOD, library="../lib/libtilegen.so"), "got '../lib/libtilegen.so'"),
    (dict(_GOOD, sha256=5), "field 'sha256' must be a string, got 5"),
    (dict(_GOOD, kernels={"a": 1}), "field 'kernels' must be a list"),
    (dict(_GOOD, packers="none"), "field 'packers' must be a list"),
    (dict(_GOOD, format="pe"), """field 'format' must be "elf" or "macho", got 'pe'"""),
    (dict(_GOOD, format=["elf"]), "field 'format' must be"),
    (dict(_GOOD, abi_probe=7), "field 'abi_probe' must be a string or null"),
], ids=lambda x: None if isinstance(x, str) else repr(x)[:30])
def test_malformed_manifest_is_a_load_error(manifest, needle, tmp_path, capsys, monkeypatch):
    """A manifest that is not a JSON object, or whose fields have the wrong types: a LoadError
    naming the field and what it must be (Library, and the CLIs that read manifests), not
    TypeError/AttributeError from the lookups."""
    import json
    import tilegen.emulate.cli
    from tilegen.runtime import Library, LoadError
    from tilegen.runtime.cpu import CpuInfo
    monkeypatch.setattr(tilegen.emulate.cli, "emulate_main", _no_emulator)
    d = tmp_path / "lib"
    d.mkdir()
    (d / "libtilegen.so").write_bytes(b"\x7fELF")
    (d / "manifest.json").write_text(json.dumps(manifest))
    for cpu in (None, CpuInfo("aarch64", frozenset({"neon"}))):   # x86 host; arm64 Linux
        with pytest.raises(LoadError) as e:
            Library(d, cpu=cpu)
        assert needle in str(e.value) and "manifest.json" in str(e.value), e.value
    for argv in (["check-abi", str(d)], ["info", "--lib", str(d)]):
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"tilegen {argv[0]}: error: ") and needle in err, err
