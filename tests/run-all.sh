#!/bin/sh
# Builds traind three times and runs every CPU test in each build:
#   style        the code's shape (tests/style): no function over 120 lines, no .c over 600, no
#                drift from .clang-format, and no include cycle between modules or upward
#                between layers; first, as it takes seconds
#   build/       Release, CUDA sources on when nvcc is found (as shipped)
#   build-asan/  AddressSanitizer + UndefinedBehaviorSanitizer, CUDA off (-DTRAIND_CUDA=OFF), the
#                op kernels forced to their baseline x86-64 variant (TRAIND_ISA=baseline): it
#                also proves the CUDA-less build and the portable C paths that stand in for the
#                AVX2 and AVX-512 kernels build and pass
#   build-fuzz/  clang's libFuzzer with ASan + UBSan (tests/fuzz): every harness replays its
#                corpus (seeds and the inputs of past findings), then fuzzes for
#                TRAIND_FUZZ_SECONDS (10) more, two at a time (bench/fuzz.sh, which runs them
#                for long); a crash, leak, sanitizer report or hang fails the run
# Both builds are portable (no -march=native): the kernels for AVX2 and AVX-512 are chosen at run
# time (trainer/core/td_isa.h), and the Release run tests each set this CPU supports.
# Exits non-zero on the first failure. Run deploy/install-deps.sh first (README command 2 does).
set -eu
cd "$(dirname "$0")/.."
jobs=${TRAIND_BUILD_JOBS:-2}
export OPENBLAS_NUM_THREADS=1 OMP_NUM_THREADS=1
# each stage's minutes, printed at the end: the suite must stay under 20 minutes on 2 cores
start=$(date +%s) last=$start times=""
lap() { now=$(date +%s); times="$times$1 $((now - last)) s; "; last=$now; }

echo "== style (sizes, format, the include graph) =="
tests/style/check_sizes.sh
python3 tests/style/include_graph.py --quiet
python3 tests/style/call_graph.py --quiet
lap "style"

echo "== build (Release, CUDA auto) =="
cmake -S . -B build -DBUILD_TESTING=ON
cmake --build build -j"$jobs"
lap "build"
(cd build && ctest --output-on-failure)
lap "tests"

echo "== build-asan (ASan + UBSan, CUDA off, portable kernels) =="
cmake -S . -B build-asan -DBUILD_TESTING=ON -DTRAIND_CUDA=OFF \
    -DTRAIND_SANITIZE=ON -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-asan -j"$jobs"
lap "build-asan"
(cd build-asan && TRAIND_ISA=baseline TRAIND_TEST_SLOW=1 ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 \
    UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 ctest --output-on-failure)
lap "asan tests"

echo "== build-fuzz (libFuzzer, ASan + UBSan: the parsers of outside input) =="
CC=clang cmake -S . -B build-fuzz -DTRAIND_FUZZ=ON -DTRAIND_CUDA=OFF \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo
cmake --build build-fuzz -j"$jobs" --target fuzzers
(cd build-fuzz && ctest -L fuzz --output-on-failure)
FUZZ_JOBS=2 bench/fuzz.sh "${TRAIND_FUZZ_SECONDS:-10}"
lap "fuzz (build and runs)"

echo "== all tests passed in the three builds =="
echo "time: ${times}total $((last - start)) s"
