/* Freestanding C client of a tilegen library: drives an f32 and a q4_0 kernel through the
 * generated header's KleidiAI-style interface structs.  Exit code 0 = all checks passed. */
#include "tilegen_kernels.h"

#define F32 matmul_clamp_f32_f32_f32p16x1b_6x16_neon_mla_ukernel

enum { M = 7, N = 20, K = 5 };
static float lhs[M * K], bias[N], w[N * K], dst[M * N + 8];
static float packed[64 * 1024];

static int check(void) {
    const struct tilegen_f32_ukernel *uk = &F32;
    if (uk->get_m_step() != 6 || uk->get_n_step() != 16 || uk->get_nr() != 16) return 10;
    if (uk->get_kr() != 1 || uk->get_sr() != 1) return 11;
    if (uk->get_lhs_offset(3, 4 * K) != 3 * 4 * K) return 12;
    if (uk->get_dst_offset(2, 4, 4 * N) != 2 * 4 * N + 16 || uk->get_dst_size(M, N) != 4 * M * N)
        return 13;
    for (int i = 0; i < M * K; i++) lhs[i] = (float)((i * 7) % 11) - 5.0f;
    for (int j = 0; j < N; j++) bias[j] = 0.5f * (float)j - 3.0f;
    for (int i = 0; i < N * K; i++) w[i] = (float)((i * 5) % 9) * 0.25f - 1.0f;
    /* pack f32p16x1b with the getters: per panel of nr columns, nr bias then K rows */
    size_t nr = uk->get_nr();
    for (size_t j0 = 0; j0 < N; j0 += nr) {
        float *p = (float *)((char *)packed + uk->get_rhs_packed_offset(j0, K));
        for (size_t c = 0; c < nr; c++) p[c] = j0 + c < N ? bias[j0 + c] : 0.0f;
        for (size_t t = 0; t < K; t++)
            for (size_t c = 0; c < nr; c++)
                p[nr * (1 + t) + c] = j0 + c < N ? w[(j0 + c) * K + t] : 0.0f;
    }
    dst[M * N] = 12345.0f;
    uk->run_matmul(M, N, K, lhs, 4 * K, packed, dst, 4 * N, 4, -1e30f, 1e30f);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            float a = bias[j];
            for (int t = 0; t < K; t++) a = __builtin_fmaf(lhs[i * K + t], w[j * K + t], a);
            if (a != dst[i * N + j]) return 20;
        }
    if (dst[M * N] != 12345.0f) return 21;     /* nothing written past the m x n window */
    /* q4_0 (llama.cpp's i8mm gemm): geometry getters against the packed formats */
    const struct tilegen_q4_0_ukernel *q = &matmul_clamp_f32_qsi8d32p4x8_qsi4c32p4x8_16x4_neon_i8mm_ukernel;
    if (q->get_m_step() != 16 || q->get_mr() != 4 || q->get_kr() != 16 || q->get_sr() != 2) return 30;
    if (q->get_lhs_packed_offset(4, 96, 32) != 4 * 3 * 34) return 31;
    if (q->get_rhs_packed_offset(8, 96, 32) != 2 * 4 * 3 * 18) return 32;
    return 0;
}

void _start(void) {
    long rc = check();
    __asm__ volatile("mov x0, %0\n\tmov x8, #93\n\tsvc #0" : : "r"(rc) : "x0", "x8", "memory");
    for (;;) {}
}
