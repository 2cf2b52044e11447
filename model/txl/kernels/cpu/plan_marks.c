/* Where each row of a decoding step puts its new position (txl.paged.decode_plan), in row order, as `plan_row`
 * decides it one row at a time: the host's share of every decoding iteration, in one call instead of some
 * forty small array operations.
 *
 * Row i's memory holds lengths[i] positions from offset starts[i] of its table's widths[i] blocks, the last of
 * which is lasts[i] (0: no table). `filled` is the pool's mark per block (positions written): a row whose
 * memory ends inside its last block, at that block's mark, appends in place and claims the next position (so a
 * later row ending there at the same mark no longer can: it copies, as plan_row has it). A row whose memory
 * fills its last block exactly (or that has none) starts a fresh block. Every other row is planned by
 * plan_row. After the step a row keeps min(keeps[i], lengths[i] + 1) positions, dropping the blocks before
 * them.
 *
 * out is [9, n]: 0 the slot each new position goes to, 1 blocks dropped, 2 the offset of the kept positions
 * in the first kept block, 3 positions fed after the step, then lists of row indices: 4 rows starting a fresh
 * block, 5 rows left to plan_row, 6 other rows that drop blocks, 7 rows that keep nothing; out[8][0..3] their
 * counts. keeps is capped in place.
 */
#include <stdint.h>

void txl_plan_marks(int64_t n, int64_t bs, const int64_t *starts, const int64_t *lengths,
                    const int64_t *widths, const int64_t *lasts, const int64_t *fed, int64_t *filled,
                    int64_t *keeps, int64_t *out) {
    int64_t *slots = out, *drops = out + n, *starts_after = out + 2 * n, *fed_after = out + 3 * n;
    int64_t *fresh = out + 4 * n, *planned = out + 5 * n, *dropping = out + 6 * n, *emptied = out + 7 * n;
    int64_t n_fresh = 0, n_planned = 0, n_dropping = 0, n_emptied = 0;
    for (int64_t i = 0; i < n; i++) {
        const int64_t end = starts[i] + lengths[i];
        const int64_t tail = end % bs;
        const int fits = (end + bs - 1) / bs == widths[i];  /* no block past the one it ends in */
        int is_planned = 0;
        if (fits && tail > 0 && filled[lasts[i]] == tail) {
            filled[lasts[i]] = tail + 1;  /* appends in place */
        } else if (fits && tail == 0) {
            fresh[n_fresh++] = i;
        } else {
            planned[n_planned++] = i;
            is_planned = 1;
        }
        const int64_t keep = keeps[i] < lengths[i] + 1 ? keeps[i] : lengths[i] + 1;
        const int64_t new_start = end + 1 - keep;
        const int64_t drop = keep > 0 ? new_start / bs : 0;
        keeps[i] = keep;
        slots[i] = tail;
        drops[i] = drop;
        starts_after[i] = keep > 0 ? new_start - drop * bs : 0;
        fed_after[i] = fed[i] + 1;
        if (drop > 0 && !is_planned) dropping[n_dropping++] = i;
        if (keep == 0) emptied[n_emptied++] = i;
    }
    int64_t *counts = out + 8 * n;
    counts[0] = n_fresh;
    counts[1] = n_planned;
    counts[2] = n_dropping;
    counts[3] = n_emptied;
}
