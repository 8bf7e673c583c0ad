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


# ---------------------------------------------------------------------------------------------
# the mixture-of-experts variant (issue #33)

MOE_SMALL = sg.ModelConfig(n_vocab=128, n_embd=64, n_ff=256, n_layer=2, n_head=2, n_head_kv=1,
                           n_expert=4, n_expert_used=2)


def test_moe_file_has_routers_and_3d_experts(tmp_path):
    path = sg.write_gguf(tmp_path / "moe-q4_0.gguf", "q4_0", MOE_SMALL)
    r = gguf.GGUFReader(str(path))
    assert int(r.fields["llama.expert_count"].parts[-1][0]) == 4
    assert int(r.fields["llama.expert_used_count"].parts[-1][0]) == 2
    T = gguf.GGMLQuantizationType
    tensors = {t.name: t for t in r.tensors}
    assert "blk.0.ffn_gate.weight" not in tensors
    for i in range(MOE_SMALL.n_layer):
        assert tensors[f"blk.{i}.ffn_gate_inp.weight"].tensor_type == T.F32
        for x, shape in (("gate", (64, 256, 4)), ("up", (64, 256, 4)), ("down", (256, 64, 4))):
            t = tensors[f"blk.{i}.ffn_{x}_exps.weight"]
            assert t.tensor_type == T.Q4_0 and tuple(int(v) for v in t.shape) == shape
    dq = sg.dequantized(sg.make_weights(MOE_SMALL), "q4_0")
    got = gguf.quants.dequantize(tensors["blk.1.ffn_down_exps.weight"].data, T.Q4_0)
    assert np.array_equal(got.reshape(4, 64, 256), dq["blk.1.ffn_down_exps.weight"])


def _independent_moe_logits(w, ids, cfg):
    """A one-layer MoE forward pass with the attention's output projection zeroed, written
    without tilegen.gguf.synth's code: the routing as a dense (tokens x experts) gate matrix
    (softmax, top-k by a sort of the probabilities, renormalised), every expert applied to
    every token and the gate matrix mixing them."""
    def rms(x, g):
        return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + cfg.rms_eps) * g
    x = w["token_embd.weight"][ids]
    h = rms(x, w["blk.0.ffn_norm.weight"])
    z = h @ w["blk.0.ffn_gate_inp.weight"].T
    p = np.exp(z - z.max(axis=1, keepdims=True))
    p = p / p.sum(axis=1, keepdims=True)
    gates = np.zeros_like(p)
    for t in range(len(ids)):
        top = sorted(range(cfg.n_expert), key=lambda e: -p[t, e])[:cfg.n_expert_used]
        gates[t, top] = p[t, top] / p[t, top].sum()
    y = np.zeros_like(x)
    for e in range(cfg.n_expert):
        g = h @ w["blk.0.ffn_gate_exps.weight"][e].T
        u = h @ w["blk.0.ffn_up_exps.weight"][e].T
        y += gates[:, e:e + 1] * (((g / (1 + np.exp(-g))) * u) @ w["blk.0.ffn_down_exps.weight"][e].T)
    return rms(x + y, w["output_norm.weight"]) @ w["output.weight"].T, gates


def test_moe_reference_matches_an_independent_routing():
    cfg = sg.ModelConfig(**{**MOE_SMALL.__dict__, "n_layer": 1})
    w = sg.dequantized(sg.make_weights(cfg), "q8_0")
    w["blk.0.attn_output.weight"][:] = 0.0     # the residual after attention is the embedding
    ids = sg.prompt_ids(cfg, "abc def xyz")
    want, gates = _independent_moe_logits(w, ids, cfg)
    got = sg.reference_logits(w, ids, cfg)
    assert np.allclose(got, want, rtol=1e-12, atol=1e-10)
    # every expert gets some tokens, and no token puts all its weight on one expert
    assert np.all(np.count_nonzero(gates, axis=0) > 0)
    assert np.all(np.count_nonzero(gates, axis=1) == cfg.n_expert_used)
    assert 0.05 < gates[gates > 0].min() and gates.max() < 0.95


@pytest.mark.parametrize("wtype", ("q4_0", "q8_0"))
def test_moe_model_has_routing_and_greedy_margins(wtype):
    """The llama.cpp check's MoE model: over its prompts and the float64 greedy path, every
    token's experts are picked with a margin a 1 % router-logit perturbation cannot close, and
    the greedy steps are far from ties."""
    cfg = sg.MOE_CONFIG
    w = sg.dequantized(sg.make_weights(cfg), wtype)
    toks, margins, _ = sg.greedy_reference(w, sg.prompt_ids(cfg), 16, cfg)
    assert min(margins) > 2.0 and all(t >= 4 for t in toks)
    assert sg.routing_margin(w, sg.prompt_ids(cfg) + toks, cfg) > sg.ROUTE_MARGIN
    assert sg.routing_margin(w, sg.prompt_ids(cfg, sg.LONG_PROMPT), cfg) > sg.ROUTE_MARGIN


def test_moe_routing_margin_detects_near_ties():
    """Without the routing codes the router logits are small random numbers: the margin
    measure reports near-ties (so the check's assertion can fail)."""
    cfg = sg.ModelConfig(**{**MOE_SMALL.__dict__, "route_gain": 0.0})
    w = sg.dequantized(sg.make_weights(cfg), "q8_0")
    assert sg.routing_margin(w, sg.prompt_ids(cfg, sg.PROMPT), cfg) < sg.ROUTE_MARGIN
