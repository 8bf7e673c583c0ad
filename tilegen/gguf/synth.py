"""A small synthetic llama-architecture GGUF model, and its float64 reference forward pass.

The model is what llama.cpp's own tools load as a "llama" model: a SentencePiece ("llama")
vocabulary, RMS norms, rotary attention with grouped KV heads, a SwiGLU feed-forward, an output
projection. Its weights are random (fixed seed) and its matrices are stored as Q4_0, Q8_0 or F16
(norms F32), so it exercises exactly the matmul kernels a quantised llama model does, at a size
that runs in seconds under qemu.

Every vocabulary entry but the four specials is a single distinct character, so any text the
model generates splits back into its token ids one character at a time (:func:`detokenize_ids`),
and the prompt is tokenised one character per token.

:func:`reference_logits` recomputes the forward pass in float64 from the dequantised weights,
i.e. with the weight rounding the file holds but none of the activation rounding a matmul kernel
does. Differences between two llama.cpp builds (and between a build and this reference) thus come
from the kernels alone.

The output projection carries a permutation "copy" signal (token t makes token ``succ(t)``
likely) on top of random weights, so greedy decoding follows paths with clear margins rather
than near-ties; :func:`greedy_reference` reports each step's top-1/top-2 margin.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

__all__ = ["ModelConfig", "MOE_CONFIG", "TYPES", "PROMPT", "LONG_PROMPT", "ROUTE_MARGIN", "vocabulary",
           "make_weights", "write_gguf", "dequantized", "reference_logits", "greedy_reference",
           "routing_margin", "detokenize_ids", "prompt_ids"]

#: Weight types of the three variants (matrices; norms are always F32).
TYPES = ("q4_0", "q8_0", "f16")

#: Fixed prompt: only characters of the vocabulary (a space is SentencePiece's "▁").
PROMPT = "the quick brown fox jumps over the lazy dog"
#: 133 tokens: a batch of 128+ rows, which ggml's KleidiAI backend may split between an SME
#: and a non-SME kernel
LONG_PROMPT = " ".join([PROMPT] * 3)

_SPACE = "\u2581"
_N_SPECIAL = 4  # <unk>, <s>, </s>, <0x0A>


@dataclass(frozen=True)
class ModelConfig:
    n_vocab: int = 512
    n_embd: int = 256
    n_ff: int = 512
    n_layer: int = 2
    n_head: int = 4
    n_head_kv: int = 2
    n_ctx: int = 256
    rope_base: float = 10000.0
    rms_eps: float = 1e-5
    seed: int = 14
    #: weight of the permutation ("copy") signal and of the random part in output.weight
    copy_gain: float = 20.0
    noise_gain: float = 2.0
    #: rms of what each attention / feed-forward block adds to the residual stream
    block_gain: float = 0.5
    #: mixture of experts (0: the dense feed-forward): ``n_expert`` experts of width ``n_ff``
    #: per layer, ``n_expert_used`` picked per token by the router ``ffn_gate_inp``
    n_expert: int = 0
    n_expert_used: int = 2
    #: amplitude of a token's routing code in its embedding (see :func:`make_weights`)
    route_gain: float = 6.0
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def head_dim(self) -> int:
        return self.n_embd // self.n_head


#: The mixture-of-experts variant: 4 experts of width 256 per layer, 2 used per token.
MOE_CONFIG = ModelConfig(n_ff=256, n_expert=4, n_expert_used=2)

#: The smallest routing margin a MoE model may have: at every position and layer, the gap
#: between the last picked and the first unpicked router logit, over the largest |router
#: logit| of that position. Above 0.02, no perturbation of each router logit by up to 1 % of
#: that scale can change which experts a token picks.
ROUTE_MARGIN = 0.02


def vocabulary(n_vocab: int = 512) -> list[str]:
    """``<unk> <s> </s> <0x0A> ▁ a..z A..Z 0..9`` then Greek, Cyrillic and CJK characters."""
    chars = [_SPACE] + [chr(c) for c in range(ord("a"), ord("z") + 1)] \
        + [chr(c) for c in range(ord("A"), ord("Z") + 1)] + [str(d) for d in range(10)] \
        + [chr(c) for c in range(0x3B1, 0x3CA)] + [chr(c) for c in range(0x430, 0x450)]
    cjk = 0x4E00
    while len(chars) < n_vocab - _N_SPECIAL:
        chars.append(chr(cjk))
        cjk += 1
    return ["<unk>", "<s>", "</s>", "<0x0A>"] + chars[:n_vocab - _N_SPECIAL]


def prompt_ids(cfg: ModelConfig = ModelConfig(), prompt: str = PROMPT) -> list[int]:
    """llama.cpp's tokenisation of ``prompt``: BOS, ``▁`` (the space prefix), one id a char."""
    index = {t: i for i, t in enumerate(vocabulary(cfg.n_vocab))}
    text = _SPACE + prompt.replace(" ", _SPACE)
    return [1] + [index[c] for c in text]


