/* synth_priv: what synth.c and synth_mix.c share (not for use outside
 * src/model/). */
#ifndef SYNTH_PRIV_H
#define SYNTH_PRIV_H

#include "model/synth.h"

/* llama-quantize's rule for the mixture w (w->ftype a llama_ftype of the
 * K-quant presets: Q2_K, Q2_K_S, Q3_K_S/M/L, Q4_K_S/M, Q5_K_S/M, Q6_K,
 * IQ4_XS), a synth_wtypes.rule. */
int synth_mix_rule(const synth_wtypes *w, const synth_shape *s, enum synth_role r, uint32_t il,
                   uint64_t n_in);

#endif
