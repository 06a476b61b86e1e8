#!/bin/sh
# Jobs across the cluster, on three "nodes": network namespaces joined by a bridge (in a fourth
# namespace, so nothing touches this machine's own network), each running its own traind with its
# own state directory, /dev/shm and hostname, as real hosts have. m0 is the master; n1 and n2 join
# it; each node has 2 CPU slots.
#   1. a 2 x 2 LeNet job on Fashion-MNIST pinned to the agents (rank 0 on an agent): succeeds; its
#      weights equal one process with the global batch; metrics, the logs of all 4 ranks and the
#      checkpoint (by SHA-256) come back through the master; GET /v1/jobs/{id} shows the placement
#   1b. a GPT on text across 2 nodes (1 rank each): its weights equal one process with the
#      global batch, and its sample lines come back through the master
#   2. two jobs on the same node rank 0 get different MASTER_PORTs; every rank has torchrun's
#      environment
#   3. gang placement: a 3 x 2 job waits while a 1 x 2 job runs, starts after it, and no partial
#      allocation is ever visible
#   3b. kill -9 of an agent mid-job, restarted at once: it re-attaches; the job goes on with the
#      same rank processes, no restart and every logged step once
#   4. a node dies mid-job (kill -9 of its traind and its job's processes): detected within the timeout + 2 s, the job restarts from its
#      checkpoint on the remaining nodes and succeeds; no process of it is left anywhere
#   5. a partition (the node's link down) mid-job: the same, and the partitioned node's ranks stop
#      by themselves
#   6. kill -9 of the master mid-job: restarted, nothing recorded is lost, no rank outside the
#      attempt it knows keeps running, and the job succeeds
#   7. a PyTorch gloo DDP script across 2 nodes, as PyTorch's tutorials write one, succeeds and
#      its metric lines come through
#   8. an mp.spawn script ("launch": "self") across 2 nodes: one process a node, holding that
#      node's declared GPUs, spawns the node's two ranks; all four train together
#   9. an ASHA experiment of 2-node trials on the agents: trials pause at their rung there and
#      the promoted ones resume on the agents from their checkpoints; no step trained twice; a
#      kill -9 of the master on the way
#  10. a command trial on an agent under ASHA: TRAIND_HPARAMS(_FILE), the stop contract, and
#      TRAIND_LATEST_CHECKPOINT there
#  11. PBT, a population of 4 on the agents: an exploit copies a checkpoint another node
#      uploaded, and the trial goes on from those weights on its node; a kill -9 of the master
#      after the exploit
# Waits are for observable events (an API answer, a log line) with deadlines, never fixed sleeps.
# Everything it creates goes on exit, also on failure. Exit 77 (ctest: skipped) when not root or
# namespaces cannot be made here.
#   cluster_jobs.sh TRAIND TRAIND_WORKER SOURCE_DIR
set -u
traind=$1 worker=$2 src=$3
if [ "$(id -u)" != 0 ]; then
    echo "SKIP: network namespaces need root"
    exit 77
