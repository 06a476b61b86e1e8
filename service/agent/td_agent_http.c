/* The agent's requests to its master, over libcurl: a JSON POST (register, heartbeat) and a
 * file's transfer either way, each with the master's TLS CA and the node's credential. Apart
 * from the threads that make them: how a request goes, not when. */
#include "service/agent/td_agent_private.h"

#include <curl/curl.h>
#include <stdio.h>
#include <string.h>

static size_t collect(char *p, size_t size, size_t n, void *ctx) {
    td_buf_append(ctx, p, size * n);
    return size * n;
}

/* Runs request h (its own options set; NULL when curl_easy_init failed) to url with the cluster
 * secret and hdr's headers, then frees both: the HTTP status, 0 when no answer came (with why). */
static long perform(td_agent *a, CURL *h, const char *url, struct curl_slist *hdr, char *why,
                    size_t why_len) {
    if (!h) {
        curl_slist_free_all(hdr);
        snprintf(why, why_len, "curl_easy_init failed");
        return 0;
    }
    /* the shared secret goes to registration only: everything else carries the node's own */
    if (strcmp(url, a->url_register) == 0) {
        hdr = curl_slist_append(hdr, a->auth);
    } else {
        char node_auth[sizeof a->node_auth];
        pthread_mutex_lock(&a->mu);
        snprintf(node_auth, sizeof node_auth, "%s", a->node_auth);
        pthread_mutex_unlock(&a->mu);
        hdr = curl_slist_append(hdr, node_auth);
        explicit_bzero(node_auth, sizeof node_auth);
    }
    char err[CURL_ERROR_SIZE] = "";
    curl_easy_setopt(h, CURLOPT_URL, url);
    curl_easy_setopt(h, CURLOPT_HTTPHEADER, hdr);
    curl_easy_setopt(h, CURLOPT_ERRORBUFFER, err);
    curl_easy_setopt(h, CURLOPT_NOSIGNAL, 1L); /* a thread of a daemon: no SIGALRM */
    curl_easy_setopt(h, CURLOPT_CONNECTTIMEOUT_MS, 3000L);
    if (a->tls_ca[0]) { /* the master is trusted for what this CA signed, nothing else */
        curl_easy_setopt(h, CURLOPT_CAINFO, a->tls_ca);
        curl_easy_setopt(h, CURLOPT_CAPATH, NULL);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYPEER, 1L);
        curl_easy_setopt(h, CURLOPT_SSL_VERIFYHOST, 2L);
    }
    long status = 0;
    CURLcode rc = curl_easy_perform(h);
    if (rc == CURLE_OK)
        curl_easy_getinfo(h, CURLINFO_RESPONSE_CODE, &status);
    else
        snprintf(why, why_len, "%s", err[0] ? err : curl_easy_strerror(rc));
    curl_slist_free_all(hdr);
    curl_easy_cleanup(h);
    return status;
}

/* POSTs body to url; the HTTP status (0 when no answer came, with why) and the reply. */
long td_agent_post(td_agent *a, const char *url, const char *body, td_buf *reply, char *why,
                   size_t why_len) {
    CURL *h = curl_easy_init();
    if (h) {
        curl_easy_setopt(h, CURLOPT_POSTFIELDS, body);
        curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
        curl_easy_setopt(h, CURLOPT_WRITEDATA, reply);
        curl_easy_setopt(h, CURLOPT_TIMEOUT_MS, 5000L);
    }
    return perform(a, h, url, curl_slist_append(NULL, "Content-Type: application/json"), why,
                   why_len);
}

/* Moves one file to or from the master (PUT when up); the HTTP status, 0 with why when none
 * came, and the master's words when it is not 200. */
long td_agent_transfer(td_agent *a, const char *url, FILE *f, long long size, bool up, char *why,
                       size_t why_len) {
    CURL *h = curl_easy_init();
    td_buf reply = {0};
    if (h) {
        /* a slow link moves big checkpoints: give up only when it stalls */
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_LIMIT, 1024L);
        curl_easy_setopt(h, CURLOPT_LOW_SPEED_TIME, 10L);
        if (up) {
            curl_easy_setopt(h, CURLOPT_UPLOAD, 1L);
            curl_easy_setopt(h, CURLOPT_READDATA, f);
            curl_easy_setopt(h, CURLOPT_INFILESIZE_LARGE, (curl_off_t)size);
            curl_easy_setopt(h, CURLOPT_WRITEFUNCTION, collect);
            curl_easy_setopt(h, CURLOPT_WRITEDATA, &reply);
        } else {
            curl_easy_setopt(h, CURLOPT_WRITEDATA, f); /* libcurl's default writer: fwrite */
        }
    }
    long status = perform(a, h, url, NULL, why, why_len);
    if (status != 0 && status != 200)
        snprintf(why, why_len, "HTTP %ld: %.300s", status, reply.data ? reply.data : "");
    td_buf_free(&reply);
    return status;
}
