/* PUT and GET /v1/cluster/files/{job}/{path}: a job's files moving between its master and the
 * nodes that run it (a checkpoint rank 0 wrote on an agent goes up; the one a restarted part
 * resumes from comes down). The cluster secret authorizes both, not a user token.
 *
 * An upload is streamed to a temporary file beside its place while its SHA-256 is computed, and
 * renamed into place only when the digest equals the ?sha256= the node sent: a file cut short or
 * altered on the way never becomes the job's. */
#define _GNU_SOURCE /* mkstemp's O_CLOEXEC via mkostemp */
#include "api/td_api_private.h"

#include "service/td_cluster.h"
#include "service/td_sha256.h"

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

/* {job}/{path} of the URL into a file of the job's directory (dir_len: its length, for an
 * upload; NULL: a download, which may be served from where the checkpoint lies). */
static int file_of(td_api *api, const char *url, char *path, size_t len, size_t *dir_len,
                   td_reply_error *e) {
    long job;
    const char *rel;
    if (!td_api_file_route_split(url, &job, &rel))
        return td_reply_fail(e, 400, "bad_request", NULL,
                             "expected /v1/cluster/files/{job id}/{path in its directory}");
    if (td_jobs_file_path(api->jobs, job, rel, !dir_len, path, len, e) != 0) return -1;
    if (dir_len) *dir_len = strlen(path) - strlen(rel) - 1; /* the job's directory */
    return 0;
}

/* Makes the directories above path, the job's user's (run_as) like the files in them: a
 * checkpoint is served only from files of that user (service/td_ckpt.h). */
static int make_parents(td_jobs *jobs, char *path, size_t below, td_reply_error *e) {
    for (char *p = path + below; (p = strchr(p + 1, '/'));) {
        *p = 0;
        int rc = mkdir(path, 0750);
        int err = errno;
        if (rc == 0) td_jobs_give(jobs, path); /* what this made, never what was there */
        if (rc != 0 && err != EEXIST) {
            td_reply_fail(e, 500, "internal", NULL, "cannot create %s: %s", path, strerror(err));
            *p = '/';
            return -1;
        }
        *p = '/';
    }
    return 0;
}

void td_api_upload_begin(td_api *api, struct MHD_Connection *c, const char *url, td_api_upload *u) {
    u->fd = -1;
    u->error.status = 0;
    u->jobs = api->jobs;
    td_cluster *cluster = api->cfg.cluster;
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!cluster) {
        td_reply_fail(&u->error, 409, "not_master", NULL, "this traind is not a cluster's master");
        return;
    }
    if (!td_cluster_authorized(cluster, auth, "a node uploading", &u->error)) return;
    size_t dir_len = 0;
    if (file_of(api, url, u->path, sizeof u->path, &dir_len, &u->error) != 0) return;
    if (make_parents(api->jobs, u->path, dir_len, &u->error) != 0) return;
    snprintf(u->tmp, sizeof u->tmp, "%s.up-XXXXXX", u->path);
    u->fd = mkostemp(u->tmp, O_CLOEXEC);
    if (u->fd < 0) {
        td_reply_fail(&u->error, 500, "internal", NULL, "cannot create %s: %s", u->tmp,
                      strerror(errno));
        return;
    }
    u->hash = td_sha256_new();
    u->size = 0;
}

void td_api_upload_chunk(td_api_upload *u, const char *data, size_t n) {
    if (u->fd < 0 || u->error.status) return;
    for (size_t done = 0; done < n;) {
        ssize_t k = write(u->fd, data + done, n - done);
        if (k < 0 && errno == EINTR) continue;
        if (k < 0) {
            td_reply_fail(&u->error, 507, "insufficient_storage", NULL, "writing %s: %s", u->tmp,
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
    if (u->fd >= 0) {
        close(u->fd);
        unlink(u->tmp);
        u->fd = -1;
    }
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
    int rc = fsync(u->fd);
    int err = errno;
    if (close(u->fd) != 0 && rc == 0) rc = -1, err = errno;
    u->fd = -1;
    if (rc == 0) td_jobs_give(u->jobs, u->tmp);
    if (rc == 0 && rename(u->tmp, u->path) != 0) rc = -1, err = errno;
    if (rc != 0) {
        unlink(u->tmp);
        td_reply_fail(&e, 500, "internal", NULL, "cannot keep %s: %s", u->path, strerror(err));
        return td_api_error(c, &e, NULL);
    }
    td_buf out = {0};
    td_buf_printf(&out, "{\"size\":%lld,\"sha256\":\"%s\"}\n", u->size, hex);
    return td_api_reply_buf(c, MHD_HTTP_OK, &out);
}

enum MHD_Result td_api_file_get(td_api *api, struct MHD_Connection *c, const char *url) {
    td_reply_error e;
    const char *auth =
        MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!api->cfg.cluster) {
        td_reply_fail(&e, 409, "not_master", NULL, "this traind is not a cluster's master");
        return td_api_error(c, &e, NULL);
    }
    if (!td_cluster_authorized(api->cfg.cluster, auth, "a node downloading", &e))
        return td_api_error(c, &e, NULL);
    char path[8192];
    if (file_of(api, url, path, sizeof path, NULL, &e) != 0) return td_api_error(c, &e, NULL);
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    struct stat st;
    if (fd < 0 || fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
        if (fd >= 0) close(fd);
        td_reply_fail(&e, 404, "not_found", NULL, "%s: no such file", url);
        return td_api_error(c, &e, NULL);
    }
    struct MHD_Response *r = MHD_create_response_from_fd64((uint64_t)st.st_size, fd);
    if (!r) close(fd);
    return td_api_respond(c, MHD_HTTP_OK, r, "application/octet-stream", NULL);
}
