"""scripts/llama_cpp_check.py's own logic, without building or running llama.cpp: which runs it
plans, the environment of each (the deterministic hybrid SME split), which export-vs-real pairs
must be bit-identical, and how a pair is judged."""
import importlib.util
import sys
from pathlib import Path

import shutil

import numpy as np
import pytest

from tilegen.emulate import provision
from tilegen.export.kleidiai import llama_patch

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(__file__).resolve().parents[2] / "shared"


def _load():
    spec = importlib.util.spec_from_file_location("llama_cpp_check",
                                                  REPO / "scripts" / "llama_cpp_check.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules.setdefault(spec.name, mod)
    spec.loader.exec_module(mod)
    return mod


lc = _load()
N_VOCAB = 512


def _run(build, cpu, sme, wtype, logits, tokens=(1, 2, 3), kernels="q4:I8MM q8:I8MM"):
    return lc.Run(build, cpu, sme, wtype, logits=np.asarray(logits, np.float32),
                  tokens=list(tokens), kernels=kernels)


@pytest.fixture
def logits():
    return np.random.default_rng(23).normal(0.0, 2.5, N_VOCAB).astype(np.float32)


def test_the_default_archive_is_the_shared_kleidiai_release_llama_cpp_pins(llama_cpp_src):
    assert lc.KLEIDIAI_ARCHIVE == SHARED / "thirdparty" / "kleidiai" / "kleidiai-v1.24.0.tar.gz"
    assert lc.KLEIDIAI_ARCHIVE.is_file(), "check out the shared inputs next to the repository"
    assert lc.parse_args([]).kleidiai == lc.KLEIDIAI_ARCHIVE
    cmake = (llama_cpp_src / "ggml" / "src" / "ggml-cpu" / "CMakeLists.txt").read_text()
    assert f'set(KLEIDIAI_COMMIT_TAG "v{lc.KLEIDIAI_VERSION}")' in cmake


def test_the_archive_unpacks_into_the_cache_once(tmp_path, monkeypatch):
    monkeypatch.setenv("TILEGEN_CACHE", str(tmp_path))
    src = provision.ensure_kleidiai_source(lc.KLEIDIAI_ARCHIVE, quiet=True)
    assert src.parent == tmp_path / "kleidiai" and (src / "CMakeLists.txt").is_file()
    assert (src / "kai" / "ukernels" / "matmul").is_dir()
    assert provision.ensure_kleidiai_source(lc.KLEIDIAI_ARCHIVE, quiet=True) == src
    bad = tmp_path / "kleidiai-v1.24.0.tar.gz"
    bad.write_bytes(lc.KLEIDIAI_ARCHIVE.read_bytes()[:-1])
    with pytest.raises(provision.ProvisionError, match="sha256"):
        provision.ensure_kleidiai_source(bad, quiet=True)


def test_the_plan_pairs_every_export_run_with_a_real_run():
    off, on, real = (lc.Build(n, Path(n), Path(n), 0.0, True) for n in ("off", "on", "real"))
    plan = lc.run_plan([off, on, real], ["n1", "v1", "max"], ["n1", "max"], ["1", "2"])
    got = [(b.name, c, s) for b, c, s in plan]
    assert got[:2] == [("off", "n1", "-"), ("off", "max", "-")]
    keys = {"on": [], "real": []}
    for b, c, s in got[2:]:
        keys[b].append((c, s))
    assert keys["on"] == keys["real"] == [("n1", "0"), ("v1", "0"), ("max", "0"), ("max", "1"),
                                          ("max", "2")]
    # side by side: each export run is directly followed by its real run
    assert all(got[i][0] == "on" and got[i + 1][0] == "real" and got[i][1:] == got[i + 1][1:]
               for i in range(2, len(got), 2))
    assert [(b.name, c, s) for b, c, s in lc.run_plan([off, on], ["max"], ["n1"], ["2"])] == \
        [("off", "n1", "-"), ("on", "max", "0"), ("on", "max", "2")]


def test_only_hybrid_runs_get_a_static_chunk_split():
    assert lc.THREADS == 2
    assert lc.run_env("n1", "-") == {}
    assert lc.run_env("max", "0") == {"GGML_KLEIDIAI_SME": "0"}
    assert lc.run_env("n2", "1") == {"GGML_KLEIDIAI_SME": "1"}          # no SME: no hybrid
    # cap 1 < 2 threads on an SME CPU: 128+-row batches split between SME and the fallback
    assert lc.run_env("max", "1") == {"GGML_KLEIDIAI_SME": "1",
                                      "GGML_KLEIDIAI_CHUNK_MULTIPLIER": "1"}
    assert lc.run_env("max", "2") == {"GGML_KLEIDIAI_SME": "2"}        # every thread on SME
    assert lc.run_env("max", "3") == {"GGML_KLEIDIAI_SME": "3"}


@pytest.mark.parametrize("bit_exact", [False, True])
def test_only_q4_0_with_sme_on_an_sme2_cpu_may_differ_until_its_gemm_is_bit_exact(
        monkeypatch, bit_exact):
    monkeypatch.setattr(lc, "F16P_Q4_0_SME2_GEMM_BIT_EXACT", bit_exact)
    for wtype in ("q4_0", "q8_0", "f16"):
        for cpu in lc.CPUS:
            for sme in ("0", "1", "2"):
                f16p = wtype == "q4_0" and cpu == "max" and sme != "0"
                assert lc.expect_identical(wtype, cpu, sme) == (bit_exact or not f16p), \
                    (wtype, cpu, sme)


def test_a_bit_exact_path_must_give_identical_logits(logits):
    row = lc.compare_real(_run("on", "n2", "0", "q4_0", logits),
                          _run("real", "n2", "0", "q4_0", logits.copy()))
    assert row["ok"] and row["problems"] == []
    assert (row["bit_equal"], row["n_logits"], row["max_abs"], row["tok_equal"]) == \
        (N_VOCAB, N_VOCAB, 0.0, True)
    assert row["expect"] == "identical"
    one_ulp = logits.copy()
    one_ulp[17] = np.nextafter(one_ulp[17], np.float32(np.inf))
    row = lc.compare_real(_run("on", "n2", "0", "q4_0", logits),
                          _run("real", "n2", "0", "q4_0", one_ulp))
    assert not row["ok"] and row["bit_equal"] == N_VOCAB - 1
    assert row["problems"] == [f"1 of {N_VOCAB} logits differ (max |d| {row['max_abs']:.3g}) "
                               "on a path whose kernels are bit-exact"]
    neg0 = np.where(np.arange(N_VOCAB) == 3, np.float32(0.0), logits)
    row = lc.compare_real(_run("on", "n1", "0", "f16", neg0),
                          _run("real", "n1", "0", "f16", np.where(neg0 == 0, -0.0, neg0)))
    assert not row["ok"] and row["max_abs"] == 0.0 and row["bit_equal"] == N_VOCAB - 1


def test_the_f16p_gemm_path_is_held_to_the_tolerance(logits, monkeypatch):
    monkeypatch.setattr(lc, "F16P_Q4_0_SME2_GEMM_BIT_EXACT", False)
    rms = float(np.sqrt(np.mean(logits.astype(np.float64) ** 2)))
    tol = lc.TOLERANCE["q4_0"]
    rng = np.random.default_rng(5)
    noise = rng.uniform(-1.0, 1.0, N_VOCAB).astype(np.float32)
    near = logits + noise * np.float32(0.5 * tol * rms)
    row = lc.compare_real(_run("on", "max", "2", "q4_0", near),
                          _run("real", "max", "2", "q4_0", logits))
    assert row["ok"], row["problems"]
    assert row["expect"] == f"d/rms<={tol}" and row["bit_equal"] < N_VOCAB
    far = logits.copy()
    far[101] += np.float32(1.5 * tol * rms)
    row = lc.compare_real(_run("on", "max", "1", "q4_0", far),
                          _run("real", "max", "1", "q4_0", logits))
    assert not row["ok"] and "> tolerance" in row["problems"][0]
    monkeypatch.setattr(lc, "F16P_Q4_0_SME2_GEMM_BIT_EXACT", True)
    row = lc.compare_real(_run("on", "max", "2", "q4_0", near),
                          _run("real", "max", "2", "q4_0", logits))
    assert not row["ok"] and row["expect"] == "identical"


def test_tokens_kernel_picks_and_failed_runs_are_failures(logits):
    row = lc.compare_real(_run("on", "v1", "0", "q8_0", logits, tokens=(1, 2, 3)),
                          _run("real", "v1", "0", "q8_0", logits, tokens=(1, 2, 4)))
    assert not row["ok"] and not row["tok_equal"]
    assert row["problems"] == ["greedy tokens differ: [1, 2, 3] vs [1, 2, 4]"]
    row = lc.compare_real(_run("on", "v1", "0", "q8_0", logits, kernels="q8:SVE"),
                          _run("real", "v1", "0", "q8_0", logits, kernels="q8:I8MM"))
    assert not row["ok"] and "picked" in row["problems"][0]
    broken = _run("real", "v1", "0", "q8_0", logits)
    broken.error, broken.logits = "llama-debug failed (exit 132)", None
    row = lc.compare_real(_run("on", "v1", "0", "q8_0", logits), broken)
    assert not row["ok"] and row["problems"] == ["not compared: the real run failed"]
    assert "bit_equal" not in row


def test_the_table_names_the_setting_that_relaxes_the_f16p_path(logits, capsys, monkeypatch):
    monkeypatch.setattr(lc, "F16P_Q4_0_SME2_GEMM_BIT_EXACT", False)
    rows = [lc.compare_real(_run("on", c, s, "q4_0", logits), _run("real", c, s, "q4_0", logits))
            for c, s in (("n1", "0"), ("max", "1"))]
    lc.print_real_table(rows)
    out = capsys.readouterr().out
    assert f"{N_VOCAB}/{N_VOCAB}" in out and "F16P_Q4_0_SME2_GEMM_BIT_EXACT = False" in out
    assert "GGML_KLEIDIAI_SME=1 runs on SME CPUs set GGML_KLEIDIAI_CHUNK_MULTIPLIER=1" in out


def test_ccache_counts_reuse_from_its_stats_log(tmp_path):
    log = tmp_path / "stats.log"
    log.write_text("# ../../a.c\ncache_miss\ndirect_cache_miss\nlocal_storage_write\n"
                   "# ../../b.cpp\ndirect_cache_hit\nlocal_storage_hit\n"
                   "# ../../c.cpp\ndirect_cache_miss\npreprocessed_cache_hit\n")
    assert lc.ccache_counts(log) == (2, 1)
    assert lc.ccache_counts(tmp_path / "none.log") == (0, 0)
    env = lc.ccache_env(log)
    assert env["CCACHE_BASEDIR"] == str(lc.llama_root())
    assert Path(env["CCACHE_DIR"]).parent == lc.llama_root()
    flags = lc.cmake_flags(True, Path("/x"))
    assert f"-DCMAKE_CXX_COMPILER_LAUNCHER={lc.CCACHE}" in flags
    assert "-DFETCHCONTENT_SOURCE_DIR_KLEIDIAI=/x" in flags


# --------------------------------------------------------------------------------------------
# K-quants (Q4_K_M through llama-kquants.patch)

def test_kquant_models_run_only_the_patched_build():
    off, on, real = (lc.Build(n, Path(n), Path(n), 0.0, True) for n in ("off", "on", "real"))
    plan = lc.run_plan([off, on, real], list(lc.CPUS), ["n1"], ["1", "2"], kquant=True)
    assert [(b.name, c, s) for b, c, s in plan] == [
        ("off", "n1", "-"), ("on", "n1", "0"), ("on", "v1", "0"), ("on", "n2", "0"),
        ("on", "max", "0"), ("on", "max", "1"), ("on", "max", "2")]
    assert "q4_k_m" in lc.TYPES and set(lc.KQUANT_TYPES) <= set(lc.REF_TOLERANCE)
    assert lc.LOGITS_PROMPT["q4_k_m"] == lc.sg.LONG_PROMPT


LOG = """\
kleidiai: primary q4 kernel feature I8MM
kleidiai: primary q4_K kernel feature I8MM
kleidiai: primary q6_K kernel feature DOTPROD
kleidiai: MUL_MAT blk.0.attn_q.weight (q4_K) m=133 n=256 k=256: I8MM gemm
kleidiai: MUL_MAT blk.0.attn_v.weight (q6_K) m=133 n=128 k=256: I8MM gemm
kleidiai: MUL_MAT blk.0.attn_k.weight (q4_0) m=133 n=128 k=256: SME2+I8MM gemm
kleidiai: MUL_MAT output.weight (q6_K) m=1 n=512 k=256: DOTPROD gemv
"""


def test_kquant_matmuls_are_counted_from_the_debug_log():
    assert lc.kquant_matmuls(LOG) == [("blk.0.attn_q.weight", "q4_K", "I8MM gemm"),
                                      ("blk.0.attn_v.weight", "q6_K", "I8MM gemm"),
                                      ("output.weight", "q6_K", "DOTPROD gemv")]
    report = lc.kleidiai_report(LOG)
    assert report == "q4:I8MM q4_K:I8MM q6_K:DOTPROD"
    assert lc.kleidiai_picks(report) == "q4:I8MM"      # what the unpatched real build reports


def test_every_kquant_weight_must_reach_the_kernels_once_per_evaluation():
    weights = {"blk.0.attn_q.weight": "q4_K", "blk.0.attn_v.weight": "q6_K", "output.weight": "q6_K"}
    r = lc.Run("on", "n2", "0", "q4_k_m")
    r.kq_calls = {w: [1, 17] for w in weights}
    assert lc.check_kquant_calls(r, weights) == []
    r.kq_calls = {w: [1, 17] for w in list(weights)[:2]}
    assert "missing ['output.weight']" in lc.check_kquant_calls(r, weights)[0]
    r.kq_calls = {w: [1, 17] for w in weights}
    r.kq_calls["output.weight"] = [1, 16]                # one evaluation went elsewhere
    assert lc.check_kquant_calls(r, weights) == [
        "llama-batched: tilegen-family MUL_MAT counts per weight differ: blk.0.attn_q.weight 17, "
        "blk.0.attn_v.weight 17, output.weight 16"]
    r.kq_calls = {}
    assert lc.check_kquant_calls(r, weights) == [
        "tilegen-family MUL_MATs on the KleidiAI backend: missing ['blk.0.attn_q.weight', "
        "'blk.0.attn_v.weight', 'output.weight'], unexpected []"]
    r.kq_calls = {w: [1, 0] for w in weights}           # llama-batched: none on the kernels
    assert lc.check_kquant_calls(r, weights)[0].startswith("llama-batched: tilegen-family MUL_MAT counts")


def test_the_patched_tree_keeps_ccache_paths(tmp_path, monkeypatch, llama_cpp_src):
    """The patched copy sits where a build dir reaches it by the same relative path as the
    unpatched tree (ccache's base dir is the llama cache dir); the cache's own files stay
    untouched, the unpatched ones are hard links, and the patch is applied once."""
    import os
    monkeypatch.setenv("TILEGEN_CACHE", str(tmp_path))
    root = lc.llama_root()
    src = root / "llama_cpp_python-9" / "vendor" / "llama.cpp"
    kai = Path("ggml/src/ggml-cpu/kleidiai")
    shutil.copytree(llama_cpp_src / kai, src / kai)
    (src / "README.md").write_text("untouched\n")
    before = {p.name: p.read_bytes() for p in (src / kai).iterdir()}
    patch = tmp_path / lc.KQUANTS_PATCH
    patch.write_text(llama_patch())           # what the export tree carries
    dst, proot = lc.patched_source(src, patch)
    assert proot.parent == root and dst == proot / src.relative_to(root)
    assert os.path.relpath(dst, proot / "0.3.36-on-x" / "build") == \
        os.path.relpath(src, root / "0.3.36-on-x" / "build")
    assert {p.name: p.read_bytes() for p in (src / kai).iterdir()} == before
    assert b"kleidiai_is_kquant" in (dst / kai / "kleidiai.cpp").read_bytes()
    assert os.stat(dst / "README.md").st_ino == os.stat(src / "README.md").st_ino
    assert os.stat(dst / kai / "kernels.cpp").st_ino != os.stat(src / kai / "kernels.cpp").st_ino
    assert lc.patched_source(src, patch) == (dst, proot)


# --------------------------------------------------------------------------------------------
# mixture of experts (MUL_MAT_ID through llama-kquants.patch, issue #33)

def test_moe_models_run_only_the_patched_build_with_their_base_type():
    off, on, real = (lc.Build(n, Path(n), Path(n), 0.0, True) for n in ("off", "on", "real"))
    from tilegen.families import LLAMA_MOE
    assert lc.MOE_TYPES == tuple(f"moe_{t}" for t in LLAMA_MOE)     # the plugins' declarations
    assert {"moe_q4_0", "moe_q8_0", "moe_q4_k_m", "moe_q5_k_m", "moe_iq4_xs", "moe_iq4_nl",
            "moe_mxfp4_moe"} <= set(lc.MOE_TYPES) and set(lc.MOE_TYPES) <= set(lc.TYPES)
    for t in lc.MOE_TYPES:
        dense = lc.REF_TOLERANCE.get(lc.base_type(t))
        assert lc.REF_TOLERANCE[t] == lc.TOLERANCE[t] == (
            dense if LLAMA_MOE[lc.base_type(t)] is None else LLAMA_MOE[lc.base_type(t)])
        assert lc.LOGITS_PROMPT[t] == lc.sg.LONG_PROMPT
        assert lc.model_config(t).n_expert == 4 and lc.model_config(lc.base_type(t)).n_expert == 0
    # MXFP4_MOE has no dense counterpart: its own tolerance, Q8_0's (its non-expert matrices)
    assert "mxfp4_moe" not in lc.TYPES and lc.REF_TOLERANCE["moe_mxfp4_moe"] == lc.REF_TOLERANCE["q8_0"]
    plan = lc.run_plan([off, on, real], list(lc.CPUS), ["n1"], ["1", "2"], kquant=True)
    assert {b.name for b, _, _ in plan} == {"off", "on"}


def test_quantised_models_take_their_family_s_llama_quantize_arguments():
    """Which models llama-quantize makes, and its ftype and options: the type as its ftype
    (Q4_K_M, IQ4_NL, the MoE model's MXFP4_MOE), MXFP4's dense model through its plugin's
    overrides (every weight matrix MXFP4 on a Q8_0 base), the synthetic model's own types
    written directly."""
    assert [t for t in lc.TYPES if not lc.quantized(t)] == ["q4_0", "q8_0", "f16", "moe_q4_0",
                                                            "moe_q8_0"]
    assert lc.quantize_args("q4_k_m") == ("Q4_K_M", ())
    assert lc.quantize_args("moe_iq4_nl") == ("IQ4_NL", ())
    assert lc.quantize_args("moe_mxfp4_moe") == ("MXFP4_MOE", ())
    assert lc.quantize_args("mxfp4") == ("Q8_0", ("--tensor-type", "weight=mxfp4"))
    assert lc.REF_TOLERANCE["mxfp4"] == lc.REF_TOLERANCE["q4_0"] == lc.TOLERANCE["mxfp4"]
    assert "mxfp4" in lc.KQUANT_GGML                   # its MUL_MATs are counted on tilegen's


MOE_LOG = """\
kleidiai: MUL_MAT blk.0.attn_q.weight (q4_0) m=45 n=256 k=256: I8MM gemm
kleidiai: MUL_MAT_ID blk.0.ffn_up_exps.weight (q4_0) m=90 n=256 k=256 experts=4/4: I8MM gemm
kleidiai: MUL_MAT_ID blk.0.ffn_down_exps.weight (q4_K) m=2 n=256 k=256 experts=2/4: SME2 gemv
kleidiai: MUL_MAT_ID blk.1.ffn_gate_exps.weight (q6_K) m=6 n=256 k=256 experts=4/4: DOTPROD gemm+gemv
"""


def test_mul_mat_ids_are_read_from_the_debug_log():
    assert lc.mul_mat_ids(MOE_LOG) == [
        ("blk.0.ffn_up_exps.weight", "q4_0", 90, "q4_0 I8MM gemm"),
        ("blk.0.ffn_down_exps.weight", "q4_K", 2, "q4_K SME2 gemv"),
        ("blk.1.ffn_gate_exps.weight", "q6_K", 6, "q6_K DOTPROD gemm+gemv")]
    assert lc.kquant_matmuls(MOE_LOG) == []            # the MUL_MAT line is q4_0, not a K-quant


def test_every_expert_weight_must_reach_the_kernels_in_prompt_and_decode():
    weights = {f"blk.{i}.ffn_{x}_exps.weight": "q4_0" for i in (0, 1) for x in ("gate", "up", "down")}
    r = lc.Run("on", "n2", "0", "moe_q4_0")

    def fill(counts=(1, 17), kernels=("q4_0 I8MM gemm", "q4_0 I8MM gemv"), rows=((133,), (90, 2))):
        r.mmid_calls = {w: list(counts) for w in weights}
        r.mmid_kernels, r.mmid_rows = kernels, rows
    fill()
    assert lc.check_mmid_calls(r, weights) == []
    fill()
    del r.mmid_calls["blk.1.ffn_down_exps.weight"]     # one expert weight left on ggml's path
    assert "missing ['blk.1.ffn_down_exps.weight']" in lc.check_mmid_calls(r, weights)[0]
    fill()
    r.mmid_calls["blk.0.ffn_up_exps.weight"] = [1, 16]
    assert lc.check_mmid_calls(r, weights) == [
        "llama-batched: MUL_MAT_ID counts per weight differ: " + ", ".join(
            f"{w} {16 if w == 'blk.0.ffn_up_exps.weight' else 17}" for w in sorted(weights))]
    fill(kernels=("q4_0 I8MM gemm",))                    # the decode steps ran no gemv
    assert lc.check_mmid_calls(r, weights) == [
        "MUL_MAT_IDs ran q4_0 I8MM gemm: want both gemm (prompt) and gemv (decode)"]
    fill(kernels=("q8_0 I8MM gemm", "q8_0 I8MM gemv"))
    assert "with types ['q8_0']" in lc.check_mmid_calls(r, weights)[0]
    fill(rows=((133,), (90, 4)))
    assert "no decode step" in lc.check_mmid_calls(r, weights)[0]
