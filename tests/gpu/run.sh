#!/bin/bash
# The GPU suite in one command, for a machine with an NVIDIA GPU, CUDA, cuDNN, NCCL, CMake and
# PyTorch but none of Debian's -dev packages and no network. It configures and builds the tree
# into a fresh build directory against the libraries tests/gpu/fetch-deps.sh gathered (run that
# on the Debian dev machine first and carry .gpu-deps/debs and .gpu-deps/fashion-mnist along),
# then runs
#   a) parity   traind-gpu-parity: every op, loss and optimizer, CPU against GPU, fp32 and bf16
#   b) ddp1     NCCL DDP with a world of one (TRAIND_FORCE_DDP=1) trains exactly as the plain
#               run: the same loss lines and checkpoint bytes; so does it with SyncBatchNorm
#               (its sums then go through NCCL too)
#   c) fmnist   Fashion-MNIST LeNet-5 in bf16 reaches val_acc >= 0.90, with cuDNN's algorithms
#               timed (train.cudnn_benchmark)
#   c2) gpt     nanoGPT's Shakespeare example: 30 steps in fp32 on the GPU within 1e-3 of the
#               CPU's losses, then 200 steps in bf16 that learn and write a sample
#   d) resume   N steps straight against N/2, stop, resume (checkpoint bytes, loss lines): fp32
#               with BatchNorm (resume), whose straight run must also equal the same job with
#               CUDA graphs off (graph-eq), and, separately, with dropout (resume-d); fp16 with its
#               GradScaler state (resume-fp16); fp32 with activation checkpointing (recompute),
#               which must also equal the run without (recompute-eq, needs resume-d's run)
#   e) bench    bench/gpu.sh, img/s against PyTorch (informational: it never fails the suite)
# and prints a summary table. Exit status 1 when a required item (a-d) failed or was skipped.
#
#   tests/gpu/run.sh [BUILD_DIR]          (default: build-gpu, removed and rebuilt)
#
# Environment:
#   CUDA_ARCH      default: the GPU's compute capability (nvidia-smi), e.g. 90; 90 if unreadable
#   JOBS           build parallelism (default: nproc)
#   PYTHON         default python3 (with torch: the bench and finding pip's cuDNN / NCCL)
#   CUDNN_ROOT, NCCL_ROOT  where cuDNN / NCCL are, when not beside the CUDA toolkit or in /usr.
#                  Otherwise a pip-installed PyTorch's wheels are looked in too
#                  (site-packages/nvidia/cudnn, nvidia/nccl, whose libraries are only
#                  libcudnn.so.9 / libnccl.so.2): those paths go to CMake directly, and their
#                  directories onto LD_LIBRARY_PATH for traind's own processes.
#   WERROR=1       keep -Werror (default: off here, as this machine's gcc/nvcc may warn where
#                  the Debian CI's do not; the warning count is in the build row)
#   SKIP_BENCH=1   skip e)
#   BENCH_COMPILE=0, BENCH_MODELS, BENCH_TIMEOUT   passed to bench/gpu.sh (see there)
#   DEVICE=cpu     a dry run of this script's own logic on a machine without a GPU (resume,
#                  resume-d and recompute should pass there; the rest fail)
# Staging, for machines that limit one command's time (the device tool: 10 minutes a command;
# BUILD_DIR stays between calls while the machine is warm):
#   ONLY=a,b,...   only these items: build parity ddp1 fmnist gpt resume resume-d resume-fp16
#                  recompute bench. Without build in the list the existing BUILD_DIR is reused.
#   SKIP_BUILD=1   reuse BUILD_DIR as it is (same as leaving build out of ONLY)
#   KEEP_BUILD=1   configure and build in BUILD_DIR without removing it first (continues a
#                  build that an earlier call's time limit cut short)
#   BUDGET_S=N     start no item after N seconds, and cut every step's timeout to what is left;
#                  the items not started are SKIP rows naming the call that runs them. Default:
#                  540 where $OUT is set (the device tool), else none; with a call's timeout_s
#                  under 600, set it about 60 below that.
#   OUT_DIR        after every item, summary.md, summary-all.md (every item's latest row over
#                  all calls on BUILD_DIR, a SKIP never hiding an earlier result) and
#                  gpu-tests-logs.tar.gz (every log, no checkpoints) are copied there. Default:
#                  $OUT where it is set.
# For example, two device calls (carry .gpu-deps/debs and .gpu-deps/fashion-mnist), a-d first,
# then the benchmark on the same build:
#   SKIP_BENCH=1 tests/gpu/run.sh
#   ONLY=bench tests/gpu/run.sh        (BENCH_COMPILE=0 or BENCH_MODELS=... if it runs long)
# and to go on after a call that BUDGET_S cut short, name what its SKIP rows name:
#   ONLY=resume-fp16,recompute tests/gpu/run.sh
# Logs of every step land in BUILD_DIR/gpu-tests/, with summary.md and summary-all.md.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
deps=$top/.gpu-deps
root=$deps/root
ma=x86_64-linux-gnu
build=$(realpath -m "${1:-$top/build-gpu}")
out=$build/gpu-tests
py=${PYTHON:-python3}
device=${DEVICE:-cuda}
only=${ONLY:-}
only=${only// /}
out_dir=${OUT_DIR:-${OUT:-}}
budget=${BUDGET_S:-}
if [ -z "$budget" ]; then
    if [ -n "${OUT:-}" ]; then budget=540; else budget=0; fi
fi
case $budget in
'' | *[!0-9]*)
    echo "run.sh: BUDGET_S=$budget is not a number of seconds" >&2
    exit 2
    ;;
