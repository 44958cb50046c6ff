/* cli_model: `duplex model synth|info` (filled in with the model layer). */
#include "cli.h"

#include <stdio.h>

int cli_model_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "duplex model: not built yet\n");
    return 2;
}

int cli_tokenize_main(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    fprintf(stderr, "duplex tokenize: not built yet\n");
    return 2;
}
