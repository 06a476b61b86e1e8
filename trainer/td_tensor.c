#include "td_tensor.h"

#include "td_error.h"

#include <stdio.h>

td_shape td_shape_image(int c, int h, int w) { return (td_shape){c, h, w, true}; }
td_shape td_shape_flat(int features) { return (td_shape){features, 1, 1, false}; }

void td_shape_format(td_shape s, char *buf, size_t len) {
    if (s.spatial)
        snprintf(buf, len, "[%d, %d, %d]", s.c, s.h, s.w);
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
