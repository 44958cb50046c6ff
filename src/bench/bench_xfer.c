#include "bench/bench_xfer.h"
#include "base/dx_err.h"
int bench_xfer_run(const bench_xfer_config *cfg, FILE *out)
{
    return dx_errf(DX_EUNSUPPORTED, "not yet");
}