def detokenize_ids(text: str, cfg: ModelConfig = ModelConfig()) -> list[int]:
    """Token ids of text the model generated (each character is one token; " " is ``▁``)."""
    index = {t: i for i, t in enumerate(vocabulary(cfg.n_vocab))}
    index["\n"] = 3
    try:
        return [index[_SPACE if c == " " else c] for c in text]
    except KeyError as e:
        raise ValueError(f"generated text {text!r} has a character outside the vocabulary: "
                         f"{e}") from None


def make_weights(cfg: ModelConfig = ModelConfig()) -> dict[str, np.ndarray]:
    """float32 weights by GGUF tensor name, each (rows = outputs, cols = inputs)."""
    rng = np.random.default_rng(cfg.seed)
    d, f, v, hd = cfg.n_embd, cfg.n_ff, cfg.n_vocab, cfg.head_dim
    kvd = cfg.n_head_kv * hd

    def lin(n_out: int, n_in: int, gain: float = 1.0) -> np.ndarray:
        return (rng.standard_normal((n_out, n_in)) * gain / math.sqrt(n_in)).astype(np.float32)

    def norm(n: int) -> np.ndarray:
        return (1.0 + 0.1 * rng.standard_normal(n)).astype(np.float32)

    w: dict[str, np.ndarray] = {}
    emb = rng.standard_normal((v, d)).astype(np.float32)
    w["token_embd.weight"] = emb
    plain = emb
    if cfg.n_expert:
        plain, emb = _routing_codes(rng, emb, cfg)
        w["token_embd.weight"] = emb
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        w[p + "attn_norm.weight"] = norm(d)
        w[p + "attn_q.weight"] = lin(d, d)
        w[p + "attn_k.weight"] = lin(kvd, d)
        w[p + "attn_v.weight"] = lin(kvd, d)
        w[p + "attn_output.weight"] = lin(d, d, cfg.block_gain)
        w[p + "ffn_norm.weight"] = norm(d)
        if cfg.n_expert:
            e = cfg.n_expert
            # the router reads layer i's code dimensions [i*e, (i+1)*e) (plus a little noise)
            router = lin(e, d, 0.05)
            router[np.arange(e), i * e + np.arange(e)] += 1.0
            w[p + "ffn_gate_inp.weight"] = router
            w[p + "ffn_gate_exps.weight"] = np.stack([lin(f, d) for _ in range(e)])
            w[p + "ffn_up_exps.weight"] = np.stack([lin(f, d) for _ in range(e)])
            w[p + "ffn_down_exps.weight"] = np.stack([lin(d, f, 2.0 * cfg.block_gain)
                                                      for _ in range(e)])
            continue
        w[p + "ffn_gate.weight"] = lin(f, d)
        w[p + "ffn_up.weight"] = lin(f, d)
        w[p + "ffn_down.weight"] = lin(d, f, 2.0 * cfg.block_gain)
    w["output_norm.weight"] = norm(d)
    # token t at the last position makes succ(t) likely: row succ(t) of output.weight is
    # aligned with t's embedding. The special tokens' rows are zero (their logit stays 0, far
    # below the winners), so greedy decoding never emits <unk>, <s>, </s> or a newline.
    succ = rng.permutation(np.arange(_N_SPECIAL, v))
    out = lin(v, d, cfg.noise_gain)
    out[succ] += plain[_N_SPECIAL:] * (cfg.copy_gain / d)
    out[:_N_SPECIAL] = 0.0
    w["output.weight"] = out
    return w


