/* A decode step's layers as one call: a program of ops run by a persistent thread team.
 *
 * At batch 1 a small model's decode step is ~300 kernel calls (SmolLM2: per layer two
 * RMSNorms, five quantized products, rotary + KV write, attention); from Python each
 * costs ~7 us of call overhead and the threads that share its work are woken per call.
 * Here the caller builds the step's ops once (`struct program_op`, pointers to the
 * weights and buffer ids; layers/decode_program.py) and runs them all per step in one
 * call: the caller's thread and `num_threads - 1` pooled threads go through the ops
 * together, each op's work shared through its own counter (rows, W-row tiles, (sequence,
 * KV head) units: whoever is free takes the next), a barrier between ops.
 *
 * Every op calls the very function the per-op path calls (`kernel_rows.h`; the quantized
 * products through the pointer the caller passes: quant_matmul_f32 / quant_matmul_q8), and
 * no result depends on which thread computed it, so a step run as a program is
 * bit-identical to the same step run op by op.
 *
 * Threads: the pool's threads spin a little (~0.1 ms) after a program for the next
 * one, then sleep on a condition variable (a spinning thread would take the core that
 * the engine process needs between steps under asynchronous scheduling); a barrier
 * spins, yielding the core now and then (a descheduled partner then costs a yield, not
 * a time slice). A forked child starts a pool of its own. Products outside a program
 * run on the same pool (`pool_matmul`), so no other team spins beside it.
 */
#include "kernel_rows.h"

#include <pthread.h>
#include <sched.h>
#include <stdint.h>
#include <string.h>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define CPU_RELAX() _mm_pause()
#else
#define CPU_RELAX() __asm__ __volatile__("" ::: "memory")
#endif

enum { OP_RMS_NORM = 1, OP_MATMUL = 2, OP_ROPE_KV = 3, OP_ATTENTION = 4, OP_QK_NORM = 5 };

typedef void (*matmul_fn)(const float *x, const uint8_t *w, const float *bias, const float *other,
                          float *y, int64_t M, int64_t N, int64_t K, int type, int op, int isa,
                          int64_t *next_unit);

/* One op. Buffers are rows of floats: a matmul reads rows of `depth` and writes rows of
 * `width` (its `other` too); a norm reads and writes rows of `width`; q/k norm (in place),
 * rotary and attention read rows of qkv ((heads + 2 * kv_heads) * head_dim: q heads, k
 * heads, v heads; q/k norm: `width` floats apart) and attention writes rows of
 * heads * head_dim. Mirrored by layers/decode_program.py. */
struct program_op {
    int64_t kind;
    int64_t src, dst, other; /* buffer ids; `other` -1: none */
    int64_t width, depth;
    int64_t type, epilogue, isa; /* matmul: ggml type, epilogue op, instruction set */
    const void *weight;          /* matmul: blocks; norm: weight; q/k norm: q's weight */
    const float *bias;           /* matmul: bias or NULL */
    void *kernel;                /* matmul: a matmul_fn */
    double eps_or_scale;         /* norm, q/k norm: eps; attention: scale */
    float *kv_cache;             /* [2][kv_heads][num_blocks * block_size][head_dim] */
    int64_t heads, kv_heads, head_dim, num_blocks, block_size;
    const float *cos_table, *sin_table;
    const float *k_weight; /* q/k norm: k's weight */
};

struct job {
    const struct program_op *ops;
    int64_t n_ops;
    float *const *buffers;
    int64_t rows;
    const int64_t *positions, *slots, *block_table, *seq_lens;
    int64_t max_blocks;
    int64_t *counters; /* one per op, zero at the start */
    int threads;
};

#define MAX_THREADS 256
#define SPINS_BEFORE_SLEEP 4096
#define SPINS_BEFORE_YIELD 1024

static pthread_mutex_t pool_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_mutex_t run_lock = PTHREAD_MUTEX_INITIALIZER; /* one program at a time */
static pthread_cond_t pool_wake = PTHREAD_COND_INITIALIZER;
static int pool_workers;       /* threads started (ids 1..pool_workers) */
static int pool_sleepers;      /* workers in pthread_cond_wait */
static int64_t pool_epoch;     /* bumped once per job */
static struct job pool_job;
static int64_t barrier_arrived;
static int64_t barrier_generation;

