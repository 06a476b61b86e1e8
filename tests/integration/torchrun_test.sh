#!/bin/sh
# traind-run as a drop-in for torchrun: our equivalents of PyTorch's launcher test scripts
# (tests/integration/torchrun/) and the DDP tutorial's torchrun line, run with torchrun's flags
# and spellings; the failure summary from @record's error file; --log-dir, --redirects, --tee;
# -m, --no-python and the choice of interpreter; the refusals.
#   torchrun_test.sh TRAIND_RUN PYTHON SOURCE_DIR
set -u
run=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") py=$2 src=$3
scripts=$src/tests/integration/torchrun
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
passes=0 fails=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
. "$src/tests/integration/free_port.sh"
export PYTHON="$py"

# 1. PyTorch's test_script.py: every torchrun variable (a KeyError otherwise), a script that is
# not executable run with Python, and a file per rank
mkdir "$tmp/touched"
"$run" --nproc-per-node=2 --standalone "$scripts/env_script.py" --touch-dir "$tmp/touched" >"$tmp/out" 2>"$tmp/err"
code=$?
if [ "$code" = 0 ] && [ -f "$tmp/touched/0" ] && [ -f "$tmp/touched/1" ]; then ok; else bad "env script: code $code: $(cat "$tmp/err")"; fi
for want in TORCHELASTIC_USE_AGENT_STORE=False NCCL_ASYNC_ERROR_HANDLING=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=1 ROLE_NAME=default GROUP_WORLD_SIZE=1; do
    if [ "$(grep -c "^$want\$" "$tmp/out")" = 2 ]; then ok; else bad "env script: no $want in $(cat "$tmp/out")"; fi
done
if grep -q "^TORCHELASTIC_ERROR_FILE=.*/attempt_0/1/error.json$" "$tmp/out"; then ok; else bad "error file: $(grep ERROR_FILE "$tmp/out")"; fi
if grep -q "running .*env_script.py with $py (\$PYTHON)" "$tmp/err"; then ok; else bad "interpreter line: $(cat "$tmp/err")"; fi

# 2. a rank raises inside @record: its exception and traceback in torchrun's summary
"$run" --nproc_per_node 2 --standalone "$scripts/env_script.py" --fail >/dev/null 2>"$tmp/err"
code=$?
if [ "$code" = 1 ]; then ok; else bad "failing rank: code $code"; fi
if grep -q "^Root Cause (first observed failure):$" "$tmp/err" && grep -q "^env_script.py FAILED$" "$tmp/err"; then ok; else bad "no summary: $(cat "$tmp/err")"; fi
if grep -q "^  rank      : 1 (local_rank: 1)$" "$tmp/err" && grep -q "^  exitcode  : 1 (pid: [0-9]*)$" "$tmp/err"; then ok; else bad "summary rank: $(cat "$tmp/err")"; fi
if grep -q '^    File ".*env_script.py", line [0-9]*, in main$' "$tmp/err" && grep -q "^  RuntimeError: rank 1 was asked to fail$" "$tmp/err"; then ok; else bad "summary traceback: $(cat "$tmp/err")"; fi
file=$(sed -n 's/^  error_file: //p' "$tmp/err")
if [ -f "$file" ] && grep -q "rank 1 was asked to fail" "$file"; then ok; else bad "error file $file not kept"; fi
rm -rf "$(dirname "$(dirname "$(dirname "$file")")")"

