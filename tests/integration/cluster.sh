#!/bin/sh
# The cluster on three "nodes": network namespaces joined by a bridge (in a fourth namespace, so
# nothing touches this machine's own network), each running its own traind with its own state
# directory. Node 0 is the master; nodes 1 and 2 join it.
#   1. three nodes join; GET /v1/nodes on the master lists them ready, each at the address it
#      reaches the master from; an agent's own API sends users to the master
#   2. refusals: a wrong cluster secret and a node name already taken end the agent with status
#      1 and the master's message, and the master logs the refusal with the peer's address
#   3. kill -9 of an agent: the master marks it lost within the timeout + 2 s; restarted, it
#      joins again
#      a stopped agent (SIGSTOP): lost; continued, its heartbeat is refused and it joins again
#   4. a partition (node 1's link down): lost within the timeout + 2 s; link up: it joins again
#   5. kill -9 of the master: restarted, it knows no node until the agents register again,
#      which they do by themselves
# Waits are for observable events (a log line, an API answer) with deadlines, never fixed
# sleeps. Everything it creates (namespaces, links, processes, files) goes on exit, also on
# failure. Exit 77 (ctest: skipped) when not root or namespaces cannot be made here.
#   cluster.sh TRAIND
set -u
traind=$1
if [ "$(id -u)" != 0 ]; then
    echo "SKIP: network namespaces need root"
    exit 77
fi
. "$(dirname "$0")/netns.sh"
tag="tc$$"
net=10.231.9 # exists only inside the namespaces below
port=8470
timeout_s=3 heartbeat_s=0.5
tmp=$(mktemp -d)
cleanup() {
    netns_down "$tag" 3
    rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 1' INT TERM HUP
netns_hosts "$tag" "$net" 3 "the three nodes' namespaces" "$tmp/netns.err"
master="$net.1:$port"
head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$tmp/secret"
echo "not-the-cluster-secret" >"$tmp/wrong"
chmod 600 "$tmp/secret" "$tmp/wrong"

# daemon K NAME LOG ARGS...: a traind in node K's namespace, in the background, serving on that
# node's address; its pid in $daemon_pid (ip netns exec execs it: the pid is traind's own, for
# kill -9; whatever is left at exit dies with its namespace in cleanup)
daemon() {
    k=$1 name=$2 log=$3
    shift 3
    # plain HTTP between the namespaces (insecure_cluster; tls_test.py covers TLS)
    ip netns exec "$tag-n$k" "$traind" --listen "$net.$((k + 1)):$port" \
        --state-dir "$tmp/state-$name" --node-name "$name" --insecure-cluster true "$@" \
        >"$tmp/$log.out" 2>"$tmp/$log.err" &
    daemon_pid=$!
}
start_master() {
    daemon 0 m0 "master$1" --cluster-secret-file "$tmp/secret" --heartbeat "$heartbeat_s" \
        --node-timeout "$timeout_s"
    master_pid=$daemon_pid
}
agent() { # K NAME LOG [SECRET]
    daemon "$1" "$2" "$3" --cluster-secret-file "${4:-$tmp/secret}" --join "$master"
}
logged() { grep -q "$2" "$tmp/$1.err"; }
# nodes: the master's GET /v1/nodes as "name=state@address" words
nodes() {
    ip netns exec "$tag-n0" curl -s --max-time 3 -H "Authorization: Bearer $(cat "$tmp/state-m0/token")" \
        "http://$master/v1/nodes" | python3 -c '
import json, sys
try:
    print(" ".join("%s=%s@%s" % (n["name"], n["state"], n["address"]) for n in json.load(sys.stdin)["nodes"]))
except ValueError:
    print("(no answer)")'
}
state_is() { nodes | grep -q "$1=$2@"; }
now_ms() { date +%s%3N; }

# 1. three nodes join
start_master 1
until_true 10 logged master1 "listening on" || bad "the master did not start: $(cat "$tmp/master1.err")"
agent 1 n1 n1
n1_pid=$daemon_pid
agent 2 n2 n2
n2_pid=$daemon_pid
until_true 10 logged n1 "joined the cluster at $master as node n1" || bad "n1 did not join: $(cat "$tmp/n1.err")"
until_true 10 logged n2 "joined the cluster at $master as node n2" || bad "n2 did not join: $(cat "$tmp/n2.err")"
got=$(nodes)
want="m0=ready@$net.1 n1=ready@$net.2 n2=ready@$net.3"
if [ "$got" = "$want" ]; then ok; else bad "GET /v1/nodes: \"$got\", expected \"$want\""; fi
if logged master1 "node n1 joined from $net.2: 2 CPU slots" || logged master1 "node n1 joined from $net.2"; then ok; else bad "the master's log: $(cat "$tmp/master1.err")"; fi
reply=$(ip netns exec "$tag-n1" curl -s -H "Authorization: Bearer $(cat "$tmp/state-n1/token")" "http://$net.2:$port/v1/nodes")
case $reply in *not_master*"$master"*) ok ;; *) bad "an agent's GET /v1/nodes: $reply" ;; esac
echo "joined: $got"

