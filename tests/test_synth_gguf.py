"""The synthetic llama GGUF of scripts/llama_cpp_check.py (tilegen.gguf.synth): file contents,
tokenizer helpers, and the float64 reference forward pass it is compared against."""
import gguf
import numpy as np
import pytest

from tilegen.gguf import synth as sg
from tilegen.gguf import load_tensor, tensor_names

SMALL = sg.ModelConfig(n_vocab=128, n_embd=64, n_ff=128, n_layer=1, n_head=2, n_head_kv=1)


@pytest.mark.parametrize("wtype", sg.TYPES)
def test_file_is_a_llama_model(tmp_path, wtype):
    path = sg.write_gguf(tmp_path / f"m-{wtype}.gguf", wtype, SMALL)
    r = gguf.GGUFReader(str(path))
    arch = r.fields["general.architecture"]
    assert bytes(arch.parts[arch.data[0]]).decode() == "llama"
    model = r.fields["tokenizer.ggml.model"]
    assert bytes(model.parts[model.data[0]]).decode() == "llama"
    assert len(r.fields["tokenizer.ggml.tokens"].data) == SMALL.n_vocab
    T = gguf.GGMLQuantizationType
    want = {"q4_0": T.Q4_0, "q8_0": T.Q8_0, "f16": T.F16}[wtype]
    for t in r.tensors:
        assert t.tensor_type == (T.F32 if t.name.endswith("norm.weight") else want), t.name
    assert set(tensor_names(path)) == set(sg.make_weights(SMALL))


def test_q4_0_tensor_reads_back_through_tilegen(tmp_path):
    path = sg.write_gguf(tmp_path / "m.gguf", "q4_0", SMALL)
    pw = load_tensor(path, "blk.0.ffn_up.weight")
    assert (pw.n, pw.k) == (SMALL.n_ff, SMALL.n_embd)


def test_vocabulary_round_trips_generated_text():
    vocab = sg.vocabulary()
    assert len(vocab) == len(set(vocab)) == 512
    assert all(len(t) == 1 for t in vocab[4:])
    ids = list(range(4, 512, 7))
    text = "".join(" " if vocab[i] == "\u2581" else vocab[i] for i in ids)
    assert sg.detokenize_ids(text) == ids
    p = sg.prompt_ids()
    assert p[0] == 1 and p[1] == vocab.index("\u2581") and len(p) == len(sg.PROMPT) + 2


def test_reference_is_causal_and_quantisation_is_small():
    w = sg.make_weights(SMALL)
    f16 = sg.dequantized(w, "f16")
    ids = sg.prompt_ids(SMALL, "abc def")
    full = sg.reference_logits(f16, ids, SMALL)
    assert np.allclose(sg.reference_logits(f16, ids[:4], SMALL), full[:4], atol=1e-12)
    rms = np.sqrt(np.mean(full ** 2))
    err = {}
    for wtype in ("q8_0", "q4_0"):
        d = sg.reference_logits(sg.dequantized(w, wtype), ids, SMALL) - full
        err[wtype] = np.max(np.abs(d)) / rms
    # weight rounding only: Q8_0 (8 bits) is ~16x finer than Q4_0 (4 bits)
    assert err["q8_0"] < 0.05 and err["q8_0"] * 4 < err["q4_0"] < 1.0, err


def test_greedy_reference_has_clear_margins():
    """The default model's 16 greedy steps are far from ties (what the llama.cpp check's
    token comparison relies on)."""
    w = sg.dequantized(sg.make_weights(), "q4_0")
    toks, margins, last = sg.greedy_reference(w, sg.prompt_ids(), 16)
    assert len(toks) == 16 and min(margins) > 2.0
    assert all(t >= 4 for t in toks)  # never a special token
    assert int(np.argmax(last)) == toks[0]