static void barrier(int threads)
{
    const int64_t generation = __atomic_load_n(&barrier_generation, __ATOMIC_ACQUIRE);
    if (__atomic_add_fetch(&barrier_arrived, 1, __ATOMIC_ACQ_REL) == threads) {
        __atomic_store_n(&barrier_arrived, 0, __ATOMIC_RELAXED);
        __atomic_fetch_add(&barrier_generation, 1, __ATOMIC_RELEASE);
        return;
    }
    for (int spins = 0; __atomic_load_n(&barrier_generation, __ATOMIC_ACQUIRE) == generation;) {
        CPU_RELAX();
        if (++spins == SPINS_BEFORE_YIELD) {
            sched_yield();
            spins = 0;
        }
    }
}

static int64_t take(int64_t *counter) { return __atomic_fetch_add(counter, 1, __ATOMIC_RELAXED); }

static void run_op(const struct job *j, int64_t i)
{
    const struct program_op *op = &j->ops[i];
    int64_t *counter = &j->counters[i];
    float *const *b = j->buffers;
    const int64_t rows = j->rows;
    switch (op->kind) {
    case OP_RMS_NORM:
        for (int64_t r; (r = take(counter)) < rows;)
            rms_norm_row_f32(b[op->src] + r * op->width, op->weight, b[op->dst] + r * op->width,
                             op->width, (float)op->eps_or_scale);
        break;
    case OP_QK_NORM:
        for (int64_t r; (r = take(counter)) < rows;)
            qk_norm_row_f32(b[op->src] + r * op->width, op->heads, op->kv_heads, op->head_dim,
                            op->weight, op->k_weight, (float)op->eps_or_scale);
        break;
    case OP_MATMUL:
        ((matmul_fn)op->kernel)(b[op->src], op->weight, op->bias,
                                op->other < 0 ? NULL : b[op->other], b[op->dst], rows, op->width,
                                op->depth, (int)op->type, (int)op->epilogue, (int)op->isa, counter);
        break;
    case OP_ROPE_KV: {
        const int64_t row = (op->heads + 2 * op->kv_heads) * op->head_dim;
        for (int64_t r; (r = take(counter)) < rows;)
            rope_write_kv_token_f32(b[op->src] + r * row, op->heads, op->kv_heads, op->head_dim,
                                    j->positions[r], op->cos_table, op->sin_table, op->kv_cache,
                                    op->num_blocks * op->block_size, j->slots[r]);
        break;
    }
    case OP_ATTENTION:
        paged_decode_attention_strided_f32(
            b[op->src], (op->heads + 2 * op->kv_heads) * op->head_dim, op->kv_cache,
            j->block_table, j->seq_lens, b[op->dst], rows, op->heads, op->kv_heads, op->head_dim,
            op->num_blocks, op->block_size, j->max_blocks, (float)op->eps_or_scale, counter);
        break;
    }
}

#ifdef PROGRAM_PROFILE
/* Built with -DPROGRAM_PROFILE (benchmarks/decode_profile.py): the caller's thread adds each
 * op's time (its work, then its wait at the barrier) in ns to profile_ns[op][0..1], a
 * worker its work to profile_ns[op][2]. */
#include <time.h>
static int64_t profile_ns[4096][3];
static int64_t now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (int64_t)t.tv_sec * 1000000000 + t.tv_nsec;
}
int64_t *decode_program_profile(void) { return &profile_ns[0][0]; }
#endif

static void run_job(const struct job *j, int caller)
{
    for (int64_t i = 0; i < j->n_ops; i++) {
#ifdef PROGRAM_PROFILE
        const int64_t t0 = now_ns();
        run_op(j, i);
        const int64_t t1 = now_ns();
        barrier(j->threads);
        if (caller && i < 4096) {
            profile_ns[i][0] += t1 - t0;
            profile_ns[i][1] += now_ns() - t1;
        } else if (i < 4096)
            profile_ns[i][2] += t1 - t0;
#else
        (void)caller;
        run_op(j, i);
        barrier(j->threads);
#endif
    }
}

static void *worker_main(void *arg)
{
    const int id = (int)(intptr_t)arg;
    int64_t seen = 0;
    for (;;) {
        int64_t epoch;
        int spins = 0;
        while ((epoch = __atomic_load_n(&pool_epoch, __ATOMIC_SEQ_CST)) == seen &&
               spins++ < SPINS_BEFORE_SLEEP)
            CPU_RELAX();
        if (epoch == seen) {
            pthread_mutex_lock(&pool_lock);
            __atomic_add_fetch(&pool_sleepers, 1, __ATOMIC_SEQ_CST);
            while ((epoch = __atomic_load_n(&pool_epoch, __ATOMIC_SEQ_CST)) == seen)
                pthread_cond_wait(&pool_wake, &pool_lock);
            __atomic_sub_fetch(&pool_sleepers, 1, __ATOMIC_SEQ_CST);
            pthread_mutex_unlock(&pool_lock);
        }
        seen = epoch;
        const struct job j = pool_job; /* a copy: the caller may post the next job as soon as
                                           this one's last barrier is passed */
        if (id < j.threads) run_job(&j, 0);
    }
    return NULL;
}

