// Writes a random bf16 Llama 3 as a Hugging Face folder with llmc/formats/llama3_config.h and
// llmc/formats/safetensors.h (config.json, then model.safetensors or shards of at most MAX_SHARD_BYTES
// and their index), and prints each tensor's name and the fp64 sum of its values, for
// dev/check_llama3_written.py to compare with what LlamaForCausalLM.from_pretrained loads.
//
// usage: write_llama3_random DIR DESCRIPTOR MAX_SHARD_BYTES    (DIR must exist)
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "llmc/error.h"
#include "llmc/formats/llama3_config.h"
#include "llmc/formats/safetensors.h"

using namespace llmc;

static int run(int argc, char** argv) {
    if (argc != 4) fail("usage: write_llama3_random DIR DESCRIPTOR MAX_SHARD_BYTES");
    const std::string dir = argv[1];
    const Llama3Config c = llama3_parse_descriptor(argv[2]);
    char* end = nullptr;
    const unsigned long long max_shard = strtoull(argv[3], &end, 10);
    if (*argv[3] == '\0' || *end != '\0' || max_shard == 0) fail(std::string(argv[3]) + ": not a byte count > 0");
    const std::vector<Llama3Param> table = llama3_param_table(c);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 0.1f);
    std::vector<std::vector<uint16_t>> values;
    std::vector<SafetensorsOut> outs;
    values.reserve(table.size());  // outs points into each
    for (const auto& p : table) {
        values.emplace_back(p.numel());
        for (auto& x : values.back()) x = f32_to_bf16(normal(rng));
        outs.push_back({p.name, "BF16", p.shape, values.back().data()});
    }
    llama3_write_hf_config(dir + "/config.json", c, "bfloat16");
    safetensors_write_model(dir, outs, max_shard, {{"format", "pt"}});
    for (size_t i = 0; i < table.size(); i++) {
        double sum = 0;
        for (uint16_t x : values[i]) sum += bf16_to_f32(x);
        printf("%s %.17g\n", table[i].name.c_str(), sum);
    }
    return 0;
}

int main(int argc, char** argv) { return run_main(run, argc, argv); }