fi
. "$(dirname "$0")/netns.sh"
tag="tj$$"
net=10.231.11 # exists only inside the namespaces below
port=8470
timeout_s=4 heartbeat_s=0.5 STEPS=1200 EVERY=100
# the sanitizer build (with the baseline kernels) trains several times slower: fewer steps, and
# a longer node timeout for margin on 2 shared cores
if [ -n "${TRAIND_TEST_SLOW:-}" ]; then timeout_s=12 heartbeat_s=1 STEPS=400 EVERY=50; fi
fmnist=/usr/share/datasets/fashion-mnist
tmp=$(mktemp -d)
# the daemons run as root and their jobs as run_as (nobody here), who must reach the state
# directories under this one and read the data made in it
chmod 755 "$tmp"
cleanup() {
    [ -n "${TRAIND_TEST_KEEP:-}" ] && cp -r "$tmp" "$TRAIND_TEST_KEEP" # for a post-mortem
    netns_down "$tag" 3
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
netns_hosts "$tag" "$net" 3 "the three nodes' namespaces" "$tmp/netns.err"
master="$net.1:$port"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
chmod 600 "$tmp/secret"

# daemon K NAME LOG ARGS...: a traind in node K's namespace with its own /dev/shm, hostname
# and local disk ($tmp/nodedisk: what one node writes there, no other sees), in the background,
# serving on that node's address; its pid in $daemon_pid (each step execs the next: the pid is
# traind's own, for kill -9)
mkdir "$tmp/nodedisk"
chmod 1777 "$tmp/nodedisk" # jobs run as run_as (nobody), and keep their checkpoint.dir here
daemon() {
    k=$1 name=$2 log=$3
    shift 3
    ip netns exec "$tag-n$k" unshare --mount --uts --propagation private sh -c '
        hostname "$1" && mount -t tmpfs -o size=256m tmpfs /dev/shm &&
            mount -t tmpfs -o size=64m tmpfs "$2" || exit 90
        shift 2
        exec env OPENBLAS_NUM_THREADS=1 "$@"' sh "$name" "$tmp/nodedisk" "$traind" \
        --listen "$net.$((k + 1)):$port" --state-dir "$tmp/state-$name" --node-name "$name" \
        --worker "$worker" --slots 2 --data-root "$fmnist" --data-root "$tmp" \
        --grace 3 --insecure-cluster true "$@" >"$tmp/$log.out" 2>"$tmp/$log.err" &
    daemon_pid=$!
}
start_master() {
    daemon 0 m0 "m0-$1" --cluster-secret-file "$tmp/secret" --heartbeat "$heartbeat_s" \
        --node-timeout "$timeout_s"
    master_pid=$daemon_pid
}
agent() { # K NAME LOG [ARGS...]
    k=$1 name=$2 log=$3
    shift 3
    daemon "$k" "$name" "$log" --cluster-secret-file "$tmp/secret" --join "$master" "$@"
}
logged() { grep -q "$2" "$tmp/$1.err"; }
# api METHOD PATH [BODY-FILE]: the master's API, from the master's namespace
api() {
    ip netns exec "$tag-n0" curl -s --max-time 10 -X "$1" \
        -H "Authorization: Bearer $(cat "$tmp/state-m0/token")" ${3:+--data-binary @"$3"} \
        "http://$master$2"
}
# field ID EXPR: a Python expression over the job's JSON (j)
field() {
    api GET "/v1/jobs/$1" | python3 -c "
import json, sys
try:
    j = json.load(sys.stdin)
except ValueError:
    print('(no answer)'); sys.exit()
print($2)"
}
state_of() { field "$1" "j['state']"; }
ended() { case $(state_of "$1") in succeeded | failed | cancelled) return 0 ;; esac; return 1; }
submit() { # SPEC-FILE: the new job's id
    api POST /v1/jobs "$1" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("id", ""))'
}
nodes_ready() { # N: GET /v1/nodes lists N ready nodes
    [ "$(api GET /v1/nodes | grep -o '"state":"ready"' | wc -l)" = "$1" ]
}
# leftovers ID: processes of job ID still running in any namespace (TRAIND_JOB_ID in their env)
leftovers() {
    for p in $(ip netns pids "$tag-n0") $(ip netns pids "$tag-n1") $(ip netns pids "$tag-n2"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TRAIND_JOB_ID=$1" && echo "$p"
    done
}
no_leftovers() { [ -z "$(leftovers "$1")" ]; }

start_master 1
until_true 10 logged m0-1 "listening on" || bad "the master did not start: $(cat "$tmp/m0-1.err")"
# the agents' GPUs are declared (no machine here has any): n1's in its config file, with names
# and memory, n2's on its command line, as ordinals 2 and 3 (a node kept to some of its GPUs)
echo '{"gpus": [{"index": 0, "name": "Declared GPU", "memory_gib": 16}, {"index": 1, "name": "Declared GPU", "memory_gib": 16}]}' >"$tmp/n1.json"
agent 1 n1 n1 --config "$tmp/n1.json"
n1_pid=$daemon_pid
agent 2 n2 n2 --gpus 2,3
n2_pid=$daemon_pid
if until_true 15 nodes_ready 3; then ok; else bad "3 nodes did not join: $(api GET /v1/nodes)"; fi
got=$(api GET /v1/nodes | python3 -c '
import json, sys
for n in json.load(sys.stdin)["nodes"]:
    print(n["name"], n["slots"]["total"], ",".join("%d:%s:%s" % (g["index"], g["name"], g["memory_bytes"]) for g in n["gpus"]) or "-")')
want="m0 2 -
n1 2 0:Declared GPU:17179869184,1:Declared GPU:17179869184
n2 2 2:None:None,3:None:None"
if [ "$got" = "$want" ]; then ok; else bad "the nodes' GPUs: $got"; fi

# 1. a 2 x 2 LeNet job on the agents; the reference: one process with the global batch
lenet() { # NAME BATCH STEPS CHECKPOINT-DIR(or "")
    cat <<JSON
{"name": "$1", "model": {"preset": "lenet5", "num_classes": 10},
 "data": {"format": "idx", "train": {"images": "$fmnist/train-images-idx3-ubyte.gz",
          "labels": "$fmnist/train-labels-idx1-ubyte.gz"}},
 "train": {"epochs": 1, "max_steps": $3, "batch_size": $2, "seed": 5,
           "optimizer": {"type": "sgd", "lr": 0.05, "momentum": 0.9}},
 "checkpoint": {${4:+\"dir\": \"$4\", }"every_steps": 20},
 "log": {"every_steps": 10}}
JSON
}
lenet one 64 60 "$tmp/one" >"$tmp/one.json"
OPENBLAS_NUM_THREADS=1 "$worker" "$tmp/one.json" >"$tmp/one.out" 2>"$tmp/one.err" ||
    bad "one process: $(cat "$tmp/one.err")"
lenet ddp 16 60 | python3 -c '
import json, sys
j = json.load(sys.stdin)
j["resources"] = {"nnodes": 2, "nproc_per_node": 2, "nodes": ["n1", "n2"]}
print(json.dumps(j))' >"$tmp/ddp.json"
id=$(submit "$tmp/ddp.json")
if until_true 120 ended "$id"; then ok; else bad "2 x 2 job: not ended: $(api GET "/v1/jobs/$id")"; fi
if [ "$(state_of "$id")" = succeeded ]; then ok; else bad "2 x 2 job: $(api GET "/v1/jobs/$id")"; fi
got=$(field "$id" "' '.join('%s:%d:%s' % (p['node'], p['node_rank'], ','.join(map(str, p['ranks']))) for p in j['placement']['nodes']) if j['placement'] else 'none'")
echo "2 x 2 placement: $got"
# Compared at step 20, not 60: the two sum their gradients in different orders (one batch of 64,
# four of 16 and an all-reduce), and after ~50 steps at lr 0.05 some max-pool window whose two
# largest values differ only by that rounding routes its gradient to the other one, which parts
# the runs by 1e-5 to 1e-4 in one step (measured: worst 2.4e-7 at step 20, 4.2e-7 at 51, 1.3e-5
# at 52). A wrong average or shard differs from the first step.
api GET "/v1/jobs/$id/checkpoints/20/model.safetensors" >"$tmp/ddp-model-20.safetensors"
api GET "/v1/jobs/$id/checkpoints/60/model.safetensors" >"$tmp/ddp-model.safetensors"
if python3 "$src/tests/integration/same_weights.py" "$tmp/one/step-00000020/model.safetensors" \
    "$tmp/ddp-model-20.safetensors" 1e-5 >"$tmp/same" 2>&1; then ok; else bad "2 x 2 job: $(cat "$tmp/same")"; fi
echo "2 x 2 LeNet vs one process: $(cat "$tmp/same")"
n_train=$(api GET "/v1/jobs/$id/metrics" | grep -o '"event":"train"' | wc -l)
if [ "$n_train" = 6 ]; then ok; else bad "2 x 2 job: $n_train train metrics, expected 6: $(api GET "/v1/jobs/$id/metrics")"; fi
for r in 0 1 2 3; do
    log=$(api GET "/v1/jobs/$id/logs?rank=$r")
    case $log in *"rank $r"* | *"[traind]"*) ok ;; *) bad "2 x 2 job: rank $r's log through the master: $log" ;; esac
done
sha_master=$(sha256sum <"$tmp/ddp-model.safetensors" | cut -d' ' -f1)
sha_node=$(sha256sum <"$tmp/state-n1/jobs/$id/checkpoints/step-00000060/model.safetensors" | cut -d' ' -f1)
if [ "$sha_master" = "$sha_node" ]; then ok; else bad "2 x 2 job: the master's checkpoint differs from rank 0's"; fi
if no_leftovers "$id"; then ok; else bad "2 x 2 job: processes left: $(leftovers "$id")"; fi

# 1b. a GPT on Shakespeare's text across two nodes, one rank each, against one process
head -c 20000 "$src/examples/data/tinyshakespeare.txt" >"$tmp/play.txt"
gpt() { # NAME BATCH CHECKPOINT-DIR(or "")
    cat <<JSON
{"name": "$1", "model": {"preset": "gpt", "n_layer": 2, "n_head": 2, "n_embd": 32,
                         "block_size": 32, "bias": false},
 "data": {"format": "text", "train": {"path": "$tmp/play.txt"}, "block_size": 32},
 "train": {"max_steps": 10, "batch_size": $2, "seed": 3, "eval_every_steps": 5,
           "optimizer": {"type": "adamw", "lr": 0.003, "decay": "matrices"},
           "clip_grad_norm": 1.0},
 "sample": {"prompt": "ROMEO:", "tokens": 40, "seed": 2},
 "checkpoint": {${3:+\"dir\": \"$3\", }"every_steps": 10},
 "log": {"every_steps": 5}}
JSON
}
gpt gpt-one 8 "$tmp/gpt-one" >"$tmp/gpt-one.json"
OPENBLAS_NUM_THREADS=1 "$worker" "$tmp/gpt-one.json" >"$tmp/gpt-one.out" 2>"$tmp/gpt-one.err" ||
    bad "GPT, one process: $(cat "$tmp/gpt-one.err")"
gpt gpt-nodes 4 | python3 -c '
import json, sys
j = json.load(sys.stdin)
j["resources"] = {"nnodes": 2, "nproc_per_node": 1, "nodes": ["n1", "n2"]}
print(json.dumps(j))' >"$tmp/gpt-nodes.json"
id=$(submit "$tmp/gpt-nodes.json")
if until_true 120 ended "$id" && [ "$(state_of "$id")" = succeeded ]; then ok; else bad "GPT on 2 nodes: $(api GET "/v1/jobs/$id") $(api GET "/v1/jobs/$id/logs?rank=1")"; fi
api GET "/v1/jobs/$id/checkpoints/10/model.safetensors" >"$tmp/gpt-nodes.safetensors"
# 1e-3: AdamW divides each step by the gradient's running RMS, so the last bits in which two
# batches of 4 and an all-reduce differ from one batch of 8 grow, for weights whose gradients
# are near zero, to some 4e-5 after 10 steps (measured); a wrong average or shard differs at
# once by the size of an update (lr 3e-3)
if python3 "$src/tests/integration/same_weights.py" "$tmp/gpt-one/step-00000010/model.safetensors" \
    "$tmp/gpt-nodes.safetensors" 1e-3 >"$tmp/same" 2>&1; then ok; else bad "GPT on 2 nodes: $(cat "$tmp/same")"; fi
echo "GPT on 2 nodes vs one process: $(cat "$tmp/same")"
samples=$(api GET "/v1/jobs/$id/metrics" | grep -o '"event":"sample"' | wc -l)
want=$(grep -c '"event":"sample"' "$tmp/gpt-one.out")
if [ "$samples" = 2 ] && [ "$want" = 2 ]; then ok; else bad "GPT on 2 nodes: $samples sample lines through the master, $want from one process"; fi
if no_leftovers "$id"; then ok; else bad "GPT on 2 nodes: processes left: $(leftovers "$id")"; fi

# 2 and 7. two PyTorch gloo DDP command jobs at once on the same nodes (2 x 1 each): different
# MASTER_PORTs, torchrun's environment on every rank, both succeed with their metric lines;
# no GLOO_SOCKET_IFNAME in the spec (each node's hostname names loopback): the daemon sets it
# to the interface of the route to the master
gloo() { # NAME WAIT-FILE
    cat <<JSON
{"name": "$1", "command": ["/usr/bin/python3", "$src/tests/integration/gloo_nodes.py"],
 "env": {"TRAIND_TEST_WAIT": "$2", "OMP_NUM_THREADS": "1"},
 "resources": {"nnodes": 2, "nproc_per_node": 1, "nodes": ["n1", "n2"]}}
JSON
}
gloo g1 "$tmp/release1" >"$tmp/g1.json"
gloo g2 "$tmp/release2" >"$tmp/g2.json"
g1=$(submit "$tmp/g1.json")
g2=$(submit "$tmp/g2.json")
env_of() { api GET "/v1/jobs/$1/metrics" | python3 -c '
import json, sys
for m in json.load(sys.stdin):
    if m["event"] == "env":
        print(" ".join("%s=%s" % kv for kv in sorted(m["vars"].items())))'; }
has_env() { [ -n "$(env_of "$1")" ]; }
if until_true 60 has_env "$g1" && until_true 60 has_env "$g2"; then ok; else bad "gloo jobs: no env lines: $(api GET "/v1/jobs/$g1") $(api GET "/v1/jobs/$g2")"; fi
p1=$(env_of "$g1" | grep -o 'MASTER_PORT=[0-9]*')
p2=$(env_of "$g2" | grep -o 'MASTER_PORT=[0-9]*')
if [ -n "$p1" ] && [ "$p1" != "$p2" ]; then ok; else bad "two jobs on the same nodes: $p1 and $p2"; fi
echo "two jobs at once: $p1, $p2"
want="GLOO_SOCKET_IFNAME=eth0 GROUP_RANK=0 GROUP_WORLD_SIZE=2 LOCAL_RANK=0 LOCAL_WORLD_SIZE=1 MASTER_ADDR=$net.2 $p1 NCCL_SOCKET_IFNAME==eth0 RANK=0 ROLE_NAME=default ROLE_RANK=0 ROLE_WORLD_SIZE=2 TORCHELASTIC_MAX_RESTARTS=0 TORCHELASTIC_RESTART_COUNT=0 TORCHELASTIC_RUN_ID=traind-job-$g1 WORLD_SIZE=2"
without_gpu() { env_of "$1" | sed 's/^CUDA_VISIBLE_DEVICES=[0-9]* //'; }
if [ "$(without_gpu "$g1")" = "$want" ]; then ok; else bad "rank 0's environment: $(env_of "$g1"), expected $want"; fi
# each job's rank got one of its node's GPUs, the two jobs different ones: rank 0 on n1 (0, 1),
# rank 1 on n2 (2, 3: the ordinals it declared), read from the environment each process saw
gpu_of() { env_of "$1" | grep -o '^CUDA_VISIBLE_DEVICES=[0-9]*' | cut -d= -f2; }
gpu_of_rank1() { api GET "/v1/jobs/$1/logs?rank=1" | grep -o '"CUDA_VISIBLE_DEVICES": "[0-9]*"' | grep -o '[0-9]*'; }
until_true 20 gpu_of_rank1 "$g1" >/dev/null && until_true 20 gpu_of_rank1 "$g2" >/dev/null
got="$(gpu_of "$g1") $(gpu_of "$g2") $(gpu_of_rank1 "$g1") $(gpu_of_rank1 "$g2")"
case $got in "0 1 2 3" | "0 1 3 2" | "1 0 2 3" | "1 0 3 2") ok ;; *) bad "the GPUs of two jobs on n1, n2: $got" ;; esac
touch "$tmp/release1" "$tmp/release2"
until_true 60 ended "$g1"
until_true 60 ended "$g2"
for g in "$g1" "$g2"; do
    if [ "$(state_of "$g")" = succeeded ]; then ok; else bad "gloo job $g: $(api GET "/v1/jobs/$g") $(api GET "/v1/jobs/$g/logs?rank=1")"; fi
    got=$(api GET "/v1/jobs/$g/metrics" | python3 -c '
import json, sys
m = json.load(sys.stdin)
print(len([x for x in m if x["event"] == "train" and x["world"] == 2]), [x["max_param_diff"] for x in m if x["event"] == "sync"])')
    if [ "$got" = "5 [0.0]" ]; then ok; else bad "gloo job $g metrics: $got"; fi
done
log1=$(api GET "/v1/jobs/$g1/logs?rank=1")
case $log1 in *'"RANK": "1"'*'"GROUP_RANK": "1"'*) ok ;; *) bad "rank 1's log (node rank 1): $log1" ;; esac

# 8. a script that spawns its own processes (mp.spawn, "launch": "self") across n1 and n2, two
# ranks a node: one process a node, given the node's two GPUs, spawns two children; the four
# ranks rendezvous at the master address the daemon chose and train
cat >"$tmp/spawn.json" <<JSON
{"name": "spawn", "command": ["/usr/bin/python3", "$src/tests/integration/spawn_ddp.py"],
 "launch": "self", "env": {"SPAWN_STEPS": "10"},
 "resources": {"nnodes": 2, "nproc_per_node": 2, "nodes": ["n1", "n2"]}}
JSON
spawn=$(submit "$tmp/spawn.json")
until_true 90 ended "$spawn"
got=$(api GET "/v1/jobs/$spawn/metrics" | python3 -c '
import json, sys
m = json.load(sys.stdin)
seen = next(x["seen"] for x in m if x["event"] == "ranks")
print(" ".join("%d:%d:%d:%d:%s" % tuple(s[:5]) for s in seen), len([x for x in m if x["event"] == "train"]))')
# rank:local rank:node rank:world:CUDA_VISIBLE_DEVICES of each rank, and the train lines
want="0:0:0:4:0,1 1:1:0:4:0,1 2:0:1:4:2,3 3:1:1:4:2,3 10"
if [ "$(state_of "$spawn")" = succeeded ] && [ "$got" = "$want" ]; then ok; else bad "mp.spawn across nodes: $got (expected $want): $(api GET "/v1/jobs/$spawn") $(api GET "/v1/jobs/$spawn/logs?rank=2")"; fi
got=$(field "$spawn" "' '.join(p['node'] + '=' + ';'.join('%s:%s' % (','.join(map(str, q['ranks'])), q['devices']) for q in p['processes']) for p in j['placement']['nodes'])")
if [ "$got" = "n1=0,1:0,1 n2=2,3:2,3" ]; then ok; else bad "mp.spawn across nodes: placement $got"; fi

# 3. gang placement: 3 x 2 waits while a 1 x 2 job runs, and holds nothing while it waits
hold() { # NAME NNODES WAIT-FILE
    cat <<JSON
{"name": "$1", "command": ["/bin/sh", "-c", "while [ ! -e $3 ]; do sleep 0.05; done"],
 "resources": {"nnodes": $2, "nproc_per_node": 2}}
JSON
}
hold small 1 "$tmp/release-small" >"$tmp/small.json"
hold wide 3 "$tmp/release-wide" >"$tmp/wide.json"
small=$(submit "$tmp/small.json")
running() { [ "$(state_of "$1")" = running ]; }
if until_true 20 running "$small"; then ok; else bad "gang: the 1 x 2 job did not start: $(api GET "/v1/jobs/$small")"; fi
wide=$(submit "$tmp/wide.json")
used() { api GET /v1/nodes | python3 -c '
import json, sys
print(" ".join("%s=%d" % (n["name"], n["slots"]["used"]) for n in json.load(sys.stdin)["nodes"]))'; }
queued_ok=1
for i in 1 2 3 4 5 6 7 8 9 10; do # the wide job stays queued and nothing is held for it
    [ "$(state_of "$wide")" = queued ] || queued_ok=0
    [ "$(used)" = "m0=2 n1=0 n2=0" ] || queued_ok=0
    [ "$(field "$wide" "j['placement']")" = None ] || queued_ok=0
done
if [ "$queued_ok" = 1 ]; then ok; else bad "gang: while the 1 x 2 job runs: wide job $(state_of "$wide"), slots $(used)"; fi
touch "$tmp/release-small" "$tmp/release-wide"
if until_true 30 ended "$wide" && [ "$(state_of "$wide")" = succeeded ]; then ok; else bad "gang: the 3 x 2 job: $(api GET "/v1/jobs/$wide")"; fi
ended_small=$(field "$small" "j['finished_at']")
started_wide=$(field "$wide" "j['started_at']")
if python3 -c "import sys; sys.exit(0 if '$started_wide' >= '$ended_small' else 1)"; then ok; else bad "gang: the 3 x 2 job started at $started_wide, before the 1 x 2 job ended at $ended_small"; fi
# cancelling a job that runs on two agents stops its ranks on both
hold held 2 "$tmp/never" | sed 's/"nnodes": 2,/"nnodes": 2, "nodes": ["n1", "n2"],/' >"$tmp/held.json"
held=$(submit "$tmp/held.json")
if until_true 20 running "$held"; then ok; else bad "cancel: the job did not start: $(api GET "/v1/jobs/$held")"; fi
placed_on() { [ "$(field "$1" "' '.join(p['node'] + '=' + p['state'] for p in j['placement']['nodes'])")" = "n1=running n2=running" ]; }
if until_true 10 placed_on "$held"; then ok; else bad "cancel: placement: $(api GET "/v1/jobs/$held")"; fi
got=$(api POST "/v1/jobs/$held/cancel" | python3 -c 'import json, sys; print(json.load(sys.stdin)["state"])')
if [ "$got" = cancelled ]; then ok; else bad "cancel: $got: $(api GET "/v1/jobs/$held")"; fi
if until_true 10 no_leftovers "$held"; then ok; else bad "cancel: processes left: $(leftovers "$held")"; fi
# a time limit stops a job on two agents: it ends failed, saying so, and nothing is left
hold limited 2 "$tmp/never" | python3 -c '
import json, sys
j = json.load(sys.stdin)
j["resources"].update({"nodes": ["n1", "n2"], "time_limit_s": 2})
print(json.dumps(j))' >"$tmp/limited.json"
limited=$(submit "$tmp/limited.json")
if until_true 30 ended "$limited"; then ok; else bad "time limit: not ended: $(api GET "/v1/jobs/$limited")"; fi
got=$(field "$limited" "j['state'] + ': ' + (j['reason'] or '')")
case $got in "failed: stopped at its time limit of 2 s"*) ok ;; *) bad "time limit: $got" ;; esac
if until_true 10 no_leftovers "$limited"; then ok; else bad "time limit: processes left: $(leftovers "$limited")"; fi
# a job that can never fit: 400 naming what the cluster has
echo '{"command": ["true"], "resources": {"nnodes": 4, "nproc_per_node": 2}}' >"$tmp/huge.json"
reply=$(api POST /v1/jobs "$tmp/huge.json")
case $reply in *"can never run here: the cluster has 3 nodes"*) ok ;; *) bad "too wide a job: $reply" ;; esac
# nodes enough, but too few slots on each: the field to change is nproc_per_node
echo '{"command": ["true"], "resources": {"nnodes": 2, "nproc_per_node": 3}}' >"$tmp/wide.json"
reply=$(api POST /v1/jobs "$tmp/wide.json")
case $reply in *resources.nproc_per_node*) ok ;; *) bad "too many processes a node: $reply" ;; esac

