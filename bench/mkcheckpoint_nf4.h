/*
 * mkcheckpoint_nf4.h: the nf4-dq quantization mkcheckpoint writes with
 * (bitsandbytes NF4, blocks of 64, the absmax double-quantized in blocks of
 * 256; docs/FORMATS.md).
 */
#ifndef MKCHECKPOINT_NF4_H
#define MKCHECKPOINT_NF4_H

#include <stdint.h>

#define NF4_BLOCK 64
#define NESTED_BLOCK 256

extern const float NF4_CODE[16]; /* the 4-bit code table (quant_map) */

/*
 * x[n] quantized: packed[ceil(n/2)] codes (high nibble first), absmax_q[nb]
 * the 8-bit codes of the block absmax less *offset, nested[ceil(nb/256)]
 * their scales, map[256] the 8-bit table; am[nb] is scratch
 * (nb = ceil(n / 64)).
 */
void nf4dq_quantize(const float *x, uint64_t n, float *am, uint8_t *packed, uint8_t *absmax_q, float *nested,
                    float map[256], float *offset);

#endif
