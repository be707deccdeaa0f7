// Tests of build/host/hellaswag: llm.c's eval .bin from $SHARED_DATA/hellaswag_val_full.txt
// (structure, 10,042 examples, labels, lengths, tokens equal to the tokenizer's), the jsonl
// input giving the same file, and bad input (one `error:` line, no output file).
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <fstream>
#include <sstream>

#include "llmc/data/tokenizer.h"
#include "test/host/host_util.h"
#include "test/test_util.h"

static std::string g_tool;

struct Example {
    int index, label;
    std::vector<uint16_t> ctx;
    std::vector<std::vector<uint16_t>> endings;
};

// Parses and checks an eval file; *why says what is wrong.
static bool parse_eval(const std::string& d, std::vector<Example>* out, int* longest, std::string* why) {
    if (d.size() < 1024 || (d.size() - 1024) % 2) return *why = "size", false;
    int32_t h[256];
    memcpy(h, d.data(), 1024);
    if (h[0] != 20240522 || h[1] != 1) return *why = "header magic/version", false;
    std::vector<uint16_t> u((d.size() - 1024) / 2);
    memcpy(u.data(), d.data() + 1024, u.size() * 2);
    size_t p = 0;
    int max_bytes = 0;
    while (p < u.size()) {
        size_t start = p;
        auto need = [&](size_t n) { return p + n <= u.size(); };
        if (!need(6) || u[p] != 65535) return *why = "delimiter at " + std::to_string(p), false;
        Example ex;
        size_t bytes = u[p + 1];
        ex.index = u[p + 2];
        ex.label = u[p + 3];
        int nc = u[p + 4];
        size_t cl = u[p + 5];
        p += 6;
        if (nc != 4) return *why = "completions != 4", false;
        if (!need(cl)) return *why = "context overruns", false;
        ex.ctx.assign(u.begin() + p, u.begin() + p + cl);
        p += cl;
        for (int k = 0; k < nc; k++) {
            if (!need(1)) return *why = "ending overruns", false;
            size_t el = u[p++];
            if (!need(el) || el == 0) return *why = "ending length", false;
            ex.endings.emplace_back(u.begin() + p, u.begin() + p + el);
            p += el;
        }
        if ((p - start) * 2 != bytes) return *why = "example " + std::to_string(ex.index) + " length field", false;
        max_bytes = std::max(max_bytes, (int)bytes);
        out->push_back(std::move(ex));
    }
    if ((int)out->size() != h[2]) return *why = "example count", false;
    if (h[3] != max_bytes) return *why = "longest example", false;
    *longest = max_bytes;
    return true;
}