# 4, 5, 6: failures mid-job. A longer LeNet job (2 x 2, a checkpoint every 100 steps) run once
# without a failure is the reference: a job resumed from its checkpoints after a failure ends
# with the same weights (case 1 showed a 2 x 2 job equals one process)
long_job() { # NAME [NODES-JSON [CHECKPOINT-DIR]]
    lenet "$1" 16 "$STEPS" | python3 -c '
import json, sys
j = json.load(sys.stdin)
j["checkpoint"]["every_steps"] = int(sys.argv[1])
j["train"]["epochs"] = 2
j["resources"] = {"nnodes": 2, "nproc_per_node": 2}
if sys.argv[2]: j["resources"]["nodes"] = json.loads(sys.argv[2])
if sys.argv[3]: j["checkpoint"]["dir"] = sys.argv[3]
j["restart"] = {"max_restarts": 3}
print(json.dumps(j))' "$EVERY" "${2:-}" "${3:-}" >"$tmp/$1.json"
    submit "$tmp/$1.json"
}
train_steps() { api GET "/v1/jobs/$1/metrics" | python3 -c '
import json, sys
print(" ".join(str(m["step"]) for m in json.load(sys.stdin) if m["event"] == "train"))'; }
has_checkpoint() { [ "$(field "$1" "j['checkpoints']")" -ge 1 ] 2>/dev/null; }
agent_of() { field "$1" "[p['node'] for p in j['placement']['nodes'] if p['node'] != 'm0'][0]"; }
final_model() { api GET "/v1/jobs/$1/checkpoints/$STEPS/model.safetensors" >"$tmp/$1.safetensors"; }
# finish ID WHAT: the job ends succeeded with the reference's weights and leaves nothing behind
finish() {
    if until_true 240 ended "$1" && [ "$(state_of "$1")" = succeeded ]; then ok; else bad "$2: $(api GET "/v1/jobs/$1")"; fi
    final_model "$1"
    if python3 "$src/tests/integration/same_weights.py" "$tmp/$clean.safetensors" \
        "$tmp/$1.safetensors" 1e-6 >"$tmp/same" 2>&1; then ok; else bad "$2: $(cat "$tmp/same")"; fi
    if until_true 10 no_leftovers "$1"; then ok; else bad "$2: processes left: $(leftovers "$1")"; fi
    echo "$2: $(field "$1" "'%d attempts; ' % len(j['attempts']) + ' | '.join(a['reason'] or '' for a in j['attempts'])")"
}
# resumed_in ID DIR: every rank of the job resumed from a checkpoint in DIR on its own node
resumed_in() {
    for r in 0 1 2 3; do
        api GET "/v1/jobs/$1/logs?rank=$r" | grep -q "resumed from $2/step-" || return 1
    done
}
now_ms() { date +%s%3N; }
# lost_after LOG NODE COUNT: the master's log has more than COUNT lines saying NODE was lost
n_lost() { grep -c "node $2 ($net\.[0-9]*) lost" "$tmp/$1.err"; }
lost_after() { [ "$(n_lost "$1" "$2")" -gt "$3" ]; }

clean=$(long_job clean)
if until_true 240 ended "$clean" && [ "$(state_of "$clean")" = succeeded ]; then ok; else bad "the reference job: $(api GET "/v1/jobs/$clean")"; fi
final_model "$clean"

# 3b. kill -9 of an agent that runs rank 0, restarted at once: it re-attaches to its part and
# reports it to the master when it registers again; the job goes on untouched (the same rank
# processes, no restart, every logged step once) and ends as the reference does
node_pids() { # K JOB: the job's processes in node K's namespace
    for p in $(ip netns pids "$tag-n$1"); do
        tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TRAIND_JOB_ID=$2" && echo "$p"
    done | sort -n | tr '\n' ' '
}
k3=$(long_job reattach '["n1", "n2"]')
until_true 60 has_checkpoint "$k3" || bad "agent restart: no checkpoint: $(api GET "/v1/jobs/$k3")"
before=$(node_pids 1 "$k3")
# held (SIGSTOP) while their daemon is away, so the job cannot end before it comes back; n2's
# ranks wait for them in the next collective
kill -STOP $before
kill -9 "$n1_pid"
wait "$n1_pid" 2>/dev/null
agent 1 n1 n1r
n1_pid=$daemon_pid
if until_true 10 logged n1r "job $k3 attempt 0: node rank 0 still runs here: re-attached"; then ok; else bad "agent restart: not re-attached: $(cat "$tmp/n1r.err")"; fi
after=$(node_pids 1 "$k3")
kill -CONT $before
if [ -n "$before" ] && [ "$after" = "$before" ]; then ok; else bad "agent restart: n1's processes of job $k3 were '$before', now '$after'"; fi
finish "$k3" "kill -9 and restart of agent n1"
got=$(field "$k3" "'%d %d' % (len(j['attempts']), j['restarts'])")
if [ "$got" = "1 0" ]; then ok; else bad "agent restart: attempts and restarts: $got"; fi
want=$(train_steps "$clean") # the reference's: every logged step once
got=$(train_steps "$k3")
if [ -n "$want" ] && [ "$got" = "$want" ]; then ok; else bad "agent restart: train steps $got; the reference's: $want"; fi
if until_true 15 nodes_ready 3; then ok; else bad "agent restart: n1 is not ready: $(api GET /v1/nodes)"; fi

# 4. kill -9 of an agent. The job keeps its checkpoints in a checkpoint.dir of its own on each
# node's local disk: the master's own rank 0 writes them there, and the node that replaces the
# dead one gets the one it resumes from there too (served by the master from where it lies)
k4=$(long_job kill9 "" "$tmp/nodedisk/kill9")
until_true 60 has_checkpoint "$k4" || bad "kill -9: no checkpoint: $(api GET "/v1/jobs/$k4")"
victim=$(agent_of "$k4")
eval "victim_pid=\$${victim}_pid"
seen=$(n_lost m0-1 "$victim")
t0=$(now_ms)
# the node dies: its traind and everything else in it (a traind killed alone comes back to its
# jobs, 3b)
kill -9 $(ip netns pids "$tag-n${victim#n}")
if until_true $((timeout_s + 4)) lost_after m0-1 "$victim" "$seen"; then ok; else bad "kill -9: $victim not lost"; fi
took=$(($(now_ms) - t0))
if [ "$took" -le $(((timeout_s + 2) * 1000)) ]; then ok; else bad "kill -9: lost after $took ms"; fi
echo "kill -9 of $victim: lost after $took ms (timeout $timeout_s s)"
finish "$k4" "kill -9 of agent $victim"
if [ "$(field "$k4" "len(j['attempts'])")" -ge 2 ]; then ok; else bad "kill -9: not restarted"; fi
if resumed_in "$k4" "$tmp/nodedisk/kill9"; then ok; else bad "kill -9: not every rank resumed from its node's checkpoint.dir: $(api GET "/v1/jobs/$k4/logs?rank=2")"; fi
case $victim in n1) agent 1 n1 n1b; n1_pid=$daemon_pid ;; n2) agent 2 n2 n2b; n2_pid=$daemon_pid ;; esac
if until_true 15 nodes_ready 3; then ok; else bad "kill -9: $victim did not come back: $(api GET /v1/nodes)"; fi

