/* Losses over logits [n, classes] and integer class labels, mean over the batch as PyTorch's
 * default reduction="mean":
 *  - cross_entropy: softmax cross-entropy from logits (torch.nn.CrossEntropyLoss), with optional
 *    label_smoothing ε: the target is (1-ε)·onehot + ε/classes;
 *  - mse: torch.nn.MSELoss between the logits and the one-hot label, mean over n·classes.
 */
#ifndef TD_LOSS_H
#define TD_LOSS_H

#include <stdint.h>

typedef enum td_loss_kind { TD_LOSS_CROSS_ENTROPY, TD_LOSS_MSE } td_loss_kind;

typedef struct td_loss {
    td_loss_kind kind;
    float label_smoothing;
} td_loss;

/* Returns the sum over the n samples of each sample's loss (callers divide); counts the argmax
 * hits into *correct when it is not NULL. When dlogits is not NULL it receives the gradient of
 * (mean loss × grad_scale). */
double td_loss_compute(const td_loss *loss, const float *logits, const int32_t *labels, int n,
                       int classes, float *dlogits, float grad_scale, int *correct);

#endif
