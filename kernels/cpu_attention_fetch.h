/* The cursor that fetches a sequence's cached rows ahead of the reading, a few lines at a time
 * between pieces of arithmetic (kernels/cpu_attention_by_sequence.h; weigh_rows in
 * kernels/cpu_paged_attention.c takes one, or NULL). Fetched a tile's rows at once, the burst
 * stalled the core with nothing to compute.
 */
#ifndef PAGEDSERVE_CPU_ATTENTION_FETCH_H
#define PAGEDSERVE_CPU_ATTENTION_FETCH_H

#include <stddef.h>
#include <stdint.h>

/* The rows a sequence reads, in order: its keys (rows 0 .. len), its values (len .. 2 len),
 * then the first next_rows keys of the thread's next sequence (2 len ..). Prefetches only: no
 * result depends on them. */
typedef struct {
    const char *k_cache, *v_cache;
    const int64_t *offsets;    /* the sequence's rows, in elements into either cache */
    const int32_t *next_table; /* the next sequence's blocks (next_rows 0: none) */
    int64_t len, next_rows, block_size, row_elems, elem, row_lines;
    int64_t row, line; /* the next line to fetch: line `line` of row `row` */
} seq_fetch;

static inline const char *seq_fetch_row(const seq_fetch *f, int64_t i) {
    if (i < f->len) return f->k_cache + f->offsets[i] * f->elem;
    if (i < 2 * f->len) return f->v_cache + f->offsets[i - f->len] * f->elem;
    i -= 2 * f->len;
    const int64_t block = f->next_table[i / f->block_size];
    return f->k_cache + (block * f->block_size + i % f->block_size) * f->row_elems * f->elem;
}

/* Fetch up to `most` lines, none of row `target` or after (nor past the last row); a NULL
 * cursor fetches nothing. */
static inline void seq_fetch_to(seq_fetch *f, int64_t target, int64_t most) {
    if (f == NULL) return;
    const int64_t end = 2 * f->len + f->next_rows;
    target = target < end ? target : end;
    while (most > 0 && f->row < target) {
        const char *row = seq_fetch_row(f, f->row);
        const int64_t stop = f->row_lines - f->line < most ? f->row_lines : f->line + most;
        for (int64_t line = f->line; line < stop; line++) __builtin_prefetch(row + 64 * line);
        most -= stop - f->line;
        f->line = stop;
        if (stop == f->row_lines) {
            f->line = 0;
            f->row++;
        }
    }
}

/* The lines before row `target` still to fetch, shared over `parts` pieces of arithmetic. */
static inline int64_t seq_fetch_share(const seq_fetch *f, int64_t target, int64_t parts) {
    const int64_t lines = (target - f->row) * f->row_lines - f->line;
    return lines > 0 ? (lines + parts - 1) / parts : 0;
}

#endif