# 5. a partition: the node's link goes down mid-job
k5=$(long_job partition)
until_true 60 has_checkpoint "$k5" || bad "partition: no checkpoint: $(api GET "/v1/jobs/$k5")"
victim=$(agent_of "$k5")
k=${victim#n}
seen=$(n_lost m0-1 "$victim")
t0=$(now_ms)
ip -n "$tag-n$k" link set eth0 down
if until_true $((timeout_s + 4)) lost_after m0-1 "$victim" "$seen"; then ok; else bad "partition: $victim not lost"; fi
took=$(($(now_ms) - t0))
if [ "$took" -le $(((timeout_s + 2) * 1000)) ]; then ok; else bad "partition: lost after $took ms"; fi
# its own ranks stop by themselves, while the link is still down
in_victim() { for p in $(ip netns pids "$tag-n$k"); do tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null | grep -qx "TRAIND_JOB_ID=$k5" && echo "$p"; done; }
victim_clear() { [ -z "$(in_victim)" ]; }
if until_true $((timeout_s + 8)) victim_clear; then ok; else bad "partition: ranks still running on $victim: $(in_victim)"; fi
if grep -q "has not reached its master" "$tmp/$victim"*.err; then ok; else bad "partition: $victim's log: $(cat "$tmp/$victim"*.err)"; fi
echo "partition of $victim: lost after $took ms; its ranks stopped by themselves"
finish "$k5" "partition of $victim"
ip -n "$tag-n$k" link set eth0 up
if until_true 15 nodes_ready 3; then ok; else bad "partition: $victim did not come back: $(api GET /v1/nodes)"; fi

# 6. kill -9 of the master while a job runs on the agents, its checkpoints in a checkpoint.dir
# on each node's local disk: n1 (node rank 0) writes them, the master holds the uploaded copies
# and hands them to both nodes again after its restart
k6=$(long_job master9 '["n1", "n2"]' "$tmp/nodedisk/master9")
until_true 60 has_checkpoint "$k6" || bad "master kill -9: no checkpoint: $(api GET "/v1/jobs/$k6")"
steps_before=$(train_steps "$k6")
ck_before=$(field "$k6" "j['checkpoints']")
kill -9 "$master_pid"
wait "$master_pid" 2>/dev/null
start_master 2
until_true 10 logged m0-2 "listening on" || bad "the master did not restart: $(cat "$tmp/m0-2.err")"
if logged m0-2 "job $k6: the daemon restarted while the job ran: restarting it"; then ok; else bad "master kill -9: the job had ended before: $(cat "$tmp/m0-2.err")"; fi
if until_true 240 ended "$k6" && [ "$(state_of "$k6")" = succeeded ]; then ok; else bad "master kill -9: $(api GET "/v1/jobs/$k6")"; fi
ck_after=$(field "$k6" "j['checkpoints']")
if [ "$ck_after" -ge "$ck_before" ]; then ok; else bad "master kill -9: checkpoints $ck_before before, $ck_after after"; fi
# the placement of a job that ended before the restart is read back from its events
got=$(field "$id" "' '.join(p['node'] for p in j['placement']['nodes'])")
if [ "$got" = "n1 n2" ]; then ok; else bad "master kill -9: job $id's placement afterwards: $got"; fi
steps_after=$(train_steps "$k6")
case " $steps_after " in *" $steps_before "*) ok ;; *) bad "master kill -9: train metrics before: $steps_before; after: $steps_after" ;; esac
finish "$k6" "kill -9 of the master"
if resumed_in "$k6" "$tmp/nodedisk/master9"; then ok; else bad "master kill -9: not every rank resumed from its node's checkpoint.dir: $(api GET "/v1/jobs/$k6/logs?rank=2")"; fi

