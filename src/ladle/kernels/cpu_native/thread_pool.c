/* A work-sharing pool for the decode kernels that never waits for a thread that is not running.
 *
 * Why not OpenMP: at the end of a parallel region every thread of the team must arrive at a
 * barrier. On a shared machine one of them is often descheduled, and the region then lasts a
 * scheduler time slice (milliseconds) instead of tens of microseconds: measured on the 2-core
 * machine at load 10, a decode step's 121 GEMVs took 115 ms on one thread and 360-700 ms on
 * two (docs/benchmarks.md, t12s). Here the calling thread claims chunks of the work itself
 * from an atomic counter, and helper threads claim chunks only while they are running, so the
 * caller waits at the end only for chunks a helper has actually started (a few microseconds
 * each), yielding its core meanwhile. When no helper gets the CPU, the caller does all of it.
 *
 * Helpers spin briefly after a job (the next GEMV of a decode step follows within ~100 us)
 * and then sleep on a futex.
 */
#define _GNU_SOURCE
#include <linux/futex.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "thread_pool.h"

#define MAX_HELPERS 63
#define SPINS_BEFORE_SLEEP 1000
#define SPINS_BEFORE_YIELD 200

/* The claim word packs the job's generation, its chunk count and the next chunk, so a claim
 * checks all three in one compare-and-swap and a stale helper can never take a chunk of a
 * job that has moved on. */
#define CHUNK_BITS 24
#define CHUNK_MASK ((1ull << CHUNK_BITS) - 1)

static struct {
    _Atomic uint64_t claim;      /* generation << 48 | num_chunks << 24 | next chunk */
    _Atomic int64_t done;        /* chunks finished in the current job */
    _Atomic uint32_t generation; /* the futex word helpers sleep on */
    _Atomic int sleepers;
    ladle_chunk_fn fn;
    const void *args;
    int num_helpers;
    uint32_t last_generation;
    pthread_mutex_t start_lock;
} pool = {.start_lock = PTHREAD_MUTEX_INITIALIZER};

static inline void cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static int claim_chunk(uint32_t generation, int64_t *chunk) {
    uint64_t word = atomic_load(&pool.claim);
    for (;;) {
        uint64_t next = word & CHUNK_MASK, count = (word >> CHUNK_BITS) & CHUNK_MASK;
        if ((uint32_t)(word >> (2 * CHUNK_BITS)) != generation || next >= count) return 0;
        if (atomic_compare_exchange_weak(&pool.claim, &word, word + 1)) {
            *chunk = (int64_t)next;
            return 1;
        }
    }
}

static void run_claimed_chunks(uint32_t generation) {
    int64_t chunk;
    while (claim_chunk(generation, &chunk)) {
        /* A successful claim means the job is still running: fn and args are its own. */
        pool.fn(pool.args, chunk);
        atomic_fetch_add(&pool.done, 1);
    }
}

static void *helper_main(void *unused) {
    (void)unused;
    uint32_t seen = atomic_load(&pool.generation);
    for (;;) {
        int spins = 0;
        while (atomic_load(&pool.generation) == seen) {
            if (++spins < SPINS_BEFORE_SLEEP) {
                cpu_relax();
                continue;
            }
            atomic_fetch_add(&pool.sleepers, 1);
            if (atomic_load(&pool.generation) == seen)
                syscall(SYS_futex, &pool.generation, FUTEX_WAIT_PRIVATE, seen, 0, 0, 0);
            atomic_fetch_sub(&pool.sleepers, 1);
            spins = 0;
        }
        seen = atomic_load(&pool.generation);
        run_claimed_chunks(seen & 0xFFFF);
    }
    return 0;
}

static void start_helpers(int wanted) {
    pthread_mutex_lock(&pool.start_lock);
    while (pool.num_helpers < wanted && pool.num_helpers < MAX_HELPERS) {
        pthread_t thread;
        pthread_attr_t attributes;
        pthread_attr_init(&attributes);
        pthread_attr_setdetachstate(&attributes, PTHREAD_CREATE_DETACHED);
        int failed = pthread_create(&thread, &attributes, helper_main, 0);
        pthread_attr_destroy(&attributes);
        if (failed) break;
        pool.num_helpers++;
    }
    pthread_mutex_unlock(&pool.start_lock);
}

void ladle_run_chunks(ladle_chunk_fn fn, const void *args, int64_t num_chunks,
                      int64_t num_threads) {
    if (num_threads <= 1 || num_chunks <= 1 || num_chunks > (int64_t)CHUNK_MASK) {
        for (int64_t chunk = 0; chunk < num_chunks; chunk++) fn(args, chunk);
        return;
    }
    if (pool.num_helpers < num_threads - 1) start_helpers((int)num_threads - 1);
    /* One job at a time: ladle calls the kernels from the engine's one thread. */
    uint32_t generation = (pool.last_generation + 1) & 0xFFFF;
    pool.last_generation = generation;
    pool.fn = fn;
    pool.args = args;
    atomic_store(&pool.done, 0);
    atomic_store(&pool.claim, ((uint64_t)generation << (2 * CHUNK_BITS)) |
                                  ((uint64_t)num_chunks << CHUNK_BITS));
    atomic_store(&pool.generation, generation);
    if (atomic_load(&pool.sleepers) > 0)
        syscall(SYS_futex, &pool.generation, FUTEX_WAKE_PRIVATE, MAX_HELPERS, 0, 0, 0);
    run_claimed_chunks(generation);
    /* Only chunks a running helper claimed are left: short, unless it was descheduled
     * mid-chunk, when yielding this core lets it finish. */
    int spins = 0;
    while (atomic_load(&pool.done) < num_chunks) {
        if (++spins < SPINS_BEFORE_YIELD) cpu_relax();
        else sched_yield();
    }
}
