#!/bin/sh
# The code's shape, held: no C or CUDA function over 120 lines, no .c or .cu file over 600, and
# no drift from .clang-format. Every tracked source is checked (nothing generated or vendored is
# tracked: the protobuf's C code is made in the build directory). Function lengths are
# Universal Ctags' view (its end: field), the same for C and for CUDA read as C.
# Prints each offence with its size; exits 1 when there is one.
set -eu
cd "$(dirname "$0")/../.."
max_function=120 max_file=600
ctags=$(command -v ctags-universal || command -v ctags) ||
    { echo "check_sizes: ctags (Debian's universal-ctags) is not installed" >&2; exit 2; }
command -v clang-format >/dev/null || { echo "check_sizes: clang-format is not installed" >&2; exit 2; }
sources=$(git ls-files '*.c' '*.h' '*.cu' '*.cuh' | grep -v node_modules/)
bodies=$(git ls-files '*.c' '*.cu' | grep -v node_modules/)
bad=0

long_files=$(for f in $bodies; do
    n=$(wc -l < "$f")
    [ "$n" -le "$max_file" ] || echo "  $f: $n lines"
done)
if [ -n "$long_files" ]; then
    echo "check_sizes: files over $max_file lines (split them by meaning):"
    echo "$long_files"
    bad=1
fi

# shellcheck disable=SC2086 # the file list is meant to split
long_functions=$("$ctags" --fields=+ne --kinds-C=f --language-force=C -o - $bodies 2>/dev/null |
    awk -F'\t' -v max="$max_function" '{
        line = ""; end = ""
        for (i = 4; i <= NF; i++) {
            if ($i ~ /^line:/) line = substr($i, 6)
            if ($i ~ /^end:/) end = substr($i, 5)
        }
        if (end != "" && end - line + 1 > max) printf "  %s:%s %s: %d lines\n", $2, line, $1, end - line + 1
    }')
if [ -n "$long_functions" ]; then
    echo "check_sizes: functions over $max_function lines (name their steps):"
    echo "$long_functions"
    bad=1
fi

# shellcheck disable=SC2086
unformatted=$(clang-format --dry-run $sources 2>&1 | grep 'warning:' | cut -d: -f1 | sort -u |
    sed 's/^/  /' || true)
if [ -n "$unformatted" ]; then
    echo "check_sizes: files that differ from .clang-format (clang-format -i FILE):"
    echo "$unformatted"
    bad=1
fi

[ "$bad" -eq 0 ] && echo "check_sizes: every function within $max_function lines, every file within $max_file, all formatted"
exit "$bad"
