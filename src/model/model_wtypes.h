/* model_wtypes: a file's weight types by tensor role, for people — what
 * `duplex model info` prints, so that a llama-quantize mixture reads at a
 * glance ("attn_q,attn_k,attn_output: q4_K; attn_v: q6_K x14, q4_K x14;
 * ffn_*: q4_K; token_embd: q4_K; output: q6_K"). */
#ifndef MODEL_WTYPES_H
#define MODEL_WTYPES_H

#include "base/dx_buf.h"
#include "model/gguf.h"

/* Appends the summary of every tensor of 2 or more dimensions: a role is a
 * name without its "blk.N." prefix and ".weight" suffix; roles of one
 * family (attn_*, ffn_*) with the same types are listed together ("fam_*"
 * when they are the whole family), a role whose layers differ lists each
 * type with its count.  DX_ENOMEM / DX_ETOOBIG from the buffer. */
int model_wtypes_summary(const gguf_ctx *g, dx_buf *out);

#endif
