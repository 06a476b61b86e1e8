#!/bin/bash
# The GPU suite in one command, for a machine with an NVIDIA GPU, CUDA, cuDNN, NCCL, CMake and
# PyTorch but none of Debian's -dev packages and no network. It configures and builds the tree
# into a fresh build directory against the libraries tests/gpu/fetch-deps.sh gathered (run that
# on the Debian dev machine first and copy .gpu-deps/ along), then runs
#   a) parity   traind-gpu-parity: every op, loss and optimizer, CPU against GPU, fp32 and bf16
#   b) ddp1     NCCL DDP with a world of one (TRAIND_FORCE_DDP=1) trains exactly as the plain
#               run: the same loss lines and checkpoint bytes
#   c) fmnist   Fashion-MNIST LeNet-5 in bf16 reaches val_acc >= 0.90
#   d) resume   N steps straight against N/2, stop, resume (checkpoint bytes, loss lines): fp32
#               with BatchNorm and, separately, with dropout; fp16 (GradScaler state); fp32 with
#               activation checkpointing, which must also equal the run without
#   e) bench    bench/gpu.sh, img/s against PyTorch (informational: it never fails the suite)
# and prints a summary table. Exit status 1 when a required item (a-d) failed.
#
#   tests/gpu/run.sh [BUILD_DIR]          (default: build-gpu, removed and rebuilt)
#
# Environment: CUDA_ARCH (default: the GPU's compute capability, e.g. 90), JOBS (build
# parallelism), PYTHON (default python3), SKIP_BENCH=1, CUDNN_ROOT / NCCL_ROOT when cuDNN / NCCL
# are not beside the CUDA toolkit (a pip-installed PyTorch's nvidia-* wheels, say). Logs of every
# step land in BUILD_DIR/gpu-tests/.
set -u
top=$(cd "$(dirname "$0")/../.." && pwd)
deps=$top/.gpu-deps
root=$deps/root
ma=x86_64-linux-gnu
build=${1:-$top/build-gpu}
out=$build/gpu-tests
py=${PYTHON:-python3}

