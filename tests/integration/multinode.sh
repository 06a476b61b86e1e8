#!/bin/sh
# traind-run on two "hosts": two network namespaces joined by a bridge (in a third namespace, so
# nothing touches this machine's own network), each with its own /dev/shm (a private tmpfs, as
# real hosts have) and a hostname that resolves to a loopback address (as Debian's /etc/hosts
# makes it). No TRAIND_HOST: what a new user types on two servers.
#   1. 2 nodes x 1 rank: trains, equals one process with the global batch, talks TCP
#   2. 2 nodes x 2 ranks: the same, shared memory within each node and TCP between them
#   3. a node advertising an address the other cannot reach: both fail within 15 s, naming the
#      peer, the address and port, and the fix
#   4. a node told (TRAIND_HOST) to advertise an address nobody has: both fail at once
#   5. PyTorch's DDP tutorial (gloo) across the two hosts without GLOO_SOCKET_IFNAME
#   6. the same with the tutorial's c10d line: node ranks from the launchers' rendezvous
# Everything it creates (namespaces, their links, processes, files) goes on exit, also on
# failure. Exit 77 (ctest: skipped) when not root or namespaces cannot be made here.
#   multinode.sh TRAIND_RUN TRAIND_WORKER SOURCE_DIR
set -u
run=$1 worker=$2 src=$3
if [ "$(id -u)" != 0 ]; then
    echo "SKIP: network namespaces need root"
    exit 77
