#include "core/td_tensor.h"

#include "base/td_error.h"

#include <stdio.h>
#include <string.h>

td_shape td_shape_image(int c, int h, int w) {
    return (td_shape){c, h, w, true};
}
td_shape td_shape_flat(int features) {
    return (td_shape){features, 1, 1, false};
}
td_shape td_shape_seq(int positions, int features) {
    return (td_shape){features, positions, 1, false};
}

void td_shape_format(td_shape s, char *buf, size_t len) {
    if (s.spatial)
        snprintf(buf, len, "[%d, %d, %d]", s.c, s.h, s.w);
    else if (s.h > 1)
        snprintf(buf, len, "[%d, %d]", s.h, s.c);
    else
        snprintf(buf, len, "[%d]", s.c);
}

void *td_arena_push(td_arena *arena, size_t bytes) {
    size_t start = (arena->used + 63) / 64 * 64;
    arena->used = start + bytes;
    if (!arena->base) return NULL;
    TD_ASSERT(arena->used <= arena->cap, "arena overflow: the layout plan and the build disagree");
    return arena->base + start;
}

void td_fill_rows(float *dst, const float *row, size_t n_rows, size_t width) {
    if (n_rows == 0) return;
    memcpy(dst, row, width * sizeof(float));
    size_t done = 1;
    while (done < n_rows) {
        size_t n = done < n_rows - done ? done : n_rows - done;
        memcpy(dst + done * width, dst, n * width * sizeof(float));
        done += n;
    }
}
