#!/bin/sh
# traind-run: the torchrun environment, failure handling without orphans, restarts, a PyTorch
# gloo job, traind-worker data-parallel training with a restart that resumes, and two nodes: the
# run id they agree on without flags, and a rendezvous that fails on every node at once.
#   launcher.sh TRAIND_RUN TRAIND_WORKER PYTHON SOURCE_DIR
set -u
run=$1 worker=$2 py=$3 src=$4
. "$src/tests/integration/free_port.sh"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passes=0 fails=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }

# 1. the environment of every local process
"$run" --nproc-per-node 3 -- sh -c 'echo "$RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $TORCHELASTIC_RESTART_COUNT"' >"$tmp/env" 2>&1
if [ "$(sort "$tmp/env" | tr '\n' '|')" = "0 0 3 3 0 127.0.0.1 0|1 1 3 3 0 127.0.0.1 0|2 2 3 3 0 127.0.0.1 0|" ]; then ok; else bad "environment: $(cat "$tmp/env")"; fi

# 2. one failure stops the others at once, with its exit code, leaving no process behind
marker="sleep 4$(($$ % 1000)).25" # a duration no other process uses, to find leftovers
start=$(date +%s)
"$run" --nproc-per-node 3 -- sh -c "if [ \"\$RANK\" = 1 ]; then exit 3; fi; exec $marker" 2>"$tmp/err"
code=$?
elapsed=$(($(date +%s) - start))
if [ "$code" = 3 ]; then ok; else bad "failure exit code $code, expected 3"; fi
if [ "$elapsed" -lt 60 ]; then ok; else bad "the other workers were not stopped ($elapsed s)"; fi
if pgrep -f "$marker" >/dev/null; then bad "orphans left: $(pgrep -af "$marker")"; pkill -f "$marker"; else ok; fi
if grep -q "rank 1 (local 1, pid [0-9]*) failed with exit code 3" "$tmp/err"; then ok; else bad "message: $(cat "$tmp/err")"; fi

# 3. restarts: the second attempt succeeds
"$run" --nproc-per-node 2 --max-restarts 1 -- sh -c '[ "$TORCHELASTIC_RESTART_COUNT" -ge 1 ]' 2>"$tmp/err"
code=$?
if [ "$code" = 0 ] && grep -q "restarting the group (attempt 2 of 2)" "$tmp/err"; then ok; else bad "restart: code $code: $(cat "$tmp/err")"; fi
"$run" --nproc-per-node 2 --max-restarts 1 -- sh -c 'exit 5' 2>/dev/null
code=$?
if [ "$code" = 5 ]; then ok; else bad "restarts exhausted: code $code, expected 5"; fi

# 4. an unmodified PyTorch gloo program
"$run" --nproc_per_node=2 -- "$py" "$src/tests/integration/gloo_allreduce.py" >"$tmp/gloo" 2>&1
if [ "$(grep -o 'of 2: sum 3' "$tmp/gloo" | wc -l)" = 2 ]; then ok; else bad "gloo: $(cat "$tmp/gloo")"; fi

# 5. traind-worker, two ranks, and a failure after a checkpoint that the restart resumes from
cat >"$tmp/job.json" <<JSON
{"model": {"preset": "mlp", "hidden": [32], "num_classes": 10},
 "data": {"format": "synthetic", "shape": [1, 8, 8], "num_classes": 10, "size": 256, "val_size": 64},
 "train": {"epochs": 2, "batch_size": 16, "seed": 9, "optimizer": {"type": "sgd", "lr": 0.1, "momentum": 0.9}},
 "checkpoint": {"dir": "$tmp/ck", "every_steps": 4},
 "log": {"every_steps": 4}}
JSON
"$run" --nproc-per-node 2 --max-restarts 1 -- sh -c \
    "if [ \"\$TORCHELASTIC_RESTART_COUNT\" = 0 ]; then $worker --stop-after 6 $tmp/job.json; exit 1; fi; exec $worker $tmp/job.json" \
    >"$tmp/out" 2>"$tmp/err"
code=$?
if [ "$code" = 0 ]; then ok; else bad "ddp run: code $code: $(tail -5 "$tmp/err")"; fi
if grep -q '"event":"done","step":16,' "$tmp/out"; then ok; else bad "no done line at step 16: $(cat "$tmp/out")"; fi
if [ "$(grep -c '"event":"done"' "$tmp/out")" = 1 ]; then ok; else bad "rank 0 alone reports"; fi
if grep -q "resuming from $tmp/ck/step-00000006" "$tmp/err"; then ok; else bad "no resume: $(cat "$tmp/err")"; fi