# 7. a node that cannot fetch the checkpoint it resumes from (the master's copy was damaged on
# its disk: its SHA-256 no longer matches what was uploaded) fails its part after the node
# timeout, saying why, instead of waiting for ever; the job ends under its restart policy.
# The job is frozen (SIGSTOP) once it has a checkpoint, and damaged once the master holds every
# checkpoint rank 0 wrote: none comes after the damage, and the job cannot end meanwhile. It is
# long (30,000 steps over many epochs, minutes here) so that it cannot end before it is frozen
# either: with one epoch it ended at step 938, which a loaded machine reached before the freeze.
lenet damaged 16 30000 | python3 -c '
import json, sys
j = json.load(sys.stdin)
j["checkpoint"]["every_steps"] = 400
j["train"]["epochs"] = 100  # one epoch is 938 steps here: max_steps must be what ends it
j["resources"] = {"nnodes": 2, "nproc_per_node": 2, "nodes": ["n1", "n2"]}
j["restart"] = {"max_restarts": 1}
print(json.dumps(j))' >"$tmp/damaged.json"
k7=$(submit "$tmp/damaged.json")
until_true 60 has_checkpoint "$k7" || bad "damaged: no checkpoint: $(api GET "/v1/jobs/$k7")"
job_pids() { # NODE-K JOB [RANK]: the job's processes in that node's namespace
    for p in $(ip netns pids "$tag-n$1"); do
        env=$(tr '\0' '\n' <"/proc/$p/environ" 2>/dev/null)
        case $env in *"TRAIND_JOB_ID=$2"*) ;; *) continue ;; esac
        echo "$env" | grep -q "^RANK=" || continue # a rank, not its shepherd
        [ -z "${3:-}" ] || echo "$env" | grep -qx "RANK=$3" && echo "$p"
    done
}
for k in 1 2; do for p in $(job_pids "$k" "$k7"); do kill -STOP "$p"; done; done
all_registered() { # every step-* rank 0 wrote on n1 is registered on the master
    [ "$(field "$k7" "j['checkpoints']")" = \
      "$(ls -d "$tmp/state-n1/jobs/$k7"/checkpoints/step-* 2>/dev/null | wc -l)" ]
}
until_true 30 all_registered || bad "damaged: checkpoints not all registered: $(api GET "/v1/jobs/$k7")"
for f in "$tmp/state-m0/jobs/$k7"/checkpoints/step-*/model.safetensors; do printf x >>"$f"; done
victim=$(job_pids 2 "$k7" 2)
[ -n "$victim" ] || bad "damaged: rank 2 not found on n2: $(api GET "/v1/jobs/$k7")"
kill -9 $victim
if until_true 60 ended "$k7"; then ok; else bad "damaged: not ended: $(api GET "/v1/jobs/$k7")"; fi
got=$(field "$k7" "j['state'] + ': ' + (j['reason'] or '')")
case $got in "failed: could not start on node n2: its checkpoint (step "*") could not be fetched from the master for "*"its SHA-256 differs"*) ok ;;
*) bad "damaged: $got" ;; esac
echo "damaged checkpoint: $got"
if until_true 10 no_leftovers "$k7"; then ok; else bad "damaged: processes left: $(leftovers "$k7")"; fi

