"""bench/q8k_vs_ggml.py (issue #30 item 9): ggml's own Q8_K quantisers (quantize_row_q8_K and the
repack's ggml_quantize_mat_q8_K_4x4 / 4x8, built from the llama.cpp sources of the sdist with the
llama check's flags, run under qemu) against numpy, byte for byte: the model
tilegen.reference.kquant.quantize_q8_k gives every value, d and sum; tilegen's q8kp gives the
same values, d and sums of 32 in its sign convention (d >= 0) — on Gaussian, heavy-tailed,
widely scaled, exact-tie and edge rows (1e-38, subnormal, zero, the flush threshold).

Before q8kp took ggml's rounding, its d differed from ggml's |d| in the last bit in 16-22 of 64
super-blocks, ties rounded away (4174 of 16384 values on the tie rows) and tiny super-blocks
gave +-127 where ggml gives 0."""
import importlib.util
import sys
from pathlib import Path

BENCH = Path(__file__).resolve().parent.parent / "bench"


def _load():
    sys.path.insert(0, str(BENCH))
    spec = importlib.util.spec_from_file_location("q8k_vs_ggml", BENCH / "q8k_vs_ggml.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules["q8k_vs_ggml"] = mod
    spec.loader.exec_module(mod)
    return mod


q8k = _load()


def test_ggml_q8_k_bytes_are_numpys(llama_cpp_src, cross_sysroot, tmp_path):
    res = q8k.measure(tmp_path, llama_cpp_src)
    assert {r["function"] for r in res} == set(q8k.FUNCS)
    assert {r["rows"] for r in res} == {"normal", "heavy", "scaled", "ties", "edges"}
    bad = [r for r in res if any(r[c] for c in r if c.startswith(("model_", "q8kp_")))]
    assert not bad, q8k.table(bad)
    # ggml's sign convention is live in these rows (else the q8kp comparison proves little)
    assert all(0 < r["negative_d"] < r["blocks"] for r in res)


def test_block_q8_kx4_interleave_is_read_back():
    """unpack_q8_kx4 puts every byte of a block_q8_Kx4 in one place (both interleaves): values
    numbered by (row, position) and sums by (row, sub-block) come back in order."""
    import numpy as np
    for il in (4, 8):
        j = np.arange(1024)
        row, pos = (j % (4 * il)) // il, (j // (4 * il)) * il + j % il
        blk = np.zeros((1, 1, 1168), np.uint8)
        blk[0, 0, 16:1040] = (row * 64 + pos // 4).astype(np.uint8)    # 0..255, unique per 4
        blk[0, 0, :16] = np.arange(4, dtype="<f4").view(np.uint8)
        index = (((j & (4 * il - 1)) // il) << 2) + ((j >> 8) << 4) + ((j >> 6) & 3)
        sums = np.zeros(64, "<i2")
        sums[index] = row * 16 + pos // 16
        blk[0, 0, 1040:] = sums.view(np.uint8)
        q, d, bsums = q8k.unpack_q8_kx4(blk, il)
        r, t = np.divmod(np.arange(4 * 256), 256)
        assert (q.reshape(-1).view(np.uint8) == (r * 64 + t // 4).astype(np.uint8)).all(), il
        assert d[:, 0].tolist() == [0, 1, 2, 3]
        assert (bsums[:, 0, :] == np.arange(64).reshape(4, 16)).all(), il
