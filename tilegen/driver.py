"""The plan driver: freestanding C, built into every library (``tilegen_driver.c``), that runs a
prepared matmul (:mod:`tilegen.runtime.plan`) with one native call per thread.

A *plan* (``struct tg_plan``) holds everything a matmul of one shape needs, filled once by the
Python runtime: kernel and packer function pointers, m/n/k/bl, the packed weights, the
workspace, the per-thread tasks (LHS rows to pack, columns to compute, their byte offsets),
the clamp, an optional bias added after the kernel, the activation limit of quantised formats.
Per call only the x and out pointers change.

Work, as :func:`tilegen.runtime.ops._run` splits it: *pack* tasks (LHS rows in multiples of
m_step into the shared workspace), then, once every pack task is done, *mm* tasks (columns in
multiples of n_step, all rows).  When the LHS is one row block (m <= m_step) each mm task packs
the whole LHS into its own workspace instead (``private_pack``): no wait between the phases.
Tasks are claimed with an atomic counter by whoever takes part in the run, so a run finishes
with any number of participants (the caller alone included) and every output element is
computed by exactly one kernel call with the same inputs: results do not depend on threads.

Threads: ``tg_pool`` is a persistent pool of worker threads.  They are Python threads started
by the runtime, each blocked in one native call (``tilegen_pool_worker``) for its lifetime,
without the GIL.  A run publishes the plan (a generation counter; idle workers spin for
``spin`` iterations, then sleep on a futex, Linux only), the caller takes part itself, then
waits until every mm task is done and no worker still looks at the plan.  A pool in use by
another run is not waited for: the caller then runs every task itself.

The struct layouts are defined once, here (:data:`PLAN_FIELDS` ...), for both the C source and
the ctypes mirror, and checked at load (``tilegen_driver_abi`` returns :data:`ABI` and the
struct sizes).
"""
from __future__ import annotations

__all__ = ["ABI", "PLAN_FIELDS", "POOL_FIELDS", "PACK_FIELDS", "MM_FIELDS", "source",
           "ST_OK", "ST_LIMIT", "ST_SLOW", "ST_BUSY", "K_F32", "K_Q4", "K_Q8",
           "P_NONE", "P_QSI8D32P", "P_ROWS", "P_GIVEN", "C_FLAGS"]

ABI = 1

# run status
ST_OK, ST_LIMIT, ST_SLOW, ST_BUSY = 0, 1, 2, 3
# kernel argument lists: f32 (lhs_stride), q4 (bl), q8_0 and bf16 (neither)
K_F32, K_Q4, K_Q8 = 0, 1, 2
# LHS: f32 rows as they are; packed by a qsi8d32p packer (bl argument); by a qai8dxp or
# bf16px4 packer (no bl); packed by the caller into the workspace before the run
P_NONE, P_QSI8D32P, P_ROWS, P_GIVEN = 0, 1, 2, 3

# (name, type): u64, u32, f32, f64, ptr
PACK_FIELDS = (("m0", "u64"), ("m1", "u64"), ("lhs_off", "u64"))
MM_FIELDS = (("n0", "u64"), ("n1", "u64"), ("rhs_off", "u64"), ("ws_off", "u64"))
PLAN_FIELDS = (
    ("abi", "u64"), ("m", "u64"), ("n", "u64"), ("k", "u64"), ("bl", "u64"),
    ("kern_args", "u64"), ("pack_args", "u64"), ("private_pack", "u64"), ("check", "u64"),
    ("post_clamp", "u64"), ("fast", "u64"), ("pmr", "u64"), ("pkr", "u64"), ("psr", "u64"),
    ("kernel", "ptr"), ("packer", "ptr"), ("rhs", "ptr"), ("rhs_size", "u64"),
    ("npack", "u64"), ("nmm", "u64"), ("pack", "ptr"), ("mm", "ptr"), ("ws", "ptr"),
    ("bias", "ptr"), ("pool", "ptr"), ("spin", "u64"), ("limit", "f64"),
    ("cmin", "f32"), ("cmax", "f32"), ("post_min", "f32"), ("post_max", "f32"),
    # the fast call reads numpy's array objects: type, float32 descr and field offsets
    ("nd_type", "ptr"), ("f32_descr", "ptr"), ("off_type", "u64"), ("off_data", "u64"),
    ("off_nd", "u64"), ("off_dims", "u64"), ("off_descr", "u64"), ("off_flags", "u64"),
    # per call
    ("x", "ptr"), ("out", "ptr"),
    ("busy", "u32"), ("status", "u32"), ("next_pack", "u32"), ("next_mm", "u32"),
    ("packed", "u32"), ("computed", "u32"), ("waiters", "u32"),
    ("by_workers", "u32"),      # mm tasks pool workers ran, over all runs (diagnostics)
)
POOL_FIELDS = (
    ("gen", "u32"), ("sleepers", "u32"), ("busy", "u32"), ("active", "u32"), ("stop", "u32"),
    ("nworkers", "u32"), ("spin", "u64"), ("plan", "ptr"),
)

