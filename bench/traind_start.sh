# Sourced by the benchmarks that run a traind of their own (api.sh, cluster.sh, search.sh):
#   start_traind LOG ARGS...
# starts "$build/traind" ARGS in the background, its stderr going to LOG, and returns once it
# said "listening on URL": traind_pid and traind_url are set. Its stderr is read as it comes,
# through a FIFO (no polling); one that ends before listening stops the benchmark with its words.
start_traind() {
    traind_log=$1
    shift
    rm -f "$traind_log.fifo"
    mkfifo "$traind_log.fifo"
    "$build/traind" "$@" 2>"$traind_log.fifo" &
    traind_pid=$!
    exec 3<"$traind_log.fifo"
    traind_url=
    while IFS= read -r line <&3; do
        printf '%s\n' "$line" >>"$traind_log"
        case $line in *"listening on "*) traind_url=${line##*listening on }; break ;; esac
    done
    if [ -z "$traind_url" ]; then
        echo "bench: traind did not start: $(cat "$traind_log")" >&2
        exit 1
    fi
    cat <&3 >>"$traind_log" & # the rest, so that traind never waits on a full pipe
    exec 3<&-
}
