"""Guest side of tests/test_moe.py: expert stacks and lib.matmul_experts / lib.plan_experts
(ggml's MUL_MAT_ID) inside the emulated aarch64 Python."""
from __future__ import annotations

import os
import tempfile

import numpy as np

import tilegen
from tilegen.families import KIND_FAMILY, KQUANT_FAMILIES, rhs_layout_class
from tilegen.layout.api import layout_for, pack_rhs
from tilegen.reference.kquant import error_bound
from tilegen.runtime.errors import ArgumentError, LoadError
from tilegen.runtime.packed import PackedWeights

from f64_bound import f64_bound

_LIBS: dict[str, object] = {}


def _lib(libdir: str):
    lib = _LIBS.get(libdir)
    if lib is None:
        lib = _LIBS[libdir] = tilegen.load(libdir)
    return lib


def _bits(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a).view(np.uint32)


def _same(a, b) -> bool:
    return a.shape == b.shape and np.array_equal(_bits(a), _bits(b))


# k per kind: K-quants two super-blocks, the ggml-block kinds three blocks of 32, the float
# kinds a k no tile divides
def _k(kind: str) -> int:
    lay = rhs_layout_class(KIND_FAMILY[kind])
    if lay.ggml_block is not None:
        return 2 * lay.ggml_block[1] if lay.ggml_only else 3 * lay.ggml_block[1]
    return 45


def _stack(lib, kind, E, n, k, rng, ggml: bool):
    """(stack, raw blocks or None): E random experts of ``kind``: ggml blocks (random valid
    ones for the ggml-only kinds, ggml's quantisation of normal floats else) or floats."""
    lay = rhs_layout_class(KIND_FAMILY[kind])
    if lay.ggml_only:
        raw = np.stack([lay.random_ggml(n, k, int(rng.integers(1 << 30))) for _ in range(E)])
        return lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k), raw
    w = rng.normal(size=(E, n, k)).astype(np.float32)
    if ggml and lay.ggml_block is not None:
        from tilegen.layout.ggml import quantize_q4_0, quantize_q8_0
        q = quantize_q4_0 if lay.ggml_block[0] == "Q4_0" else quantize_q8_0
        raw = np.stack([q(w[e]) for e in range(E)])
        return lib.pack_weights(kind=kind, from_ggml=raw, n=n, k=k), raw
    if kind == "f16":
        w = w.astype(np.float16)
    return lib.pack_weights(w, kind=kind), None


