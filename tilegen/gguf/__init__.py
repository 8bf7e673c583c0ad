"""GGUF files: weight tensors read as packed weights (`tensors`: `load_tensor`, `tensor_names`)
and the synthetic llama models of the llama.cpp check (`synth`).

``tilegen.gguf.load_tensor`` and ``tensor_names`` are imported on first use, so that
``tilegen.gguf.synth`` does not load the runtime."""
from __future__ import annotations

__all__ = ["load_tensor", "tensor_names"]


def __getattr__(name: str):
    if name in __all__:
        from . import tensors
        return getattr(tensors, name)
    raise AttributeError(f"module 'tilegen.gguf' has no attribute {name!r}")
