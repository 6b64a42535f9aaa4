/* The decode kernels' work-sharing pool (thread_pool.c). */
#ifndef LADLE_THREAD_POOL_H
#define LADLE_THREAD_POOL_H
#include <stdint.h>

typedef void (*ladle_chunk_fn)(const void *args, int64_t chunk);

/* Runs fn(args, chunk) for every chunk < num_chunks on up to num_threads threads (the caller's
 * included) and returns when all are done. */
void ladle_run_chunks(ladle_chunk_fn fn, const void *args, int64_t num_chunks,
                      int64_t num_threads);

/* The blocks [*first, *last) of chunk `chunk` when num_blocks blocks are cut into chunks of
 * blocks_per_chunk (the GEMVs' unit of work). */
static inline void ladle_chunk_blocks(int64_t chunk, int64_t num_blocks, int64_t blocks_per_chunk,
                                      int64_t *first, int64_t *last) {
    *first = chunk * blocks_per_chunk;
    *last = *first + blocks_per_chunk < num_blocks ? *first + blocks_per_chunk : num_blocks;
}

#endif