def _routing_codes(rng, emb: np.ndarray, cfg: ModelConfig) -> tuple[np.ndarray, np.ndarray]:
    """(embedding without codes, embedding with codes) of a MoE model.

    Each token gets, per layer i, ``n_expert_used`` distinct experts (random, fixed seed) and
    its embedding ``route_gain`` on those experts' code dimensions ``i*n_expert + e`` (which it
    otherwise has zeroed). Layer i's router reads these dimensions, so a token's router logits
    are ~``route_gain`` (after the norm) for its experts and ~0 for the others: the picks are
    far from ties whatever the attention and the earlier layers add. The copy signal of
    output.weight uses the embedding without the codes, so tokens sharing experts do not
    raise each other's successors.
    """
    e, used = cfg.n_expert, cfg.n_expert_used
    if not 0 < used < e or cfg.n_layer * e > cfg.n_embd:
        raise ValueError(f"MoE config: need 0 < n_expert_used < n_expert and "
                         f"n_layer * n_expert <= n_embd, got {used}, {e}, {cfg.n_layer}, {cfg.n_embd}")
    plain = emb.copy()
    plain[:, :cfg.n_layer * e] = 0.0
    coded = plain.copy()
    for i in range(cfg.n_layer):
        for t in range(cfg.n_vocab):
            coded[t, i * e + rng.choice(e, used, replace=False)] = cfg.route_gain
    return plain, coded


def _qtype(gguf, name: str):
    T = gguf.GGMLQuantizationType
    return {"q4_0": T.Q4_0, "q8_0": T.Q8_0, "f16": T.F16, "f32": T.F32}[name]


def _stored(gguf, name: str, a: np.ndarray, wtype: str):
    """(array to write, raw dtype or None) of tensor ``name`` in a ``wtype`` model."""
    if a.ndim == 1 or name.endswith("ffn_gate_inp.weight"):   # llama-quantize keeps routers F32
        return a.astype(np.float32), None
    if wtype == "f16":
        return a.astype(np.float16), None
    q = gguf.quants.quantize(a.astype(np.float32), _qtype(gguf, wtype))
    return q, _qtype(gguf, wtype)


def dequantized(weights: dict[str, np.ndarray], wtype: str) -> dict[str, np.ndarray]:
    """The weights as a ``wtype`` file holds them, back in float64 (the reference's weights)."""
    import gguf
    out = {}
    for name, a in weights.items():
        data, raw = _stored(gguf, name, a, wtype)
        if raw is None:
            out[name] = data.astype(np.float64)
        else:
            out[name] = gguf.quants.dequantize(data, raw).astype(np.float64).reshape(a.shape)
    return out