esac
all_items="build parity ddp1 fmnist gpt resume resume-d resume-fp16 recompute bench"
for i in ${only//,/ }; do
    case " $all_items " in
    *" $i "*) ;;
    *)
        echo "run.sh: ONLY names an unknown item $i (items: $all_items)" >&2
        exit 2
        ;;
    esac
done
want() { case ",${only:-$1}," in *",$1,"*) return 0 ;; esac; return 1; }
do_build=yes
if [ "${SKIP_BUILD:-0}" = 1 ] || ! want build; then do_build=no; fi

# The unpacked root is twice the size of the .debs, so only the .debs travel (the device tool
# carries at most 64 MiB) and are unpacked here: with dpkg where there is one, else ar + tar.
# The stamp marks a finished unpack (a call cut short mid-way unpacks again).
stamp=$root/.unpacked
if [ ! -f "$stamp" ] && compgen -G "$deps/debs/*.deb" >/dev/null; then
    echo "[gpu-tests] unpacking $deps/debs into $root"
    sh "$top/tests/gpu/unpack-root.sh" "$deps/debs" "$root" || exit 2
fi
if [ ! -d "$root/usr/include" ]; then
    echo "run.sh: $root is missing: run tests/gpu/fetch-deps.sh on the Debian dev machine and" \
        "carry .gpu-deps/debs and .gpu-deps/fashion-mnist here with the tree" >&2
    exit 2
fi

# ---- bookkeeping ----------------------------------------------------------------------------

names=() results=() details=() secs=() required=()

table() { # this call's rows
    local i
    echo "| item         | result | seconds | required | detail"
    echo "|--------------|--------|---------|----------|-------"
    for i in "${!names[@]}"; do
        printf '| %-12s | %-6s | %7s | %-8s | %s\n' "${names[$i]}" "${results[$i]}" \
            "${secs[$i]}" "${required[$i]}" "${details[$i]}"
    done
}

# summary.md (this call), summary-all.md (the latest row of each item over every call on this
# build directory) and, with OUT_DIR, copies of both and a tarball of the logs.
publish() {
    if [ ! -d "$out" ]; then # nothing built or reused: the table alone
        if [ -n "$out_dir" ] && mkdir -p "$out_dir" 2>/dev/null; then
            table >"$out_dir/summary.md"
        fi
        return 0
    fi
    table >"$out/summary.md"
    if [ -f "$out/results.tsv" ]; then
        {
            echo "| item         | result | seconds | required | detail (latest call on $build)"
            echo "|--------------|--------|---------|----------|-------"
            awk -F '\t' '!($1 in row) { order[n++] = $1; row[$1] = $0 }
                $2 != "SKIP" { row[$1] = $0 }
                END { for (i = 0; i < n; i++) {
                    split(row[order[i]], f, "\t")
                    printf "| %-12s | %-6s | %7s | %-8s | %s\n", f[1], f[2], f[3], f[4], f[5] } }' \
                "$out/results.tsv"
        } >"$out/summary-all.md"
    fi
    [ -n "$out_dir" ] || return 0
    mkdir -p "$out_dir" 2>/dev/null || return 0
    cp -f "$out/summary.md" "$out_dir/summary.md" 2>/dev/null
    [ -f "$out/summary-all.md" ] && cp -f "$out/summary-all.md" "$out_dir/summary-all.md"
    tar -C "$build" --exclude='*.safetensors' -czf "$out_dir/gpu-tests-logs.part" gpu-tests \
        2>/dev/null && mv -f "$out_dir/gpu-tests-logs.part" "$out_dir/gpu-tests-logs.tar.gz"
    rm -f "$out_dir/gpu-tests-logs.part"
    return 0
}

record() { # name PASS|FAIL|SKIP detail seconds required(yes|no)
    names+=("$1") results+=("$2") details+=("$3") secs+=("$4") required+=("$5")
    printf '[gpu-tests] %-8s %s: %s (%ss)\n' "$1" "$2" "$3" "$4"
    if [ -d "$out" ]; then
        printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$2" "$4" "$5" "${3//$'\t'/ }" >>"$out/results.tsv"
    fi
    publish
}

summary() {
    local failed=0 i
    echo
    table
    for i in "${!names[@]}"; do
        if [ "${results[$i]}" != PASS ] && [ "${required[$i]}" = yes ]; then failed=1; fi
    done
    echo
    echo "logs: $out (summary.md; summary-all.md has every item's latest row on this build)"
    [ -n "$out_dir" ] && echo "copied to: $out_dir"
    return $failed
}
# The trap can fire inside a step whose output goes to a log: fds 3 and 4 are the script's own.
exec 3>&1 4>&2
trap '{ echo "[gpu-tests] interrupted"; summary; } >&3 2>&4; exit 130' INT TERM HUP

# A step's timeout: N seconds, cut to what is left of BUDGET_S.
tmo() {
    local n=$1 left
    if [ "$budget" -gt 0 ]; then
        left=$((budget - SECONDS))
        if [ "$left" -lt "$n" ]; then n=$left; fi
        if [ "$n" -lt 1 ]; then n=1; fi
    fi
    echo "$n"
}
# Whether to run an item: ONLY selects it and BUDGET_S is not spent (else a SKIP row).
begin() { # item [required]
    want "$1" || return 1
    if [ "$budget" -gt 0 ] && [ "$SECONDS" -ge "$budget" ]; then
        record "$1" SKIP "BUDGET_S=$budget spent: run it in a later call (SKIP_BUILD=1 ONLY=$1)" \
            0 "${2:-yes}"
        return 1
    fi
    return 0
}
# "timed out" for timeout's exit status
why() { case $1 in 124 | 137) echo "timed out (exit $1)" ;; *) echo "exit $1" ;; esac; }

