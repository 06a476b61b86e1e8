#!/bin/sh
# Checks the systemd units in DIR (default: this script's directory) without installing them
# and without a running systemd (PID 1 may be anything: a container, a build machine):
#   - systemd-analyze verify, in a throw-away root that holds the unit, its drop-ins, the
#     host's stock units (for sysinit.target and the like) and a stand-in executable for
#     every absolute Exec*= path, so the package's binaries need not be installed;
#   - systemd-analyze security --offline=true --threshold=N: the exposure must stay at or
#     below THRESHOLD tenths (default 31, i.e. 3.1, the score of traind.service now); and,
#     as the score moves in steps of 0.1 that a small weakening (ProtectSystem=full for
#     strict) does not reach, every check it marks failed must be one accepted below.
# Each DIR/UNIT.service.d/*.conf.example drop-in is checked too, applied to its unit (verify
# and the threshold).
# Exits non-zero on any failure. Needs systemd-analyze (systemd >= 252).
# usage: check-units.sh [DIR]    environment: THRESHOLD (tenths of the exposure scale)
set -eu

dir=${1:-$(CDPATH='' cd -- "$(dirname -- "$0")" && pwd)}
dir=$(CDPATH='' cd -- "$dir" && pwd)
threshold=${THRESHOLD:-31}

# The security checks traind.service is known to fail, each for a reason (see the comments
# in the unit): the jobs' system calls (@resources: CPU/NUMA placement; @privileged: chown
# and set*id, which the daemon needs to give jobs their identities; @debug: pidfd_getfd for CUDA
# memory sharing); RemoveIPC (would delete surviving jobs' /dev/shm); the host's root, devices
# (GPUs, RDMA) and users (jobs' files); W+X memory (CUDA JIT); netlink, Unix and IP sockets,
# the host's network and no IP allow list (a TCP service and NCCL); all of /proc (CUDA,
# Python). And, since jobs run under identities of their own (issue 42): root (User=), with
# CAP_SETUID/SETGID (their uids), CAP_CHOWN (their directories), CAP_KILL (their processes),
# CAP_DAC_*/FOWNER (the files they wrote), and a delegated, writable cgroup (their cgroups).
accepted_traind='SystemCallFilter=~@resources SystemCallFilter=~@privileged
SystemCallFilter=~@debug RemoveIPC= RootDirectory=/RootImage= PrivateDevices=
MemoryDenyWriteExecute= RestrictAddressFamilies=~AF_NETLINK RestrictAddressFamilies=~AF_UNIX
RestrictAddressFamilies=~AF_(INET|INET6) ProcSubset= PrivateNetwork= PrivateUsers=
DeviceAllow= IPAddressDeny= User=/DynamicUser= CapabilityBoundingSet=~CAP_KILL
CapabilityBoundingSet=~CAP_(DAC_*|FOWNER|IPC_OWNER) CapabilityBoundingSet=~CAP_(CHOWN|FSETID|SETFCAP)
CapabilityBoundingSet=~CAP_SET(UID|GID|PCAP) ProtectControlGroups= Delegate='

command -v systemd-analyze >/dev/null 2>&1 || {
    echo "check-units: systemd-analyze not found" >&2
    exit 1
}

# the stock unit directory: verify needs sysinit.target, basic.target and the like
stock=
for d in "$(pkg-config --variable=systemdsystemunitdir systemd 2>/dev/null || :)" \
    /usr/lib/systemd/system /lib/systemd/system; do
    if [ -n "$d" ] && [ -f "$d/sysinit.target" ]; then
        stock=$d
        break
    fi
done
[ -n "$stock" ] || {
    echo "check-units: no systemd unit directory with sysinit.target found" >&2
    exit 1
}

root=$(mktemp -d "${TMPDIR:-/tmp}/check-units.XXXXXX")
trap 'rm -rf "$root"' EXIT
trap 'exit 130' INT
trap 'exit 143' TERM
mkdir -p "$root/usr/lib/systemd"
cp -RP "$stock" "$root/usr/lib/systemd/system"

failed=0