# 2. refusals, each ending the agent with status 1 and the master's message
ip netns exec "$tag-n2" timeout 60 "$traind" --listen "$net.3:$((port + 1))" --state-dir "$tmp/state-n3" \
    --node-name n3 --cluster-secret-file "$tmp/wrong" --join "$master" --insecure-cluster true \
    >/dev/null 2>"$tmp/wrong.err"
code=$?
if [ "$code" = 1 ]; then ok; else bad "wrong secret: exit $code (124: still running after 120 s)"; fi
if logged wrong "refused this node (HTTP 401): wrong cluster secret"; then ok; else bad "wrong secret, agent's log: $(cat "$tmp/wrong.err")"; fi
if logged master1 "refused an agent from $net.3: wrong cluster secret"; then ok; else bad "wrong secret, master's log: $(cat "$tmp/master1.err")"; fi
# the same name as n2, from node 1 (its own state directory, so another node id)
ip netns exec "$tag-n1" timeout 60 "$traind" --listen "$net.2:$((port + 1))" --state-dir "$tmp/state-dup" \
    --node-name n2 --cluster-secret-file "$tmp/secret" --join "$master" --insecure-cluster true \
    >/dev/null 2>"$tmp/dup.err"
code=$?
if [ "$code" = 1 ]; then ok; else bad "taken name: exit $code"; fi
if logged dup "refused this node (HTTP 409): a node named \"n2\" is already in the cluster (at $net.3)"; then ok; else bad "taken name, agent's log: $(cat "$tmp/dup.err")"; fi
if [ "$(nodes)" = "$want" ]; then ok; else bad "after the refusals: $(nodes)"; fi
echo "refused: a wrong secret and a taken name"

# 3. kill -9 of an agent: lost within the timeout + 2 s; restarted, it joins again
t0=$(now_ms)
kill -9 "$n2_pid"
wait "$n2_pid" 2>/dev/null
if until_true $((timeout_s + 4)) state_is n2 lost; then ok; else bad "killed agent: not lost: $(nodes)"; fi
took=$(($(now_ms) - t0))
if [ "$took" -le $(((timeout_s + 2) * 1000)) ]; then ok; else bad "killed agent: lost after $took ms"; fi
if logged master1 "node n2 ($net.3) lost: no heartbeat for"; then ok; else bad "killed agent, master's log: $(cat "$tmp/master1.err")"; fi
echo "killed agent: lost after $took ms (timeout $timeout_s s)"
agent 2 n2 n2b
n2_pid=$daemon_pid
if until_true 10 state_is n2 ready; then ok; else bad "restarted agent: $(nodes)"; fi
if logged master1 "node n2 is back from $net.3"; then ok; else bad "restarted agent, master's log: $(cat "$tmp/master1.err")"; fi

# 3b. a stopped agent (SIGSTOP past the timeout): lost; continued, its next heartbeat is refused
# and it registers again
kill -STOP "$n2_pid"
if until_true $((timeout_s + 4)) state_is n2 lost; then ok; else bad "stopped agent: not lost: $(nodes)"; fi
kill -CONT "$n2_pid"
if until_true 10 state_is n2 ready; then ok; else bad "continued agent: $(nodes)"; fi
if logged n2b "the master at $master says: node n2 is not registered (the master marked it lost): register again"; then ok; else bad "continued agent's log: $(cat "$tmp/n2b.err")"; fi
echo "stopped agent: lost, then joined again when continued"

# 4. a partition: node 1's link down, then up
t0=$(now_ms)
ip -n "$tag-n1" link set eth0 down
if until_true $((timeout_s + 4)) state_is n1 lost; then ok; else bad "partition: not lost: $(nodes)"; fi
took=$(($(now_ms) - t0))
if [ "$took" -le $(((timeout_s + 2) * 1000)) ]; then ok; else bad "partition: lost after $took ms"; fi
if until_true 10 logged n1 "cannot reach the master at $master"; then ok; else bad "partition, agent's log: $(cat "$tmp/n1.err")"; fi
ip -n "$tag-n1" link set eth0 up
# the agent retries with back-off of at most 10 s
if until_true 15 state_is n1 ready; then ok; else bad "partition healed: $(nodes)"; fi
if logged n1 "joined again the cluster at $master as node n1"; then ok; else bad "partition healed, agent's log: $(cat "$tmp/n1.err")"; fi
echo "partition: lost after $took ms; joined again when the link came back"

# 5. kill -9 of the master: restarted, the agents register again by themselves
kill -9 "$master_pid"
wait "$master_pid" 2>/dev/null
start_master 2
until_true 10 logged master2 "listening on" || bad "the master did not restart: $(cat "$tmp/master2.err")"
all_back() { [ "$(nodes)" = "$want" ]; }
if until_true 15 all_back; then ok; else bad "after the master's restart: $(nodes)"; fi
for k in 1 2; do
    log=n$k
    [ "$k" = 2 ] && log=n2b
    if logged "$log" "joined again the cluster at $master as node n$k"; then ok; else bad "after the master's restart, n$k's log: $(cat "$tmp/$log.err")"; fi
done
echo "master restarted: $(nodes)"

kill "$master_pid" "$n1_pid" "$n2_pid" 2>/dev/null
wait
echo "$passes passed, $fails failed"
[ "$fails" -eq 0 ]