# 6. a peer SIGKILLed in the middle of an all-reduce: the launcher reports it, stops the other
# rank, and nothing is left running
start=$(date +%s)
TRAIND_FAULT=allreduce:1:7 "$run" --nproc-per-node 2 -- "$worker" "$tmp/job.json" \
    >/dev/null 2>"$tmp/err"
code=$?
elapsed=$(($(date +%s) - start))
if [ "$code" = 137 ]; then ok; else bad "killed peer: code $code, expected 137: $(cat "$tmp/err")"; fi
if grep -q "rank 1 (local 1, pid [0-9]*) failed with signal 9" "$tmp/err"; then ok; else bad "launcher message: $(cat "$tmp/err")"; fi
if [ "$elapsed" -lt 60 ]; then ok; else bad "took $elapsed s"; fi
if pgrep -f "$tmp/job.json" >/dev/null; then bad "workers left behind"; pkill -f "$tmp/job.json"; else ok; fi

# 7. the same without a launcher to stop them: three ranks, rank 2 dies mid all-reduce; ranks 0
# and 1 exit with errors that lead to rank 2 (rank 1's own neighbour may be rank 0 giving up)
port=$(free_port)
export MASTER_ADDR=127.0.0.1 MASTER_PORT=$port WORLD_SIZE=3 TRAIND_TIMEOUT_S=30
RANK=0 "$worker" "$tmp/job.json" >/dev/null 2>"$tmp/rank0" &
p0=$!
RANK=1 "$worker" "$tmp/job.json" >/dev/null 2>"$tmp/rank1" &
p1=$!
RANK=2 TRAIND_FAULT=allreduce:2:7 "$worker" "$tmp/job.json" >/dev/null 2>/dev/null &
p2=$!
wait $p2
wait $p0
c0=$?
wait $p1
c1=$?
unset MASTER_ADDR MASTER_PORT WORLD_SIZE TRAIND_TIMEOUT_S
if [ "$c0" = 1 ] && grep -q "peer rank 2" "$tmp/rank0"; then ok; else bad "rank 0: code $c0: $(cat "$tmp/rank0")"; fi
if [ "$c1" = 1 ] && grep -q "peer rank 2" "$tmp/rank1"; then ok; else bad "rank 1: code $c1: $(cat "$tmp/rank1")"; fi

# 8-11. two "nodes" on this host, each a traind-run started as docs/training.md shows. Their ring
# addresses are this host's loopback (TRAIND_HOST); every wait is bounded by TRAIND_TIMEOUT_S.
sed "s|$tmp/ck|$tmp/ck2|" "$tmp/job.json" >"$tmp/job2.json"
export TRAIND_HOST=127.0.0.1
node() { # node K [traind-run options] -- COMMAND...: node K of two, in the background, with
    # TRAIND_TIMEOUT_S=$timeout
    k=$1
    shift
    TRAIND_TIMEOUT_S=$timeout "$run" --nnodes 2 --node-rank "$k" --master-addr 127.0.0.1 --master-port "$port" \
        --nproc-per-node 1 "$@" >"$tmp/node$k.out" 2>"$tmp/node$k.err" &
}
# both nodes' exit codes in c0 and c1, and the seconds until both ended in elapsed
wait_nodes() {
    wait "$1"
    c0=$?
    wait "$2"
    c1=$?
    elapsed=$(($(date +%s) - start))
}

# 8. no --run-id: both launchers derive the same one from the master's address and port
port=$(free_port) timeout=30
start=$(date +%s)
node 0 -- "$worker" "$tmp/job2.json"
p0=$!
node 1 -- "$worker" "$tmp/job2.json"
p1=$!
wait_nodes $p0 $p1
if [ "$c0" = 0 ] && [ "$c1" = 0 ]; then ok; else bad "two nodes: codes $c0 $c1: $(tail -3 "$tmp/node0.err") | $(tail -3 "$tmp/node1.err")"; fi
if grep -q '"event":"done","step":16,' "$tmp/node0.out"; then ok; else bad "two nodes: no done line: $(cat "$tmp/node0.out")"; fi

# 9. different run ids: a configuration error that stops both nodes at once, saying so (a
# hang would last TRAIND_TIMEOUT_S)
port=$(free_port) timeout=120
start=$(date +%s)
node 0 --run-id job-a -- "$worker" "$tmp/job2.json"
p0=$!
node 1 --run-id job-b -- "$worker" "$tmp/job2.json"
p1=$!
wait_nodes $p0 $p1
if [ "$c0" != 0 ] && [ "$c1" != 0 ]; then ok; else bad "run id mismatch: codes $c0 $c1"; fi
if [ "$elapsed" -lt 10 ]; then ok; else bad "run id mismatch took $elapsed s"; fi
mismatch='belongs to run "job-b" but this store serves run "job-a"'
if grep -q "$mismatch" "$tmp/node0.err" && grep -q "$mismatch" "$tmp/node1.err"; then ok; else bad "run id mismatch: $(cat "$tmp/node0.err") | $(cat "$tmp/node1.err")"; fi