# ---- the libraries from .gpu-deps -------------------------------------------------------------

libdirs="$root/usr/lib/$ma/openblas-pthread:$root/usr/lib/$ma:$root/lib/$ma"
# The .pc files, rewritten in place to the unpacked root (an earlier rewrite, made where the tree
# lay then, is undone first). Requires.private names packages that did not come along (gnutls,
# libgit2, ...), which no static link here needs: those lines go.
pcdirs="$root/usr/lib/$ma/pkgconfig:$root/usr/lib/$ma/openblas-pthread/pkgconfig"
for f in "$root/usr/lib/$ma/pkgconfig/"*.pc "$root/usr/lib/$ma/openblas-pthread/pkgconfig/"*.pc; do
    [ -f "$f" ] || continue
    sed -i -e 's|^\([A-Za-z_]*\)=\(/[^=]*\)\{0,1\}/\.gpu-deps/root/usr|\1=/usr|' \
        -e "s#^\([A-Za-z_]*\)=/usr\(/\|\$\)#\1=$root/usr\2#" -e '/^Requires.private:/d' "$f"
done
pkg_config=$(command -v pkg-config || true)
if [ -z "$pkg_config" ]; then # Debian's pkgconf from the root, with its library
    mkdir -p "$deps/bin"
    cat >"$deps/bin/pkg-config" <<EOF
#!/bin/sh
LD_LIBRARY_PATH="$root/usr/lib/$ma\${LD_LIBRARY_PATH:+:\$LD_LIBRARY_PATH}" exec "$root/usr/bin/pkgconf" "\$@"
EOF
    chmod +x "$deps/bin/pkg-config"
    pkg_config=$deps/bin/pkg-config
fi
export PKG_CONFIG_PATH="$pcdirs${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}"
export CPATH="$root/usr/include:$root/usr/include/$ma/openblas-pthread${CPATH:+:$CPATH}"
export LIBRARY_PATH="$libdirs${LIBRARY_PATH:+:$LIBRARY_PATH}"

