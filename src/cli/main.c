/* duplex: one binary, subcommands.  This file only dispatches. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

#define DUPLEX_VERSION "0.1.0"

static const cli_cmd k_cmds[] = {
    {"model", cli_model_main, "synth|info: write or inspect GGUF models"},
    {"tokenize", cli_tokenize_main, "tokenise text with a model's tokenizer (or --decode)"},
    {"generate", cli_generate_main, "generate text from a prompt on one engine"},
    {"bench", cli_bench_main, "engine|xfer|chat: engine speed, KV transfer speed, a chat"},
    {"kv", cli_kv_main, "hold|pull|bench: KV transfer between processes (tests, bench)"},
    {"serve", cli_serve_main, "OpenAI-compatible HTTP server for one node"},
    {"router", cli_router_main, "KV-aware router in front of prefill and decode nodes"},
    {"up", cli_up_main, "router + prefill/decode nodes on this machine, one command"},
    {"node", cli_node_main, "drain: ask a running node to finish its work and exit"},
};

static void usage(FILE *f)
{
    fprintf(f, "duplex %s — P/D disaggregated LLM serving with bidirectional KV transfer\n\n",
            DUPLEX_VERSION);
    fprintf(f, "usage: duplex <command> [options]   (duplex <command> --help)\n\ncommands:\n");
    cli_list_cmds(f, k_cmds, sizeof k_cmds / sizeof k_cmds[0]);
    fprintf(f, "  %-10s %s\n", "version", "print the version");
}

int main(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help") || !strcmp(argv[1], "-h") ||
        !strcmp(argv[1], "help")) {
        usage(argc < 2 ? stderr : stdout);
        return argc < 2 ? 2 : 0;
    }
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("duplex %s\n", DUPLEX_VERSION);
        return 0;
    }
    for (size_t i = 0; i < sizeof k_cmds / sizeof k_cmds[0]; i++)
        if (!strcmp(argv[1], k_cmds[i].name)) return k_cmds[i].fn(argc - 2, argv + 2);
    fprintf(stderr, "duplex: unknown command '%s'\n\n", argv[1]);
    usage(stderr);
    return 2;
}
