/* cli_up: placeholder until written. */
#include "cli.h"

#include <stdio.h>

int cli_up_main(int argc, char **argv)
{
    fprintf(stderr, "duplex up: not yet\n");
    return 2;
}
