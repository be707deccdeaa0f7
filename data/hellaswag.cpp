// hellaswag: HellaSwag validation items -> llm.c's multiple-choice eval .bin (GPT-2 tokens).
//
//   build/host/hellaswag --input hellaswag_val.jsonl --out data/hellaswag/hellaswag_val.bin
//   build/host/hellaswag --input $SHARED_DATA/hellaswag_val_full.txt --out hellaswag_val.bin
//
// Input: the official jsonl (fields ctx, endings[4], label) or the 6-lines-per-item text form
// (context; gold label 0..3; the four endings). As in llm.c's recipe the context is encoded
// as is and each ending as " " + ending.
// Output: header 256 x int32 [0]=20240522, [1]=1, [2]=number of examples, [3]=longest example
// in bytes; then per example uint16s: 65535 (delimiter), the example's length in bytes (all
// of its uint16s, these two included), its index, the label, the number of endings (4), the
// context length in tokens, the context tokens, then for each ending its length in tokens and
// its tokens. Written atomically (temporary file + rename).
#include <sys/stat.h>

#include <cstdio>
#include <string>
#include <vector>

#include "llmc/formats/regular_file.h"
#include "llmc/data/tokenizer.h"

namespace {

using llmc::fail;

struct Item {
    std::string ctx;
    int label;
    std::vector<std::string> endings;
};

void usage(FILE* f) {
    fprintf(f, "usage: hellaswag --input FILE --out FILE.bin [options]\n"
               "Builds llm.c's HellaSwag eval file (GPT-2 tokens) from the official jsonl (ctx, endings,\n"
               "label) or the 6-lines-per-item text form (context, label 0..3, four endings).\n"
               "  --input FILE        *.jsonl: jsonl; anything else: the text form (or --format)\n"
               "  --out FILE          the eval .bin to write\n"
               "  --format jsonl|text input format (default: from the file name)\n"
               "  --gpt2-dir DIR      encoder.json + vocab.bpe (default: data/gpt2, $SHARED_DATA/gpt2,\n"
               "                      ../shared/data/gpt2)\n"
               "  --tokenizer FILE    an llm.c tokenizer .bin instead\n"
               "  --threads N         encoding threads (default: all CPUs)\n"
               "  --limit N           only the first N items\n");
}

std::vector<std::string_view> split_lines(const std::string& text) {
    std::vector<std::string_view> lines;
    size_t p = 0;
    while (p < text.size()) {
        size_t nl = text.find('\n', p);
        if (nl == std::string::npos) nl = text.size();
        std::string_view l(text.data() + p, nl - p);
        if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
        lines.push_back(l);
        p = nl + 1;
    }
    return lines;
}

std::vector<Item> read_text_form(const std::string& path, const std::string& text) {
    auto lines = split_lines(text);
    while (!lines.empty() && lines.back().empty()) lines.pop_back();
    if (lines.empty()) fail(path + ": no items");
    if (lines.size() % 6 != 0)
        fail(path + ": " + std::to_string(lines.size()) +
             " lines, not a multiple of 6 (context, label, four endings per item)");
    std::vector<Item> items;
    for (size_t i = 0; i < lines.size(); i += 6) {
        Item it;
        it.ctx = std::string(lines[i]);
        std::string_view lab = lines[i + 1];
        if (lab.size() != 1 || lab[0] < '0' || lab[0] > '3')
            fail(path + ":" + std::to_string(i + 2) + ": label \"" + llmc::tok_detail::printable(lab) +
                 "\" is not 0..3");
        it.label = lab[0] - '0';
        for (int k = 0; k < 4; k++) it.endings.emplace_back(lines[i + 2 + k]);
        items.push_back(std::move(it));
    }
    return items;
}

std::vector<Item> read_jsonl(const std::string& path, const std::string& text) {
    auto lines = split_lines(text);
    std::vector<Item> items;
    for (size_t i = 0; i < lines.size(); i++) {
        if (lines[i].find_first_not_of(" \t") == std::string_view::npos) continue;
        auto where = [&] { return path + ":" + std::to_string(i + 1) + ": "; };
        nlohmann::json j;
        try {
            j = nlohmann::json::parse(lines[i]);
        } catch (const nlohmann::json::exception& e) {
            fail(where() + "invalid JSON: " + e.what());
        }
        if (!j.is_object()) fail(where() + "not a JSON object");
        Item it;
        auto ctx = j.find("ctx");
        if (ctx == j.end() || !ctx->is_string()) fail(where() + "no string field \"ctx\"");
        it.ctx = ctx->get<std::string>();
        auto lab = j.find("label");
        if (lab == j.end()) fail(where() + "no field \"label\"");
        if (lab->is_number_integer()) it.label = lab->get<int>();
        else if (lab->is_string() && lab->get<std::string>().size() == 1) it.label = lab->get<std::string>()[0] - '0';
        else fail(where() + "field \"label\" is not an integer");
        if (it.label < 0 || it.label > 3) fail(where() + "label " + std::to_string(it.label) + " is not 0..3");
        auto ends = j.find("endings");
        if (ends == j.end() || !ends->is_array() || ends->size() != 4)
            fail(where() + "field \"endings\" is not an array of 4 strings");
        for (const auto& e : *ends) {
            if (!e.is_string()) fail(where() + "field \"endings\" is not an array of 4 strings");
            it.endings.push_back(e.get<std::string>());
        }
        items.push_back(std::move(it));
    }
    if (items.empty()) fail(path + ": no items");
    return items;
}

int run(int argc, char** argv) {
    std::string input, out, format, gpt2_dir, tokenizer_bin;
    int threads = 0;
    long long limit = -1;
    for (int i = 1; i < argc; i++) {
        std::string a = argv[i];
        auto value = [&]() -> std::string {
            if (i + 1 >= argc) fail("option " + a + " needs a value");
            return argv[++i];
        };
        if (a == "-h" || a == "--help") {
            usage(stdout);
            return 0;
        } else if (a == "--input") input = value();
        else if (a == "--out" || a == "-o") out = value();
        else if (a == "--format") format = value();
        else if (a == "--gpt2-dir") gpt2_dir = value();
        else if (a == "--tokenizer") tokenizer_bin = value();
        else if (a == "--threads" || a == "--limit") {
            std::string v = value();
            char* end = nullptr;
            long long x = strtoll(v.c_str(), &end, 10);
            if (v.empty() || *end || x < 1 || x > (a == "--threads" ? 1024 : INT32_MAX))
                fail("option " + a + ": expected a positive integer, got \"" + v + "\"");
            if (a == "--threads") threads = (int)x;
            else limit = x;
        } else fail("unknown argument " + a + " (see --help)");
    }
    if (input.empty() || out.empty()) fail("--input and --out are required (see --help)");
    if (!format.empty() && format != "jsonl" && format != "text") fail("--format must be jsonl or text");
    if (threads <= 0) threads = (int)std::max(1u, std::thread::hardware_concurrency());
    bool jsonl = format == "jsonl" ||
                 (format.empty() && input.size() >= 6 && input.compare(input.size() - 6, 6, ".jsonl") == 0);

    const std::string text = llmc::tok_detail::read_whole_file(input);
    std::vector<Item> items = jsonl ? read_jsonl(input, text) : read_text_form(input, text);
    if (limit > 0 && (long long)items.size() > limit) items.resize((size_t)limit);

    llmc::Tokenizer tok;
    if (!tokenizer_bin.empty()) {
        tok.load_bin(tokenizer_bin);
    } else {
        if (gpt2_dir.empty()) gpt2_dir = llmc::find_gpt2_dir();
        if (gpt2_dir.empty()) fail(llmc::GPT2_DIR_NOT_FOUND);
        tok.load_gpt2(gpt2_dir + "/encoder.json", gpt2_dir + "/vocab.bpe");
    }
    if (tok.vocab_size() > 65535)
        fail("the eval format holds uint16 tokens; this vocabulary has " + std::to_string(tok.vocab_size()));

    // encode every context and " " + ending in one parallel batch
    std::vector<std::string> strs;
    for (const auto& it : items) {
        strs.push_back(it.ctx);
        for (const auto& e : it.endings) strs.push_back(" " + e);
    }
    std::vector<std::string_view> views(strs.begin(), strs.end());
    llmc::ParallelEncoder enc(tok, threads);
    auto ids = enc.encode_batch(views);

    std::vector<uint16_t> data;
    size_t longest = 0;
    for (size_t i = 0; i < items.size(); i++) {
        std::vector<uint16_t> ex = {65535, 0, (uint16_t)i, (uint16_t)items[i].label, 4};
        if (i > 65535) fail("more than 65,536 examples do not fit the uint16 example index");
        const auto& c = ids[i * 5];
        if (c.empty() || c.size() > 65535) fail(input + ": item " + std::to_string(i) + ": empty or huge context");
        ex.push_back((uint16_t)c.size());
        ex.insert(ex.end(), c.begin(), c.end());
        for (int k = 1; k <= 4; k++) {
            const auto& e = ids[i * 5 + k];
            ex.push_back((uint16_t)e.size());
            ex.insert(ex.end(), e.begin(), e.end());
        }
        size_t bytes = ex.size() * 2;
        if (bytes > 65535)
            fail(input + ": item " + std::to_string(i) + " is " + std::to_string(bytes) +
                 " bytes; the format holds at most 65,535");
        ex[1] = (uint16_t)bytes;
        longest = std::max(longest, bytes);
        data.insert(data.end(), ex.begin(), ex.end());
    }
    int32_t h[256] = {0};
    h[0] = 20240522;
    h[1] = 1;
    h[2] = (int32_t)items.size();
    h[3] = (int32_t)longest;

    std::string tmp = out + ".tmp." + std::to_string(getpid());
    std::string why;
    FILE* f = fopen_regular_file_for_writing(tmp.c_str(), O_WRONLY | O_TRUNC, &why);
    if (!f) fail(out + ": cannot create " + tmp + ": " + why);
    bool ok = fwrite(h, 1, sizeof h, f) == sizeof h;
    ok = ok && fwrite(data.data(), 2, data.size(), f) == data.size();
    ok = (fclose(f) == 0) && ok;
    if (!ok || rename(tmp.c_str(), out.c_str()) != 0) {
        int e = errno;
        remove(tmp.c_str());
        fail(out + ": write failed: " + strerror(e));
    }
    printf("hellaswag: %zu examples from %s -> %s (%zu bytes, longest example %zu bytes)\n", items.size(),
           input.c_str(), out.c_str(), sizeof h + data.size() * 2, longest);
    return 0;
}

}  // namespace

int main(int argc, char** argv) { return llmc::run_main(run, argc, argv); }
