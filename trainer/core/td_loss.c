#include "core/td_loss.h"

#include <math.h>
#include <stddef.h>

static int argmax(const float *v, int n) {
    int best = 0;
    for (int i = 1; i < n; i++)
        if (v[i] > v[best]) best = i;
    return best;
}

static double cross_entropy_row(const float *z, int label, int classes, float eps, float *dz,
                                float scale) {
    float max = z[0];
    for (int c = 1; c < classes; c++) max = z[c] > max ? z[c] : max;
    double sum = 0.0;
    for (int c = 0; c < classes; c++) sum += exp((double)(z[c] - max));
    double log_sum = log(sum);
    /* -log p_c = log_sum - (z_c - max) */
    double nll = log_sum - (double)(z[label] - max);
    double loss = nll;
    if (eps > 0.0f) {
        double mean_nll = 0.0;
        for (int c = 0; c < classes; c++) mean_nll += log_sum - (double)(z[c] - max);
        mean_nll /= classes;
        loss = (1.0 - eps) * nll + eps * mean_nll;
    }
    if (dz) {
        for (int c = 0; c < classes; c++) {
            double p = exp((double)(z[c] - max)) / sum;
            double target = (c == label ? 1.0 - eps : 0.0) + (double)eps / classes;
            dz[c] = (float)((p - target) * scale);
        }
    }
    return loss;
}

static double mse_row(const float *z, int label, int classes, float *dz, float scale) {
    double loss = 0.0;
    for (int c = 0; c < classes; c++) {
        double d = (double)z[c] - (c == label ? 1.0 : 0.0);
        loss += d * d;
        if (dz) dz[c] = (float)(2.0 * d * scale);
    }
    /* per-sample share of a mean over n·classes elements */
    return loss / classes;
}

double td_loss_compute(const td_loss *loss, const float *logits, const int32_t *labels, int n,
                       int classes, float *dlogits, float grad_scale, int *correct) {
    double total = 0.0;
    int hits = 0;
    float scale = grad_scale / (float)n;
    if (loss->kind == TD_LOSS_MSE) scale /= (float)classes;
    for (int i = 0; i < n; i++) {
        const float *z = logits + (size_t)i * classes;
        float *dz = dlogits ? dlogits + (size_t)i * classes : NULL;
        if (loss->kind == TD_LOSS_MSE)
            total += mse_row(z, labels[i], classes, dz, scale);
        else
            total += cross_entropy_row(z, labels[i], classes, loss->label_smoothing, dz, scale);
        hits += argmax(z, classes) == labels[i];
    }
    if (correct) *correct = hits;
    return total;
}