# 10. a rank that connects to the store and then fails (it cannot listen on its ring address)
port=$(free_port) timeout=120
start=$(date +%s)
node 0 -- "$worker" "$tmp/job2.json"
p0=$!
node 1 -- env TRAIND_HOST=192.0.2.1 "$worker" "$tmp/job2.json"
p1=$!
wait_nodes $p0 $p1
if [ "$c0" != 0 ] && [ "$c1" != 0 ]; then ok; else bad "peer lost in rendezvous: codes $c0 $c1"; fi
if [ "$elapsed" -lt 10 ]; then ok; else bad "peer lost in rendezvous: took $elapsed s"; fi
if grep -q "rendezvous failed: rank 1 (host [^,]*, pid [0-9]*) failed before every rank had joined: .*192.0.2.1" "$tmp/node0.err"; then ok; else bad "peer lost in rendezvous: $(cat "$tmp/node0.err")"; fi

# 11. a worker that dies before it reaches the store: its launcher tells the master's store
port=$(free_port) timeout=120
start=$(date +%s)
node 0 -- "$worker" "$tmp/job2.json"
p0=$!
# node 0's store is up before node 1 starts, or there would be no one to tell (polls, bounded)
"$py" -c 'import socket, sys, time
end = time.time() + 30
while time.time() < end:
    try:
        socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1).close()
        sys.exit(0)
    except OSError:
        time.sleep(0.05)
sys.exit(1)' "$port"
node 1 -- sh -c 'exit 3'
p1=$!
wait_nodes $p0 $p1
if [ "$c0" != 0 ] && [ "$c1" = 3 ]; then ok; else bad "worker dead before rendezvous: codes $c0 $c1"; fi
if [ "$elapsed" -lt 10 ]; then ok; else bad "worker dead before rendezvous: took $elapsed s"; fi
if grep -q "rendezvous failed: node 1: rank 1 failed with exit code 3 before the job began" "$tmp/node0.err"; then ok; else bad "worker dead before rendezvous: $(cat "$tmp/node0.err")"; fi
unset TRAIND_HOST
if pgrep -f "$tmp/job2.json" >/dev/null; then bad "workers left behind: $(pgrep -af "$tmp/job2.json")"; pkill -f "$tmp/job2.json"; else ok; fi

# 12. each worker bound to its share of the CPUs (two workers, two or more CPUs: disjoint lists,
# neither the whole), and left on all of them with --no-cpu-bind
allowed() { sed -n 's/^Cpus_allowed_list:[[:space:]]*//p' /proc/self/status; }
all=$(allowed)
show='echo "$LOCAL_RANK $(sed -n "s/^Cpus_allowed_list:[[:space:]]*//p" /proc/self/status)"'
if [ "$(nproc)" -ge 2 ]; then
    "$run" --nproc-per-node 2 -- sh -c "$show" | sort >"$tmp/cpus"
    c0=$(sed -n 's/^0 //p' "$tmp/cpus") c1=$(sed -n 's/^1 //p' "$tmp/cpus")
    if [ -n "$c0" ] && [ -n "$c1" ] && [ "$c0" != "$c1" ] && [ "$c0" != "$all" ] && [ "$c1" != "$all" ]; then ok; else bad "cpu binding: $(cat "$tmp/cpus") (all: $all)"; fi
    "$run" --no-cpu-bind --nproc-per-node 2 -- sh -c "$show" | sort >"$tmp/cpus"
    if [ "$(cut -d' ' -f2 "$tmp/cpus" | sort -u)" = "$all" ]; then ok; else bad "--no-cpu-bind: $(cat "$tmp/cpus") (all: $all)"; fi
    # data.num_workers "auto": a rank on a core of its own makes its batches itself (a loader
    # thread would preempt its step); unbound, with cores to spare, it has a loader thread
    if [ "$(nproc)" -eq 2 ]; then
        sed 's/"checkpoint": {[^}]*},//' "$tmp/job.json" >"$tmp/auto.json"
        "$run" --nproc-per-node 2 -- "$worker" "$tmp/auto.json" >/dev/null 2>"$tmp/err"
        if grep -q 'classes; batches made in the training thread$' "$tmp/err"; then ok; else bad "bound ranks' loaders: $(grep 'data:' "$tmp/err")"; fi
        "$worker" "$tmp/auto.json" >/dev/null 2>"$tmp/err"
        if grep -q 'classes; 1 loader thread$' "$tmp/err"; then ok; else bad "unbound loader: $(grep 'data:' "$tmp/err")"; fi
    fi
fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
