"""Models of the generated kernels: llvm-mca (`mca`), the SME static instruction mix (`sme`),
the tile search (`tune`) and its charts (`plot`)."""