# check UNIT [DROPIN LABEL]: verify and security-check DIR/UNIT (with DROPIN applied)
check() {
    unit=$1 dropin=${2:-} label=${3:-$1}
    etc=$root/etc/systemd/system
    rm -rf "$etc"
    mkdir -p "$etc"
    cp "$dir/$unit" "$etc/$unit"
    if [ -d "$dir/$unit.d" ]; then
        mkdir -p "$etc/$unit.d"
        for f in "$dir/$unit.d"/*.conf; do
            if [ -f "$f" ]; then cp "$f" "$etc/$unit.d/"; fi
        done
    fi
    if [ -n "$dropin" ]; then
        mkdir -p "$etc/$unit.d"
        cp "$dropin" "$etc/$unit.d/$(basename "$dropin" .example)"
    fi
    # a stand-in for each absolute Exec*= command (prefixes - @ : + ! | stripped)
    cat "$etc/$unit" "$etc/$unit.d"/*.conf 2>/dev/null |
        sed -n 's/^[[:space:]]*Exec[A-Za-z]*=[-@:+!|]*[[:space:]]*\([^[:space:]]*\).*/\1/p' |
        while read -r exe; do
            case $exe in
            /*)
                mkdir -p "$root$(dirname "$exe")"
                printf '#!/bin/sh\nexit 0\n' >"$root$exe"
                chmod 755 "$root$exe"
                ;;
            esac
        done

    echo "== $label"
    # verify reports warnings (an unknown key, a bad value) on stderr with status 0: any line
    # naming the unit fails the check too
    if out=$(systemd-analyze verify --root="$root" --man=no --generators=no "$unit" 2>&1); then
        rc=0
    else
        rc=$?
    fi
    if [ -n "$out" ]; then printf '%s\n' "$out"; fi
    if [ "$rc" -ne 0 ] || printf '%s\n' "$out" | grep -q -F "$unit"; then
        echo "check-units: $label: systemd-analyze verify failed (status $rc)" >&2
        failed=1
    else
        echo "verify: ok"
    fi

    # LC_ALL=C: ASCII marks ("-" for a failed check, "+" for a passed one) in any locale
    if out=$(LC_ALL=C SYSTEMD_COLORS=0 systemd-analyze security --offline=true \
        --root="$root" --threshold="$threshold" --no-pager "$unit" 2>&1); then
        rc=0
    else
        rc=$?
    fi
    score=$(printf '%s\n' "$out" | grep 'Overall exposure level' || :)
    if [ "$rc" -ne 0 ] || [ -z "$score" ]; then
        # the failed checks and the score, or all of it if there is no score
        if [ -n "$score" ]; then
            printf '%s\n' "$out" | grep -e '^- ' -e 'Overall exposure level' || :
        else
            printf '%s\n' "$out"
        fi
        echo "check-units: $label: systemd-analyze security failed (status $rc; the threshold" \
            "is $threshold, an exposure of at most $((threshold / 10)).$((threshold % 10)))" >&2
        failed=1
        return 0
    fi
    printf '%s\n' "$score"
    # the list is the shipped unit's; an example drop-in may trade a check for a use (e.g.
    # ProtectHome=tmpfs to bind datasets from /home): the threshold only
    [ -z "$dropin" ] || return 0
    case $unit in
    traind.service) accepted=$(printf '%s\n' "$accepted_traind" | tr '\n' ' ') ;;
    *) return 0 ;; # no list for other units: the threshold only
    esac
    new=
    set -f # the names hold * and ?
    for name in $(printf '%s\n' "$out" | sed -n 's/^- \([^ ]*\) .*/\1/p'); do
        case " $accepted " in
        *" $name "*) ;;
        *) new="$new $name" ;;
        esac
    done
    set +f
    if [ -n "$new" ]; then
        printf '%s\n' "$out" | grep '^- ' || :
        echo "check-units: $label: failed security checks not accepted in check-units.sh:$new" >&2
        failed=1
    fi
    return 0
}

found=0
for path in "$dir"/*.service; do
    [ -f "$path" ] || continue
    found=1
    unit=$(basename "$path")
    check "$unit"
    for ex in "$dir/$unit.d"/*.conf.example; do
        if [ -f "$ex" ]; then check "$unit" "$ex" "$unit + $(basename "$ex")"; fi
    done
done
if [ "$found" -eq 0 ]; then
    echo "check-units: no *.service in $dir" >&2
    exit 1
fi
exit "$failed"