/* A forked child has none of the parent's threads: it starts its own pool when it runs a
 * program (the locks may have been held by a parent thread at the fork). */
static void forget_pool_in_child(void)
{
    pthread_mutex_init(&pool_lock, NULL);
    pthread_mutex_init(&run_lock, NULL);
    pthread_cond_init(&pool_wake, NULL);
    pool_workers = 0;
    pool_sleepers = 0;
    barrier_arrived = 0;
}

/* Workers up to `threads - 1`; returns how many threads can take part (>= 1). */
static int ensure_workers(int threads)
{
    static int fork_handler;
    if (!fork_handler) fork_handler = pthread_atfork(NULL, NULL, forget_pool_in_child) == 0;
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    while (pool_workers < threads - 1) {
        pthread_t thread;
        pthread_attr_t attr;
        pthread_attr_init(&attr);
        pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
        const int failed =
            pthread_create(&thread, &attr, worker_main, (void *)(intptr_t)(pool_workers + 1));
        pthread_attr_destroy(&attr);
        if (failed) break;
        pool_workers++;
    }
    return pool_workers + 1 < threads ? pool_workers + 1 : threads;
}

/* Run `n_ops` ops over `rows` rows on `num_threads` threads (this one included).
 * `buffers`: the buffer table the ops' ids index; positions, slots: [rows] int64;
 * block_table [rows][max_blocks], seq_lens [rows] int64 (attention). */
void decode_program_run(const struct program_op *ops, int64_t n_ops, float *const *buffers,
                        int64_t rows, const int64_t *positions, const int64_t *slots,
                        const int64_t *block_table, const int64_t *seq_lens, int64_t max_blocks,
                        int num_threads)
{
    int64_t stack_counters[1024];
    int64_t *counters = n_ops <= 1024 ? stack_counters : NULL;
    if (!counters) { /* a program of more ops: run it in slices of 1024 */
        for (int64_t first = 0; first < n_ops; first += 1024)
            decode_program_run(ops + first, n_ops - first < 1024 ? n_ops - first : 1024, buffers,
                               rows, positions, slots, block_table, seq_lens, max_blocks,
                               num_threads);
        return;
    }
    memset(counters, 0, (size_t)n_ops * sizeof(int64_t));
    struct job j = {ops,      n_ops,    buffers,     rows, positions, slots, block_table,
                    seq_lens, max_blocks, counters, 1};
    if (num_threads <= 1) {
        run_job(&j, 1);
        return;
    }
    pthread_mutex_lock(&run_lock);
    j.threads = ensure_workers(num_threads);
    pool_job = j;
    __atomic_fetch_add(&pool_epoch, 1, __ATOMIC_SEQ_CST);
    if (__atomic_load_n(&pool_sleepers, __ATOMIC_SEQ_CST) > 0) {
        pthread_mutex_lock(&pool_lock);
        pthread_cond_broadcast(&pool_wake);
        pthread_mutex_unlock(&pool_lock);
    }
    run_job(&j, 1);
    pthread_mutex_unlock(&run_lock);
}

/* One product on the pool: `kernel` (a matmul_fn) with quant_matmul_f32's arguments, its
 * units shared by `num_threads` threads (this one included). */
void pool_matmul(void *kernel, const float *x, const uint8_t *w, const float *bias,
                 const float *other, float *y, int64_t M, int64_t N, int64_t K, int type, int op,
                 int isa, int num_threads)
{
    struct program_op product = {0};
    product.kind = OP_MATMUL;
    product.src = 0;
    product.dst = 1;
    product.other = other ? 2 : -1;
    product.width = N;
    product.depth = K;
    product.type = type;
    product.epilogue = op;
    product.isa = isa;
    product.weight = w;
    product.bias = bias;
    product.kernel = kernel;
    float *const buffers[3] = {(float *)x, y, (float *)other};
    decode_program_run(&product, 1, buffers, M, NULL, NULL, NULL, NULL, 0, num_threads);
}
