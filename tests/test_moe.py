"""Mixture-of-experts from Python (issue #33 item 4): expert stacks (``lib.pack_weights`` of
(E, n, k) floats or (E, n, row bytes) ggml blocks) and ``lib.matmul_experts`` /
``lib.plan_experts`` (ggml's MUL_MAT_ID), run in the emulated guest (tests/guest_moe.py).

Each result is bit-identical to ``lib.matmul`` per expert on the rows gathered for it, for
1 and 3 threads and through the plan, and within the kernel family's bound of float64 on
the exact weights (``get_rows`` of the stack; the K-quants: ``reference.kquant.error_bound``);
every kind, on each qemu CPU model of the execution tests (and max with SME on), so each CPU's
pick of gemm and gemv kernel runs.  The id patterns give experts with no rows, one row (the
gemv), all rows, and x broadcast over slots."""
from __future__ import annotations

from pathlib import Path

import pytest

import tilegen
from tilegen.families import KIND_FAMILY

from tilegen.layout.api import layout_for, pack_rhs
from tilegen.runtime.errors import ArgumentError, LoadError
from tilegen.runtime.packed import PackedWeights

from conftest import EXEC_CPUS, SME_ON, guest

KINDS = tuple(KIND_FAMILY)
# the qemu models with BF16 (kind "bf16" is refused on the others: no bf16 kernel runs there)
BF16_CPUS = {"max"}
# (tokens, n_used, slots (None: x is (tokens, k)), ids pattern): decode (1 token: every group
# one row, the gemv), a prompt where one expert gets every token, one expert one token and
# some none, x broadcast over 2 slots of 4 picks, and more rows than an m_step
CASES = ((1, 2, None, "one"), (7, 2, None, "skewed"), (5, 4, 2, "random"),
         (19, 2, 1, "random"))


