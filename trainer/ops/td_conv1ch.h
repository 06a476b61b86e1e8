/* Direct convolution for single-channel images (the first layer of grayscale models such as
 * LeNet on Fashion-MNIST): stride 1, no padding, kernel up to 5x5, up to 12 output channels.
 *
 * im2col is the wrong tool there: it writes every input pixel K*K times as short 5-float runs
 * and then reads them back, and that traffic cost more than the arithmetic. These kernels read
 * the window straight from the image instead: the forward puts 8 output pixels in a register and
 * broadcasts each weight against them, and the weight gradient assembles each window in 3 or 4
 * registers, over several passes (td_conv1ch.c, which says why the AVX-512 build runs the same
 * 8-lane code). td_conv1ch_fits says false when the shape or the build (no AVX2 with FMA) does not
 * suit them. */
#ifndef TD_CONV1CH_H
#define TD_CONV1CH_H

#include "ops/td_ops_isa.h"

#include <stdbool.h>

/* one per instruction set (ops/td_ops_isa.h) */
#define td_conv1ch_fits    TD_ISA_SYM(td_conv1ch_fits)
#define td_conv1ch_forward TD_ISA_SYM(td_conv1ch_forward)
#define td_conv1ch_wgrad   TD_ISA_SYM(td_conv1ch_wgrad)

/* Whether the kernels below handle this geometry on this build. */
bool td_conv1ch_fits(int c, int k, int stride, int padding, int o);

/* y [n, oh, ow, o] = conv(x [n, h, w]) with wp [o, k*k + 1] (weights in (kh, kw) order, then the
 * bias). scratch: 16·(k*k + 1) floats. */
void td_conv1ch_forward(int n, int h, int w, int k, int o, const float *x, const float *wp,
                        float *y, float *scratch);

/* dwp [o, k*k + 1] = sum over the batch of dy ⊗ window (the last column is the bias gradient);
 * add: accumulate into dwp instead of overwriting it. */
void td_conv1ch_wgrad(int n, int h, int w, int k, int o, const float *x, const float *dy,
                      float *dwp, bool add);

#endif