# traind's binaries carry an RPATH into the root (DT_RPATH, which also serves libopenblas's own
# libgfortran); LD_LIBRARY_PATH is set for them alone as a second net, never for Python, whose
# modules must keep the system's libsqlite3 and libz. libtraind_gpu.so, which the worker opens,
# finds cuBLAS, cuDNN and NCCL through the directories CMake linked them from (gpudirs, below):
# ld.so.conf knows the toolkit's at best, never a pip wheel's.
rtdirs=$libdirs
td() { LD_LIBRARY_PATH="$rtdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

# ---- CUDA, cuDNN and NCCL -----------------------------------------------------------------------

nvcc=$(command -v nvcc || true)
if [ -z "$nvcc" ]; then
    for c in /usr/local/cuda/bin/nvcc /usr/local/cuda-*/bin/nvcc; do
        if [ -x "$c" ]; then nvcc=$c && break; fi
    done
fi
sites=$($py -c 'import sys
print("\n".join(p for p in sys.path if p.endswith(("site-packages", "dist-packages"))))' \
    2>/dev/null || true)
if [ -z "$nvcc" ]; then # nvidia-cuda-nvcc's wheel, the last resort
    for s in $sites; do
        if [ -x "$s/nvidia/cu13/bin/nvcc" ]; then nvcc=$s/nvidia/cu13/bin/nvcc && break; fi
    done
fi
cuda_root=""
if [ -n "$nvcc" ]; then cuda_root=$(dirname "$(dirname "$(readlink -f "$nvcc")")"); fi

# The first root that holds both the header and the library (lib.so, else the versioned name
# that pip wheels ship alone): two lines, the include directory and the library.
find_dep() { # header lib root...
    local hdr=$1 lib=$2 r i l f
    shift 2
    for r in "$@"; do
        if [ -z "$r" ] || [ ! -d "$r" ]; then continue; fi
        for i in "$r/include" "$r/include/$ma" "$r/targets/x86_64-linux/include"; do
            [ -f "$i/$hdr" ] || continue
            for l in "$r/lib64" "$r/lib" "$r/lib/$ma" "$r/targets/x86_64-linux/lib"; do
                for f in "$l/lib$lib.so" "$l/lib$lib.so".[0-9]*; do
                    if [ -e "$f" ]; then
                        printf '%s\n%s\n' "$i" "$f"
                        return 0
                    fi
                done
            done
        done
    done
    return 1
}
pip_roots() { # subdir...: those directories under nvidia/ of every site-packages
    local s d
    for s in $sites; do for d in "$@"; do echo "$s/nvidia/$d"; done; done
}
cudnn=() nccl=() pip_cudnn=() pip_nccl=()
mapfile -t pip_cudnn < <(pip_roots cudnn cu13)
mapfile -t pip_nccl < <(pip_roots nccl cu13)
mapfile -t cudnn < <(find_dep cudnn.h cudnn "${CUDNN_ROOT:-}" "$cuda_root" /usr/local/cuda /usr \
    "${pip_cudnn[@]}")
mapfile -t nccl < <(find_dep nccl.h nccl "${NCCL_ROOT:-}" "$cuda_root" /usr/local/cuda /usr \
    "${pip_nccl[@]}")
cuda_args=()
if [ -n "$nvcc" ]; then cuda_args+=(-DCMAKE_CUDA_COMPILER="$nvcc"); fi
if [ ${#cudnn[@]} -eq 2 ]; then
    cuda_args+=(-DTRAIND_CUDNN_INCLUDE:PATH="${cudnn[0]}" -DTRAIND_CUDNN_LIB:FILEPATH="${cudnn[1]}")
fi
if [ ${#nccl[@]} -eq 2 ]; then
    cuda_args+=(-DTRAIND_NCCL_INCLUDE:PATH="${nccl[0]}" -DTRAIND_NCCL_LIB:FILEPATH="${nccl[1]}")
fi

gpu=$(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null |
    head -1)
echo "[gpu-tests] GPU: ${gpu:-none listed by nvidia-smi}"
echo "[gpu-tests] nvcc: ${nvcc:-none} ($("${nvcc:-false}" --version 2>/dev/null | tail -1));" \
    "cmake: $(cmake --version 2>/dev/null | head -1); cc: $(cc --version 2>/dev/null | head -1)"
echo "[gpu-tests] python: $($py -c 'import sys, torch
print(sys.executable, "torch", torch.__version__)' 2>/dev/null || echo "$py without torch")"
if [ "$do_build" = yes ]; then
    echo "[gpu-tests] cuDNN: ${cudnn[1]:-not found (CMake searches)}; NCCL: ${nccl[1]:-not" \
        "found (CMake searches)}"
fi
if [ "$budget" -gt 0 ]; then echo "[gpu-tests] BUDGET_S=$budget"; fi

# The directories CMake linked cuBLAS, cuDNN and NCCL from, onto td's LD_LIBRARY_PATH.
set_rtdirs() {
    local v f d gpudirs=""
    for v in TRAIND_CUDNN_LIB TRAIND_NCCL_LIB CUDA_cublas_LIBRARY CUDA_cublasLt_LIBRARY; do
        f=$(sed -n "s/^$v:[A-Z]*=//p" "$build/CMakeCache.txt" 2>/dev/null | head -1)
        case $f in "" | *NOTFOUND) continue ;; esac
        d=$(dirname "$f")
        case ":$gpudirs:" in *":$d:"*) ;; *) gpudirs=${gpudirs:+$gpudirs:}$d ;; esac
    done
    rtdirs=$libdirs${gpudirs:+:$gpudirs}
}

# ---- build ------------------------------------------------------------------------------------

t0=$SECONDS
built=no
has_parity=no
if [ "$do_build" = no ]; then
    if [ -x "$build/traind-worker" ] && [ -f "$build/CMakeCache.txt" ]; then
        built=yes
        if [ -x "$build/traind-gpu-parity" ]; then has_parity=yes; fi
        mkdir -p "$out"
        set_rtdirs
        record build SKIP "reusing $build (SKIP_BUILD=1 or ONLY without build)" 0 no
    else
        record build FAIL "no traind-worker in $build to reuse: build first (ONLY=build)" 0 yes
    fi
else
    if [ -d "$build" ] && [ ! -f "$build/CMakeCache.txt" ] && [ -n "$(ls -A "$build")" ]; then
        echo "run.sh: $build is not empty and not a CMake build directory; not removing it" >&2
        exit 2
    fi
    if [ "${KEEP_BUILD:-0}" != 1 ]; then rm -rf "$build"; fi
    mkdir -p "$out"
    rm -f "$out/results.tsv"
    detected=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
        head -1 | tr -d '. ')
    case $detected in [1-9][0-9] | [1-9][0-9][0-9]) ;; *) detected=90 ;; esac
    arch=${CUDA_ARCH:-$detected}
    jobs=${JOBS:-$(nproc)}
    # -Werror off unless WERROR=1: a launcher drops it (and nvcc's --Werror=all-warnings) from
    # each compile line, which CMAKE_C_FLAGS could not undo (add_compile_options comes later)
    launch=()
    if [ "${WERROR:-0}" != 1 ]; then
        mkdir -p "$build/tools"
        cat >"$build/tools/no-werror" <<'EOF'
#!/bin/sh
for a do
    shift
    case $a in -Werror | --Werror=all-warnings) ;; *) set -- "$@" "$a" ;; esac
done
exec "$@"
EOF
        chmod +x "$build/tools/no-werror"
        launch=(-DCMAKE_C_COMPILER_LAUNCHER="$build/tools/no-werror"
            -DCMAKE_CUDA_COMPILER_LAUNCHER="$build/tools/no-werror")
    fi
    if timeout -k 10 "$(tmo 600)" cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Release \
        -DTRAIND_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPKG_CONFIG_EXECUTABLE="$pkg_config" \
        -DCMAKE_PREFIX_PATH="$root/usr" \
        -DZLIB_INCLUDE_DIR="$root/usr/include" -DZLIB_LIBRARY="$root/usr/lib/$ma/libz.so" \
        -DCMAKE_BUILD_RPATH="${libdirs//:/;}" \
        -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath-link,${libdirs//:/ -Wl,-rpath-link,}" \
        "${cuda_args[@]}" "${launch[@]}" >"$out/configure.log" 2>&1; then
        if ! grep -q "CUDA sources enabled" "$out/configure.log"; then
            record build FAIL "CMake found no nvcc: put the CUDA toolkit's bin on PATH (see \
$out/configure.log)" $((SECONDS - t0)) yes
        else
            set_rtdirs
            targets="traind-worker"
            if grep -q "traind-gpu-parity" "$build/CMakeFiles/TargetDirectories.txt" 2>/dev/null; then
                targets="$targets traind-gpu-parity"
                has_parity=yes
            fi
            # shellcheck disable=SC2086 # one word per target
            timeout -k 10 "$(tmo 3000)" cmake --build "$build" -j"$jobs" --target $targets \
                >"$out/build.log" 2>&1
            rc=$?
            warnings=$(grep -c "warning" "$out/build.log")
            if [ $rc -eq 0 ]; then
                built=yes
                missing=$(td ldd "$build/traind-worker" | grep "not found" | tr -s ' \t' ' ')
                if [ -f "$build/libtraind_gpu.so" ]; then
                    missing="$missing$(td ldd "$build/libtraind_gpu.so" | grep "not found" |
                        tr -s ' \t' ' ')"
                fi
                if [ -n "$missing" ]; then
                    record build FAIL "traind-worker or libtraind_gpu.so misses libraries:$missing \
(LD_LIBRARY_PATH for them: $rtdirs)" $((SECONDS - t0)) yes
                    built=no
                else
                    record build PASS "CUDA arch $arch, targets: $targets, $warnings lines with \
'warning' in $out/build.log" $((SECONDS - t0)) yes
                fi
            elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
                record build FAIL "cmake --build timed out: KEEP_BUILD=1 ONLY=build continues it" \
                    $((SECONDS - t0)) yes
            else
                record build FAIL "cmake --build failed: $(grep -m1 -E 'error|Error' \
"$out/build.log" | cut -c1-200) (see $out/build.log)" $((SECONDS - t0)) yes
            fi
        fi
    else
        record build FAIL "cmake configure failed: $(grep -m1 -E 'Error|error' \
"$out/configure.log" | cut -c1-200) (see $out/configure.log)" $((SECONDS - t0)) yes
    fi
