// bench/moe_overhead.py's ggml side: one GGML_OP_MUL_MAT_ID on weights in ggml's CPU_REPACK
// buffer (ggml's own repack path, as the llama check's OFF build runs it), computed by the CPU
// backend with one thread, linked against that build's static ggml libraries.
// usage: moe_overhead_ggml IN
//   IN: int64 type (ggml_type), k, n, n_as, n_ids, n_tokens, src1_rows; the weights' ggml
//       blocks [n_as][n][row bytes]; f32 src1 [n_tokens][src1_rows][k]; int32 ids [n_tokens][n_ids]
// It computes a one-node graph of a tiny ggml_add first (the cost of a graph compute of its own,
// the framework), then the MUL_MAT_ID graph twice (the first warms up); mmid_mark(0)/(1)
// bracket the framework graph, mmid_mark(2)/(3) the second MUL_MAT_ID compute. With MMID_MAPS
// set, it prints each loaded object's load address (map NAME ADDRESS) to stderr, then
// waits for a line on stdin.
#include <link.h>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ggml.h"
#include "ggml-alloc.h"
#include "ggml-backend.h"
#include "ggml-cpu.h"

extern "C" __attribute__((noinline)) void mmid_mark(int phase) {
    asm volatile("" : : "r"(phase) : "memory");
}

static int print_map(struct dl_phdr_info * info, size_t, void *) {
    fprintf(stderr, "map %s 0x%lx\n", info->dlpi_name, (unsigned long) info->dlpi_addr);
    return 0;
}

static void fail(const char * what) {
    fprintf(stderr, "moe_overhead_ggml: %s\n", what);
    exit(2);
}

static void read_exact(FILE * f, void * p, size_t n) {
    if (fread(p, 1, n, f) != n) {
        fail("short input");
    }
}

int main(int argc, char ** argv) {
    if (argc != 2) {
        fail("usage: moe_overhead_ggml IN");
    }
    FILE * in = fopen(argv[1], "rb");
    if (!in) {
        fail("cannot open the input");
    }
    int64_t h[7];
    read_exact(in, h, sizeof h);
    const ggml_type type = (ggml_type) h[0];
    const int64_t k = h[1], n = h[2], n_as = h[3], n_ids = h[4], n_tokens = h[5], src1_rows = h[6];
    std::vector<uint8_t> raw((size_t) n_as * n * ggml_row_size(type, k));
    read_exact(in, raw.data(), raw.size());
    std::vector<float> x((size_t) (n_tokens * src1_rows * k));
    read_exact(in, x.data(), x.size() * sizeof(float));
    std::vector<int32_t> ids((size_t) (n_tokens * n_ids));
    read_exact(in, ids.data(), ids.size() * sizeof(int32_t));
    fclose(in);

    ggml_backend_t backend = ggml_backend_cpu_init();
    ggml_backend_cpu_set_n_threads(backend, 1);
    ggml_backend_reg_t reg = ggml_backend_cpu_reg();
    auto get_extra = (ggml_backend_dev_get_extra_bufts_t) ggml_backend_reg_get_proc_address(
        reg, "ggml_backend_dev_get_extra_bufts");
    ggml_backend_buffer_type_t repack = nullptr;
    for (ggml_backend_buffer_type_t * b = get_extra ? get_extra(ggml_backend_reg_dev_get(reg, 0)) : nullptr;
         b && *b; ++b) {
        if (strcmp(ggml_backend_buft_name(*b), "CPU_REPACK") == 0) {
            repack = *b;
        }
    }
    if (!repack) {
        fail("this ggml has no CPU_REPACK buffer type");
    }

    ggml_init_params wp = { 4 * ggml_tensor_overhead(), nullptr, true };
    ggml_context * wctx = ggml_init(wp);
    ggml_tensor * as = ggml_new_tensor_3d(wctx, type, k, n, n_as);
    ggml_backend_buffer_t wbuf = ggml_backend_alloc_ctx_tensors_from_buft(wctx, repack);
    if (!wbuf) {
        fail("cannot allocate the weights in CPU_REPACK");
    }
    ggml_backend_tensor_set(as, raw.data(), 0, raw.size());     // ggml's repack, once

    ggml_init_params gp = { 16 * ggml_tensor_overhead() + 2 * ggml_graph_overhead(), nullptr, true };
    ggml_context * ctx = ggml_init(gp);
    ggml_tensor * b   = ggml_new_tensor_3d(ctx, GGML_TYPE_F32, k, src1_rows, n_tokens);
    ggml_tensor * sel = ggml_new_tensor_2d(ctx, GGML_TYPE_I32, n_ids, n_tokens);
    ggml_tensor * out = ggml_mul_mat_id(ctx, as, b, sel);
    ggml_tensor * one = ggml_new_tensor_1d(ctx, GGML_TYPE_F32, 1);
    ggml_tensor * tiny = ggml_add(ctx, one, one);
    ggml_cgraph * g = ggml_new_graph(ctx);
    ggml_build_forward_expand(g, out);
    ggml_cgraph * g0 = ggml_new_graph(ctx);
    ggml_build_forward_expand(g0, tiny);
    ggml_backend_buffer_t buf = ggml_backend_alloc_ctx_tensors(ctx, backend);
    if (!buf) {
        fail("cannot allocate the activations");
    }
    ggml_backend_tensor_set(b, x.data(), 0, x.size() * sizeof(float));
    ggml_backend_tensor_set(sel, ids.data(), 0, ids.size() * sizeof(int32_t));
    const float v = 1.0f;
    ggml_backend_tensor_set(one, &v, 0, sizeof v);
    if (getenv("MMID_MAPS")) {
        dl_iterate_phdr(print_map, nullptr);
        fprintf(stderr, "maps end\n");
        getchar();      // the counter resolves the marks' address before they run
    }

    ggml_backend_graph_compute(backend, g0);
    mmid_mark(0);
    ggml_backend_graph_compute(backend, g0);
    mmid_mark(1);
    ggml_backend_graph_compute(backend, g);
    mmid_mark(2);
    ggml_backend_graph_compute(backend, g);
    mmid_mark(3);

    std::vector<float> y((size_t) ggml_nelements(out));
    ggml_backend_tensor_get(out, y.data(), 0, y.size() * sizeof(float));
    double sum = 0;
    for (float f : y) {
        sum += f;
    }
    printf("%lld rows, checksum %.6g\n", (long long) (n_tokens * n_ids), sum);
    ggml_backend_buffer_free(buf);
    ggml_backend_buffer_free(wbuf);
    ggml_free(ctx);
    ggml_free(wctx);
    ggml_backend_free(backend);
    return 0;
}
