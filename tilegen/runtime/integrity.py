"""Checks a library directory passes before anything of it is mapped or called.

:func:`check_image`: the shared object's headers describe ranges inside the file (a truncated
or corrupt file is a LoadError, not a SIGBUS/SIGSEGV inside the dynamic loader).
:func:`check_entries`: every manifest entry equals the entry its spec string derives
(:mod:`tilegen.generator.manifest`); each spec string is parsed once, here, and what it
derives (the kernels' descriptors, the packers' specs) is what the library binds.  Nothing
here allocates registers or renders code: a spec is parsed unchecked and described
(:func:`tilegen.generator.descriptor.descriptor`, which checks the records' preconditions and
the layouts' rules); the library's digest covers the rest.
"""
from __future__ import annotations

import struct

from ..generator.descriptor import KernelDescriptor, descriptor
from ..generator.manifest import KERNEL_FREE_FIELDS, kernel_entry, packer_entry, parse_packer_spec
from ..generator.packers import PackerSpec
from ..generator.render import symbol_for
from ..generator.spec import parse_unchecked
from ..records import SpecError
from .errors import LoadError

__all__ = ["check_image", "check_entries"]

_EM_AARCH64, _ET_DYN, _SHT_NOBITS, _PT_LOAD = 183, 3, 8, 1
_MH_MAGIC_64, _CPU_TYPE_ARM64, _MH_DYLIB = 0xFEEDFACF, 0x0100000C, 6
_LC_SEGMENT_64, _LC_SYMTAB = 0x19, 0x2


def check_image(blob: bytes, fmt: str, name: str) -> None:
    """LoadError unless ``blob`` is a structurally sound aarch64 shared object of ``fmt``
    ("elf" or "macho") whose headers, segments and sections lie within the file."""
    if fmt == "elf":
        _check_elf(blob, name)
    elif fmt == "macho":
        _check_macho(blob, name)
    else:
        raise LoadError(f"{name}: unknown library format {fmt!r} in the manifest (elf or macho)")


def _within(blob: bytes, name: str, what: str, off: int, size: int) -> None:
    if off + size > len(blob):
        raise LoadError(f"{name} is truncated or corrupt: {what} ends at byte {off + size}, the "
                     f"file has {len(blob)} bytes (rebuild it)")


def _check_elf(blob: bytes, name: str) -> None:
    if blob[:4] != b"\x7fELF":
        raise LoadError(f"{name} is not an ELF file (manifest format elf)")
    _within(blob, name, "the ELF header", 0, 64)
    if blob[4] != 2 or blob[5] != 1:
        raise LoadError(f"{name} is not a 64-bit little-endian ELF file")
    e_type, e_machine = struct.unpack_from("<HH", blob, 16)
    if e_machine != _EM_AARCH64 or e_type != _ET_DYN:
        raise LoadError(f"{name} is not an aarch64 shared object (e_type {e_type}, "
                     f"e_machine {e_machine})")
    e_phoff, e_shoff = struct.unpack_from("<QQ", blob, 32)
    _, e_phentsize, e_phnum, e_shentsize, e_shnum, _ = struct.unpack_from("<6H", blob, 52)
    if e_phnum == 0 or e_phentsize != 56:
        raise LoadError(f"{name} is corrupt: {e_phnum} program headers of {e_phentsize} bytes")
    _within(blob, name, "the program header table", e_phoff, e_phnum * 56)
    for i in range(e_phnum):
        p_type, _, p_offset, _, _, p_filesz, p_memsz, _ = struct.unpack_from(
            "<IIQQQQQQ", blob, e_phoff + 56 * i)
        _within(blob, name, f"segment {i}", p_offset, p_filesz)
        if p_type == _PT_LOAD and p_filesz > p_memsz:
            raise LoadError(f"{name} is corrupt: loadable segment {i} has more file bytes "
                         f"({p_filesz}) than memory bytes ({p_memsz})")
    if e_shnum:
        if e_shentsize != 64:
            raise LoadError(f"{name} is corrupt: section headers of {e_shentsize} bytes")
        _within(blob, name, "the section header table", e_shoff, e_shnum * 64)
        for i in range(e_shnum):
            base = e_shoff + 64 * i
            sh_type, = struct.unpack_from("<I", blob, base + 4)
            sh_offset, sh_size = struct.unpack_from("<QQ", blob, base + 24)
            if sh_type != _SHT_NOBITS:
                _within(blob, name, f"section {i}", sh_offset, sh_size)