fi
if [ "$built" != yes ]; then
    summary
    exit 1
fi
worker=$build/traind-worker
echo "[gpu-tests] LD_LIBRARY_PATH for traind's processes: $rtdirs"

# ---- helpers ------------------------------------------------------------------------------------

# A small convolutional net with BatchNorm (buffers to broadcast and checkpoint) and optionally
# dropout before the classifier; 28x28 synthetic data, 40 steps per epoch.
spec() { # name ckpt_dir max_steps precision dropout(0|p) extra_json [train_extra_json]
    local drop=""
    if [ "$5" != 0 ]; then drop="{\"name\": \"drop\", \"op\": \"dropout\", \"p\": $5},"; fi
    cat <<JSON
{"name": "$1",
 "model": {"num_classes": 10, "nodes": [
   {"name": "conv1", "op": "conv2d", "out_channels": 16, "kernel_size": 3, "padding": 1,
    "bias": false},
   {"name": "bn1", "op": "batchnorm2d"},
   {"name": "relu1", "op": "relu"},
   {"name": "pool1", "op": "maxpool2d", "kernel_size": 2},
   {"name": "conv2", "op": "conv2d", "out_channels": 32, "kernel_size": 3, "padding": 1,
    "bias": false},
   {"name": "bn2", "op": "batchnorm2d"},
   {"name": "relu2", "op": "relu"},
   {"name": "gap", "op": "global_avgpool"},
   $drop
   {"name": "fc", "op": "linear", "out_features": 10}]},
 "data": {"format": "synthetic", "shape": [1, 28, 28], "num_classes": 10, "size": 2560},
 "train": {"epochs": 4, "max_steps": $3, "batch_size": 64, "seed": 7, "device": "$device",
           "precision": "$4",
           "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9, "weight_decay": 0.0005},
           "schedule": {"type": "cosine", "warmup_steps": 5}${7:-}},
 "checkpoint": {"dir": "$2"},
 "log": {"every_steps": 5}$6}
JSON
}

# The loss of every train and done line, one "event step loss" per line: what two runs that
# train identically share (timings and memory figures differ).
losses() {
    $py -c '
import json, sys
for line in open(sys.argv[1]):
    if line.startswith("{"):
        e = json.loads(line)
        if e.get("event") in ("train", "done"):
            print(e["event"], e["step"], repr(e["loss"]))' "$1"
}

# Byte comparison of a checkpoint's tensors: "same" or what differs.
same_checkpoint() { # dir_a dir_b
    local f diff=""
    for f in model.safetensors optimizer.safetensors; do
        if [ ! -f "$1/$f" ] || [ ! -f "$2/$f" ]; then
            diff="$diff $f missing;"
        elif ! cmp -s "$1/$f" "$2/$f"; then
            diff="$diff $f differs;"
        fi
    done
    echo "${diff:-same}"
}

last_checkpoint() { # the newest step-NNNNNNNN (the glob sorts them)
    local last="" c
    for c in "$1"/step-[0-9]*[0-9]; do [ -d "$c" ] && last=$c; done
    echo "$last"
}

# ---- a) parity ----------------------------------------------------------------------------------

if begin parity; then
    t0=$SECONDS
    if [ "$has_parity" = yes ]; then
        td timeout -k 10 "$(tmo 900)" "$build/traind-gpu-parity" >"$out/parity.log" 2>&1
        rc=$?
        cat "$out/parity.log"
        tally=$(tail -1 "$out/parity.log")
        case $rc in
        0) record parity PASS "$tally" $((SECONDS - t0)) yes ;;
        77) record parity SKIP "$(head -1 "$out/parity.log")" $((SECONDS - t0)) yes ;;
        *) record parity FAIL "$(why $rc): $tally; FAIL rows in $out/parity.log" \
            $((SECONDS - t0)) yes ;;
        esac
    else
        record parity FAIL "no CMake target traind-gpu-parity (add tests/gpu/test_gpu_parity.c)" \
            0 yes
    fi
fi

# ---- b) DDP with a world of one ---------------------------------------------------------------

