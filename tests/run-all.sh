#!/bin/sh
# Builds traind twice and runs every CPU test in each build:
#   build/       Release, CUDA sources on when nvcc is found (as shipped)
#   build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, CUDA off (-DTRAIND_CUDA=OFF), the
#                op kernels forced to their baseline x86-64 variant (TRAIND_ISA=baseline): it
#                also proves the CUDA-less build and the portable C paths that stand in for the
#                AVX2 and AVX-512 kernels build and pass
# Both builds are portable (no -march=native): the kernels for AVX2 and AVX-512 are chosen at run
# time (trainer/core/td_isa.h), and the Release run tests each set this CPU supports.
# Exits non-zero on the first failure. Run deploy/install-deps.sh first (README command 2 does).
set -eu
cd "$(dirname "$0")/.."
jobs=${TRAIND_BUILD_JOBS:-2}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1

echo "== build (Release, CUDA auto) =="
cmake -S . -B build -DBUILD_TESTING=ON
cmake --build build -j"$jobs"
(cd build && ctest --output-on-failure)

echo "== build-asan (ASan + UBSan, CUDA off, portable kernels) =="
cmake -S . -B build-asan -DBUILD_TESTING=ON -DTRAIND_CUDA=OFF \
    -DTRAIND_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-asan -j"$jobs"
(cd build-asan && TRAIND_ISA=baseline TRAIND_TEST_SLOW=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure)

echo "== all tests passed in both builds =="
