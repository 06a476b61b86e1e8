# Hosts made of network namespaces, for the multi-node tests (sourced, POSIX sh). Nothing here
# touches this machine's own network: the bridge lives in a namespace of its own.
#   netns_up TAG NET N ERRFILE   TAG-sw holding bridge br0, and TAG-n0 .. TAG-n(N-1), each with
#                                eth0 on the bridge at NET.(k+1)/24 and lo up. Returns 77 when
#                                no namespace can be made here (not root, no netns; the reason
#                                in ERRFILE), 1 on any other failure.
#   netns_down TAG N             kills whatever runs inside them and deletes them; safe to call
#                                for namespaces that were never made (cleanup on failure).
#   netns_sweep TAG              (netns_up calls it) deletes the namespaces an earlier run of the
#                                same test left when it was killed before its cleanup could run
#                                (SIGKILL at ctest's timeout): TAG is a prefix and the test's
#                                PID (tj1234), so those are PREFIX<a PID no longer running>-*.
#   netns_hosts TAG NET N WHAT ERRFILE
#                                netns_up, or the test's end: exit 77 (SKIP, with the reason)
#                                when no namespace can be made here, 1 (FAIL: cannot build WHAT)
# and the checks' bookkeeping every multi-node test keeps the same way:
#   ok, bad MESSAGE              count a pass, or print and count a failure ($passes, $fails)
#   until_true SECONDS CMD...    runs CMD until it succeeds, false if it never did in time: a
#                                wait for an observable event with a deadline, not a sleep
passes=0 fails=0
ok() { passes=$((passes + 1)); }
bad() { echo "FAIL: $*"; fails=$((fails + 1)); }
until_true() {
    _limit=$1
    shift
    _end=$(($(date +%s) + _limit))
    until "$@"; do
        [ "$(date +%s)" -ge "$_end" ] && return 1
        sleep 0.1
    done
}

netns_del() { # NS
    _pids=$(ip netns pids "$1" 2>/dev/null)
    # processes still inside (a failed case) die before their namespace goes
    [ -n "$_pids" ] && kill -9 $_pids 2>/dev/null
    ip netns del "$1" 2>/dev/null
    return 0
}

netns_down() { # TAG N
    _k=0
    while [ "$_k" -lt "$2" ]; do
        netns_del "$1-n$_k"
        _k=$((_k + 1))
    done
    netns_del "$1-sw"
}

netns_sweep() { # TAG
    _prefix=${1%%[0-9]*}
    for _ns in $(ip netns list 2>/dev/null | cut -d' ' -f1); do
        _rest=${_ns#"$_prefix"}
        [ "$_rest" != "$_ns" ] || continue
        _pid=${_rest%%-*}
        case $_pid in '' | *[!0-9]*) continue ;; esac
        case ${_rest#"$_pid"} in -sw | -n[0-9]*) ;; *) continue ;; esac
        # a live PID (this run, or another run of the same test at the same time) keeps its own
        kill -0 "$_pid" 2>/dev/null || netns_del "$_ns"
    done
    return 0
}

netns_up() { # TAG NET N ERRFILE
    netns_sweep "$1"
    ip netns add "$1-sw" 2>"$4" || return 77
    { ip -n "$1-sw" link add br0 type bridge && ip -n "$1-sw" link set br0 up; } || return 1
    _k=0
    while [ "$_k" -lt "$3" ]; do
        _ns="$1-n$_k"
        { ip netns add "$_ns" &&
            ip -n "$1-sw" link add "p$_k" type veth peer name eth0 netns "$_ns" &&
            ip -n "$1-sw" link set "p$_k" master br0 up &&
            ip -n "$_ns" addr add "$2.$((_k + 1))/24" dev eth0 &&
            ip -n "$_ns" link set eth0 up && ip -n "$_ns" link set lo up; } || return 1
        _k=$((_k + 1))
    done
}

netns_hosts() { # TAG NET N WHAT ERRFILE
    netns_up "$1" "$2" "$3" "$5"
    case $? in
    0) ;;
    77)
        echo "SKIP: cannot create a network namespace: $(cat "$5")"
        exit 77
        ;;
    *)
        echo "FAIL: cannot build $4"
        exit 1
        ;;
    esac
}