# The trainer treats WORLD_SIZE=1 as no distribution at all; TRAIND_FORCE_DDP=1 sends a world of
# one through NCCL and the buckets anyway. A small bucket cap makes several buckets. With
# train.sync_bn the BatchNorm sums take the NCCL path as well; over one rank they add nothing,
# so that run must equal the plain one too.
ddp1_compare() { # plain_dir run_dir label: "" when they trained identically, else what differs
    local ck
    if [ "$(losses "$1/plain.out")" != "$(losses "$2.out")" ]; then
        echo "$3: loss lines differ: $(diff <(losses "$1/plain.out") <(losses "$2.out") |
            head -3 | tr '\n' ' ')"
        return
    fi
    ck=$(same_checkpoint "$(last_checkpoint "$1/ck-plain")" "$(last_checkpoint "$1/ck-$3")")
    [ "$ck" = same ] || echo "$3: losses equal but the final checkpoint differs:$ck"
}

if begin ddp1; then
    t0=$SECONDS
    d=$out/ddp1
    rm -rf "$d"
    mkdir -p "$d"
    dist=', "distributed": {"backend": "nccl", "bucket_cap_mb": 0.001}'
    spec ddp1 "$d/ck-plain" 40 fp32 0 "$dist" >"$d/plain.json"
    spec ddp1 "$d/ck-ddp" 40 fp32 0 "$dist" >"$d/ddp.json"
    spec ddp1 "$d/ck-sync" 40 fp32 0 "$dist" ', "sync_bn": true' >"$d/sync.json"
    td timeout -k 10 "$(tmo 600)" "$worker" "$d/plain.json" >"$d/plain.out" 2>"$d/plain.err"
    rc1=$?
    for run in ddp sync; do
        td env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 TRAIND_FORCE_DDP=1 \
            TRAIND_TIMEOUT_S=120 timeout -k 10 "$(tmo 600)" "$worker" "$d/$run.json" \
            >"$d/$run.out" 2>"$d/$run.err"
        eval "rc_$run=\$?"
    done
    buckets=$(grep -o 'gradients in [0-9]* bucket' "$d/ddp.err" | grep -o '[0-9]*')
    if [ $rc1 -ne 0 ] || [ $rc_ddp -ne 0 ] || [ $rc_sync -ne 0 ]; then
        record ddp1 FAIL "worker $(why $rc1) (plain) / $(why $rc_ddp) (DDP) / $(why $rc_sync) \
(SyncBatchNorm): $(tail -1 "$d/plain.err") / $(tail -1 "$d/ddp.err") / $(tail -1 "$d/sync.err")" \
            $((SECONDS - t0)) yes
    elif ! grep -q "all-reduced through NCCL" "$d/ddp.err"; then
        record ddp1 FAIL "the DDP run did not go through NCCL (is TRAIND_FORCE_DDP honoured?)" \
            $((SECONDS - t0)) yes
    elif ! grep -q "SyncBatchNorm statistics over every rank" "$d/sync.err"; then
        record ddp1 FAIL "the sync_bn run did not announce SyncBatchNorm (see $d/sync.err)" \
            $((SECONDS - t0)) yes
    else
        diffs="$(ddp1_compare "$d" "$d/ddp" ddp)$(ddp1_compare "$d" "$d/sync" sync)"
        if [ -z "$diffs" ]; then
            record ddp1 PASS "$(losses "$d/ddp.out" | wc -l) loss lines and the final \
checkpoint identical, with and without SyncBatchNorm; ${buckets:-?} buckets" $((SECONDS - t0)) yes
        else
            record ddp1 FAIL "$diffs" $((SECONDS - t0)) yes
        fi
    fi
fi

# ---- c) Fashion-MNIST in bf16 -------------------------------------------------------------------

if begin fmnist; then
    t0=$SECONDS
    data=$deps/fashion-mnist
    [ -f "$data/train-images-idx3-ubyte.gz" ] || data=/usr/share/datasets/fashion-mnist
    rm -f "$out/fmnist.json" "$out/fmnist.out" "$out/fmnist.err"
    if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
        record fmnist FAIL "no Fashion-MNIST in $deps/fashion-mnist (rerun fetch-deps.sh)" 0 yes
    elif ! $py -c 'import json, os, sys
job = json.load(open(sys.argv[1]))
job["train"].update(device=sys.argv[4], precision="bf16", cudnn_benchmark=True)
for split in ("train", "val"):
    for key, path in job["data"][split].items():
        job["data"][split][key] = os.path.join(sys.argv[2], os.path.basename(path))