def write_gguf(path: str | Path, wtype: str, cfg: ModelConfig = ModelConfig()) -> Path:
    """Write the ``wtype`` (q4_0, q8_0 or f16) variant of the model to ``path``."""
    import gguf
    if wtype not in TYPES:
        raise ValueError(f"unknown weight type {wtype!r}; choose from {', '.join(TYPES)}")
    path = Path(path)
    weights = make_weights(cfg)
    wr = gguf.GGUFWriter(str(path), "llama")
    wr.add_name(f"tilegen-synthetic-{'moe-' if cfg.n_expert else ''}{wtype}")
    wr.add_context_length(cfg.n_ctx)
    wr.add_embedding_length(cfg.n_embd)
    wr.add_block_count(cfg.n_layer)
    wr.add_feed_forward_length(cfg.n_ff)
    wr.add_head_count(cfg.n_head)
    wr.add_head_count_kv(cfg.n_head_kv)
    wr.add_rope_dimension_count(cfg.head_dim)
    wr.add_rope_freq_base(cfg.rope_base)
    wr.add_layer_norm_rms_eps(cfg.rms_eps)
    wr.add_vocab_size(cfg.n_vocab)
    if cfg.n_expert:
        wr.add_expert_count(cfg.n_expert)
        wr.add_expert_used_count(cfg.n_expert_used)
    wr.add_file_type({"q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
                      "q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
                      "f16": gguf.LlamaFileType.MOSTLY_F16}[wtype])
    vocab = vocabulary(cfg.n_vocab)
    TT = gguf.TokenType
    types = [TT.UNKNOWN, TT.CONTROL, TT.CONTROL, TT.BYTE] + [TT.NORMAL] * (len(vocab) - 4)
    wr.add_tokenizer_model("llama")
    wr.add_token_list(vocab)
    wr.add_token_scores([0.0] * 4 + [-float(i) for i in range(len(vocab) - 4)])
    wr.add_token_types(types)
    wr.add_bos_token_id(1)
    wr.add_eos_token_id(2)
    wr.add_unk_token_id(0)
    wr.add_add_bos_token(True)
    wr.add_add_eos_token(False)
    wr.add_add_space_prefix(True)
    for name, a in weights.items():
        data, raw = _stored(gguf, name, a, wtype)
        wr.add_tensor(name, data, raw_dtype=raw)
    wr.write_header_to_file()
    wr.write_kv_data_to_file()
    wr.write_tensors_to_file()
    wr.close()
    return path


# ---------------------------------------------------------------------------------------------
# float64 reference forward pass (llama.cpp's LLM_ARCH_LLAMA graph)

def _rms(x: np.ndarray, w: np.ndarray, eps: float) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def _rope(x: np.ndarray, base: float) -> np.ndarray:
    """ggml's "normal" rope (mode 0, llama): rotate the pairs (x[2i], x[2i+1]) of each head."""
    n, _, hd = x.shape
    pos = np.arange(n, dtype=np.float64)[:, None]
    theta = pos * base ** (-np.arange(0, hd, 2, dtype=np.float64) / hd)[None, :]
    c, s = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    x0, x1 = x[..., 0::2], x[..., 1::2]
    out = np.empty_like(x)
    out[..., 0::2] = x0 * c - x1 * s
    out[..., 1::2] = x0 * s + x1 * c
    return out


def _silu(g: np.ndarray) -> np.ndarray:
    return g / (1 + np.exp(-g))


def _moe(w: dict[str, np.ndarray], p: str, h: np.ndarray, cfg: ModelConfig,
         routes: list | None) -> np.ndarray:
    """llama.cpp's build_moe_ffn for LLM_ARCH_LLAMA: softmax over the router logits, the top
    ``n_expert_used`` experts, their probabilities normalised to sum 1 (clamped below at
    6.103515625e-5), no scale; each picked expert's SwiGLU weighted and summed."""
    logits = h @ w[p + "ffn_gate_inp.weight"].T                       # (n, n_expert)
    if routes is not None:
        routes.append(logits)
    probs = np.exp(logits - logits.max(axis=1, keepdims=True))
    probs /= probs.sum(axis=1, keepdims=True)
    pick = np.argsort(-probs, axis=1, kind="stable")[:, :cfg.n_expert_used]
    wts = np.take_along_axis(probs, pick, axis=1)
    wts /= np.maximum(wts.sum(axis=1, keepdims=True), 6.103515625e-5)
    out = np.zeros_like(h)
    gate, up, down = (w[p + f"ffn_{x}_exps.weight"] for x in ("gate", "up", "down"))
    for t in range(h.shape[0]):
        for e, wt in zip(pick[t], wts[t]):
            out[t] += wt * (down[e] @ (_silu(gate[e] @ h[t]) * (up[e] @ h[t])))
    return out


