/* dx_quant_priv: what dx_quant shares with dx_kquant and nothing else.
 * IQ4_XS is IQ4_NL's codebook with a 6-bit scale per 32 elements; its
 * sub-block scales are found by exactly IQ4_NL's search (llama.cpp runs one
 * function for both), so both formats call the one written here. */
#ifndef DX_QUANT_PRIV_H
#define DX_QUANT_PRIV_H

/* The index of the IQ4_NL codebook entry nearest to v (a tie goes to the
 * upper one, as in llama.cpp). */
int dx_iq4nl_nearest(float v);

/* The least-weighted-error scale of 32 elements on the IQ4_NL codebook
 * (weights x^2, no importance matrix); 0 for a block of |x| < 1e-15. */
float dx_iq4nl_block_scale(const float *x);

#endif
