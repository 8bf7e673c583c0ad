"""The llama.cpp patch (``llama-kquants.patch``), generated from the export's kernel entries.

llama.cpp's KleidiAI backend (ggml/src/ggml-cpu/kleidiai/) has no K-quant path; the patch adds
one the way Q8_0 is there: a table of (gemm, gemv) entries in ``kernels.cpp``, and the type
checks, repack, LHS packing and GET_ROWS of ``kleidiai.cpp`` extended to the patch's weight
types (docs/llama_cpp_check.md#k-quants-llama-kquantspatch).  The text is Jinja templates under
``templates/export/llama/``: the fixed hunks as template text (the type lists rendered from
:data:`LLAMA_FAMILIES`), the table rendered per :class:`LlamaEntry` (``entry.cpp.j2``).  This
module computes what the templates cannot: each hunk header's counts and new start (from the
rendered lines; the templates give the old start and git's function context) and the ``index``
line of each file.

The entries come from :mod:`tilegen.export.kleidiai` (``kquant_entries``: the tiles the
preset picks, ``--tuned`` included) through its one converter ``llama_entry``, which renders
each kernel's descriptor (:func:`tilegen.generator.descriptor.descriptor`); this module only
renders them.
"""
from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from ..families import FAMILIES, GGML_BLOCKS, LLAMA_KERNELS
from ..generator.render import render_template

__all__ = ["PATCH_NAME", "LLAMA_FAMILIES", "LLAMA_ISAS", "LlamaFamily", "LlamaKernel",
           "LlamaEntry", "patch_text", "hunk_headers", "PatchError"]

#: the file name of the patch (at the root of every export tree; scripts/llama_cpp_check.py
#: applies the tree's copy)
PATCH_NAME = "llama-kquants.patch"


class PatchError(ValueError):
    """The entries cannot be written as a patch (the message names the entry)."""


@dataclass(frozen=True)
class LlamaFamily:
    """A tilegen weight family llama.cpp's backend gets through the patch: its ggml type
    (``GGML_TYPE_<ggml>``), the ggml block struct, the context field that holds its primary
    entry."""

    name: str                   # tilegen family, e.g. "q4_K" (also the start-up log's name)
    ggml: str                   # ggml type suffix, e.g. "Q4_K"
    block_len: int              # k values of its ggml block (QK_K = 256, IQ4_NL's 32)
    kernel_bl: bool             # its kernels take the block length (KleidiAI's q4_0 shape)

    @classmethod
    def of(cls, name: str) -> "LlamaFamily":
        """The mapping of family ``name`` from its record: the ggml type of its kind's blocks
        (tilegen.families.GGML_BLOCKS), and whether its kernels' convention has a ``bl``."""
        rec = FAMILIES[name]
        ggml, block_len = GGML_BLOCKS[rec.kinds[0]]
        return cls(name, ggml, block_len, any(p.role == "bl" for p in rec.abi.params))

    @property
    def block(self) -> str:
        return f"block_{self.name}"

    @property
    def ctx(self) -> str:
        return f"kernels_{self.name.lower()}"


#: the families with a llama.cpp mapping (the plugins' LLAMA_KERNELS), in the table's order:
#: K-quants (QK_K super-blocks, kernels without bl, q8kp activations) and block-32 families
#: (IQ4_NL: q4_0's kernel shape with bl, qsi8d32p activations) alike; the fixed hunks take every
#: patched type (kleidiai_is_kquant) with its block length and block arguments from here.
LLAMA_FAMILIES: dict[str, LlamaFamily] = {name: LlamaFamily.of(name) for name in LLAMA_KERNELS}

#: the table's ISA slots, in its order (SME2 first, as llama.cpp's Q4_0 table): tilegen ISA ->
#: (label of the entry's comments, the ggml CPU features the entry requires).  No SVE slot: the
#: backend's CPU_FEATURE_SVE means a 256-bit vector length (docs/llama_cpp_check.md).
LLAMA_ISAS: dict[str, tuple[str, tuple[str, ...]]] = {
    "sme2": ("SME2", ("SME2",)),
    "i8mm": ("I8MM", ("I8MM", "DOTPROD")),
    "dotprod": ("DOTPROD", ("DOTPROD",)),
}


@dataclass(frozen=True)
class LlamaKernel:
    """What the table needs of one micro-kernel: its header (include path under the tree) and
    its functions (KleidiAI getter slot, e.g. ``get_m_step``, -> C function name; ``run``)."""

    name: str
    header: str
    getters: Mapping[str, str]
    run: str


@dataclass(frozen=True)
class LlamaEntry:
    """One entry of ``gemm_gemv_kernels_kquant[]``: a gemm and a gemv reading one packed RHS
    (packed at the gemm's nr/kr by ``rhs_packer``), each LHS by ``lhs_packer`` at its own mr/kr."""

    family: str                 # a key of LLAMA_FAMILIES
    isa: str                    # a key of LLAMA_ISAS
    gemm: LlamaKernel
    gemv: LlamaKernel
    lhs_packer: str             # packer names without "kai_"
    rhs_packer: str
    lhs_format: str             # the LHS layout format both kernels read (e.g. q8kp)

    @property
    def label(self) -> str:
        return LLAMA_ISAS[self.isa][0]

    @property
    def required_cpu(self) -> tuple[str, ...]:
        return LLAMA_ISAS[self.isa][1]

    @property
    def ggml_type(self) -> str:
        return LLAMA_FAMILIES[self.family].ggml

    @property
    def kernel_bl(self) -> bool:
        """The kernels and the LHS packer take bl (llama.cpp's q4_0 wrappers), else not."""
        return LLAMA_FAMILIES[self.family].kernel_bl


