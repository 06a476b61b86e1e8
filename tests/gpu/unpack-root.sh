#!/bin/sh
# Unpacks the .debs tests/gpu/fetch-deps.sh gathered into a root that builds and runs without
# touching the system: used by fetch-deps.sh on the Debian machine and by run.sh on the GPU
# machine, which may lack dpkg (ar + tar then). Afterwards
#   - Debian's libopenblas links, which go through /etc/alternatives, point at the pthread
#     flavour directly;
#   - absolute symlinks (zlib1g-dev's libz.so -> /lib/x86_64-linux-gnu/libz.so.1.2.13) are made
#     relative inside the root where their target came along, and dropped where it did not;
#   - ROOT/.unpacked marks the root finished (a run cut short mid-way unpacks again).
#
#   tests/gpu/unpack-root.sh DEBS_DIR ROOT
set -eu
debs=$(cd "$1" && pwd) root=$2 ma=x86_64-linux-gnu # debs absolute: ar runs elsewhere
rm -rf "$root"
mkdir -p "$root"
for deb in "$debs"/*.deb; do
    case $deb in */dataset-fashion-mnist_*) continue ;; esac
    if command -v dpkg-deb >/dev/null; then
        dpkg-deb -x "$deb" "$root"
    else
        tmp=$(mktemp -d)
        (cd "$tmp" && ar x "$deb" && tar -xf data.tar.* -C "$root")
        rm -rf "$tmp"
    fi
done
obl=$root/usr/lib/$ma/openblas-pthread
for lib in libopenblas.so libopenblas.so.0; do
    if [ -e "$obl/$lib" ]; then ln -sfn "openblas-pthread/$lib" "$root/usr/lib/$ma/$lib"; fi
done
find "$root" -type l | while read -r link; do
    target=$(readlink "$link")
    case $target in
    /*)
        if [ -e "$root$target" ]; then
            ln -sfnr "$root$target" "$link"
        else
            rm -f "$link"
        fi
        ;;
    esac
done
find "$root" -xtype l -delete
touch "$root/.unpacked"
