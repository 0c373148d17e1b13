/* The sequence a thread attends next, fetched from memory a few lines at a time while it
 * computes the current one (kernels/cpu_paged_attention.c).
 *
 * A sequence's key and value rows come from memory cold: fetched all at once before its first
 * KV head (warm_sequence), the thread waits on them with nothing to compute, at the few
 * misses a core keeps in flight. Its next sequence is known once the thread has claimed it,
 * so its rows can be asked for during this one's scores instead, a share per tile of keys:
 * the misses then overlap arithmetic that does not need them. Fetched all at once ahead
 * instead, the burst stalls the core as warm_sequence does (tried: no faster). Spread over
 * the scores and the bf16 path's value interleaving, against warm_sequence alone (2-core
 * Zen 4, 16-64 sequences of 176-300 tokens from memory, 1 or 4 new tokens each): bf16
 * 1.15-1.42x a call, fp32 1.20-1.38x, AVX2 caps 1.03-1.43x, bit-identical
 * (benchmarks/results/cpu_attention/2026-12-05_lookahead.md).
 *
 * The rows are fetched block by block, key and value lines in step, in table order: only the
 * context's tokens, at most WARM_BYTES of them (what L2 holds beside the current
 * sequence). Prefetches only: no result depends on them.
 */
#ifndef PAGEDSERVE_CPU_ATTENTION_LOOKAHEAD_H
#define PAGEDSERVE_CPU_ATTENTION_LOOKAHEAD_H

#include <stdint.h>

#define WARM_BYTES (512 * 1024) /* the most of a sequence's rows fetched ahead into L2 */

/* The first tokens of a sequence of `seq_len` whose key and value rows (`row_bytes` each)
 * WARM_BYTES holds: those fetched ahead, at once (warm_sequence) or spread (a lookahead). */
static inline int64_t warm_tokens(int64_t seq_len, int64_t row_bytes) {
    const int64_t most = WARM_BYTES / (2 * row_bytes);
    return seq_len < most ? seq_len : most;
}

typedef struct {
    const char *k_cache, *v_cache;
    const int32_t *table;    /* the next sequence's blocks */
    int64_t block_bytes;     /* a block of one cache: block_size tokens of all KV heads */
    int64_t lines;           /* key (and as many value) lines left to fetch */
    int64_t block, line;     /* the cursor: next line `line` of table[block] */
    int64_t per_tile;        /* lines fetched each tile of keys scored */
} lookahead;

/* Fetch the rows of a sequence's first warm_tokens(seq_len, token_bytes) tokens (all KV
 * heads' rows of a token, token_bytes) over `tiles` calls of lookahead_step. */
static inline void lookahead_start(lookahead *a, const void *k_cache, const void *v_cache,
                                   const int32_t *table, int64_t seq_len, int64_t block_size,
                                   int64_t token_bytes, int64_t tiles) {
    a->k_cache = (const char *)k_cache;
    a->v_cache = (const char *)v_cache;
    a->table = table;
    a->block_bytes = block_size * token_bytes;
    a->lines = (warm_tokens(seq_len, token_bytes) * token_bytes + 63) / 64;
    a->block = a->line = 0;
    a->per_tile = tiles > 0 ? (a->lines + tiles - 1) / tiles : a->lines;
}

/* Fetch up to n more key lines and their value lines. */
static inline void lookahead_fetch(lookahead *a, int64_t n) {
    const int64_t block_lines = a->block_bytes / 64;
    for (; n > 0 && a->lines > 0; n--, a->lines--) {
        const int64_t at = (int64_t)a->table[a->block] * a->block_bytes + 64 * a->line;
        __builtin_prefetch(a->k_cache + at, 0, 2);
        __builtin_prefetch(a->v_cache + at, 0, 2);
        if (++a->line == block_lines) {
            a->line = 0;
            a->block++;
        }
    }
}

/* One tile's share; a NULL lookahead fetches nothing. */
static inline void lookahead_step(lookahead *a) {
    if (a != NULL) lookahead_fetch(a, a->per_tile);
}

/* Whatever the tiles left. */
static inline void lookahead_finish(lookahead *a) {
    if (a != NULL) lookahead_fetch(a, a->lines);
}

#endif