# the patched files, in the patch's order (templates/export/llama/<name>.diff.j2)
_FILES = ("kernels.cpp", "kernels.h", "kleidiai.cpp")

# git's blob ids of each file of llama-cpp-python 0.3.36's llama.cpp before the patch, and
# after it for the one rendering of the file whose sha256 is the key (the default tile set:
# tests/data/llama-kquants.patch; tests/test_export_kleidiai.py recomputes them from the
# vendored tree).  A file rendered otherwise (another tile set, another family) gets no index
# line: its patched blob id is not known here, and patch(1) / git apply do not need it, so a new
# family adds nothing to this table.
_BLOB_IDS: dict[str, tuple[str, dict[str, str]]] = {
    "kernels.cpp": ("d455129", {
        "8f308e441c131ccaf817eb78e283e210609ed1bb731c69e7e81f06e5546d9d1a": "8a794c8"}),
    "kernels.h": ("1da8610", {
        "dc49c0e783c68225fd5e7ab5c63e51996eba6715999c4881efc7772fa4bfdae6": "f4d9692"}),
    "kleidiai.cpp": ("dbd1987", {
        "a14d13f0015c3453a8a4c37e7f96125ee05b13c3ad7fc68db9e1e73aafa0d688": "cde5bb1"}),
}

_HUNK = re.compile(r"^@@ -(\d+) @@(.*)$")


def hunk_headers(text: str) -> str:
    """``text`` (one file's diff, its hunks headed ``@@ -<old start> @@<context>``) with every
    header written out: ``@@ -a,b +c,d @@<context>``, b and d counted from the hunk's lines
    (' ' and '-' / ' ' and '+'), c shifted by the lines the earlier hunks add.  A hunk runs to
    the next header or the end; any other line in it is a template error."""
    lines = text.split("\n")
    end = lines.pop() if lines and lines[-1] == "" else None
    out: list[str] = []
    shift = 0
    hunk: list[str] | None = None        # [header match, body lines...] of the open hunk

    def close():
        nonlocal shift
        if hunk is None:
            return
        m, body = hunk[0], hunk[1:]
        old = sum(1 for l in body if l[:1] in (" ", "-"))
        new = sum(1 for l in body if l[:1] in (" ", "+"))
        start = int(m[1])
        out.append(f"@@ -{_range(start, old)} +{_range(start + shift, new)} @@{m[2]}")
        out.extend(body)
        shift += new - old

    for line in lines:
        m = _HUNK.match(line)
        if m:
            close()
            hunk = [m]
        elif line.startswith("@@"):
            raise PatchError(f"malformed hunk header in the template: {line!r}")
        elif hunk is None:
            out.append(line)
        elif line[:1] in (" ", "+", "-"):
            hunk.append(line)
        else:
            raise PatchError(f"not a diff line in a hunk of the template: {line!r}")
    close()
    return "\n".join(out + ([end] if end is not None else []))


def _range(start: int, count: int) -> str:
    return str(start) if count == 1 else f"{start},{count}"


def _join_types(types: Sequence[str]) -> str:
    return ", ".join(types[:-1]) + " and " + types[-1] if len(types) > 1 else types[0]


def _with_index(name: str, text: str) -> str:
    """The file's diff with git's index line after its ``diff --git`` line, when known."""
    pre, post = _BLOB_IDS[name]
    head, rest = text.split("\n", 1)
    known = post.get(hashlib.sha256(rest.encode()).hexdigest())
    return f"{head}\nindex {pre}..{known} 100644\n{rest}" if known else text


def patch_text(entries: Sequence[LlamaEntry]) -> str:
    """The patch: every file's hunks rendered from ``entries`` (in table order), hunk headers
    and index lines computed."""
    if not entries:
        raise PatchError("no kernel entries: the patch needs at least one")
    seen: set[tuple[str, str]] = set()
    for e in entries:
        if e.family not in LLAMA_FAMILIES or e.isa not in LLAMA_ISAS:
            raise PatchError(f"{e.gemm.name}: no llama.cpp mapping for {e.family} on {e.isa}")
        if (e.family, e.isa) in seen:
            raise PatchError(f"{e.gemm.name}: a second {e.family} {e.isa} entry")
        seen.add((e.family, e.isa))
    families = [LLAMA_FAMILIES[f] for f in dict.fromkeys(e.family for e in entries)]
    packers = list(dict.fromkeys([e.lhs_packer for e in entries] + [e.rhs_packer for e in entries]))
    lhs_formats = list(dict.fromkeys(e.lhs_format for e in entries))
    context = dict(entries=list(entries), families=families, packers=packers,
                   lhs_formats=lhs_formats,
                   types_text=_join_types(["Q4_0", "Q8_0"] + [f.ggml for f in families]))
    parts = []
    for name in _FILES:
        text = render_template(f"export/llama/{name}.diff.j2", **context)
        parts.append(_with_index(name, hunk_headers(text)))
    return "".join(parts)