# The unpacked root is twice the size of the .debs, so only the .debs travel (the device tool
# carries at most 64 MiB) and are unpacked here: with dpkg where there is one, else ar + tar.
if [ ! -d "$root/usr/include" ] && [ -d "$deps/debs" ]; then
    mkdir -p "$root"
    for deb in "$deps"/debs/*.deb; do
        if command -v dpkg-deb > /dev/null; then
            dpkg-deb -x "$deb" "$root" || exit 2
        else
            (tmp=$(mktemp -d) && cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$root" &&
                rm -rf "$tmp") || exit 2
        fi
    done
fi
if [ ! -d "$root/usr/include" ]; then
    echo "run.sh: $root is missing: run tests/gpu/fetch-deps.sh on the Debian dev machine and" \
        "carry .gpu-deps/debs and .gpu-deps/fashion-mnist here with the tree" >&2
    exit 2
fi

# ---- bookkeeping ----------------------------------------------------------------------------

names=() results=() details=() secs=() required=()
record() { # name PASS|FAIL|SKIP detail seconds required(yes|no)
    names+=("$1") results+=("$2") details+=("$3") secs+=("$4") required+=("$5")
    printf '[gpu-tests] %-8s %s: %s (%ss)\n' "$1" "$2" "$3" "$4"
}

summary() {
    echo
    echo "| item     | result | seconds | required | detail"
    echo "|----------|--------|---------|----------|-------"
    local failed=0 i
    for i in "${!names[@]}"; do
        printf '| %-8s | %-6s | %7s | %-8s | %s\n' "${names[$i]}" "${results[$i]}" \
            "${secs[$i]}" "${required[$i]}" "${details[$i]}"
        if [ "${results[$i]}" != PASS ] && [ "${required[$i]}" = yes ]; then failed=1; fi
    done
    echo
    echo "logs: $out"
    return $failed
}

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
# modules must keep the system's libsqlite3 and libz
td() { LD_LIBRARY_PATH="$libdirs${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" "$@"; }

# ---- build ------------------------------------------------------------------------------------

if [ -d "$build" ] && [ ! -f "$build/CMakeCache.txt" ] && [ -n "$(ls -A "$build")" ]; then
    echo "run.sh: $build is not empty and not a CMake build directory; not removing it" >&2
    exit 2
fi
rm -rf "$build"
mkdir -p "$out"
echo "[gpu-tests] $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
    2>/dev/null | head -1 || echo 'nvidia-smi: no GPU listed')"
arch=${CUDA_ARCH:-$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null |
    head -1 | tr -d '. ')}
arch=${arch:-native}
jobs=${JOBS:-$(nproc)}
t0=$SECONDS
built=no
if cmake -S "$top" -B "$build" -DCMAKE_BUILD_TYPE=Release -DTRAIND_CUDA=ON \
    -DCMAKE_CUDA_ARCHITECTURES="$arch" -DPKG_CONFIG_EXECUTABLE="$pkg_config" \
    -DCMAKE_PREFIX_PATH="$root/usr" \
    -DZLIB_INCLUDE_DIR="$root/usr/include" -DZLIB_LIBRARY="$root/usr/lib/$ma/libz.so" \
    -DCMAKE_BUILD_RPATH="${libdirs//:/;}" \
    -DCMAKE_EXE_LINKER_FLAGS="-Wl,--disable-new-dtags -Wl,-rpath-link,${libdirs//:/ -Wl,-rpath-link,}" \
    >"$out/configure.log" 2>&1; then
    if ! grep -q "CUDA sources enabled" "$out/configure.log"; then
        record build FAIL "CMake found no nvcc: put the CUDA toolkit's bin on PATH (see \
$out/configure.log)" $((SECONDS - t0)) yes
    else
        targets="traind-worker"
        has_parity=no
        if grep -q "traind-gpu-parity" "$build/CMakeFiles/TargetDirectories.txt" 2>/dev/null; then
            targets="$targets traind-gpu-parity"
            has_parity=yes
        fi
        # shellcheck disable=SC2086 # one word per target
        if cmake --build "$build" -j"$jobs" --target $targets >"$out/build.log" 2>&1; then
            built=yes
            missing=$(td ldd "$build/traind-worker" | grep "not found" | tr -s ' \t' ' ')
            if [ -n "$missing" ]; then
                record build FAIL "traind-worker misses libraries:$missing" \
                    $((SECONDS - t0)) yes
                built=no
            else
                record build PASS "CUDA arch $arch, targets: $targets" $((SECONDS - t0)) yes
            fi
        else
            record build FAIL "cmake --build failed: $(grep -m1 -E 'error|Error' \
"$out/build.log" | cut -c1-160) (see $out/build.log)" $((SECONDS - t0)) yes
        fi
    fi
else
    record build FAIL "cmake configure failed: $(grep -m1 -E 'Error|error' \
"$out/configure.log" | cut -c1-160) (see $out/configure.log)" $((SECONDS - t0)) yes
fi
if [ "$built" != yes ]; then
    summary
    exit 1
fi
worker=$build/traind-worker

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
 "train": {"epochs": 4, "max_steps": $3, "batch_size": 64, "seed": 7, "device": "cuda",
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
    for c in "$1"/step-*; do [ -d "$c" ] && last=$c; done
    echo "$last"
}

# ---- a) parity ----------------------------------------------------------------------------------

t0=$SECONDS
if [ "$has_parity" = yes ]; then
    td timeout 900 "$build/traind-gpu-parity" >"$out/parity.log" 2>&1
    rc=$?
    cat "$out/parity.log"
    tally=$(tail -1 "$out/parity.log")
    case $rc in
    0) record parity PASS "$tally" $((SECONDS - t0)) yes ;;
    77) record parity SKIP "$(head -1 "$out/parity.log")" $((SECONDS - t0)) yes ;;
    *) record parity FAIL "exit $rc: $tally; FAIL rows in $out/parity.log" $((SECONDS - t0)) yes ;;
    esac
else
    record parity FAIL "no CMake target traind-gpu-parity (add tests/gpu/test_gpu_parity.c)" 0 yes
fi

# ---- b) DDP with a world of one ---------------------------------------------------------------

# The trainer treats WORLD_SIZE=1 as no distribution at all; TRAIND_FORCE_DDP=1 sends a world of
# one through NCCL and the buckets anyway. A small bucket cap makes several buckets.
t0=$SECONDS
d=$out/ddp1
mkdir -p "$d"
dist=', "distributed": {"backend": "nccl", "bucket_cap_mb": 0.001}'
spec ddp1 "$d/ck-plain" 40 fp32 0 "$dist" >"$d/plain.json"
spec ddp1 "$d/ck-ddp" 40 fp32 0 "$dist" >"$d/ddp.json"
td timeout 600 "$worker" "$d/plain.json" >"$d/plain.out" 2>"$d/plain.err"
rc1=$?
td env RANK=0 WORLD_SIZE=1 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 TRAIND_FORCE_DDP=1 TRAIND_TIMEOUT_S=120 \
    timeout 600 "$worker" "$d/ddp.json" >"$d/ddp.out" 2>"$d/ddp.err"
rc2=$?
buckets=$(grep -o 'gradients in [0-9]* bucket' "$d/ddp.err" | grep -o '[0-9]*')
if [ $rc1 -ne 0 ] || [ $rc2 -ne 0 ]; then
    record ddp1 FAIL "worker exit $rc1 (plain) / $rc2 (DDP): $(tail -1 "$d/plain.err") / \
$(tail -1 "$d/ddp.err")" $((SECONDS - t0)) yes
elif ! grep -q "all-reduced through NCCL" "$d/ddp.err"; then
    record ddp1 FAIL "the DDP run did not go through NCCL (is TRAIND_FORCE_DDP honoured?)" \
        $((SECONDS - t0)) yes
elif [ "$(losses "$d/plain.out")" != "$(losses "$d/ddp.out")" ]; then
    record ddp1 FAIL "loss lines differ: $(diff <(losses "$d/plain.out") <(losses "$d/ddp.out") |
        head -3 | tr '\n' ' ')" $((SECONDS - t0)) yes
else
    ck=$(same_checkpoint "$(last_checkpoint "$d/ck-plain")" "$(last_checkpoint "$d/ck-ddp")")
    if [ "$ck" = same ]; then
        record ddp1 PASS "$(losses "$d/ddp.out" | wc -l) loss lines and the final checkpoint \
identical; $buckets buckets" $((SECONDS - t0)) yes
    else
        record ddp1 FAIL "losses equal but the final checkpoint differs:$ck" $((SECONDS - t0)) yes
    fi
fi

# ---- c) Fashion-MNIST in bf16 -------------------------------------------------------------------

t0=$SECONDS
data=$deps/fashion-mnist
[ -f "$data/train-images-idx3-ubyte.gz" ] || data=/usr/share/datasets/fashion-mnist
if [ ! -f "$data/train-images-idx3-ubyte.gz" ]; then
    record fmnist FAIL "no Fashion-MNIST in $deps/fashion-mnist (rerun fetch-deps.sh)" 0 yes
else
    $py -c 'import json, os, sys
job = json.load(open(sys.argv[1]))
job["train"].update(device="cuda", precision="bf16")
for split in ("train", "val"):
    for key, path in job["data"][split].items():
        job["data"][split][key] = os.path.join(sys.argv[2], os.path.basename(path))
json.dump(job, open(sys.argv[3], "w"), indent=1)' "$top/examples/fmnist-lenet.json" "$data" \
        "$out/fmnist.json"
    td timeout 1800 "$worker" "$out/fmnist.json" >"$out/fmnist.out" 2>"$out/fmnist.err"
    rc=$?
    acc=$($py -c '
import json, sys
accs = [json.loads(l)["val_acc"] for l in open(sys.argv[1]) if "\"event\":\"eval\"" in l]
print(accs[-1] if accs else "none")' "$out/fmnist.out")
    if [ $rc -ne 0 ]; then
        record fmnist FAIL "worker exit $rc: $(tail -1 "$out/fmnist.err")" $((SECONDS - t0)) yes
    elif $py -c "import sys; sys.exit(0 if '$acc' != 'none' and float('$acc') >= 0.90 else 1)"; then
        record fmnist PASS "val_acc $acc >= 0.90 after 10 epochs, bf16" $((SECONDS - t0)) yes
    else
        record fmnist FAIL "val_acc $acc < 0.90 after 10 epochs, bf16" $((SECONDS - t0)) yes
    fi
fi

# ---- d) resume exactness, fp32 ----------------------------------------------------------------

resume_case() { # item dropout [precision [train_extra_json]]
    local t0=$SECONDS d=$out/$1 n=48 half=24 rc prec=${3:-fp32} tx=${4:-}
    mkdir -p "$d"
    spec "$1" "$d/ck-a" $n "$prec" "$2" "" "$tx" >"$d/a.json"
    spec "$1" "$d/ck-a2" $n "$prec" "$2" "" "$tx" >"$d/a2.json"
    spec "$1" "$d/ck-b" $n "$prec" "$2" "" "$tx" >"$d/b1.json"
    spec "$1" "$d/ck-b" $n "$prec" "$2" ', "resume_from": "latest"' "$tx" >"$d/b2.json"
    td timeout 600 "$worker" "$d/a.json" >"$d/a.out" 2>"$d/a.err" &&
        td timeout 600 "$worker" "$d/a2.json" >"$d/a2.out" 2>"$d/a2.err" &&
        td timeout 600 "$worker" --stop-after $half "$d/b1.json" >"$d/b1.out" 2>"$d/b1.err" &&
        td timeout 600 "$worker" "$d/b2.json" >"$d/b2.out" 2>"$d/b2.err"
    rc=$?
    if [ $rc -ne 0 ]; then
        record "$1" FAIL "a worker run failed (exit $rc; logs in $d)" $((SECONDS - t0)) yes
        return
    fi
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
resume_case resume 0
resume_case resume-d 0.3
# fp16: the GradScaler's scale and growth tracker travel in the checkpoint
resume_case resume-fp16 0 fp16
# activation checkpointing (dropout inside a segment): resumes exactly, and trains exactly as
# the run that keeps every activation (resume-d's straight run)
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
    record recompute-eq FAIL "a run it compares did not finish" 0 yes
fi

# ---- e) benchmark ------------------------------------------------------------------------------

if [ "${SKIP_BENCH:-0}" = 1 ]; then
    record bench SKIP "SKIP_BENCH=1" 0 no
else
    t0=$SECONDS
    PYTHON=$py TRAIND_LD_LIBRARY_PATH=$libdirs sh "$top/bench/gpu.sh" "$build" 2>"$out/bench.err" |
        tee "$out/bench.log"
    rc=${PIPESTATUS[0]}
    if [ "$rc" -eq 0 ]; then
        record bench PASS "table above and in $out/bench.log" $((SECONDS - t0)) no
    else
        record bench FAIL "bench/gpu.sh exit $rc (see $out/bench.err)" $((SECONDS - t0)) no
    fi
fi

summary
