/* Whether a path a job names lies inside the daemon's data roots, symlinks resolved: what a
 * submission may read (its data, a command's cwd). */
#include "service/submit/td_submit.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool under(const char *path, const char *root) {
    size_t n = strlen(root);
    if (n == 1 && root[0] == '/') return true;
    return strncmp(path, root, n) == 0 && (path[n] == 0 || path[n] == '/');
}

bool td_path_inside_roots(const char *path, const char *const *roots, int n_roots) {
    if (!path || !*path) return true;
    char real[PATH_MAX], probe[PATH_MAX];
    snprintf(probe, sizeof probe, "%s", path);
    /* a path not there yet (a checkpoint directory): its nearest existing parent decides, and
     * the part below it must not climb out with ".." */
    const char *rest = "";
    while (!realpath(probe, real)) {
        if (errno != ENOENT) return false;
        char *slash = strrchr(probe, '/');
        if (!slash) {
            if (!getcwd(real, sizeof real)) return false;
            rest = path;
            break;
        }
        if (strcmp(slash + 1, "..") == 0) return false;
        rest = path + (slash - probe);
        if (slash == probe) {
            snprintf(real, sizeof real, "/");
            break;
        }
        *slash = 0;
    }
    if (strstr(rest, "/../") || (strlen(rest) >= 3 && !strcmp(rest + strlen(rest) - 3, "/..")))
        return false;
    for (int i = 0; i < n_roots; i++)
        if (under(real, roots[i])) return true;
    return false;
}
