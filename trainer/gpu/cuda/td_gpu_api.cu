// The one symbol the library exports: its table of functions (td_gpu.h), which td_gpu_loader.c
// finds with one dlsym. Everything else of the library is hidden (trainer/CMakeLists.txt).
#include "gpu/cuda/td_gpu_internal.h"

// Filled member by member, by name: a table in another order than td_gpu.h's struct cannot
// swap two functions of one type (forward and backward), and the count below catches a member
// left out. constexpr: the table is constant data, complete before anyone can dlsym it.
static constexpr td_gpu_api make_table() {
    td_gpu_api t{};
    t.size = sizeof t;
#define TD_GPU_SET(member) t.member = td_gpu_##member;
    TD_GPU_API_FUNCTIONS(TD_GPU_SET)
#undef TD_GPU_SET
    return t;
}

#define TD_GPU_COUNT(member) +1
static_assert(sizeof(td_gpu_api) ==
                  sizeof(size_t) + (0 TD_GPU_API_FUNCTIONS(TD_GPU_COUNT)) * sizeof(void (*)(void)),
              "TD_GPU_API_FUNCTIONS (td_gpu_internal.h) must name every member of td_gpu_api");
#undef TD_GPU_COUNT

extern "C" __attribute__((visibility("default"))) const td_gpu_api TD_GPU_API_NAME = make_table();