@pytest.fixture(scope="module")
def moe_lib(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("moelib")
    tilegen.build_library(None, target="linux-aarch64-all", out_dir=out)
    return out


CONFIGS = [(cpu, None) for cpu in EXEC_CPUS] + [("max", SME_ON)]


@pytest.mark.parametrize("cpu,env", CONFIGS, ids=[c + ("-sme" if e else "") for c, e in CONFIGS])
def test_matmul_experts_bit_identical_to_matmul_per_expert(moe_lib, cpu, env):
    kinds = tuple(k for k in KINDS if k != "bf16" or cpu in BF16_CPUS)
    r = guest(cpu, env=env).call("guest_moe:moe_vs_matmul", str(moe_lib), kinds, CASES)
    assert r["bad"] == [], r["bad"][:10]
    assert {kind for kind, _, _ in r["ran"]} == set(kinds)
    for kind in kinds:      # each kind ran one-row groups and groups of several rows
        names = {(gemv, name) for kd, gemv, name in r["ran"] if kd == kind}
        assert any(g for g, _ in names) and any(not g for g, _ in names), (kind, names)
    # one-row groups ran gemv kernels (m = 1 tiles; SME's bf16 pair has none: its gemm)
    assert any("_1x" in name for _, g, name in r["ran"] if g), r["ran"]
    for want in (("one", "none"), ("one", "one"), ("skewed", "all"), ("skewed", "one"),
                 ("skewed", "none"), ("random", "some")):
        assert tuple(want) in {tuple(s) for s in r["seen"]}, (want, r["seen"])
    if env is not None:
        assert any("sme" in name for _, _, name in r["ran"]), r["ran"]
    assert set(r["worst"]) == set(kinds) and all(v <= 1 for v in r["worst"].values())
    assert r["pool"] >= 2, r["pool"]      # threads=3 ran tasks on the library's worker pool


def test_expert_stacks_save_load_get_rows_adopt(moe_lib):
    r = guest("max").call("guest_moe:moe_stack_io", str(moe_lib), KINDS)
    assert r["bad"] == [], r["bad"]
    for kind, (E, stride, nbytes) in r["facts"].items():
        assert E == 3 and stride % 64 == 0 and nbytes == 3 * stride, (kind, stride, nbytes)


def test_matmul_experts_errors(moe_lib):
    r = guest("neoverse-n1").call("guest_moe:moe_errors", str(moe_lib))
    expect = {
        "ids out of range": "ids out of range 0..3 (the stack has 4 experts): ids[0, 1] = 4",
        "ids negative": "ids[1, 0] = -1",
        "ids float": "ids must be an integer numpy array",
        "ids list": "ids must be an integer numpy array",
        "ids 1-D": "ids must have shape (3, n_used)",
        "ids tokens": "ids must have shape (3, n_used) (tokens, n_used), got (2, 2)",
        "ids duplicate": "token 1 picks expert 3 twice",
        "x float64": "x must be a float32 numpy array",
        "x wrong k": "x must have shape (tokens, k) or (tokens, slots, k) with k=64",
        "x 1-D": "x must have shape (tokens, k)",
        "x slots not dividing": "x has 3 slots, ids 2 picks per token",
        "weights shape": "weights must be a float32 numpy array of ids' shape (3, 2)",
        "weights float64": "weights must be a float32 numpy array",
        "experts one matrix": "experts must be an expert stack",
        "experts not packed": "experts must be an expert stack",
        "n_used above E": "n_used=5 picks per token, but the stack has only 4 experts",
        "matmul on a stack": "weights are an expert stack (4 experts): use lib.matmul_experts",
        "plan on a stack": "weights are an expert stack",
        "kernel on a stack": "expert stack (4 experts): pass one expert",
        "expert out of range": "expert must be an int in 0..3",
        "get_rows 1-D on a stack": "pairs, shape (r, 2)",
        "get_rows expert range": "expert index out of range 0..3",
        "get_rows row range": "row index out of range 0..8",
        "for_ops with a stack": "for_ops= does not take an expert stack",
        "bias shape": "the bias of 4 experts must have shape (4, n)",
        "empty stack": "an expert stack needs at least one expert",
        "ggml stack rows": "expert 0 of 4: Q8_0 data for n=9, k=64 must hold 612 bytes",
        "activations NaN": "q4_0 activations must be finite",
        "PackedLayouts of a stack": "is an expert stack (4 experts): PackedLayouts holds one",
        "plan x shape": "x has shape (2, 64); this plan takes (3, 64)",
        "plan ids shape": "ids must have shape (3, 2)",
        "plan duplicate": "token 0 picks expert 0 twice",
        "plan slots": "slots=3 must divide n_used=2",
        "plan n_used": "n_used=5 picks per token",
        "plan one matrix": "experts must be an expert stack",
        "plan tokens 0": "tokens must be a positive int",
        "plan after close": "is closed",
        "matmul_experts after close": "is closed",
    }
    assert set(r) == set(expect)
    for name, msg in expect.items():
        assert r[name].startswith("ArgumentError") and msg in r[name], (name, r[name])


def test_stack_files_on_the_host(tmp_path):
    """A stack's file keeps E and each expert's bytes; a header whose experts is not a positive
    int, or whose E does not match the data, is a LoadError; PackedWeights.stack refuses
    packings of different layouts or shapes."""
    import numpy as np
    rng = np.random.default_rng(3)
    lay = layout_for("f32p", nr=8, kr=1)
    w = rng.normal(size=(3, 10, 7)).astype(np.float32)
    parts = [PackedWeights(lay, 10, 7, pack_rhs("f32p", w[e], nr=8, kr=1)) for e in range(3)]
    st = PackedWeights.stack(parts)
    assert st.experts == 3 and st.expert_stride % 64 == 0 and st.nbytes == 3 * st.expert_stride
    st.save(tmp_path / "s.tgpw")
    back = PackedWeights.load(tmp_path / "s.tgpw")
    assert back.experts == 3
    for e in range(3):
        assert np.array_equal(back.expert(e).data, parts[e].data)
    for experts, msg in ((0, "experts must be a positive int, got 0"),
                         (4, f"{st.nbytes} bytes but f32p n=10 k=7 x 4 experts needs")):
        bad = PackedWeights(lay, 10, 7, st.data, False, "f32", experts)
        bad.save(tmp_path / "bad.tgpw")
        with pytest.raises(LoadError, match=msg):
            PackedWeights.load(tmp_path / "bad.tgpw")
    other = PackedWeights(layout_for("f32p", nr=4, kr=1), 10, 7,
                          pack_rhs("f32p", w[0], nr=4, kr=1))
    with pytest.raises(ArgumentError, match=r"expert 1 is f32 f32p4x1b \(kr=1, sr=1\) n=10 k=7, expert 0 f32 f32p8x1b"):
        PackedWeights.stack([parts[0], other])
    with pytest.raises(ArgumentError, match="an expert stack needs at least one expert"):
        PackedWeights.stack([])
    with pytest.raises(ArgumentError, match="expert 0 must be PackedWeights of one matrix"):
        PackedWeights.stack([st])


# --------------------------------------------------------------------------------------------
# tilegen.gguf.load_tensor of 3-D expert tensors (ffn_*_exps: k x n x E) as expert stacks

def _expert_files(tmp_path):
    """[(path, {3-D expert tensor name: its ggml type name})]: the synthetic MoE model
    (tilegen.gguf.synth, MOE_CONFIG) in each of its weight types, and a file with one 3-D
    tensor of every other ggml type the families read (random valid blocks; F32 floats)."""
    import gguf
    import numpy as np
    from tilegen.families import GGML_TYPES, rhs_layout_class
    from tilegen.gguf import synth
    out = []
    for wtype in synth.TYPES:
        path = synth.write_gguf(tmp_path / f"moe-{wtype}.gguf", wtype, synth.MOE_CONFIG)
        r = gguf.GGUFReader(str(path))
        exps = {t.name: t.tensor_type.name for t in r.tensors if "_exps" in t.name}
        assert len(exps) == 3 * synth.MOE_CONFIG.n_layer, exps
        assert {ty for ty in exps.values()} == {wtype.upper()}
        out.append((path, exps))
    done = {wtype.upper() for wtype in synth.TYPES}
    T = gguf.GGMLQuantizationType
    rng = np.random.default_rng(5)
    E, n, k = 3, 13, 512
    wr = gguf.GGUFWriter(str(tmp_path / "exps.gguf"), "llama")
    others = {}
    for ty, kind in GGML_TYPES.items():
        if ty in done:
            continue
        name = f"blk.0.ffn_up_exps.{ty.lower()}"
        if ty == "F32":
            wr.add_tensor(name, rng.normal(size=(E, n, k)).astype(np.float32))
        else:
            from tilegen.families import KIND_FAMILY
            lay = rhs_layout_class(KIND_FAMILY[kind])
            raw = np.stack([lay.random_ggml(n, k, int(rng.integers(1 << 30))).reshape(n, -1)
                            for _ in range(E)])
            wr.add_tensor(name, raw, raw_dtype=T[ty])
        others[name] = ty
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    assert set(others.values()) | done == set(GGML_TYPES)
    out.append((tmp_path / "exps.gguf", others))
    return out


def _slices_file(path, name, out):
    """Each expert slice of 3-D tensor ``name`` of ``path`` written as a 2-D tensor of its
    type into the GGUF file ``out`` (names e0, e1, ...); returns E."""
    import gguf
    import numpy as np
    t = next(t for t in gguf.GGUFReader(str(path)).tensors if t.name == name)
    k, n, E = (int(d) for d in t.shape)
    data = np.asarray(t.data)
    wr = gguf.GGUFWriter(str(out), "llama")
    for e in range(E):
        if t.tensor_type.name in ("F32", "F16"):
            wr.add_tensor(f"e{e}", np.ascontiguousarray(data.reshape(E, n, k)[e]))
        else:
            wr.add_tensor(f"e{e}", np.ascontiguousarray(data.view(np.uint8).reshape(E, n, -1)[e]),
                          raw_dtype=t.tensor_type)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return E


@pytest.fixture(scope="module")
def expert_files(tmp_path_factory):
    """[(path, slices path, {name: ggml type}, {name: E})]: _expert_files, each expert
    tensor's slices in a second file (the 2-D path the stack must equal)."""
    base = tmp_path_factory.mktemp("exps")
    out = []
    for path, names in _expert_files(base):
        for i, name in enumerate(names):
            sl = base / f"{path.stem}-{i}.gguf"
            out.append((str(path), str(sl), name, names[name], _slices_file(path, name, sl)))
    return out


def test_load_tensor_reads_expert_tensors_as_stacks(expert_files):
    """load_tensor of a 3-D expert tensor (the synthetic MoE model's ffn_*_exps in Q4_0, Q8_0
    and F16; one of every other ggml type of the families) is an expert stack whose every
    expert is, byte for byte, load_tensor of that expert's 2-D slice (llama.cpp's default
    layouts, no library); a 1-D tensor is refused, naming what is supported."""
    import numpy as np
    from tilegen.families import GGML_TYPES
    from tilegen.gguf import load_tensor
    seen = set()
    for path, sl, name, ty, E in expert_files:
        st = load_tensor(path, name)
        parts = [load_tensor(sl, f"e{e}") for e in range(E)]
        assert (st.experts, st.kind, st.n, st.k, st.layout) == (
            E, GGML_TYPES[ty], parts[0].n, parts[0].k, parts[0].layout), (name, ty)
        for e in range(E):
            assert np.array_equal(st.expert(e).data, parts[e].data), (name, ty, e)
        assert np.array_equal(st.data, PackedWeights.stack(parts).data), (name, ty)
        p8 = load_tensor(path, name, nr=8)
        assert p8.nr == 8 and np.array_equal(p8.expert(E - 1).data, load_tensor(sl, f"e{E - 1}", nr=8).data)
        seen.add(ty)
    assert seen == set(GGML_TYPES)
    with pytest.raises(ArgumentError, match=r"tensor 'blk.0.attn_norm.weight' has shape \[\d+\]; only "
                                            r"2-D weights and 3-D expert tensors"):
        load_tensor(expert_files[0][0], "blk.0.attn_norm.weight")


def test_load_tensor_expert_stacks_with_a_library(moe_lib, expert_files):
    """load_tensor(lib=) of every expert tensor of expert_files (in the guest, max with SME on:
    the library's preferred layouts) equals lib.pack_weights of each expert's 2-D slice
    (load_tensor(lib=) of the slices), byte for byte, and lib.matmul_experts on it equals
    lib.matmul per expert on the slices."""
    r = guest("max", env=SME_ON).call("guest_moe:load_stacks", str(moe_lib),
                                      [(p, sl, name, E) for p, sl, name, _, E in expert_files])
    assert r["bad"] == [], r["bad"]
    assert r["checked"] == len(expert_files)