int main(int argc, char** argv) {
    const char* sd = getenv("SHARED_DATA");
    std::string shared = sd && *sd ? sd : "../shared/data";
    std::string self = argv[0], dir = self.find('/') == std::string::npos ? "." : self.substr(0, self.rfind('/'));
    for (const std::string& c : {dir + "/hellaswag", std::string("build/host/hellaswag")})
        if (exists(c)) {
            g_tool = c;
            break;
        }
    char tmpl[] = "/tmp/test_hellaswag.XXXXXX";
    if (!mkdtemp(tmpl)) {
        printf("FAIL cannot create a temporary directory\n");
        return test_summary("test_hellaswag_tool");
    }
    g_tmp = tmpl;
    std::string gpt2 = shared + "/gpt2", txt = shared + "/hellaswag_val_full.txt";
    if (g_tool.empty()) {
        printf("SKIP hellaswag tests: no hellaswag binary next to this test or in build/host\n");
    } else if (!exists(gpt2 + "/encoder.json")) {
        printf("SKIP hellaswag tests: %s/encoder.json absent (set SHARED_DATA)\n", gpt2.c_str());
    } else {
        std::string base = g_tool + " --gpt2-dir " + gpt2 + " ";
        auto tok = llmc::Tokenizer::from_gpt2_files(gpt2 + "/encoder.json", gpt2 + "/vocab.bpe");
        if (!exists(txt)) {
            printf("SKIP HellaSwag text form: %s absent\n", txt.c_str());
        } else {
            std::string out = g_tmp + "/hs.bin";
            Run r = run_cmd(base + "--input " + txt + " --out " + out);
            CHECK(r.code == 0, "hellaswag on the text form exits 0 (%s)", first_line(r.err).c_str());
            std::vector<Example> exs;
            int longest = 0;
            std::string why;
            bool ok = parse_eval(read_file(out), &exs, &longest, &why);
            CHECK(ok, "eval file structure: header, delimiters, per-example byte lengths, 4 endings (%s)", why.c_str());
            CHECK(exs.size() == 10042, "10,042 examples (%zu)", exs.size());
            bool idx = true, labels = true, toks = true;
            int counts[4] = {0};
            for (size_t i = 0; i < exs.size(); i++) {
                idx = idx && exs[i].index == (int)i;
                labels = labels && exs[i].label >= 0 && exs[i].label <= 3;
                if (exs[i].label >= 0 && exs[i].label <= 3) counts[exs[i].label]++;
                toks = toks && !exs[i].ctx.empty();
                for (auto& e : exs[i].endings)
                    for (auto t : e) toks = toks && t < 50257;
                for (auto t : exs[i].ctx) toks = toks && t < 50257;
            }
            CHECK(idx, "example indices 0..N-1 in order");
            CHECK(labels, "labels in 0..3 (counts %d %d %d %d)", counts[0], counts[1], counts[2], counts[3]);
            CHECK(toks, "contexts non-empty, every token < 50257");
            CHECK(longest > 0 && longest < 65536, "longest example %d bytes, in the header", longest);
            // the first and last items against the tokenizer: context as is, endings as " " + ending
            std::string text = read_file(txt);
            std::vector<std::string> lines;
            std::stringstream ss(text);
            for (std::string l; std::getline(ss, l);) lines.push_back(l);
            bool same = lines.size() == 6 * exs.size();
            for (size_t i : {(size_t)0, (size_t)1, exs.size() - 1}) {
                if (!same) break;
                const Example& ex = exs[i];
                auto c = tok.encode(lines[6 * i]);
                same = same && std::vector<uint16_t>(c.begin(), c.end()) == ex.ctx &&
                       ex.label == std::stoi(lines[6 * i + 1]);
                for (int k = 0; k < 4; k++) {
                    auto e = tok.encode(" " + lines[6 * i + 2 + k]);
                    same = same && std::vector<uint16_t>(e.begin(), e.end()) == ex.endings[k];
                }
            }
            CHECK(same,
                  "items 0, 1 and the last: context tokens = encode(ctx), ending tokens = encode(\" \" + ending)");
            CHECK(exs.size() > 0 && exs[0].label == 3 && exs[0].ctx.size() == 15,
                  "item 0 (\"Roof shingle removal: ...\"): label 3, 15 context tokens");

            // the same first 50 items as jsonl -> a byte-identical file
            std::string jl;
            for (size_t i = 0; i < 50 && 6 * i + 5 < lines.size(); i++) {
                nlohmann::json o;
                o["ctx"] = lines[6 * i];
                o["label"] = std::stoi(lines[6 * i + 1]);
                o["endings"] = {lines[6 * i + 2], lines[6 * i + 3], lines[6 * i + 4], lines[6 * i + 5]};
                o["ind"] = i;
                jl += o.dump() + "\n";
            }
            write_file(g_tmp + "/hs50.jsonl", jl);
            Run a = run_cmd(base + "--input " + g_tmp + "/hs50.jsonl --out " + g_tmp + "/a.bin --threads 1");
            Run b = run_cmd(base + "--input " + txt + " --limit 50 --out " + g_tmp + "/b.bin --threads 2");
            std::string fa = read_file(g_tmp + "/a.bin"), fb = read_file(g_tmp + "/b.bin");
            CHECK(a.code == 0 && b.code == 0 && !fa.empty() && fa == fb,
                  "jsonl input (50 items, 1 thread) == text form --limit 50 (2 threads), byte for byte (%zu B)",
                  fa.size());
        }

        // bad input
        std::string t = g_tmp + "/bad";
        mkdir(t.c_str(), 0755);
        std::string o = " --out " + t + "/out.bin";
        auto no_out = [&] { return !exists(t + "/out.bin"); };
        write_file(t + "/label.txt", "ctx\n7\na\nb\nc\nd\n");
        Run r = run_cmd(base + "--input " + t + "/label.txt" + o);
        CHECK(is_clean_error(r, {"label.txt:2", "not 0..3"}) && no_out(), "text form, label 7: %s",
              first_line(r.err).c_str());
        write_file(t + "/short.txt", "ctx\n1\na\nb\nc\nd\nctx2\n2\n");
        r = run_cmd(base + "--input " + t + "/short.txt" + o);
        CHECK(is_clean_error(r, {"short.txt", "multiple of 6"}) && no_out(), "text form, truncated item: %s",
              first_line(r.err).c_str());
        write_file(t + "/empty.txt", "");
        r = run_cmd(base + "--input " + t + "/empty.txt" + o);
        CHECK(is_clean_error(r, {"empty.txt", "no items"}) && no_out(), "empty input: %s", first_line(r.err).c_str());
        write_file(t + "/noend.jsonl", "{\"ctx\": \"a\", \"label\": 1, \"endings\": [\"x\", \"y\", \"z\"]}\n");
        r = run_cmd(base + "--input " + t + "/noend.jsonl" + o);
        CHECK(is_clean_error(r, {"noend.jsonl:1", "endings"}) && no_out(), "jsonl with 3 endings: %s",
              first_line(r.err).c_str());
        write_file(t + "/broken.jsonl",
                   "{\"ctx\": \"a\", \"label\": 1, \"endings\": [\"w\", \"x\", \"y\", \"z\"]}\n{\"ctx\": \n");
        r = run_cmd(base + "--input " + t + "/broken.jsonl" + o);
        CHECK(is_clean_error(r, {"broken.jsonl:2", "invalid JSON"}) && no_out(), "broken jsonl line: %s",
              first_line(r.err).c_str());
        write_file(t + "/noctx.jsonl", "{\"label\": 1, \"endings\": [\"w\", \"x\", \"y\", \"z\"]}\n");
        r = run_cmd(base + "--input " + t + "/noctx.jsonl" + o);
        CHECK(is_clean_error(r, {"noctx.jsonl:1", "ctx"}) && no_out(), "jsonl without ctx: %s",
              first_line(r.err).c_str());
        r = run_cmd(base + "--input " + t + "/missing.jsonl" + o);
        CHECK(is_clean_error(r, {"missing.jsonl", "cannot open"}) && no_out(), "missing input: %s",
              first_line(r.err).c_str());
        write_file(t + "/ok.txt", "ctx\n1\na\nb\nc\nd\n");
        r = run_cmd(base + "--input " + t + "/ok.txt --out /nonexistent_dir_xyz/out.bin");
        CHECK(is_clean_error(r, {"/nonexistent_dir_xyz/out.bin", "cannot create"}), "unwritable output: %s",
              first_line(r.err).c_str());
        r = run_cmd(base + "--input " + t + "/ok.txt" + o);
        std::vector<Example> exs;
        int longest;
        std::string why;
        CHECK(r.code == 0 && parse_eval(read_file(t + "/out.bin"), &exs, &longest, &why) && exs.size() == 1 &&
                  exs[0].label == 1,
              "a one-item file works (%s)", first_line(r.err).c_str());
    }
    run_cmd("rm -rf " + g_tmp);
    return test_summary("test_hellaswag_tool");
}
