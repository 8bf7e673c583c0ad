"""ggml's Q8_K activation bytes, as ggml's own code writes them on Arm, against numpy (issue #30
item 9): the int8 values, the scale d and the sums of every 256-value super-block.

    python bench/q8k_vs_ggml.py                    # build, run under qemu, print the table
    python bench/q8k_vs_ggml.py --json out.json    # the figures as JSON too

ggml: the three quantisers llama.cpp runs for Q4_K / Q6_K matmuls on Arm, compiled from the
llama.cpp sources of the llama-cpp-python sdist (``tilegen.emulate.provision.
ensure_llama_cpp_source``; never vendored) with clang-19 and the flags of
``scripts/llama_cpp_check.sh``'s builds (-O3, ggml-cpu at -march=armv8.2-a+dotprod+fp16), linked
statically with ``bench/q8k_vs_ggml_driver.c`` and run under qemu-user:

* ``quantize_row_q8_K`` (ggml-cpu/arch/arm/quants.c; it calls ggml-quants.c's
  ``quantize_row_q8_K_ref``): the Q8_K ``from_float`` of the CPU backend — the rows of a gemv,
  the rows past the last group of 4 in the repack's gemm, and the generic ``vec_dot_q6_K_q8_K``
  path of tensors ggml does not repack;
* ``ggml_quantize_mat_q8_K_4x4`` / ``_4x8`` (ggml-cpu/repack.cpp, the generic code: on Arm there
  is no NEON version): groups of 4 rows for the CPU_REPACK gemm kernels (block_q8_Kx4, the
  values interleaved 4 or 8 bytes at a time, the sums of 16 interleaved 4 at a time).

numpy: :func:`tilegen.reference.kquant.quantize_q8_k` (the model of ggml's arithmetic) must give
every byte; tilegen's q8kp (:meth:`tilegen.layout.kquant.Q8KP.quantize_rows`, which the
generated packers and the export's C packer match bit for bit in the tests) must give the same
values in its sign convention: ggml's (q, d) = s * (q8kp's q, d) with s = -sign(max), max the
super-block's first value of largest magnitude (q8kp keeps d >= 0; d * q and every kernel result
are the same), and the sums of 32 = s * (two ggml sums of 16).

Rows (seeded): ``normal`` (standard normal), ``heavy`` (Student t, 3 degrees of freedom),
``scaled`` (normal x 10^[-30, 30]), ``ties`` (multiples of 0.5, max |x| = 127: exact .5 ties),
and ``edges`` (tests/q8kp_edges.py's super-blocks: 1e-38, subnormal, zero, both sides of the
flush threshold, 1e-36).
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))           # this checkout's tilegen
sys.path.insert(0, str(HERE))                  # vs_ggml's helpers
sys.path.insert(0, str(HERE.parent / "tests"))  # the edge rows of the tests

from q8kp_edges import edge_rows  # noqa: E402
from tilegen.layout.kquant import Q8KP  # noqa: E402
from tilegen.reference.kquant import quantize_q8_k  # noqa: E402
from vs_ggml import GgmlError, _qemu, _run, ggml_tree  # noqa: E402
from vs_kleidiai import tool  # noqa: E402

DRIVER = HERE / "q8k_vs_ggml_driver.c"
ARCH = "-march=armv8.2-a+dotprod+fp16"           # the llama check's GGML_CPU_ARM_ARCH
FUNCS = ("quantize_row_q8_K", "ggml_quantize_mat_q8_K_4x4", "ggml_quantize_mat_q8_K_4x8")
Q8K_BYTES, Q8KX4_BYTES = 292, 1168
F = np.float32


def build(tmp: Path, tree: Path | None = None) -> Path:
    """The driver linked statically with ggml-quants.c, ggml-cpu/arch/arm/quants.c and
    ggml-cpu/repack.cpp, compiled as the llama check's builds compile them."""
    from tilegen.emulate.provision import ensure_cross_sysroot
    tree = tree or ggml_tree()
    src = tree / "ggml" / "src"
    target = ["--target=aarch64-linux-gnu", f"--sysroot={ensure_cross_sysroot(quiet=True)}"]
    inc = [f"-I{tree / 'ggml' / d}" for d in ("include", "src", "src/ggml-cpu")]
    common = [*target, "-O3", "-DNDEBUG", "-ffunction-sections", *inc]
    objs = []
    for path, cc, std, arch in (("ggml-quants.c", "clang-19", "gnu11", ()),
                                ("ggml-cpu/arch/arm/quants.c", "clang-19", "gnu11", (ARCH,)),
                                ("ggml-cpu/repack.cpp", "clang++-19", "gnu++17", (ARCH,))):
        if not (src / path).is_file():
            raise GgmlError(f"{src / path} is missing: is {tree} a llama.cpp tree?")
        obj = tmp / (path.replace("/", "_") + ".o")
        _run([tool(cc, cc.split("-")[0]), *common, f"-std={std}", *arch, "-c", str(src / path),
              "-o", str(obj)])
        objs.append(obj)
    exe = tmp / "q8k_vs_ggml_driver"
    _run([tool("clang++-19", "clang++"), *target, "-O2", "-fuse-ld=lld", "-static", "-x", "c",
          str(DRIVER), "-x", "none", *map(str, objs), "-Wl,--gc-sections", "-o", str(exe)])
    return exe