json.dump(job, open(sys.argv[3], "w"), indent=1)' "$top/examples/fmnist-lenet.json" "$data" \
        "$out/fmnist.json" "$device"; then
        record fmnist FAIL "could not write $out/fmnist.json with $py" $((SECONDS - t0)) yes
    else
        td timeout -k 10 "$(tmo 1800)" "$worker" "$out/fmnist.json" >"$out/fmnist.out" \
            2>"$out/fmnist.err"
        rc=$?
        acc=$($py -c '
import json, sys
accs = [json.loads(l)["val_acc"] for l in open(sys.argv[1]) if "\"event\":\"eval\"" in l]
print(accs[-1] if accs else "none")' "$out/fmnist.out")
        if [ $rc -ne 0 ]; then
            record fmnist FAIL "worker $(why $rc): $(tail -1 "$out/fmnist.err"); last val_acc \
${acc:-none}" $((SECONDS - t0)) yes
        elif [ "$device" = cuda ] && ! grep -q "cuDNN benchmark: [1-9]" "$out/fmnist.err"; then
            record fmnist FAIL "train.cudnn_benchmark set but no convolution was timed (see \
$out/fmnist.err)" $((SECONDS - t0)) yes
        elif $py -c "import sys; sys.exit(0 if '$acc' != 'none' and float('$acc') >= 0.90 else 1)"
        then
            record fmnist PASS "val_acc $acc >= 0.90 after 10 epochs, bf16, cuDNN algorithms \
timed" $((SECONDS - t0)) yes
        else
            record fmnist FAIL "val_acc $acc < 0.90 after 10 epochs, bf16" $((SECONDS - t0)) yes
        fi
    fi
fi

# ---- c2) a GPT (nanoGPT's Shakespeare example) on the GPU against the CPU ------------------------

if begin gpt; then
    t0=$SECONDS
    rm -f "$out"/gpt-*.json "$out"/gpt-*.out "$out"/gpt-*.err
    # 30 steps with a loss line each: fp32 on the GPU against the CPU (1e-3 relative, the
    # kernels' sums run in another order), then bf16 on the GPU with an evaluation and a sample
    if ! $py -c 'import json, sys
job = json.load(open(sys.argv[1]))
job["data"]["train"]["path"] = sys.argv[2]
job["log"] = {"every_steps": 1}
for dev, prec, steps in (("cpu", "fp32", 30), ("cuda", "fp32", 30), ("cuda", "bf16", 200)):
    j = json.loads(json.dumps(job))
    j["train"].update(device=dev, precision=prec, max_steps=steps, eval_every_steps=100,
                      eval_iters=5)
    j["train"].pop("threads", None)
    json.dump(j, open("%s/gpt-%s-%s.json" % (sys.argv[3], dev, prec), "w"), indent=1)' \
        "$top/examples/shakespeare-gpt.json" "$top/examples/data/tinyshakespeare.txt" "$out"; then
        record gpt FAIL "could not write the GPT jobs with $py" $((SECONDS - t0)) yes
    else
        rc=0
        for run in cpu-fp32 "$device"-fp32 "$device"-bf16; do
            [ -f "$out/gpt-$run.out" ] && continue
            td timeout -k 10 "$(tmo 900)" "$worker" "$out/gpt-$run.json" >"$out/gpt-$run.out" \
                2>"$out/gpt-$run.err" || rc=$?
        done
        verdict=$($py -c 'import json, sys
def lines(path, event):
    return [json.loads(l) for l in open(path) if "\"event\":\"%s\"" % event in l]
cpu = [l["loss"] for l in lines(sys.argv[1], "train")]
gpu = [l["loss"] for l in lines(sys.argv[2], "train")]
if len(cpu) != 30 or len(gpu) != 30:
    print("FAIL %d CPU and %d GPU loss lines, expected 30 each" % (len(cpu), len(gpu))); sys.exit()
worst = max(abs(a - b) / abs(a) for a, b in zip(cpu, gpu))
bf = [l["loss"] for l in lines(sys.argv[3], "train")]
samples = lines(sys.argv[3], "sample")
if worst > 1e-3:
    print("FAIL fp32 GPU losses differ from the CPU by %.2e relative (bound 1e-3)" % worst)
elif len(bf) != 200 or not bf[-1] < bf[0] - 1.0:
    print("FAIL bf16: %d loss lines, first %s, last %s" % (len(bf), bf[:1], bf[-1:]))
elif not samples:
    print("FAIL bf16: no sample line")
else:
    print("PASS fp32 losses within %.1e of the CPU over 30 steps; bf16 loss %.3f -> %.3f in 200 "
          "steps, sample: %r" % (worst, bf[0], bf[-1], samples[-1]["text"][:40]))' \
            "$out/gpt-cpu-fp32.out" "$out/gpt-$device-fp32.out" "$out/gpt-$device-bf16.out" \
            2>&1 | tail -1)
        if [ $rc -ne 0 ]; then
            record gpt FAIL "worker $(why $rc): $(tail -1 "$out/gpt-$device-bf16.err")" \
                $((SECONDS - t0)) yes
        else
            record gpt "${verdict%% *}" "${verdict#* }" $((SECONDS - t0)) yes
        fi
    fi
fi

# ---- d) resume exactness ------------------------------------------------------------------------

resume_case() { # item dropout [precision [train_extra_json]]
    local t0=$SECONDS d=$out/$1 n=48 half=24 rc prec=${3:-fp32} tx=${4:-}
    rm -rf "$d"
    mkdir -p "$d"
    spec "$1" "$d/ck-a" $n "$prec" "$2" "" "$tx" >"$d/a.json"
    spec "$1" "$d/ck-a2" $n "$prec" "$2" "" "$tx" >"$d/a2.json"
    spec "$1" "$d/ck-b" $n "$prec" "$2" "" "$tx" >"$d/b1.json"
    spec "$1" "$d/ck-b" $n "$prec" "$2" ', "resume_from": "latest"' "$tx" >"$d/b2.json"
    # a and a2 straight, b1 stopped half-way, b2 resumed from b1's checkpoint
    local run stop=()
    for run in a a2 b1 b2; do
        stop=()
        if [ $run = b1 ]; then stop=(--stop-after "$half"); fi
        td timeout -k 10 "$(tmo 600)" "$worker" "${stop[@]}" "$d/$run.json" >"$d/$run.out" \
            2>"$d/$run.err"
        rc=$?
        if [ $rc -ne 0 ]; then
            record "$1" FAIL "worker run $run $(why $rc): $(tail -1 "$d/$run.err")" \
                $((SECONDS - t0)) yes
            return
        fi
    done
    local straight resumed again
    straight=$(same_checkpoint "$(last_checkpoint "$d/ck-a")" "$d/ck-b/step-$(printf %08d $n)")
    again=$(same_checkpoint "$(last_checkpoint "$d/ck-a")" "$(last_checkpoint "$d/ck-a2")")
    resumed=$(cat "$d/b1.out" "$d/b2.out" >"$d/b.out" && losses "$d/b.out")
    if [ "$again" != same ]; then
        record "$1" FAIL "two straight runs already differ ($again): the GPU run is not \
deterministic (cuDNN algorithm choice? atomics?)" $((SECONDS - t0)) yes
    elif [ "$straight" != same ]; then
        record "$1" FAIL "step $n after a stop at $half:$straight" $((SECONDS - t0)) yes
    elif [ "$(losses "$d/a.out")" != "$resumed" ]; then
        record "$1" FAIL "checkpoints equal but loss lines differ: $(diff <(losses "$d/a.out") \
<(echo "$resumed") | head -3 | tr '\n' ' ')" $((SECONDS - t0)) yes
    else
        record "$1" PASS "$n steps straight = $half + resume: checkpoint bytes and \
$(echo "$resumed" | wc -l) loss lines identical" $((SECONDS - t0)) yes
    fi
}
# CUDA graph replays train exactly as op-by-op steps: resume's straight run (its first step op by
# op, then replays of one captured graph, the learning rate changing every step under warmup and
# cosine) against the same job with train.cuda_graph off
graph_eq() {
    local t0=$SECONDS d=$out/resume rc same
    rm -rf "$d/ck-eager"
    spec resume "$d/ck-eager" 48 fp32 0 "" ', "cuda_graph": false' >"$d/eager.json"
    td timeout -k 10 "$(tmo 600)" "$worker" "$d/eager.json" >"$d/eager.out" 2>"$d/eager.err"
    rc=$?
    if [ $rc -ne 0 ]; then
        record graph-eq FAIL "worker $(why $rc): $(tail -1 "$d/eager.err")" $((SECONDS - t0)) yes
        return
    fi
    if [ ! -f "$d/a.err" ] || [ -z "$(last_checkpoint "$d/ck-a")" ]; then
        record graph-eq FAIL "resume's straight run did not finish" $((SECONDS - t0)) yes
        return
    fi
    if [ "$device" = cuda ] && grep -q "training op by op from here" "$d/a.err"; then
        record graph-eq FAIL "the straight run never replayed a graph: $(grep -m1 "CUDA graph:" \
"$d/a.err")" $((SECONDS - t0)) yes
        return
    fi
    same=$(same_checkpoint "$(last_checkpoint "$d/ck-a")" "$(last_checkpoint "$d/ck-eager")")
    if [ "$same" != same ]; then
        record graph-eq FAIL "48 steps from CUDA graph replays against op by op:$same" \
            $((SECONDS - t0)) yes
    elif [ "$(losses "$d/a.out")" != "$(losses "$d/eager.out")" ]; then
        record graph-eq FAIL "checkpoints equal but loss lines differ: $(diff <(losses "$d/a.out") \
<(losses "$d/eager.out") | head -3 | tr '\n' ' ')" $((SECONDS - t0)) yes
    else
        record graph-eq PASS "48 steps, 47 of them CUDA graph replays = op by op: checkpoint \
bytes and $(losses "$d/eager.out" | wc -l) loss lines identical" $((SECONDS - t0)) yes
    fi
}
if begin resume; then
    resume_case resume 0
    graph_eq
fi
if begin resume-d; then resume_case resume-d 0.3; fi
# fp16: the GradScaler's scale and growth tracker travel in the checkpoint
if begin resume-fp16; then resume_case resume-fp16 0 fp16; fi
# activation checkpointing (dropout inside a segment): resumes exactly, and trains exactly as
# the run that keeps every activation (resume-d's straight run, from this call or an earlier one
# on this build directory)
if begin recompute; then
    segments=', "activation_checkpointing": [{"first": "conv1", "last": "pool1"},
    {"first": "conv2", "last": "drop"}]'
    resume_case recompute 0.3 fp32 "$segments"
    t0=$SECONDS
    if [ -d "$out/recompute/ck-a" ] && [ -d "$out/resume-d/ck-a" ]; then
        same=$(same_checkpoint "$(last_checkpoint "$out/resume-d/ck-a")" \
            "$(last_checkpoint "$out/recompute/ck-a")")
        if [ "$same" = same ]; then
            record recompute-eq PASS "48 steps with 2 recomputed segments = without: checkpoint \
bytes identical" $((SECONDS - t0)) yes
        else
            record recompute-eq FAIL "with and without activation checkpointing:$same" \
                $((SECONDS - t0)) yes
        fi
    else
        record recompute-eq FAIL "a run it compares did not finish (it needs resume-d's, from \
this call or an earlier one on $build)" 0 yes
    fi
fi

# ---- e) benchmark ------------------------------------------------------------------------------

if [ "${SKIP_BENCH:-0}" = 1 ]; then
    if want bench; then record bench SKIP "SKIP_BENCH=1" 0 no; fi
elif begin bench no; then
    t0=$SECONDS
    # stdout and stderr (a progress line per figure) both into bench.log: what a time limit
    # cuts short still shows what was measured
    PYTHON=$py TRAIND_LD_LIBRARY_PATH=$rtdirs timeout -k 10 "$(tmo 3600)" \
        sh "$top/bench/gpu.sh" "$build" 2>&1 | tee "$out/bench.log"
    rc=${PIPESTATUS[0]}
    failed=$(grep '^|' "$out/bench.log" | grep -o 'failed' | wc -l)
    if [ "$rc" -eq 0 ]; then
        record bench PASS "table above and in $out/bench.log; $failed figures failed (their \
reasons: the 'bench:' lines there)" $((SECONDS - t0)) no
    else
        record bench FAIL "bench/gpu.sh $(why "$rc") (see $out/bench.log)" $((SECONDS - t0)) no
    fi
fi

trap - INT TERM HUP
summary