# 3. PyTorch's test_script_init_method.py: env:// and tcp://
"$run" --nproc-per-node 2 --standalone "$scripts/init_method_script.py" --init-method env:// >"$tmp/out" 2>"$tmp/err"
# (two ranks' lines may share one: Python writes a line's end apart from it)
if [ "$(grep -o "init method env:// works" "$tmp/out" | wc -l)" = 2 ]; then ok; else bad "env://: $(cat "$tmp/out" "$tmp/err")"; fi
port=$(free_port)
"$run" --nproc-per-node 2 --master-port "$port" "$scripts/init_method_script.py" --init_method "tcp://127.0.0.1:$port" >"$tmp/out" 2>"$tmp/err"
if [ "$(grep -o "init method tcp://127.0.0.1:$port works" "$tmp/out" | wc -l)" = 2 ]; then ok; else bad "tcp://: $(cat "$tmp/out" "$tmp/err")"; fi

# 4. PyTorch's test_script_local_rank.py: --local_rank=N appended on request, not otherwise
"$run" --nproc-per-node 2 --standalone --local-rank-arg --local_rank "$scripts/local_rank_script.py" >"$tmp/out" 2>"$tmp/err"
if [ "$(grep -o "agrees" "$tmp/out" | wc -l)" = 2 ]; then ok; else bad "--local-rank-arg: $(cat "$tmp/out" "$tmp/err")"; fi
"$run" --nproc-per-node 1 --standalone "$scripts/local_rank_script.py" >/dev/null 2>&1
code=$?
if [ "$code" = 2 ]; then ok; else bad "without --local-rank-arg: code $code, expected argparse's 2"; fi

# 5. PyTorch's test_script_is_torchelastic_launched.py
"$run" --standalone "$scripts/launched_script.py" "$tmp/launched" 2>"$tmp/err"
if [ "$(cat "$tmp/launched" 2>/dev/null)" = True ]; then ok; else bad "is_torchelastic_launched: $(cat "$tmp/err")"; fi

# 6. the DDP tutorial's torchrun line, with traind-run in its place
port=$(free_port)
"$run" --nnodes=1 --nproc_per_node=2 --rdzv_id=100 --rdzv_backend=c10d --rdzv_endpoint=localhost:"$port" "$scripts/ddp_tutorial.py" >"$tmp/out" 2>"$tmp/err"
code=$?
if [ "$code" = 0 ] && [ "$(grep -o "finished one DDP step, weights agree" "$tmp/out" | wc -l)" = 2 ]; then ok; else bad "DDP tutorial: code $code: $(cat "$tmp/out" "$tmp/err")"; fi

# 7. -m MODULE (from the working directory, as python -m), --no-python, and the interpreter
# chosen without $PYTHON: the first python3 on PATH that imports torch
cp "$scripts/local_rank_script.py" "$tmp/lr_module.py"
(cd "$tmp" && "$run" --nproc-per-node 2 --standalone -m --local-rank-arg=--local_rank lr_module) >"$tmp/out" 2>"$tmp/err"
if [ "$(grep -o "agrees" "$tmp/out" | wc -l)" = 2 ]; then ok; else bad "-m: $(cat "$tmp/out" "$tmp/err")"; fi
"$run" --nproc-per-node 2 --standalone --no-python sh -c 'echo "rank $RANK"' >"$tmp/out" 2>&1
if [ "$(sort "$tmp/out" | tr '\n' '|')" = "rank 0|rank 1|" ]; then ok; else bad "--no-python: $(cat "$tmp/out")"; fi
mkdir "$tmp/bin"
printf '#!/bin/sh\nexit 1\n' >"$tmp/bin/python3" # a python3 without torch, first on PATH
chmod +x "$tmp/bin/python3"
(unset PYTHON TRAIND_PYTHON; PATH="$tmp/bin:$(dirname "$py"):$PATH" "$run" --standalone "$scripts/launched_script.py" "$tmp/launched2") 2>"$tmp/err"
if [ "$(cat "$tmp/launched2" 2>/dev/null)" = True ] && grep -q "with $(dirname "$py")/python3 (the first python3 on PATH that can import torch)" "$tmp/err"; then ok; else bad "interpreter choice: $(cat "$tmp/err")"; fi

# 8. --log-dir, --redirects (rank 0's stdout to its file only), --tee (the rest, prefixed)
"$run" --nproc-per-node 2 --standalone --log-dir "$tmp/logs" --redirects 0:1 --tee 1:3 --no-python sh -c 'echo "out $RANK"; echo "err $RANK" >&2' >"$tmp/out" 2>"$tmp/err"
base=$(ls -d "$tmp"/logs/run-*_* 2>/dev/null)
if [ -n "$base" ] && [ "$(cat "$base/attempt_0/0/stdout.log")" = "out 0" ] && [ "$(cat "$base/attempt_0/1/stderr.log")" = "err 1" ]; then ok; else bad "log files: $(find "$tmp/logs" -type f)"; fi
if [ "$(cat "$tmp/out")" = "[default1]:out 1" ] && grep -q "^err 0$" "$tmp/err" && grep -q "^\[default1\]:err 1$" "$tmp/err"; then ok; else bad "tee: $(cat "$tmp/out") | $(cat "$tmp/err")"; fi

# 9. torchrun's default port and what it cannot do, refused with the reason
"$run" --no-python sh -c 'echo "$MASTER_ADDR:$MASTER_PORT $WORLD_SIZE"' >"$tmp/out" 2>&1
if [ "$(cat "$tmp/out")" = "127.0.0.1:29500 1" ]; then ok; else bad "defaults: $(cat "$tmp/out")"; fi
"$run" --nnodes 1:4 "$scripts/env_script.py" 2>"$tmp/err"
code=$?
if [ "$code" = 2 ] && grep -q "elastic ranges (MIN below MAX) are not supported" "$tmp/err"; then ok; else bad "elastic range: code $code: $(cat "$tmp/err")"; fi
"$run" --rdzv-backend etcd --rdzv-endpoint h:2379 "$scripts/env_script.py" 2>"$tmp/err"
code=$?
if [ "$code" = 2 ] && grep -q "etcd is not supported" "$tmp/err"; then ok; else bad "etcd: code $code: $(cat "$tmp/err")"; fi
port=$(free_port)
"$py" -c 'import signal, socket, sys
s = socket.socket(); s.bind(("0.0.0.0", int(sys.argv[1]))); s.listen()
print("listening", flush=True); signal.pause()' "$port" >"$tmp/holder" &
holder=$!
until grep -q listening "$tmp/holder" 2>/dev/null || ! kill -0 $holder 2>/dev/null; do sleep 0.05; done
"$run" --master-port "$port" --no-python true 2>"$tmp/err"
code=$?
kill $holder 2>/dev/null
wait $holder 2>/dev/null
if [ "$code" = 1 ] && grep -q "master port $port is in use on this machine" "$tmp/err"; then ok; else bad "port in use: code $code: $(cat "$tmp/err")"; fi

# 10. two launchers of one job meet at a c10d endpoint (both on this machine: the first to bind
# it hosts), as torchrun's agents do, without --node-rank: node ranks and the workers' port
# come from the host. A rank that fails outside any collective on one node stops the other
# node's workers 5 s later (not at their timeout), and with a restart left both start again.
port=$(free_port)
two() { # two launchers with the given options and command, both waited for: codes in c0, c1
    for k in 0 1; do
        "$run" --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" \
            "$@" >"$tmp/l$k.out" 2>"$tmp/l$k.err" &
        eval "p$k=\$!"
    done
    wait "$p0"
    c0=$?
    wait "$p1"
    c1=$?
    elapsed=$(($(date +%s) - start))
}
start=$(date +%s)
two --max-restarts 1 --no-python sh -c 'if [ "$TORCHELASTIC_RESTART_COUNT" = 0 ]; then
    [ "$RANK" = 3 ] && exit 3; exec sleep 120; fi; echo "rank $RANK of $WORLD_SIZE at $MASTER_PORT"'
if [ "$c0" = 0 ] && [ "$c1" = 0 ]; then ok; else bad "c10d restart: codes $c0 $c1: $(cat "$tmp/l0.err" "$tmp/l1.err")"; fi
if [ "$elapsed" -lt 60 ]; then ok; else bad "c10d: the other node's workers ran on for $elapsed s"; fi
if [ "$(cat "$tmp/l0.out" "$tmp/l1.out" | sed 's/ at [0-9]*$//' | sort | tr '\n' '|')" = "rank 0 of 4|rank 1 of 4|rank 2 of 4|rank 3 of 4|" ]; then ok; else bad "c10d ranks: $(cat "$tmp/l0.out" "$tmp/l1.out")"; fi
if [ "$(cat "$tmp/l0.out" "$tmp/l1.out" | grep -o 'at [0-9]*$' | sort -u | wc -l)" = 1 ] && ! grep -q "at $port\$" "$tmp/l0.out"; then ok; else bad "c10d: the workers' MASTER_PORT: $(cat "$tmp/l0.out" "$tmp/l1.out")"; fi
if grep -q "node 1: rank 3 (local 1, pid [0-9]*) failed with exit code 3 (5 s ago); stopping this node's workers" "$tmp/l0.err" "$tmp/l1.err"; then ok; else bad "c10d stop message: $(cat "$tmp/l0.err" "$tmp/l1.err")"; fi
# launchers that disagree on the run id: the one that joins is refused, saying so; the host says
# it refused one and, with no other, gives up at join_timeout
port=$(free_port)
for k in 0 1; do
    "$run" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --rdzv-id "job-$k" \
        --rdzv-conf join_timeout=5 --no-python true >/dev/null 2>"$tmp/l$k.err" &
    eval "p$k=\$!"
done
wait "$p0"
c0=$?
wait "$p1"
c1=$?
if [ "$c0" = 1 ] && [ "$c1" = 1 ] && [ "$(grep -l 'give every node the same --rdzv-id' "$tmp/l0.err" "$tmp/l1.err" | wc -l)" = 2 ]; then ok; else bad "c10d run ids: codes $c0 $c1: $(cat "$tmp/l0.err" "$tmp/l1.err")"; fi

# a stranger connected to the endpoint without a word takes no node's place
port=$(free_port)
"$run" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --rdzv-conf join_timeout=30 \
    --no-python sh -c 'echo "rank $RANK"' >"$tmp/l0.out" 2>"$tmp/l0.err" &
p0=$!
"$py" -c 'import signal, socket, sys, time
end = time.time() + 30
while True:  # the host is up once it takes a connection (polled, bounded)
    try:
        s = socket.create_connection(("127.0.0.1", int(sys.argv[1])), 1)
        break
    except OSError:
        if time.time() > end: sys.exit(1)
        time.sleep(0.05)
print("connected", flush=True)
signal.pause()' "$port" >"$tmp/silent" &
silent=$!
until grep -q connected "$tmp/silent" 2>/dev/null || ! kill -0 $silent 2>/dev/null; do sleep 0.05; done
"$run" --nnodes 2 --rdzv-backend c10d --rdzv-endpoint "127.0.0.1:$port" --no-python sh -c 'echo "rank $RANK"' >"$tmp/l1.out" 2>"$tmp/l1.err"
c1=$?
wait "$p0"
c0=$?
kill $silent 2>/dev/null
wait $silent 2>/dev/null
if [ "$c0" = 0 ] && [ "$c1" = 0 ] && [ "$(cat "$tmp/l0.out" "$tmp/l1.out" | sort | tr '\n' '|')" = "rank 0|rank 1|" ]; then ok; else bad "a silent stranger: codes $c0 $c1: $(cat "$tmp/l0.err" "$tmp/l1.err")"; fi

echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
