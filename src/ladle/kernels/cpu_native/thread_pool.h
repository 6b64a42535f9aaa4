/* The decode kernels' work-sharing pool (thread_pool.c). */
#ifndef LADLE_THREAD_POOL_H
#define LADLE_THREAD_POOL_H
#include <stdint.h>

typedef void (*ladle_chunk_fn)(const void *args, int64_t chunk);

/* Runs fn(args, chunk) for every chunk < num_chunks on up to num_threads threads (the caller's
 * included) and returns when all are done. */
void ladle_run_chunks(ladle_chunk_fn fn, const void *args, int64_t num_chunks,
                      int64_t num_threads);

#endif