def reference_logits(w: dict[str, np.ndarray], ids: list[int],
                     cfg: ModelConfig = ModelConfig(), routes: list | None = None) -> np.ndarray:
    """float64 logits (len(ids) x n_vocab) of the weights ``w`` (e.g. :func:`dequantized`).
    A MoE model appends each layer's router logits (len(ids) x n_expert) to ``routes``."""
    hd, nh, nkv = cfg.head_dim, cfg.n_head, cfg.n_head_kv
    n = len(ids)
    x = w["token_embd.weight"][ids].astype(np.float64)
    mask = np.triu(np.full((n, n), -np.inf), 1)
    for i in range(cfg.n_layer):
        p = f"blk.{i}."
        h = _rms(x, w[p + "attn_norm.weight"], cfg.rms_eps)
        q = _rope((h @ w[p + "attn_q.weight"].T).reshape(n, nh, hd), cfg.rope_base)
        k = _rope((h @ w[p + "attn_k.weight"].T).reshape(n, nkv, hd), cfg.rope_base)
        v = (h @ w[p + "attn_v.weight"].T).reshape(n, nkv, hd)
        att = np.empty((n, nh, hd))
        for hh in range(nh):
            kv = hh // (nh // nkv)
            s = q[:, hh] @ k[:, kv].T / math.sqrt(hd) + mask
            s = np.exp(s - s.max(axis=1, keepdims=True))
            att[:, hh] = (s / s.sum(axis=1, keepdims=True)) @ v[:, kv]
        x = x + att.reshape(n, nh * hd) @ w[p + "attn_output.weight"].T
        h = _rms(x, w[p + "ffn_norm.weight"], cfg.rms_eps)
        if cfg.n_expert:
            x = x + _moe(w, p, h, cfg, routes)
            continue
        g = h @ w[p + "ffn_gate.weight"].T
        x = x + ((g / (1 + np.exp(-g))) * (h @ w[p + "ffn_up.weight"].T)) @ w[p + "ffn_down.weight"].T
    return _rms(x, w["output_norm.weight"], cfg.rms_eps) @ w["output.weight"].T


def greedy_reference(w: dict[str, np.ndarray], ids: list[int], steps: int,
                     cfg: ModelConfig = ModelConfig()) -> tuple[list[int], list[float], np.ndarray]:
    """(greedy tokens, top-1 minus top-2 logit at each step, last prompt position's logits)."""
    seq = list(ids)
    toks, margins = [], []
    last = None
    for _ in range(steps):
        lg = reference_logits(w, seq, cfg)[-1]
        if last is None:
            last = lg
        top2 = np.argsort(lg)[-2:]
        toks.append(int(top2[1]))
        margins.append(float(lg[top2[1]] - lg[top2[0]]))
        seq.append(int(top2[1]))
    assert last is not None
    return toks, margins, last


def routing_margin(w: dict[str, np.ndarray], ids: list[int], cfg: ModelConfig) -> float:
    """The smallest routing margin of a MoE model over every position of ``ids`` and every
    layer: (last picked - first unpicked router logit) / max |router logit| of the position
    (compare with :data:`ROUTE_MARGIN`)."""
    routes: list[np.ndarray] = []
    reference_logits(w, ids, cfg, routes)
    k = cfg.n_expert_used
    worst = math.inf
    for lg in routes:
        s = -np.sort(-lg, axis=1)
        worst = min(worst, float(np.min((s[:, k - 1] - s[:, k]) / np.max(np.abs(lg), axis=1))))
    return worst