# 9. an ASHA experiment whose trials each span both agents (a rank a node): each trial pauses at
#    its first rung there (the step to stop at travels in the part's order), the promoted ones are
#    placed again and resume from their checkpoints on the agents; the master is killed (kill -9)
#    once a trial is paused and restarted: the experiment goes on, one job a trial, every step
#    trained (a trial running then restarts from its last checkpoint, as any job across nodes)
lenet asha 32 40 | python3 -c '
import json, sys
j = json.load(sys.stdin)
j["checkpoint"] = {"every_steps": 10}
j["log"] = {"every_steps": 5}
j["resources"] = {"nnodes": 2, "nproc_per_node": 1, "nodes": ["n1", "n2"]}
print(json.dumps({"name": "asha-nodes", "job": j, "max_concurrent": 1, "seed": 2,
                  "space": {"train.optimizer.lr": {"log_uniform": [0.01, 0.1]}},
                  "searcher": {"type": "asha", "metric": "loss", "mode": "min", "max_trials": 4,
                               "max_steps": 40, "reduction_factor": 2, "rungs": 2,
                               "promotion": "rung"}}))' >"$tmp/asha.json"
eid=$(api POST /v1/experiments "$tmp/asha.json" | python3 -c 'import json, sys; print(json.load(sys.stdin).get("id", ""))')
exp_field() { api GET "/v1/experiments/$eid" | python3 -c "
import json, sys
x = json.load(sys.stdin)
print($1)"; }
exp_ended() { [ "$(exp_field "x['state']")" != running ]; }
one_paused() { [ "$(exp_field "x['counts']['paused']")" -ge 1 ] 2>/dev/null; }
until_true 120 one_paused || bad "ASHA across nodes: no trial paused: $(api GET "/v1/experiments/$eid")"
kill -9 "$master_pid"
wait "$master_pid" 2>/dev/null
start_master 3
until_true 10 logged m0-3 "listening on" || bad "the master did not restart: $(cat "$tmp/m0-3.err")"
if until_true 300 exp_ended; then ok; else bad "ASHA across nodes: not ended: $(api GET "/v1/experiments/$eid")"; fi
got=$(exp_field "x['state'], sorted(t['rung'] for t in x['trials']), sorted(t['steps'] for t in x['trials'])")
if [ "$got" = "succeeded [0, 0, 1, 1] [20, 20, 40, 40]" ]; then ok; else bad "ASHA across nodes: $got: $(api GET "/v1/experiments/$eid")"; fi
echo "ASHA across nodes: $got"
for job in $(exp_field "' '.join(str(t['job']) for t in x['trials'])"); do
    steps=$(api GET "/v1/jobs/$job/metrics" | python3 -c '
import json, sys
print(" ".join(str(m["step"]) for m in json.load(sys.stdin) if m.get("event") == "train"))')
    steps=$(echo "$steps" | tr ' ' '\n' | sort -nu | tr '\n' ' ')
    case $steps in "5 10 15 20 " | "5 10 15 20 25 30 35 40 ") ok ;; *) bad "ASHA across nodes: job $job trained steps $steps" ;; esac
    nodes=$(field "$job" "' '.join(sorted(p['node'] for p in j['placement']['nodes']))")
    if [ "$nodes" = "n1 n2" ]; then ok; else bad "ASHA across nodes: job $job placed on $nodes"; fi
