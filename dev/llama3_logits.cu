// The logits train_llama3.cu's model computes from a Hugging Face Llama
// folder (the one -e takes, a checkpoint's model_S/) for one sequence of
// tokens at positions 0..T-1 (causal attention, no document mask): T x V
// little-endian float32 written to OUT, for a check against transformers'
// LlamaForCausalLM on the same folder (dev/compare_llama3_logits.py). The fp32
// build (build/cpu-fp32/llama3_logits) computes as transformers does in fp32.
//   usage: llama3_logits FOLDER OUT TOKEN...
//   e.g.   build/cpu-fp32/llama3_logits run/model_00000004 /tmp/logits.f32 2256 17 300 9
#define TESTING
#include "train_llama3.cu"
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

static int parse_token(const char* s, int V) {
    char* end = nullptr;
    errno = 0;
    const long x = strtol(s, &end, 10);
    if (errno || end == s || *end || x < 0 || x >= V) llmc::failf("token %s: not an id of the vocabulary (V=%d)", s, V);
    return (int)x;
}

static int logits_main(int argc, char** argv) {
    if (argc < 4) llmc::fail("usage: llama3_logits FOLDER OUT TOKEN...");
    Llama3 model;
    init_from_model_file(&model, argv[1]);
    const int V = model.config.V, Vp = padded_vocab(model.config), T = argc - 3;
    if (T > model.config.max_seq_len)
        llmc::failf("%d tokens: more than the model's %d positions", T, model.config.max_seq_len);
    std::vector<int> tokens(T), targets(T, -1);
    for (int t = 0; t < T; t++) tokens[t] = parse_token(argv[3 + t], V);
    allocate_activations(LLAMA3_FAMILY, &model, 1, T, 1);
    evaluate_batch(LLAMA3_FAMILY, &model, tokens.data(), targets.data());
    std::vector<float> logits((size_t)T * V);
    for (int t = 0; t < T; t++) read_logits_row(model.acts.logits, t, V, Vp, &logits[(size_t)t * V]);
    std::string why;
    FILE* f = fopen_regular_file_for_writing(argv[2], O_WRONLY | O_TRUNC, &why);
    if (!f) llmc::failf("%s: cannot create: %s", argv[2], why.c_str());
    const bool ok = fwrite(logits.data(), sizeof(float), logits.size(), f) == logits.size();
    if ((fclose(f) != 0) || !ok) llmc::failf("%s: write failed", argv[2]);
    printf("%d x %d logits of %s written to %s\n", T, V, argv[1], argv[2]);
    free_model(&model);
    matmul_teardown();
    return 0;
}

// a bad folder, token or CUDA error (llmc::Error) is one line "error: ..." and exit status 1
int main(int argc, char** argv) { return llmc::run_main(logits_main, argc, argv); }