def run(exe: Path, x: np.ndarray, tmp: Path, cpu: str = "neoverse-n1") -> dict[str, tuple]:
    """{function: (q int8 (m, k), d f32 (m, S), bsums int16 (m, S, 16))} as ggml wrote them."""
    m, k = x.shape
    S = k // 256
    src, dst = tmp / "rows.f32", tmp / "q8k.bin"
    np.ascontiguousarray(x, dtype="<f4").tofile(src)
    p = subprocess.run([_qemu(), "-cpu", cpu, str(exe), str(m), str(k), str(src), str(dst)],
                       capture_output=True, text=True)
    if p.returncode:
        raise GgmlError(f"{exe.name} under qemu: {p.stderr.strip()[:400]}")
    raw = np.fromfile(dst, np.uint8)
    rows = raw[:m * S * Q8K_BYTES].reshape(m, S, Q8K_BYTES)
    out = {FUNCS[0]: (rows[..., 4:260].copy().view(np.int8).reshape(m, k),
                      rows[..., :4].copy().view("<f4")[..., 0],
                      rows[..., 260:].copy().view("<i2"))}
    mats = raw[m * S * Q8K_BYTES:].reshape(2, m // 4, S, Q8KX4_BYTES)
    for name, blocks, il in ((FUNCS[1], mats[0], 4), (FUNCS[2], mats[1], 8)):
        out[name] = unpack_q8_kx4(blocks, il)
    return out


def unpack_q8_kx4(blocks: np.ndarray, il: int) -> tuple:
    """uint8 (G, S, 1168) block_q8_Kx4 of G groups of 4 rows -> (q (4G, 256S), d (4G, S),
    bsums (4G, S, 16)): value j of a block is row (j % 4il) // il, position (j // 4il) * il +
    j % il (il: the interleave, 4 or 8); its sum of 16 is at ggml's index of j (repack.cpp's
    formula), which must name one (row, sub-block of 16) for all the j it collects."""
    G, S = blocks.shape[:2]
    j = np.arange(1024)
    row = (j % (4 * il)) // il
    pos = (j // (4 * il)) * il + j % il
    index = (((j & (4 * il - 1)) // il) << 2) + ((j >> 8) << 4) + ((j >> 6) & 3)
    where = {}
    for i, r, b in zip(index, row, pos // 16):
        if where.setdefault(int(i), (int(r), int(b))) != (int(r), int(b)):
            raise GgmlError(f"block_q8_Kx4 ({il}) sum index {i} holds two sub-blocks")
    assert sorted(where) == list(range(64))
    qs = blocks[..., 16:1040].view(np.int8)                         # (G, S, 1024)
    q = np.zeros((G, 4, S, 256), np.int8)
    q[:, row, :, pos] = qs.transpose(2, 0, 1)
    d = blocks[..., :16].copy().view("<f4").reshape(G, S, 4).transpose(0, 2, 1)
    bs = blocks[..., 1040:].copy().view("<i2")                      # (G, S, 64)
    bsums = np.zeros((G, 4, S, 16), np.int16)
    for i, (r, b) in where.items():
        bsums[:, r, :, b] = bs[..., i]
    return q.reshape(4 * G, S * 256), d.reshape(4 * G, S), bsums.reshape(4 * G, S, 16)


def workloads(seed: int = 9) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    m, k = 16, 1024
    scaled = rng.standard_normal((m, k)) * 10.0 ** rng.uniform(-30, 30, (m, k // 256)).repeat(256, 1)
    ties = (rng.integers(-254, 255, (m, k)) * 0.5)
    ties[:, ::256] = 127 * rng.choice([-1, 1], (m, k // 256))
    return {"normal": rng.standard_normal((m, k)).astype(F),
            "heavy": rng.standard_t(3, (m, k)).astype(F),
            "scaled": scaled.astype(F),
            "ties": ties.astype(F),
            "edges": edge_rows(rng, m, 2048)}


def compare(got: tuple, x: np.ndarray) -> dict:
    """Counts of differing values of ``got`` (q, d, bsums of 16) against quantize_q8_k (the
    model: every byte) and against Q8KP.quantize_rows in q8kp's sign convention."""
    m, k = x.shape
    S = k // 256
    q, d, bsums = got
    mq, md, mb = quantize_q8_k(x)
    tq, td, tb = Q8KP.quantize_rows(x)
    xb = x.reshape(m, S, 256)
    mx = np.take_along_axis(xb, np.abs(xb).argmax(axis=2)[..., None], axis=2)[..., 0]
    s = np.where(mx > 0, -1, 1)
    bits = lambda a: np.asarray(a, F).view(np.uint32)  # noqa: E731
    b32 = bsums.astype(np.int32).reshape(m, S, 8, 2).sum(axis=3)
    return {
        "values": q.size, "blocks": d.size,
        "model_q": int((q != mq).sum()), "model_d": int((bits(d) != bits(md)).sum()),
        "model_bsums": int((bsums != mb).sum()),
        "q8kp_q": int((q.reshape(m, S, 256) != (tq.reshape(m, S, 256) * s[..., None])).sum()),
        "q8kp_d": int((bits(d) != bits(td * s)).sum()),     # flushed: s * +0 = ggml's -+0
        "q8kp_bsums": int((b32 != tb * s[..., None]).sum()),
        "negative_d": int((d < 0).sum() + ((d == 0) & np.signbit(d)).sum()),
    }


def measure(tmp: Path, tree: Path | None = None) -> list[dict]:
    exe = build(tmp, tree)
    out = []
    for name, x in workloads().items():
        for func, got in run(exe, x, tmp).items():
            out.append({"rows": name, "function": func, **compare(got, x)})
    return out


def table(res: list[dict]) -> str:
    cols = ("model_q", "model_d", "model_bsums", "q8kp_q", "q8kp_d", "q8kp_bsums")
    lines = ["| rows | ggml function | values / blocks | " + " | ".join(cols) + " | d < 0 |",
             "|---|---|---|" + "---|" * len(cols) + "---|"]
    for r in res:
        lines.append(f"| {r['rows']} | `{r['function']}` | {r['values']} / {r['blocks']} | "
                     + " | ".join(str(r[c]) for c in cols) + f" | {r['negative_d']} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--json", type=Path, help="write the figures here too")
    ap.add_argument("--llama-src", type=Path, help="llama.cpp tree (default: the sdist's)")
    a = ap.parse_args(argv)
    with tempfile.TemporaryDirectory() as t:
        res = measure(Path(t), a.llama_src)
    print(table(res))
    print("\nmodel_*: values that differ from tilegen.reference.kquant.quantize_q8_k; q8kp_*: from "
          "Q8KP.quantize_rows times s = -sign(max) (sums of 32); d compared by its bits.")
    if a.json:
        a.json.write_text(json.dumps(res, indent=1) + "\n")
    return 0 if all(r[c] == 0 for r in res for c in r if c.startswith(("model_", "q8kp_"))) else 1


if __name__ == "__main__":
    sys.exit(main())