done
n_jobs=$(api GET "/v1/jobs?limit=500" | python3 -c "
import json, sys
print(sorted(j['trial'] for j in json.load(sys.stdin)['jobs'] if j.get('experiment') == $eid))")
if [ "$n_jobs" = "[0, 1, 2, 3]" ]; then ok; else bad "ASHA across nodes: the trials' jobs: $n_jobs"; fi
best=$(exp_field "x['best']['job']")
case $(api GET "/v1/jobs/$best/logs?rank=0") in *"resumed from "*" at step 20 "*) ok ;;
*) bad "ASHA across nodes: the best trial (job $best) did not resume at step 20: $(api GET "/v1/jobs/$best/logs?rank=0" | tail -5)" ;; esac
if until_true 10 no_leftovers "$best"; then ok; else bad "ASHA across nodes: processes left: $(leftovers "$best")"; fi

# 10. a command trial on an agent under ASHA: its hyperparameters in TRAIND_HPARAMS and the file
#     TRAIND_HPARAMS_FILE there, the stop contract (TRAIND_STOP_AT_STEP, a checkpoint line) and,
#     promoted, TRAIND_LATEST_CHECKPOINT naming its checkpoint on that node
cat >"$tmp/stepper.sh" <<'SH'
test "$(cat "$TRAIND_HPARAMS_FILE")" = "$TRAIND_HPARAMS" || exit 3
s=0
if [ -n "${TRAIND_LATEST_CHECKPOINT:-}" ]; then s=$(cat "$TRAIND_LATEST_CHECKPOINT") || exit 4; fi
stop=${TRAIND_STOP_AT_STEP:-$TRAIND_MAX_STEPS}
while [ "$s" -lt "$stop" ]; do
    s=$((s + 1))
    echo "{\"event\": \"train\", \"step\": $s, \"score\": $((N * s))}"
done
echo "$s" >"ck-$s"
echo "{\"event\": \"checkpoint\", \"step\": $s, \"path\": \"ck-$s\"}"
SH
chmod 644 "$tmp/stepper.sh"
cat >"$tmp/cmd-asha.json" <<JSON
{"name": "cmd-asha", "max_concurrent": 1, "seed": 4,
 "job": {"name": "stepper", "command": ["/bin/sh", "$tmp/stepper.sh"],
         "resources": {"nnodes": 1, "nproc_per_node": 1, "nodes": ["n1"]}},
 "space": {"env.N": {"int": [1, 1000]}},
 "searcher": {"type": "asha", "metric": "score", "mode": "max", "max_trials": 4, "max_steps": 8,
              "reduction_factor": 2, "rungs": 2, "promotion": "rung"}}