fi
. "$(dirname "$0")/netns.sh"
tag="td$$"
n0="$tag-n0" n1="$tag-n1"
net=10.231.7 # exists only inside the namespaces below
tmp=$(mktemp -d)
cleanup() {
    netns_down "$tag" 2
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
netns_hosts "$tag" "$net" 2 "the two hosts' namespaces" "$tmp/netns.err"
master=$net.1

# node K NS ENV... -- ARGS: traind-run as node K of two in namespace NS, in the background,
# with its own /dev/shm and a hostname (nodeK) that /etc/hosts maps to 127.0.1.1; output in
# $tmp/nodeK.out and .err. ENV (NAME=VALUE words) go to the workers.
node() {
    k=$1 ns=$2
    shift 2
    printf '127.0.0.1 localhost\n127.0.1.1 node%s\n' "$k" >"$tmp/hosts$k"
    ip netns exec "$ns" unshare --mount --uts --propagation private sh -c '
        k=$1 hosts=$2
        shift 2
        hostname "node$k" && mount -t tmpfs -o size=256m tmpfs /dev/shm &&
            mount --bind "$hosts" /etc/hosts || exit 90
        exec "$@"' sh "$k" "$tmp/hosts$k" timeout 60 env OPENBLAS_NUM_THREADS=1 TRAIND_TIMEOUT_S=45 \
        "$@" >"$tmp/node$k.out" 2>"$tmp/node$k.err" &
}
# two_nodes G JOB [HOST1]: traind-run on both nodes, G ranks each, on a fresh master port,
# node 1's workers advertising HOST1 when given (TRAIND_HOST); waits for both: their exit codes
# in c0 and c1, the seconds until both ended in elapsed
two_nodes() {
    g=$1 job=$2 host1=${3:-}
    port=$((port + 1))
    start=$(date +%s)
    node 0 "$n0" "$run" --nnodes 2 --node-rank 0 --nproc-per-node "$g" --master-addr "$master" \
        --master-port "$port" -- "$worker" "$job"
    p0=$!
    node 1 "$n1" "$run" --nnodes 2 --node-rank 1 --nproc-per-node "$g" --master-addr "$master" \
        --master-port "$port" -- env ${host1:+TRAIND_HOST=$host1} "$worker" "$job"
    p1=$!
    wait "$p0"
    c0=$?
    wait "$p1"
    c1=$?
    elapsed=$(($(date +%s) - start))
}
port=29500

# the premise: inside a node the hostname names loopback
printf '127.0.0.1 localhost\n127.0.1.1 node0\n' >"$tmp/hosts0"
ip netns exec "$n0" unshare --mount --uts --propagation private sh -c '
    hostname node0 && mount --bind "$1" /etc/hosts && getent hosts node0' sh "$tmp/hosts0" \
    >"$tmp/premise" 2>&1
if grep -q "^127\.0\.1\.1 *node0" "$tmp/premise"; then ok; else bad "hostname does not resolve to loopback: $(cat "$tmp/premise")"; fi

# job NAME BATCH: a spec whose checkpoints go to $tmp/NAME (an MLP: no batch statistics, so
# ranks of batch B equal one process of batch B x ranks)
job() {
    cat >"$tmp/$1.json" <<JSON
{"model": {"preset": "mlp", "hidden": [32], "num_classes": 10},
 "data": {"format": "synthetic", "shape": [1, 8, 8], "num_classes": 10, "size": 512, "val_size": 64},
 "train": {"epochs": 2, "batch_size": $2, "seed": 9, "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9}},
 "checkpoint": {"dir": "$tmp/$1", "every_steps": 1000},
 "log": {"every_steps": 8}}
JSON
}
# last_model DIR: the model of the last checkpoint in DIR
last_model() { echo "$(ls -d "$1"/step-* | sort | tail -1)/model.safetensors"; }

# the reference: one process, the global batch of 32
job one 32
OPENBLAS_NUM_THREADS=1 "$worker" "$tmp/one.json" >"$tmp/one.out" 2>"$tmp/one.err" ||
    bad "one process: $(cat "$tmp/one.err")"

# 1 and 2: G ranks per node, batch 32 / (2 G) each
for g in 1 2; do
    job "ddp$g" $((16 / g))
    two_nodes "$g" "$tmp/ddp$g.json"
    what="2 nodes x $g"
    if [ "$c0" = 0 ] && [ "$c1" = 0 ]; then ok; else bad "$what: codes $c0 $c1: $(tail -3 "$tmp/node0.err") | $(tail -3 "$tmp/node1.err")"; fi
    if python3 "$src/tests/integration/same_weights.py" "$(last_model "$tmp/one")" \
        "$(last_model "$tmp/ddp$g")" 1e-5 >"$tmp/same" 2>&1; then ok; else bad "$what: $(cat "$tmp/same")"; fi
    # each rank advertises its node's own address: the interface of the route to the master, which
    # traind-run gives it in GLOO_SOCKET_IFNAME
    for r in $(seq 0 $((2 * g - 1))); do
        k=$((r / g))
        if grep -q "rank $r advertises $net.$((k + 1)) for its ring connections (the address of eth0 (GLOO_SOCKET_IFNAME))" "$tmp/node$k.err"; then ok; else bad "$what: rank $r's address: $(grep advertises "$tmp/node$k.err")"; fi
    done
    if [ "$g" = 1 ]; then
        transport="the TCP ring (one rank on each of 2 nodes)"
    else
        transport="shared memory within each node, and a TCP ring between the 2 nodes' leaders"
    fi
    if grep -q "all-reduced through $transport" "$tmp/node0.err"; then ok; else bad "$what: transport: $(grep all-reduced "$tmp/node0.err")"; fi
    echo "$what: $(cat "$tmp/same")"
done

# 3. node 1 advertises an address it has (on its loopback) but node 0 has no route to
ip -n "$n1" addr add 10.232.7.2/32 dev lo
two_nodes 1 "$tmp/ddp1.json" 10.232.7.2
if [ "$c0" != 0 ] && [ "$c0" != 124 ] && [ "$c1" != 0 ] && [ "$c1" != 124 ]; then ok; else bad "unreachable: codes $c0 $c1 (124: still running after 60 s)"; fi
if [ "$elapsed" -lt 15 ]; then ok; else bad "unreachable: took $elapsed s"; fi
if grep -q "rank 0: cannot reach rank 1 at 10\.232\.7\.2:[0-9]*, the address it advertises .*TRAIND_HOST" "$tmp/node0.err"; then ok; else bad "unreachable, node 0: $(cat "$tmp/node0.err")"; fi
if grep -q "rank 1: rank 0 never connected to 10\.232\.7\.2:[0-9]*, the address this rank advertises .*TRAIND_HOST" "$tmp/node1.err"; then ok; else bad "unreachable, node 1: $(cat "$tmp/node1.err")"; fi
echo "unreachable address: both nodes failed in $elapsed s"

# 4. node 1 told to advertise an address that no host has: it cannot listen there, says so,
# and the rendezvous fails on both nodes at once
two_nodes 1 "$tmp/ddp1.json" "$net.99"
if [ "$c0" != 0 ] && [ "$c0" != 124 ] && [ "$c1" != 0 ] && [ "$c1" != 124 ]; then ok; else bad "address nobody has: codes $c0 $c1"; fi
if [ "$elapsed" -lt 15 ]; then ok; else bad "address nobody has: took $elapsed s"; fi
for k in 0 1; do
    if grep -q "$net\.99.*not an address of this machine: check TRAIND_HOST" "$tmp/node$k.err"; then ok; else bad "address nobody has, node $k: $(cat "$tmp/node$k.err")"; fi
done
echo "address nobody has: both nodes failed in $elapsed s"

# 5. PyTorch's DDP tutorial (gloo) as its users start it on two hosts whose hostnames name
# loopback, with no GLOO_SOCKET_IFNAME: traind-run gives each rank the interface of its route to
# the master (Gloo would advertise 127.0.1.1 and the peer's connection be refused)
port=$((port + 1))
start=$(date +%s)
for k in 0 1; do
    node "$k" "$tag-n$k" env PYTHON=/usr/bin/python3 "$run" --nnodes 2 --node-rank "$k" \
        --nproc-per-node 1 --master-addr "$master" --master-port "$port" \
        "$src/tests/integration/torchrun/ddp_tutorial.py"
    eval "p$k=\$!"
done
wait "$p0"
c0=$?
wait "$p1"
c1=$?
if [ "$c0" = 0 ] && [ "$c1" = 0 ]; then ok; else bad "DDP tutorial on 2 hosts: codes $c0 $c1: $(tail -5 "$tmp/node0.err") | $(tail -5 "$tmp/node1.err")"; fi
for k in 0 1; do
    if grep -q "finished one DDP step, weights agree" "$tmp/node$k.out"; then ok; else bad "DDP tutorial, node $k: $(cat "$tmp/node$k.out")"; fi
    if grep -q "GLOO_SOCKET_IFNAME=eth0 NCCL_SOCKET_IFNAME==eth0: the interface of the route to MASTER_ADDR $master ($net.$((k + 1)))" "$tmp/node$k.err"; then ok; else bad "DDP tutorial, node $k's interface: $(cat "$tmp/node$k.err")"; fi
done
echo "DDP tutorial on 2 hosts: $(($(date +%s) - start)) s"

# 6. the tutorial's torchrun line for two hosts as users type it: c10d at the master's address,
# no --node-rank (the launcher on the endpoint's host hosts the rendezvous and is node 0)
port=$((port + 1))
start=$(date +%s)
for k in 0 1; do
    node "$k" "$tag-n$k" env PYTHON=/usr/bin/python3 "$run" --nnodes=2 --nproc_per_node=1 \
        --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint="$master:$port" \
        "$src/tests/integration/torchrun/ddp_tutorial.py"
    eval "p$k=\$!"
done
wait "$p0"
c0=$?
wait "$p1"
c1=$?
if [ "$c0" = 0 ] && [ "$c1" = 0 ]; then ok; else bad "c10d on 2 hosts: codes $c0 $c1: $(tail -5 "$tmp/node0.err") | $(tail -5 "$tmp/node1.err")"; fi
if grep -q "node rank 0 of 2 (c10d rendezvous at $master:$port, hosted here)" "$tmp/node0.err" && grep -q "node rank 1 of 2 (c10d rendezvous at $master:$port)" "$tmp/node1.err"; then ok; else bad "c10d node ranks: $(cat "$tmp/node0.err" "$tmp/node1.err")"; fi
echo "c10d DDP tutorial on 2 hosts: $(($(date +%s) - start)) s"

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
