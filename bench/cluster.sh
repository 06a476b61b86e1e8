#!/bin/sh
# The cluster at scale: one real traind master on loopback against simulated agents speaking the
# real protocol (bench/cluster_sim.py, many per process): 256 nodes x 8 slots by default.
# Measures registering every node, the master's CPU while it serves the heartbeats (every 2 s
# from each node), the heartbeats' latency, and how long the master takes to list 10 nodes that
# went silent at once as lost (its timeout is 10 s), and the time to place 1,000 queued jobs of
# mixed sizes (1 to 4 nodes, 1 or 2 slots each) once the job holding every slot ends; before
# that, 10 experiments of 100 one-slot trials each: until all 1,000 trials run, and the master's
# CPU meanwhile.
#   bench/cluster.sh [BUILD_DIR]      NODES=256 SLOTS=8 STEADY_S=20 LOSE=10 JOBS=1000
#                                     EXPERIMENTS=10 TRIALS=100
# Only loopback traffic.
set -eu
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
tmp=$(mktemp -d)
pid=""
cleanup() {
    [ -n "$pid" ] && kill "$pid" 2>/dev/null && wait "$pid" 2>/dev/null
    rm -rf "$tmp"
}
trap cleanup EXIT
head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"
port=$(/usr/bin/python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
. "$here/traind_start.sh"
start_traind "$tmp/master.err" --listen "127.0.0.1:$port" --state-dir "$tmp/state" \
    --node-name master --cluster-secret-file "$tmp/secret" --heartbeat 2 --node-timeout 10
pid=$traind_pid
echo "CPU: $(lscpu | sed -n 's/^Model name: *//p' | head -1), $(nproc) cores"
/usr/bin/python3 "$here/cluster_sim.py" --master "127.0.0.1:$port" --secret-file "$tmp/secret" \
    --token-file "$tmp/state/token" --pid "$pid" --nodes "${NODES:-256}" --slots "${SLOTS:-8}" \
    --steady-s "${STEADY_S:-20}" --lose "${LOSE:-10}" --jobs "${JOBS:-1000}" \
    --experiments "${EXPERIMENTS:-10}" --trials "${TRIALS:-100}"
echo "master RSS at the end: $(awk '/^VmRSS/ {print $2, $3}' "/proc/$pid/status"), threads: $(awk '/^Threads/ {print $2}' "/proc/$pid/status")"