JSON
eid=$(api POST /v1/experiments "$tmp/cmd-asha.json" | python3 -c 'import json, sys; x = json.load(sys.stdin); print(x.get("id", x))')
if until_true 120 exp_ended; then ok; else bad "command ASHA on an agent: not ended: $(api GET "/v1/experiments/$eid")"; fi
got=$(exp_field "x['state'], sorted(t['rung'] for t in x['trials']), sorted(t['steps'] for t in x['trials']), x['best']['value'] == max(int(t['hparams']['env.N']) for t in x['trials']) * 8")
if [ "$got" = "succeeded [0, 0, 1, 1] [4, 4, 8, 8] True" ]; then ok; else bad "command ASHA on an agent: $got: $(api GET "/v1/experiments/$eid")"; fi
echo "command ASHA on an agent: $got"
for job in $(exp_field "' '.join(str(t['job']) for t in x['trials'])"); do
    nodes=$(field "$job" "' '.join(p['node'] for p in j['placement']['nodes'])")
    if [ "$nodes" = "n1" ]; then ok; else bad "command ASHA on an agent: job $job placed on $nodes"; fi
    # a promoted trial went on from its checkpoint: each step once
    steps=$(api GET "/v1/jobs/$job/metrics" | python3 -c '
import json, sys
print(" ".join(str(m["step"]) for m in json.load(sys.stdin) if "score" in m))')
    case $steps in "1 2 3 4" | "1 2 3 4 5 6 7 8") ok ;; *) bad "command ASHA on an agent: job $job's steps $steps" ;; esac
done

# 11. PBT across the agents: a population of 4 one-process trials on n1 and n2 (2 slots each,
#     the fullest node first: trials 0 and 1 on one node, 2 and 3 on the other; seed 1 draws
#     learning rates whose worst at step 20 is trial 1 and best trial 2, on different nodes:
#     the same whatever the timing, as training is deterministic); at the
#     generation's end the worst takes the best's checkpoint, which the best's node uploaded to
#     the master: the master's copy for the target is the source's byte for byte, and the node
#     the target goes on from fetched that copy; the master is killed (kill -9) after the exploit
#     and restarted: every trial trains every step
lenet pbt 32 40 | python3 -c '
import json, sys
j = json.load(sys.stdin)
j["checkpoint"] = {"every_steps": 10}
j["log"] = {"every_steps": 5}
j["resources"] = {"nnodes": 1, "nproc_per_node": 1, "nodes": ["n1", "n2"]}
print(json.dumps({"name": "pbt-nodes", "job": j, "max_concurrent": 4, "seed": 1,
                  "space": {"train.optimizer.lr": {"log_uniform": [0.01, 0.1]}},
                  "searcher": {"type": "pbt", "metric": "loss", "mode": "min", "population": 4,
                               "max_steps": 40, "interval": 20}}))' >"$tmp/pbt.json"
eid=$(api POST /v1/experiments "$tmp/pbt.json" | python3 -c 'import json, sys; x = json.load(sys.stdin); print(x.get("id", x))')
# the master killed (kill -9) once the exploit is made: the one that comes back goes on from there
exploited_once() { [ "$(exp_field "sum(t.get('exploits', 0) for t in x['trials'])")" -ge 1 ] 2>/dev/null; }
until_true 120 exploited_once || bad "PBT across nodes: no exploit: $(api GET "/v1/experiments/$eid")"
kill -9 "$master_pid"
wait "$master_pid" 2>/dev/null
start_master 4
until_true 10 logged m0-4 "listening on" || bad "the master did not restart: $(cat "$tmp/m0-4.err")"
if until_true 300 exp_ended; then ok; else bad "PBT across nodes: not ended: $(api GET "/v1/experiments/$eid")"; fi
got=$(exp_field "x['state'], [t['steps'] for t in x['trials']]")
if [ "$got" = "succeeded [40, 40, 40, 40]" ]; then ok; else bad "PBT across nodes: $got: $(api GET "/v1/experiments/$eid")"; fi
# job_events ID TYPE: the data of a finished job's events of that type, one JSON a line
job_events() {
    api GET "/v1/jobs/$1/events" | python3 -c "
import sys
kind = None
for line in sys.stdin:
    line = line.rstrip('\n')
    if line.startswith('event: '):
        kind = line[7:]
    elif line.startswith('data: ') and kind == '$2':
        print(line[6:])"
}
target="" source="" exploited=0
for job in $(exp_field "' '.join(str(t['job']) for t in x['trials'])"); do
    e=$(job_events "$job" exploit)
    if [ -n "$e" ]; then
        target=$job exploited=$((exploited + 1))
        source=$(echo "$e" | python3 -c 'import json, sys; e = json.loads(sys.stdin.readline()); print(e["source"] if e["step"] == 20 else "")')
    fi
done
echo "PBT across nodes: job $target exploited job $source"
if [ -n "$source" ] && [ "$exploited" = 1 ]; then ok; else bad "PBT across nodes: $exploited trials exploited, not one at step 20"; fi
first_node() { job_events "$1" placement | head -1 | python3 -c 'import json, sys; print(json.load(sys.stdin)["nodes"][0]["node"])'; }
n_target=$(first_node "$target") n_source=$(first_node "$source")
if [ "$n_target" != "$n_source" ]; then ok; else bad "PBT across nodes: both trials began on $n_target"; fi
weights() { api GET "/v1/jobs/$1/checkpoints/20/model.safetensors" | sha256sum | cut -c1-64; }
w_target=$(weights "$target") w_source=$(weights "$source")
if [ "$w_target" = "$w_source" ]; then ok; else bad "PBT across nodes: the exploited weights at step 20 differ from the source's"; fi
n_after=$(field "$target" "j['placement']['nodes'][0]['node']")
got=$(sha256sum <"$tmp/state-$n_after/jobs/$target/checkpoints/step-00000020/model.safetensors" | cut -c1-64)
if [ "$got" = "$w_source" ]; then ok; else bad "PBT across nodes: job $target on $n_after went on from weights other than the source's ($got)"; fi
case $(api GET "/v1/jobs/$target/logs?rank=0") in *"resumed from "*" at step 20 "*) ok ;;
*) bad "PBT across nodes: job $target did not resume at step 20" ;; esac
for job in $(exp_field "' '.join(str(t['job']) for t in x['trials'])"); do
    steps=$(api GET "/v1/jobs/$job/metrics" | python3 -c '
import json, sys
print(" ".join(str(m["step"]) for m in json.load(sys.stdin) if m.get("event") == "train"))')
    steps=$(echo "$steps" | tr ' ' '\n' | sort -nu | tr '\n' ' ')
    case $steps in "5 10 15 20 25 30 35 40 ") ok ;; *) bad "PBT across nodes: job $job trained steps $steps" ;; esac
done
echo "PBT across nodes: began on $n_target (the source on $n_source), went on on $n_after"

echo "cluster_jobs: $passes passed, $fails failed"
[ "$fails" = 0 ]