# numpy array flags the fast call needs (NPY_ARRAY_C_CONTIGUOUS, _ALIGNED, _WRITEABLE)
C_FLAGS = {"contiguous": 0x1, "aligned": 0x100, "writeable": 0x400}

_C_TYPES = {"u64": "u64", "u32": "u32", "f32": "float", "f64": "double", "ptr": "void *"}


def _struct(name: str, fields) -> str:
    body = "\n".join(f"    {_C_TYPES[t]} {n};" for n, t in fields)
    return f"struct {name} {{\n{body}\n}};"


_BODY = r"""
#define SEQ __ATOMIC_SEQ_CST
#define LD(p) __atomic_load_n((p), SEQ)
#define ST(p, v) __atomic_store_n((p), (v), SEQ)
#define ADD(p, v) __atomic_add_fetch((p), (v), SEQ)
#define SUB(p, v) __atomic_sub_fetch((p), (v), SEQ)

typedef void (*f32_fn)(size_t, size_t, size_t, const void *, size_t, const void *, void *,
                       size_t, size_t, float, float);
typedef void (*q4_fn)(size_t, size_t, size_t, size_t, const void *, const void *, void *,
                      size_t, size_t, float, float);
typedef void (*q8_fn)(size_t, size_t, size_t, const void *, const void *, void *, size_t,
                      size_t, float, float);
typedef void (*pk_bl_fn)(size_t, size_t, size_t, size_t, size_t, size_t, size_t, const void *,
                         size_t, void *);
typedef void (*pk_fn)(size_t, size_t, size_t, size_t, size_t, size_t, const void *, size_t,
                      void *);

static inline void relax(void) { __asm__ volatile("yield" ::: "memory"); }

#if defined(__linux__)
static long futex(u32 *addr, long op, u32 val)
{
    register long x0 __asm__("x0") = (long)addr;
    register long x1 __asm__("x1") = op;
    register long x2 __asm__("x2") = (long)val;
    register long x3 __asm__("x3") = 0;
    register long x8 __asm__("x8") = 98;          /* __NR_futex */
    __asm__ volatile("svc #0" : "+r"(x0) : "r"(x1), "r"(x2), "r"(x3), "r"(x8) : "memory", "cc");
    return x0;
}
#define FUTEX_WAIT_PRIVATE 128
#define FUTEX_WAKE_PRIVATE 129
static void sleep_on(u32 *addr, u32 seen) { futex(addr, FUTEX_WAIT_PRIVATE, seen); }
static void wake(u32 *addr, u32 count) { futex(addr, FUTEX_WAKE_PRIVATE, count); }
#define HAVE_FUTEX 1
#else      /* no futex: waits spin (the runtime starts no pool here) */
static void sleep_on(u32 *addr, u32 seen) { (void)addr; (void)seen; relax(); }
static void wake(u32 *addr, u32 count) { (void)addr; (void)count; }
#define HAVE_FUTEX 0
#endif

static inline float fmax_(float a, float b)
{ float r; __asm__("fmax %s0, %s1, %s2" : "=w"(r) : "w"(a), "w"(b)); return r; }
static inline float fmin_(float a, float b)
{ float r; __asm__("fmin %s0, %s1, %s2" : "=w"(r) : "w"(a), "w"(b)); return r; }

/* wait until *word >= target: spin, then sleep (woken by the last increment) */
static void wait_ge(struct tg_plan *p, u32 *word, u32 target)
{
    u32 v;
    u64 s = 0;
    while ((v = LD(word)) < target) {
        if (++s < p->spin) { relax(); continue; }
        ADD(&p->waiters, 1);
        while ((v = LD(word)) < target)
            sleep_on(word, v);
        SUB(&p->waiters, 1);
        return;
    }
}

static void bump(struct tg_plan *p, u32 *word, u32 target)
{
    if (ADD(word, 1) == target && LD(&p->waiters))
        wake(word, 0x7fffffff);
}

/* every |x| <= limit (a NaN fails) */
static int scan_ok(const float *x, u64 count, double limit)
{
    u64 i = 0;
    for (; i + 32 <= count; i += 32) {
        int bad = 0;
        for (int j = 0; j < 32; j++)
            bad |= !((double)__builtin_fabsf(x[i + j]) <= limit);
        if (bad)
            return 0;
    }
    for (; i < count; i++)
        if (!((double)__builtin_fabsf(x[i]) <= limit))
            return 0;
    return 1;
}

static void pack_rows(const struct tg_plan *p, u64 m0, u64 m1, char *dst)
{
    u64 xs = 4 * p->k;
    const char *src = (const char *)p->x + m0 * xs;
    if (p->pack_args == P_QSI8D32P)
        ((pk_bl_fn)p->packer)(m1 - m0, p->k, p->bl, p->pmr, p->pkr, p->psr, 0, src, xs, dst);
    else
        ((pk_fn)p->packer)(m1 - m0, p->k, p->pmr, p->pkr, p->psr, 0, src, xs, dst);
}

static void do_pack(struct tg_plan *p, const struct tg_pack *t)
{
    if (p->check && !scan_ok((const float *)p->x + t->m0 * p->k, (t->m1 - t->m0) * p->k,
                             p->limit)) {
        __atomic_or_fetch(&p->status, ST_LIMIT, SEQ);
        return;
    }
    pack_rows(p, t->m0, t->m1, (char *)p->ws + t->lhs_off);
}

static void do_mm(struct tg_plan *p, const struct tg_mm *t)
{
    u64 m = p->m, k = p->k, nn = t->n1 - t->n0;
    const void *lhs;
    if (p->private_pack) {
        char *ws = (char *)p->ws + t->ws_off;
        if (p->check && !scan_ok((const float *)p->x, m * k, p->limit)) {
            __atomic_or_fetch(&p->status, ST_LIMIT, SEQ);
            return;
        }
        pack_rows(p, 0, m, ws);
        lhs = ws;
    } else {
        lhs = p->pack_args == P_NONE ? p->x : p->ws;
    }
    float *dst = (float *)p->out + t->n0;
    u64 ds = m == 1 ? 4 * nn : 4 * p->n;      /* as the binding passes row_stride(dst) */
    const char *rhs = (const char *)p->rhs + t->rhs_off;
    if (p->kern_args == K_F32)
        ((f32_fn)p->kernel)(m, nn, k, lhs, 4 * k, rhs, dst, ds, 4, p->cmin, p->cmax);
    else if (p->kern_args == K_Q4)
        ((q4_fn)p->kernel)(m, nn, k, p->bl, lhs, rhs, dst, ds, 4, p->cmin, p->cmax);
    else
        ((q8_fn)p->kernel)(m, nn, k, lhs, rhs, dst, ds, 4, p->cmin, p->cmax);
    if (p->bias) {     /* numpy's dst += bias, then minimum(maximum(dst, lo), hi) */
        const float *b = (const float *)p->bias + t->n0;
        for (u64 r = 0; r < m; r++) {
            float *row = (float *)p->out + r * p->n + t->n0;
            for (u64 c = 0; c < nn; c++) {
                float v = row[c] + b[c];
                if (p->post_clamp)
                    v = fmin_(fmax_(v, p->post_min), p->post_max);
                row[c] = v;
            }
        }
    }
}

static void participate(struct tg_plan *p, int worker)
{
    const struct tg_pack *pack = (const struct tg_pack *)p->pack;
    const struct tg_mm *mm = (const struct tg_mm *)p->mm;
    u32 i;
    while ((i = ADD(&p->next_pack, 1) - 1) < p->npack) {
        do_pack(p, &pack[i]);
        bump(p, &p->packed, (u32)p->npack);
    }
    while ((i = ADD(&p->next_mm, 1) - 1) < p->nmm) {
        if (p->npack)
            wait_ge(p, &p->packed, (u32)p->npack);
        if (!LD(&p->status))
            do_mm(p, &mm[i]);
        if (worker)
            ADD(&p->by_workers, 1);
        bump(p, &p->computed, (u32)p->nmm);
    }
}

static u32 run(struct tg_plan *p, const void *x, void *out)
{
    u32 idle = 0;
    if (!__atomic_compare_exchange_n(&p->busy, &idle, 1, 0, SEQ, SEQ))
        return ST_BUSY;
    p->x = (void *)x;
    p->out = out;
    ST(&p->status, 0); ST(&p->next_pack, 0); ST(&p->next_mm, 0);
    ST(&p->packed, 0); ST(&p->computed, 0);
    struct tg_pool *pool = (struct tg_pool *)p->pool;
    u64 tasks = p->npack > p->nmm ? p->npack : p->nmm;
    int pooled = 0;
    if (pool && tasks > 1 && LD(&pool->nworkers)) {
        u32 free_ = 0;
        pooled = __atomic_compare_exchange_n(&pool->busy, &free_, 1, 0, SEQ, SEQ);
    }
    if (pooled) {
        ST(&pool->plan, (void *)p);
        ADD(&pool->gen, 1);
        if (LD(&pool->sleepers))
            wake(&pool->gen, (u32)(tasks - 1));
    }
    participate(p, 0);
    wait_ge(p, &p->computed, (u32)p->nmm);
    if (pooled) {
        ST(&pool->plan, (void *)0);
        while (LD(&pool->active))
            relax();
        ST(&pool->busy, 0);
    }
    u32 st = LD(&p->status);
    ST(&p->busy, 0);
    return st;
}

/* the plan on explicit pointers (x: contiguous rows; out: contiguous m x n) */
u32 tilegen_plan_run(struct tg_plan *p, const void *x, void *out) { return run(p, x, out); }

static int array_ok(const struct tg_plan *p, const char *a, u64 rows, u64 cols, long need)
{
    if (*(void *const *)(a + p->off_type) != p->nd_type)   /* any object has its type */
        return 0;                                           /* the rest: ndarray fields */
    const long *dims = *(const long *const *)(a + p->off_dims);
    return *(void *const *)(a + p->off_descr) == p->f32_descr
        && *(const int *)(a + p->off_nd) == 2 && (u64)dims[0] == rows && (u64)dims[1] == cols
        && (*(const int *)(a + p->off_flags) & need) == need;
}

/* the plan on two numpy arrays (PyObject pointers): x (m, k) and out (m, n), both exactly
   numpy.ndarray of float32, C-contiguous and aligned, out writeable, no overlap of out with x
   or the weights; anything else is ST_SLOW (the runtime checks and runs it) */
u32 tilegen_plan_call(struct tg_plan *p, const void *xo, void *oo)
{
    const char *xa = xo, *oa = oo;
    if (!p->fast || !array_ok(p, xa, p->m, p->k, 0x101) || !array_ok(p, oa, p->m, p->n, 0x501))
        return ST_SLOW;
    const char *x = *(char *const *)(xa + p->off_data);
    char *out = *(char *const *)(oa + p->off_data);
    u64 xb = 4 * p->m * p->k, ob = 4 * p->m * p->n;
    if ((x < out + ob && out < x + xb) ||
        (out < (const char *)p->rhs + p->rhs_size && (const char *)p->rhs < out + ob))
        return ST_SLOW;
    return run(p, x, out);
}

/* a pool worker: takes part in every run published on the pool until stop */
void tilegen_pool_worker(struct tg_pool *pool)
{
    u32 seen = LD(&pool->gen);
    for (;;) {
        u32 g;
        u64 s = 0;
        while ((g = LD(&pool->gen)) == seen) {
            if (LD(&pool->stop))
                return;
            if (++s < pool->spin || !HAVE_FUTEX) { relax(); continue; }
            ADD(&pool->sleepers, 1);
            sleep_on(&pool->gen, seen);
            SUB(&pool->sleepers, 1);
            s = 0;
        }
        seen = g;
        if (LD(&pool->stop))
            return;
        ADD(&pool->active, 1);
        struct tg_plan *p = (struct tg_plan *)LD(&pool->plan);
        if (p)
            participate(p, 1);
        SUB(&pool->active, 1);
    }
}

/* wake every worker (after stop is set) */
void tilegen_pool_wake(struct tg_pool *pool) { ADD(&pool->gen, 1); wake(&pool->gen, 0x7fffffff); }

u64 tilegen_driver_abi(void) { return ABI; }
u64 tilegen_driver_sizes(void)
{
    return sizeof(struct tg_plan) | (u64)sizeof(struct tg_pool) << 16
        | (u64)sizeof(struct tg_pack) << 32 | (u64)sizeof(struct tg_mm) << 48;
}
u64 tilegen_driver_futex(void) { return HAVE_FUTEX; }
"""


def source() -> str:
    """The driver's freestanding C source (no libc, no headers)."""
    consts = {"ABI": ABI, "ST_OK": ST_OK, "ST_LIMIT": ST_LIMIT, "ST_SLOW": ST_SLOW,
              "ST_BUSY": ST_BUSY, "K_F32": K_F32, "K_Q4": K_Q4, "K_Q8": K_Q8, "P_NONE": P_NONE,
              "P_QSI8D32P": P_QSI8D32P, "P_ROWS": P_ROWS, "P_GIVEN": P_GIVEN}
    head = ["/* Generated by tilegen -- do not edit.  The plan driver (tilegen.driver). */",
            "typedef __SIZE_TYPE__ size_t;", "typedef unsigned int u32;",
            "typedef unsigned long long u64;", ""]
    head += [f"#define {k} {v}" for k, v in consts.items()] + [""]
    head += [_struct("tg_pack", PACK_FIELDS), _struct("tg_mm", MM_FIELDS),
             _struct("tg_plan", PLAN_FIELDS), _struct("tg_pool", POOL_FIELDS)]
    return "\n".join(head) + "\n" + _BODY
