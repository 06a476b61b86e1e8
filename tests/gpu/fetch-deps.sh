#!/bin/sh
# Run on the Debian 12 development machine (apt, network): gathers what tests/gpu/run.sh needs on
# a GPU machine that has CUDA, cuDNN, NCCL, CMake and PyTorch but none of Debian's -dev packages
# and no network:
#   .gpu-deps/debs/           the .debs, as apt-get download fetches them (about 16 MB)
#   .gpu-deps/root/           each unpacked (dpkg-deb -x): headers, .pc files, libraries, for
#                             a look here; it stays here (run.sh unpacks debs/ again there)
#   .gpu-deps/fashion-mnist/  the four Fashion-MNIST .gz files (examples/fmnist-lenet.json,
#                             about 30 MB)
#   .gpu-deps/MANIFEST        package and version of each .deb
# .gpu-deps/ is ignored by git: carry .gpu-deps/debs and .gpu-deps/fashion-mnist along with the
# tree (the device tool: carry [".gpu-deps/debs", ".gpu-deps/fashion-mnist"], 64 MiB at most
# with the tree).
#
#   tests/gpu/fetch-deps.sh
#
# Nothing is installed here. The runtime libraries come along too (libjansson4, libopenblas0-
# pthread and its libgfortran5, ...): the GPU machine may lack them, and run.sh links the
# binaries with an RPATH into root/ so they are found without touching the system.
set -eu
top=$(cd "$(dirname "$0")/../.." && pwd)
deps=$top/.gpu-deps
ma=x86_64-linux-gnu

# traind_engine: openblas, jansson, zlib; traind_service: sqlite3; the daemon's CMake target:
# libmicrohttpd; the test tree's configure step: criterion (only its .pc and library are used,
# as run.sh builds no Criterion test); pkgconf for machines without pkg-config. The daemon's
# and service's libraries (libarchive, libcurl, libcrypto, libsystemd, protobuf-c, ISA-L) and
# protoc-c only have to be found for CMake's configure step to pass: run.sh builds the worker and
# the parity test, which link none of them, so their -dev packages come without runtime
# libraries (the dangling .so links are pruned below; CMake then names them bare).
packages="libjansson-dev libjansson4
libsqlite3-dev libsqlite3-0
libmicrohttpd-dev libmicrohttpd12
libopenblas-dev libopenblas0 libopenblas-pthread-dev libopenblas0-pthread libgfortran5 libquadmath0
libcriterion-dev libcriterion3
zlib1g-dev zlib1g
pkgconf pkgconf-bin libpkgconf3
libarchive-dev libcurl4-openssl-dev libssl-dev libsystemd-dev libprotobuf-c-dev libisal-dev
protobuf-c-compiler"

for p in $packages; do
    if ! apt-cache policy "$p" | grep -q 'Candidate: [0-9]'; then
        echo "fetch-deps: apt knows no package $p (run apt-get update?)" >&2
        exit 1
    fi
done

rm -rf "$deps/debs" "$deps/root"
mkdir -p "$deps/debs" "$deps/root" "$deps/fashion-mnist"
# shellcheck disable=SC2086 # one word per package
(cd "$deps/debs" && apt-get download $packages)
: >"$deps/MANIFEST"
for deb in "$deps"/debs/*.deb; do
    dpkg-deb -f "$deb" Package Version | tr '\n' ' ' >>"$deps/MANIFEST"
    echo >>"$deps/MANIFEST"
done
sh "$top/tests/gpu/unpack-root.sh" "$deps/debs" "$deps/root"

# Only shared libraries, headers and .pc files are used: static archives, the separate BLAS and
# LAPACK (libopenblas has both), manuals and docs stay behind (about 60 MB of the 110).
find "$deps/root" -name '*.a' -delete
rm -f "$deps/root/usr/lib/$ma/openblas-pthread"/libblas.so* \
    "$deps/root/usr/lib/$ma/openblas-pthread"/liblapack.so*
rm -rf "$deps/root/usr/share/doc" "$deps/root/usr/share/man" "$deps/root/usr/share/lintian"

find "$deps/root" -xtype l -delete # links to what was pruned above

# Fashion-MNIST: Debian's dataset-fashion-mnist if installed, else its .deb, fetched beside
# debs/ (not into it: debs/ travels, and the .gz files already do).
src=/usr/share/datasets/fashion-mnist
if [ ! -f "$src/train-images-idx3-ubyte.gz" ]; then
    rm -rf "$deps/fmnist-deb"
    mkdir -p "$deps/fmnist-deb/x"
    (cd "$deps/fmnist-deb" && apt-get download dataset-fashion-mnist)
    dpkg-deb -x "$deps"/fmnist-deb/dataset-fashion-mnist_*.deb "$deps/fmnist-deb/x"
    src=$deps/fmnist-deb/x/usr/share/datasets/fashion-mnist
fi
for f in train-images-idx3-ubyte.gz train-labels-idx1-ubyte.gz t10k-images-idx3-ubyte.gz \
    t10k-labels-idx1-ubyte.gz; do
    cp "$src/$f" "$deps/fashion-mnist/$f"
done
rm -rf "$deps/fmnist-deb"

echo "fetch-deps: $(wc -l <"$deps/MANIFEST") packages unpacked into $deps/root" \
    "($(du -sh "$deps/root" | cut -f1)), Fashion-MNIST in $deps/fashion-mnist"
echo "fetch-deps: carry $deps/debs ($(du -sh "$deps/debs" | cut -f1)) and $deps/fashion-mnist" \
    "($(du -sh "$deps/fashion-mnist" | cut -f1)) along with the tree, then run tests/gpu/run.sh" \
    "on the GPU machine"