def _check_macho(blob: bytes, name: str) -> None:
    if len(blob) < 4 or struct.unpack_from("<I", blob, 0)[0] != _MH_MAGIC_64:
        raise LoadError(f"{name} is not a 64-bit Mach-O file (manifest format macho)")
    _within(blob, name, "the Mach-O header", 0, 32)
    _, cputype, _, filetype, ncmds, sizeofcmds, _, _ = struct.unpack_from("<8I", blob, 0)
    if cputype != _CPU_TYPE_ARM64 or filetype != _MH_DYLIB:
        raise LoadError(f"{name} is not an arm64 dylib (cputype {cputype:#x}, filetype {filetype})")
    _within(blob, name, "the load commands", 32, sizeofcmds)
    off, end = 32, 32 + sizeofcmds
    for i in range(ncmds):
        if off + 8 > end:
            raise LoadError(f"{name} is corrupt: load command {i} lies outside the load commands")
        cmd, cmdsize = struct.unpack_from("<II", blob, off)
        if cmdsize < 8 or off + cmdsize > end:
            raise LoadError(f"{name} is corrupt: load command {i} has size {cmdsize}")
        if cmd == _LC_SEGMENT_64 and cmdsize >= 72:
            fileoff, filesize = struct.unpack_from("<QQ", blob, off + 40)
            seg = blob[off + 8:off + 24].rstrip(b"\0").decode("ascii", "replace")
            _within(blob, name, f"segment {seg}", fileoff, filesize)
        elif cmd == _LC_SYMTAB and cmdsize >= 24:
            symoff, nsyms, stroff, strsize = struct.unpack_from("<4I", blob, off + 8)
            _within(blob, name, "the symbol table", symoff, 16 * nsyms)
            _within(blob, name, "the string table", stroff, strsize)
        off += cmdsize


def _diff(have, want, prefix: str = "") -> tuple[str, object, object] | None:
    """First field (dotted path) where ``have`` differs from ``want``."""
    if isinstance(have, dict) and isinstance(want, dict):
        for key in sorted(set(have) | set(want)):
            d = _diff(have.get(key, "<missing>"), want.get(key, "<missing>"), f"{prefix}{key}.")
            if d:
                return d
        return None
    if have != want or type(have) is not type(want):
        return prefix.rstrip("."), have, want
    return None


def _parse_kernel(text: str) -> KernelDescriptor:
    return descriptor(parse_unchecked(text))


def check_entries(kernels: list, packers: list, fmt: str,
                  name: str) -> tuple[list[KernelDescriptor], list[PackerSpec]]:
    """LoadError unless every entry equals what its spec string derives (for ``fmt``); else
    the kernels' descriptors and the packers' specs, in the manifest's order."""
    if not isinstance(kernels, list) or not isinstance(packers, list):
        raise LoadError(f"{name}: the manifest's kernels and packers must be lists")
    out: tuple[list, list] = ([], [])
    for what, entries, parsed in (("kernel", kernels, out[0]), ("packer", packers, out[1])):
        for e in entries:
            label = e.get("name", "?") if isinstance(e, dict) else repr(e)
            if not isinstance(e, dict) or not isinstance(e.get("spec"), str):
                raise LoadError(f"{name}: manifest {what} entry {label} has no spec string")
            try:
                got = _parse_kernel(e["spec"]) if what == "kernel" else parse_packer_spec(e["spec"])
            except SpecError as err:
                raise LoadError(f"{name}: manifest {what} {label} has a bad spec: {err}") from None
            sym = symbol_for(got.name, fmt)
            want = kernel_entry(got.spec, sym) if what == "kernel" else packer_entry(got, sym)
            have = e
            if what == "kernel":
                have = {k: v for k, v in e.items() if k not in KERNEL_FREE_FIELDS}
            d = _diff(have, want)
            if d:
                field, val, exp = d
                raise LoadError(f"{name}: manifest {what} {label} has {field}={val!r}, but its spec "
                             f"{e['spec']!r} gives {exp!r} (the manifest was edited; rebuild "
                             f"the library or use its manifest)")
            parsed.append(got)
    return out
