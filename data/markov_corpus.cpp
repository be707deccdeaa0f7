// Writes the built-in Markov corpus (llmc/data/markov_corpus.h) and prints its floor.
//   markov_corpus [-o dir] [-s seed] [-V vocab] [-n train_tokens] [-v val_tokens]
//   markov_corpus -f shard.bin      prints the floor recorded in a shard
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "llmc/data/markov_corpus.h"

static void usage(const char* prog) {
    fprintf(stderr,
            "usage: %s [-o dir] [-s seed] [-V vocab_size] [-n train_tokens] [-v val_tokens]\n"
            "       %s -f shard.bin\n"
            "defaults: -o build/markov -s %llu -V %d -n %zu -v %zu\n",
            prog, prog, (unsigned long long)MARKOV_DEFAULT_SEED, MARKOV_DEFAULT_VOCAB,
            (size_t)MARKOV_DEFAULT_TRAIN_TOKENS, (size_t)MARKOV_DEFAULT_VAL_TOKENS);
    exit(EXIT_FAILURE);
}

static unsigned long long parse_num(const char* prog, const char* flag, const char* s) {
    char* end = nullptr;
    errno = 0;
    unsigned long long v = strtoull(s, &end, 10);
    if (errno != 0 || end == s || *end != '\0' || s[0] == '-') {
        fprintf(stderr, "error: %s %s: not a non-negative integer\n", flag, s);
        usage(prog);
    }
    return v;
}

static int run(int argc, char** argv) {
    const char* dir = "build/markov";
    const char* floor_of = nullptr;
    unsigned long long seed = MARKOV_DEFAULT_SEED, vocab = MARKOV_DEFAULT_VOCAB;
    unsigned long long ntrain = MARKOV_DEFAULT_TRAIN_TOKENS, nval = MARKOV_DEFAULT_VAL_TOKENS;
    for (int i = 1; i < argc; i++) {
        const char* a = argv[i];
        if (strcmp(a, "-h") == 0 || strcmp(a, "--help") == 0) usage(argv[0]);
        if (i + 1 >= argc || a[0] != '-' || strlen(a) != 2) usage(argv[0]);
        const char* v = argv[++i];
        switch (a[1]) {
            case 'o': dir = v; break;
            case 'f': floor_of = v; break;
            case 's': seed = parse_num(argv[0], a, v); break;
            case 'V': vocab = parse_num(argv[0], a, v); break;
            case 'n': ntrain = parse_num(argv[0], a, v); break;
            case 'v': nval = parse_num(argv[0], a, v); break;
            default: usage(argv[0]);
        }
    }
    if (floor_of) {
        MarkovShardInfo info;
        if (!markov_corpus_info(floor_of, &info)) llmc::fail(std::string(floor_of) + ": not a Markov corpus shard");
        printf("%s: %llu tokens, vocab %d, eot %d, seed %llu, split %s\n", floor_of,
               (unsigned long long)info.num_tokens, info.vocab_size, info.eot, (unsigned long long)info.seed,
               info.split == 0 ? "val" : "train");
        printf("floor %.6f nats/token (true-chain loss here %.6f), entropy rate %.6f\n", info.floor, info.true_nll,
               info.entropy_rate);
        return 0;
    }
    if (vocab > MARKOV_MAX_VOCAB) vocab = 0;  // reported as out of range
    markov_corpus_write(dir, seed, (size_t)ntrain, (size_t)nval, (int)vocab);
    MarkovShardInfo val;
    if (!markov_corpus_info(markov_corpus_val_path(dir).c_str(), &val))
        llmc::fail(std::string(dir) + ": the corpus just written cannot be read back");
    printf("%s, %s: vocab %d (eot %d), seed %llu, %llu train and %llu val tokens\n",
           markov_corpus_train_path(dir).c_str(), markov_corpus_val_path(dir).c_str(), val.vocab_size, val.eot, seed,
           ntrain, nval);
    printf("val floor %.6f nats/token (true-chain loss on val %.6f), entropy rate %.6f, uniform %.6f\n", val.floor,
           val.true_nll, val.entropy_rate, std::log((double)val.vocab_size));
    return 0;
}

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
