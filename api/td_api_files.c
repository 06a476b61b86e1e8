/* PUT and GET /v1/cluster/files/{job}/{path}: a job's files moving between its master and the
 * nodes that run it (a checkpoint rank 0 wrote on an agent goes up; the one a restarted part
 * resumes from comes down). A node's own credential (given at its registration) authorizes
 * both, not a user token, and only for a job with a part on that node, under its checkpoints/
 * (td_jobs_file_path).
 *
 * An upload is streamed to a temporary file beside its place while its SHA-256 is computed, and
 * renamed into place only when the digest equals the ?sha256= the node sent: a file cut short or
 * altered on the way never becomes the job's. */
#define _GNU_SOURCE /* mkstemp's O_CLOEXEC via mkostemp */
#include "api/td_api_private.h"

#include "service/cluster/td_cluster.h"
#include "service/run/td_jobfs.h"
#include "base/td_sha256.h"

#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static const char PREFIX[] = "/v1/cluster/files/";

bool td_api_is_file_upload(const char *url, const char *method) {
    return strcmp(method, "PUT") == 0 && strncmp(url, PREFIX, sizeof PREFIX - 1) == 0;
}

bool td_api_file_route_split(const char *url, long *job, const char **rel) {
    if (strncmp(url, PREFIX, sizeof PREFIX - 1) != 0) return false;
    const char *id = url + sizeof PREFIX - 1, *slash = strchr(id, '/');
    if (!slash || !td_api_parse_id(id, (size_t)(slash - id), job)) return false;
    *rel = slash + 1;
    return true;
}

/* {job}/{path} of the URL into a file of the job's (files: whose, and how it is reached), for
 * an upload (writing) or a download, which may be served from where the checkpoint lies; the
 * calling node (its credential) must run a part of the job's attempt (node rank 0's, to send
 * checkpoints). */
static int file_of(td_api *api, struct MHD_Connection *c, const char *url, bool writing, char *path,
                   size_t len, td_job_files *files, td_reply_error *e) {
    long job;
    const char *rel;
    if (!api->cfg.cluster)
        return td_reply_fail(e, 409, "not_master", NULL, "this traind is not a cluster's master");
    char peer[64], node[64];
    td_api_peer(c, peer, sizeof peer);
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!td_cluster_node_authorized(api->cfg.cluster, auth, peer, node, e)) return -1;
    if (!td_api_file_route_split(url, &job, &rel))
        return td_reply_fail(e, 400, "bad_request", NULL,
                             "expected /v1/cluster/files/{job id}/{path in its directory}");
    return td_jobs_file_path(api->jobs, job, rel, writing, node, path, len, files, e);
}

void td_api_upload_begin(td_api *api, struct MHD_Connection *c, const char *url, td_api_upload *u) {
    u->put.fd = u->put.dir = -1;
    u->error.status = 0;
    u->jobs = api->jobs;
    char path[8192];
    if (file_of(api, c, url, true, path, sizeof path, &u->files, &u->error) != 0) return;
    /* into the job's directory as the job, never through a link it planted there
     * (td_jobfs.h); the name is taken only once the bytes are whole and their digest right */
    const char *rel = path + strlen(u->files.dir) + 1;
    td_err err = {{0}};
    int root = open(u->files.dir, O_PATH | O_DIRECTORY | O_CLOEXEC);
    if (root < 0 || td_jobfs_put_begin(&u->files.who, root, rel, "up", &u->put, &err) != 0) {
        td_reply_fail(&u->error, 500, "internal", NULL, "cannot write %s: %s", rel,
                      root < 0 ? strerror(errno) : err.msg);
        if (root >= 0) close(root);
        return;
    }
    close(root);
    snprintf(u->path, sizeof u->path, "%s", rel);
    u->hash = td_sha256_new();
    u->size = 0;
}

void td_api_upload_chunk(td_api_upload *u, const char *data, size_t n) {
    if (u->put.fd < 0 || u->error.status) return;
    for (size_t done = 0; done < n;) {
        ssize_t k = write(u->put.fd, data + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            td_reply_fail(&u->error, 507, "insufficient_storage", NULL, "writing %s: %s", u->path,
                          strerror(errno));
            return;
        }
        done += (size_t)k;
    }
    td_sha256_update(u->hash, data, n);
    u->size += (long long)n;
}

void td_api_upload_abandon(td_api_upload *u) {
    if (u->hash) {
        char hex[TD_SHA256_HEX];
        td_sha256_finish(u->hash, hex);
        u->hash = NULL;
    }
    td_err ignored = {{0}};
    if (u->put.fd >= 0 || u->put.dir >= 0) td_jobfs_put_end(&u->put, false, &ignored);
}

enum MHD_Result td_api_upload_end(struct MHD_Connection *c, td_api_upload *u) {
    if (u->error.status) {
        td_api_upload_abandon(u);
        return td_api_error(c, &u->error, NULL);
    }
    char hex[TD_SHA256_HEX];
    td_sha256_finish(u->hash, hex);
    u->hash = NULL;
    const char *want = MHD_lookup_connection_value(c, MHD_GET_ARGUMENT_KIND, "sha256");
    td_reply_error e;
    if (!want || strcmp(want, hex) != 0) {
        td_api_upload_abandon(u);
        td_reply_fail(&e, 400, "checksum_mismatch", "sha256",
                      "the %lld bytes that arrived have SHA-256 %s, the node said %s: send it "
                      "again",
                      u->size, hex, want ? want : "(no ?sha256=)");
        return td_api_error(c, &e, NULL);
    }
    td_err err = {{0}};
    if (td_jobfs_put_end(&u->put, true, &err) != 0) {
        td_reply_fail(&e, 500, "internal", NULL, "cannot keep %s: %s", u->path, err.msg);
        return td_api_error(c, &e, NULL);
    }
    td_buf out = {0};
    td_buf_printf(&out, "{\"size\":%lld,\"sha256\":\"%s\"}\n", u->size, hex);
    return td_api_reply_buf(c, MHD_HTTP_OK, &out);
}

enum MHD_Result td_api_file_get(td_api *api, struct MHD_Connection *c, const char *url) {
    td_reply_error e;
    char path[8192];
    td_job_files files;
    if (file_of(api, c, url, false, path, sizeof path, &files, &e) != 0)
        return td_api_error(c, &e, NULL);
    /* as the job, never through a link (td_jobfs.h): a regular file of the job's, or nothing */
    td_err err = {{0}};
    int fd = td_jobfs_open_path(&files.who, files.dir, path, O_RDONLY, &err);
    struct stat st;
    if (fd < 0 || td_jobfs_check(fd, url, false, files.owner, 0, &st, &err) != 0) {
        if (fd >= 0) close(fd);
        td_reply_fail(&e, 404, "not_found", NULL, "%s: no such file of the job's (%s)", url,
                      err.msg);
        return td_api_error(c, &e, NULL);
    }
    fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK);
    struct MHD_Response *r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
    if (!r) close(fd);
    return td_api_respond(c, MHD_HTTP_OK, r, "application/octet-stream", NULL);
}
