/* node_engine: the node_backend that serves from a real engine and model
 * (engine_submit/cancel/get_stats, the model's tokenizer and chat template). */
#ifndef NODE_ENGINE_H
#define NODE_ENGINE_H

#include "engine/engine.h"
#include "node/node_server.h"

/* Fills *out; e and m must outlive the server's use of it. */
void node_engine_backend(engine *e, const model *m, node_backend *out);

#endif
