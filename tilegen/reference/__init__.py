"""Numpy references of the kernels' arithmetic: `f32` (exact binary32 FMA chains), `q4`, `q8`,
`bf16` and `kquant` (bit-exact models of the generated kernels, float64 products)."""