def _ids(case: str, T: int, U: int, E: int, rng) -> np.ndarray:
    """ids (T, U) int32, distinct per token.  "skewed": every token picks expert 0, one
    token expert E-1, the rest expert 1 (experts 2..E-2 get none); "one": expert E-1 gets one
    row; "random": U distinct random experts per token."""
    if case == "random":
        return np.stack([rng.permutation(E)[:U] for _ in range(T)]).astype(np.int32)
    ids = np.zeros((T, U), np.int32)
    for u in range(U):
        ids[:, u] = u
    ids[T // 2, U - 1] = E - 1
    if case == "skewed":
        ids = ids[:, ::-1].copy()       # expert 0 in the last slot
    return ids


def _f64_check(kind, kern, xg, yg, deq, raw_e, n) -> float:
    """yg within the kernel family's bound of float64 xg @ deq.T; returns the worst
    err / bound."""
    if KIND_FAMILY[kind] in KQUANT_FAMILIES:        # the K-quants' bound needs the blocks
        ref = xg.astype(np.float64) @ deq.astype(np.float64).T
        bound = error_bound(rhs_layout_class(KIND_FAMILY[kind]), xg, raw_e, n)
    else:
        ref, bound = f64_bound(kern.family, xg, deq)
    err = np.abs(yg.astype(np.float64) - ref)
    assert (err <= bound).all(), (kind, kern.name, float((err / bound).max()))
    return float((err / bound).max())


def moe_vs_matmul(libdir: str, kinds, cases, thread_counts=(1, 3), seed=0, E=5, n=37) -> dict:
    """Per kind and case (tokens, n_used, slots, ids pattern): matmul_experts (each thread
    count, with and without weights) and its plan against lib.matmul per expert on the
    gathered rows (bit for bit), and against float64 on the exact weights (get_rows of the
    stack); which kernels ran (per group size), which experts got none, one, all rows."""
    lib = _lib(libdir)
    rng = np.random.default_rng(seed)
    bad, ran, worst, seen = [], set(), {}, set()
    for kind in kinds:
        k = _k(kind)
        for ci, (T, U, S, pattern) in enumerate(cases):
            st, raw = _stack(lib, kind, E, n, k, rng, ggml=ci % 2 == 1)
            x = rng.normal(size=(T, k) if S is None else (T, S, k)).astype(np.float32)
            ids = _ids(pattern, T, U, E, rng)
            xr = x if S is None else x[np.arange(T)[:, None], np.arange(U)[None, :] % S]
            xr = xr.reshape(T, 1, k) if S is None else xr      # row (t, u)'s activations
            wts = rng.uniform(0.1, 1.0, size=(T, U)).astype(np.float32)
            outs = [lib.matmul_experts(x, st, ids, threads=t) for t in thread_counts]
            tag = (kind, T, U, S, pattern)
            y = outs[0]
            if y.shape != (T, U, n) or not all(_same(o, y) for o in outs):
                bad.append(tag + ("threads differ",))
            for e in range(E):
                t_, u_ = np.nonzero(ids == e)
                rows = t_.size
                seen.add((pattern, "none" if rows == 0 else "one" if rows == 1 else
                          "all" if rows == T else "some"))
                if not rows:
                    continue
                xg = np.ascontiguousarray(xr[t_, u_ if S is not None else 0])
                one = st.expert(e)
                ref = lib.matmul(xg, one, threads=1)
                kern = lib.select(lib.adopt(one), rows)
                ran.add((kind, rows == 1, kern.name))
                if not _same(y[t_, u_], ref):
                    bad.append(tag + (f"expert {e}",))
                deq = lib.get_rows(st, np.stack([np.full(n, e), np.arange(n)], axis=1))
                if not _same(deq, lib.get_rows(one, np.arange(n))):
                    bad.append(tag + (f"get_rows expert {e}",))
                r = _f64_check(kind, kern, xg, ref, deq, None if raw is None else raw[e], n)
                worst[kind] = max(worst.get(kind, 0.0), r)
            want = y[:, 0] * wts[:, 0, None]
            for u in range(1, U):
                want += y[:, u] * wts[:, u, None]
            for t in thread_counts:
                if not _same(lib.matmul_experts(x, st, ids, wts, threads=t), want):
                    bad.append(tag + (f"weighted threads={t}",))
            for t in thread_counts:
                p = lib.plan_experts(st, T, U, S, threads=t)
                if len(p.plans) != E:        # the per-expert one-thread lib.plans
                    bad.append(tag + (f"plan native groups threads={t}",))
                if not _same(p(x, ids), y) or not _same(p(x, ids, wts), want):
                    bad.append(tag + (f"plan threads={t}",))
                for rows in {1, 2, T}:      # the kernels the plan runs per group size
                    if p.kernel(rows) is not lib.select(lib.adopt(st.expert(0)), rows):
                        bad.append(tag + (f"plan kernel for {rows} rows threads={t}",))
                ids2 = _ids("random", T, U, E, rng)       # other picks, same plan
                if not _same(p(x, ids2), lib.matmul_experts(x, st, ids2, threads=1)):
                    bad.append(tag + (f"plan other ids threads={t}",))
    return {"bad": bad, "ran": sorted(ran), "worst": worst, "seen": sorted(seen),
            "pool": len(lib.workers.threads())}


def moe_stack_io(libdir: str, kinds, seed=1, E=3, n=21) -> dict:
    """Per kind: a stack saved and loaded (same bytes, E, results), get_rows of (expert, row)
    pairs against each expert's, adopt of a stack; f32: a stack packed for a layout no
    kernel reads (f32p nr=2) adopted, its results equal to the stack's as packed."""
    lib = _lib(libdir)
    rng = np.random.default_rng(seed)
    bad, facts = [], {}
    with tempfile.TemporaryDirectory() as d:
        for kind in kinds:
            k = _k(kind)
            st, _ = _stack(lib, kind, E, n, k, rng, ggml=False)
            path = os.path.join(d, f"{kind}.tgpw")
            st.save(path)
            back = PackedWeights.load(path)
            x = rng.normal(size=(4, k)).astype(np.float32)
            ids = np.array([[0, 2], [1, 0], [2, 1], [0, 1]], np.int32)
            y = lib.matmul_experts(x, st, ids)
            if back.experts != E or not np.array_equal(back.data, st.data) or \
                    not _same(lib.matmul_experts(x, back, ids, threads=2), y) or \
                    not _same(lib.plan_experts(back, 4, 2, threads=1)(x, ids), y):
                bad.append((kind, "save/load"))
            pairs = np.array([[2, 5], [0, 0], [2, n - 1], [1, 3]])
            got = lib.get_rows(st, pairs)
            want = np.stack([lib.get_rows(st.expert(int(e)), [int(r)])[0] for e, r in pairs])
            if not _same(got, want):
                bad.append((kind, "get_rows"))
            if lib.adopt(st) is not st:
                bad.append((kind, "adopt of a stack in its layout is not the stack"))
            facts[kind] = (st.experts, st.expert_stride, st.nbytes)
        w = rng.normal(size=(E, n, 45)).astype(np.float32)
        lay2 = layout_for("f32p", nr=2, kr=1)
        odd = PackedWeights.stack(
            PackedWeights(lay2, n, 45, pack_rhs("f32p", w[e], nr=2, kr=1), False, "f32")
            for e in range(E))
        adopted = lib.adopt(odd)
        x = rng.normal(size=(4, 45)).astype(np.float32)
        ids = np.array([[0, 2], [1, 0], [2, 1], [0, 1]], np.int32)
        y = lib.matmul_experts(x, odd, ids)
        if adopted is odd or adopted.experts != E or adopted.layout == lay2 or \
                not _same(lib.matmul_experts(x, adopted, ids), y):
            bad.append(("f32", "adopt repack"))
        for e in range(E):
            t_, u_ = np.nonzero(ids == e)
            if not _same(y[t_, u_], lib.matmul(x[t_], odd.expert(e))):
                bad.append(("f32", f"adopted expert {e}"))
    return {"bad": bad, "facts": facts}


def moe_errors(libdir: str) -> dict:
    """name -> the message of what each misuse raised ("no error" when nothing did)."""
    lib = _lib(libdir)
    rng = np.random.default_rng(2)
    E, n, k = 4, 9, 64
    w = rng.normal(size=(E, n, k)).astype(np.float32)
    st = lib.pack_weights(w, kind="q8_0")
    one = lib.pack_weights(w[0], kind="q8_0")
    x = rng.normal(size=(3, k)).astype(np.float32)
    ids = np.array([[0, 1], [2, 3], [1, 2]], np.int32)
    wts = np.ones((3, 2), np.float32)
    out = {}

    def rec(name, fn):
        try:
            fn()
            out[name] = "no error"
        except (ArgumentError, LoadError) as e:
            out[name] = f"{type(e).__name__}: {e}"

    me = lib.matmul_experts
    rec("ids out of range", lambda: me(x, st, np.array([[0, 4], [2, 3], [1, 2]], np.int32)))
    rec("ids negative", lambda: me(x, st, np.array([[0, 1], [-1, 3], [1, 2]], np.int32)))
    rec("ids float", lambda: me(x, st, ids.astype(np.float32)))
    rec("ids list", lambda: me(x, st, ids.tolist()))
    rec("ids 1-D", lambda: me(x, st, ids[:, 0]))
    rec("ids tokens", lambda: me(x, st, ids[:2]))
    rec("ids duplicate", lambda: me(x, st, np.array([[0, 1], [3, 3], [1, 2]], np.int32)))
    rec("x float64", lambda: me(x.astype(np.float64), st, ids))
    rec("x wrong k", lambda: me(x[:, :32], st, ids))
    rec("x 1-D", lambda: me(x[0], st, ids))
    rec("x slots not dividing", lambda: me(np.zeros((3, 3, k), np.float32),
                                           st, np.zeros((3, 2), np.int32) + [[0, 1]]))
    rec("weights shape", lambda: me(x, st, ids, wts[:, :1]))
    rec("weights float64", lambda: me(x, st, ids, wts.astype(np.float64)))
    rec("experts one matrix", lambda: me(x, one, ids))
    rec("experts not packed", lambda: me(x, w, ids))
    rec("n_used above E", lambda: me(x, st, np.array([[0, 1, 2, 3, 0]] * 3, np.int32)))
    rec("matmul on a stack", lambda: lib.matmul(x, st))
    rec("plan on a stack", lambda: lib.plan(st, 3))
    rec("kernel on a stack", lambda: lib.select(st.expert(0), 3)(x, st, np.zeros((3, n),
                                                                                 np.float32)))
    rec("expert out of range", lambda: st.expert(E))
    rec("get_rows 1-D on a stack", lambda: lib.get_rows(st, [0, 1]))
    rec("get_rows expert range", lambda: lib.get_rows(st, [[E, 0]]))
    rec("get_rows row range", lambda: lib.get_rows(st, [[0, n]]))
    rec("for_ops with a stack", lambda: lib.pack_weights(w, kind="q8_0", for_ops=("gemm", "gemv")))
    rec("bias shape", lambda: lib.pack_weights(w, kind="f32", bias=np.zeros(n, np.float32)))
    rec("empty stack", lambda: lib.pack_weights(w[:0], kind="f32"))
    rec("ggml stack rows", lambda: lib.pack_weights(
        kind="q8_0", from_ggml=np.zeros((E, n - 1, 68), np.uint8), n=n, k=k))
    q4 = lib.pack_weights(w, kind="q4_0")
    rec("activations NaN", lambda: me(np.where(x > 1, np.nan, x).astype(np.float32), q4, ids))
    rec("PackedLayouts of a stack", lambda: tilegen.PackedLayouts({"gemm": st, "gemv": st}))
    p = lib.plan_experts(st, 3, 2)
    rec("plan x shape", lambda: p(x[:2], ids[:2]))
    rec("plan ids shape", lambda: p(x, ids[:, :1]))
    rec("plan duplicate", lambda: p(x, np.array([[0, 0], [2, 3], [1, 2]], np.int32)))
    rec("plan slots", lambda: lib.plan_experts(st, 3, 2, slots=3))
    rec("plan n_used", lambda: lib.plan_experts(st, 3, 5))
    rec("plan one matrix", lambda: lib.plan_experts(one, 3, 2))
    rec("plan tokens 0", lambda: lib.plan_experts(st, 0, 2))
    lib2 = tilegen.load(libdir)
    p2 = lib2.plan_experts(st, 3, 2)
    lib2.close()
    rec("plan after close", lambda: p2(x, ids))
    rec("matmul_experts after close", lambda: lib2.matmul_experts(x, st, ids))
    return out


def grouped_call(libdir: str, kind: str, gemm: str, gemv: str, raw, n: int, k: int, x, ids,
                 thread_counts) -> dict:
    """lib.matmul_experts on ggml blocks ``raw`` (E, n, row bytes) with the ``kind`` table set
    to one pair (the spec strings ``gemm``, ``gemv``: the kernels of a llama.cpp table entry),
    x (tokens, slots, k), for each thread count: {"y": [results], "kernels": [the gemv and
    the gemm the stack's groups run]}."""
    from tilegen.runtime.select import KernelPair
    lib = _lib(libdir)
    by_spec = {kern.spec.spec_string: kern for kern in lib.kernels.values()}
    lib.set_table(kind, [KernelPair(by_spec[gemm], by_spec[gemv])])
    st = lib.pack_weights(kind=kind, from_ggml=np.ascontiguousarray(raw), n=n, k=k)
    one = st.expert(0)
    return {"y": [lib.matmul_experts(x, st, ids, threads=t) for t in thread_counts],
            "kernels": [lib.select(one, 1).spec.spec_string,
                        lib.select(one, lib.gemv_threshold + 1).spec.spec_string]}


def load_stacks(libdir: str, tensors) -> dict:
    """Per (path, slices path, name, E): load_tensor(path, name, lib) against the 2-D slices'
    load_tensor(lib=) (bytes per expert) and lib.matmul_experts on it against lib.matmul per
    expert on the slices (bit for bit)."""
    from tilegen.gguf import load_tensor
    lib = _lib(libdir)
    rng = np.random.default_rng(6)
    bad, checked = [], 0
    for path, sl, name, E in tensors:
        st = load_tensor(path, name, lib=lib)
        parts = [load_tensor(sl, f"e{e}", lib=lib) for e in range(E)]
        if st.experts != E or any(not np.array_equal(st.expert(e).data, parts[e].data)
                                  for e in range(E)):
            bad.append((name, "bytes"))
            continue
        T = 5
        x = rng.normal(size=(T, st.k)).astype(np.float32)
        ids = np.stack([rng.permutation(E)[:2] for _ in range(T)]).astype(np.int32)
        y = lib.matmul_experts(x, st, ids)
        for e in range(E):
            t_, u_ = np.nonzero(ids == e)
            if t_.size and not _same(y[t_, u_], lib.matmul(x[t_], parts[e], threads=1)):
                bad.append((name, f"expert {e}"))
        checked += 1
    return {"bad": bad, "checked": checked}
