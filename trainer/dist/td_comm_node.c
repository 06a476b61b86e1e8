/* Which ranks share a node, decided from what each rank says it runs on, not from whether a
 * shared-memory mapping happens to succeed.
 *
 * Two processes can read each other's POSIX shared memory exactly when they run under one
 * kernel (the boot id) and see the same tmpfs at /dev/shm (its device and inode): two
 * containers or two network namespaces with their own /dev/shm are two nodes even on one
 * machine, and test them as such. Ranks on one node all-reduce through shared memory; ranks of
 * different nodes always talk TCP. */
#define _GNU_SOURCE /* gethostname */
#include "dist/td_comm_private.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

void td_comm_node_identity(char *out, size_t len) {
    char boot[64] = "unknown-boot";
    FILE *f = fopen("/proc/sys/kernel/random/boot_id", "r");
    if (f) {
        if (!fgets(boot, sizeof boot, f)) snprintf(boot, sizeof boot, "unknown-boot");
        boot[strcspn(boot, "\n")] = 0;
        fclose(f);
    }
    struct stat st;
    if (stat("/dev/shm", &st) == 0)
        snprintf(out, len, "%s shm %llx:%llx", boot, (unsigned long long)st.st_dev,
                 (unsigned long long)st.st_ino);
    else /* no shared memory here: shm_open fails and the node's ranks use the TCP ring */
        snprintf(out, len, "%s no-shm", boot);
}

int td_comm_find_nodes(td_comm *c, const char *node, td_err *err) {
    char mine[TD_COMM_NODE_MAX], key[64];
    if (node)
        snprintf(mine, sizeof mine, "%s", node);
    else
        td_comm_node_identity(mine, sizeof mine);
    snprintf(key, sizeof key, "comm/node/%d", c->rank);
    if (td_store_set(c->store, key, mine, strlen(mine) + 1, err) != 0) return -1;
    /* and where this rank is, in the words the rendezvous uses ("host n2, pid 4711"): an error
     * about a peer that hangs or died then says where to look */
    char who[TD_COMM_WHO_MAX], host[64];
    if (gethostname(host, sizeof host) != 0 || !host[0]) snprintf(host, sizeof host, "?");
    host[sizeof host - 1] = 0;
    snprintf(who, sizeof who, "host %s, pid %d", host, (int)getpid());
    snprintf(key, sizeof key, "comm/who/%d", c->rank);
    if (td_store_set(c->store, key, who, strlen(who) + 1, err) != 0) return -1;
    /* every rank's identity, then: the node of rank p is the first rank with its identity */
    char(*ids)[TD_COMM_NODE_MAX] = td_calloc((size_t)c->world, sizeof *ids);
    int *first = c->node_first = td_calloc((size_t)c->world, sizeof(int));
    c->local = td_calloc((size_t)c->world, sizeof(int));
    c->who = td_calloc((size_t)c->world, sizeof *c->who);
    c->local_size = c->nodes = 0;
    for (int p = 0; p < c->world; p++) {
        void *v;
        snprintf(key, sizeof key, "comm/node/%d", p);
        if (td_store_get(c->store, key, &v, NULL, err) != 0) {
            free(ids);
            return td_fail_prefix(err, "rank %d: learning which node rank %d runs on", c->rank, p);
        }
        snprintf(ids[p], sizeof ids[p], "%s", (char *)v);
        free(v);
        snprintf(key, sizeof key, "comm/who/%d", p);
        if (td_store_get(c->store, key, &v, NULL, err) != 0) {
            free(ids);
            return td_fail_prefix(err, "rank %d: learning where rank %d runs", c->rank, p);
        }
        snprintf(c->who[p], sizeof c->who[p], "%s", (char *)v);
        free(v);
        first[p] = p;
        for (int q = 0; q < p; q++)
            if (strcmp(ids[q], ids[p]) == 0) {
                first[p] = first[q];
                break;
            }
        if (first[p] == p) c->nodes++;
    }
    for (int p = 0; p < c->world; p++)
        if (first[p] == first[c->rank]) {
            if (p == c->rank) c->local_pos = c->local_size;
            c->local[c->local_size++] = p;
        }
    free(ids);
    return 0;
}
