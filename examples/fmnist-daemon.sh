#!/bin/sh
# README command 1, after the build: starts traind on a free loopback port with a fresh state
# directory, submits examples/fmnist-lenet.json with curl, follows the job's Server-Sent Events
# until it ends, prints the final validation accuracy and the curl line that downloads the
# checkpoint, then stops the daemon.
#   examples/fmnist-daemon.sh [BUILD_DIR]
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
export OPENBLAS_NUM_THREADS=${OPENBLAS_NUM_THREADS:-1}
state=$(mktemp -d /tmp/traind-demo.XXXXXX)
mkfifo "$state/stderr"
"$build/traind" --listen 127.0.0.1:0 --state-dir "$state" 2>"$state/stderr" &
daemon=$!
trap 'kill $daemon 2>/dev/null; wait $daemon 2>/dev/null || true' EXIT
# the daemon says where it listens once it serves: read its stderr up to that line
exec 3<"$state/stderr"
url=
while IFS= read -r line <&3; do
    case $line in
    *"listening on "*) url=${line##*listening on }; echo "$line" >&2; break ;;
    *) echo "$line" >&2 ;;
    esac
done
[ -n "$url" ] || { echo "fmnist-daemon: traind did not start" >&2; exit 1; }
cat <&3 >"$state/traind.log" &
token=$(cat "$state/token")
auth="Authorization: Bearer $token"

job=$(curl -sS --fail-with-body -H "$auth" -H 'Content-Type: application/json' \
    --data-binary @"$here/fmnist-lenet.json" "$url/v1/jobs")
id=$(printf '%s' "$job" | sed -n 's/^{"id":\([0-9]*\),.*/\1/p')
echo "submitted job $id: curl -H \"Authorization: Bearer \$(cat $state/token)\" $url/v1/jobs/$id" >&2

# one line per event; the stream ends after the job's final state
curl -sS -N -H "$auth" "$url/v1/jobs/$id/events" | awk '
    /^event: / { ev = substr($0, 8) }
    /^data: /  {
        d = substr($0, 7)
        if (ev == "state" || ev == "eval" || ev == "done" || ev == "restart") print ev ": " d
        else if (ev == "train") { n++; if (n % 20 == 0) print ev ": " d }
        if (ev == "done" && match(d, /"val_acc":[0-9.]+/)) acc = substr(d, RSTART + 10, RLENGTH - 10)
        if (ev == "state") last = d
    }
    END {
        if (acc != "") printf "final validation accuracy: %s\n", acc
        if (last !~ /"succeeded"/) { print "the job did not succeed: " last; exit 1 }
    }'
step=$(curl -sS -H "$auth" "$url/v1/jobs/$id/checkpoints" |
    sed -n 's/.*"step":\([0-9]*\),"size".*/\1/p' | tail -1)
echo "download the final weights (while this daemon runs; state kept in $state):"
echo "  curl -H \"Authorization: Bearer \$(cat $state/token)\" -o model.safetensors $url/v1/jobs/$id/checkpoints/$step/model.safetensors"
echo "  (or the whole checkpoint, weights, optimizer and state, as one archive: .../checkpoints/$step.tar)"
curl -sS -H "$auth" -o "$state/model.safetensors" "$url/v1/jobs/$id/checkpoints/$step/model.safetensors"
echo "downloaded it once to $state/model.safetensors ($(wc -c <"$state/model.safetensors") bytes)"
