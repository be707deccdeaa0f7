// Tests of llmc/data/tokenizer.h and build/host/prepro: GPT-2 ids against tiktoken (committed
// cases from dev/make_tokenizer_cases.py), llm.c's tinyshakespeare numbers, round trips,
// the tokenizer .bin, thread-count independence, and bad input (one `error:` line, no crash);
// tiktoken ranks files with Llama 3's pattern and specials against tiktoken (the committed
// test ranks test/data/tiktoken_test.ranks, and GPT-2's ranks rewritten in that format).
// Real data comes from $SHARED_DATA (default ../shared/data); cases needing it SKIP without it.
// TOKENIZER_SWEEPS=N (the sanitizer build in make test): only the first N of the sweeps over
// every code point, per vocabulary; the plain build runs them all.
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <random>
#include <sstream>

#include "llmc/data/dataloader.h"
#include "llmc/data/tokenizer.h"
#include "test/host/sha256.h"
#include "test/host/host_util.h"
#include "test/test_util.h"

using llmc::Tokenizer;

static std::string g_shared, g_prepro, g_tokenizer_cases, g_llama3_cases, g_test_ranks;

static std::string from_hex(const std::string& h) {
    std::string out;
    for (size_t i = 0; i + 1 < h.size(); i += 2) out += (char)std::stoi(h.substr(i, 2), nullptr, 16);
    return out;
}
static std::string sha_u16(const std::vector<int>& ids, size_t b, size_t e) {
    std::vector<uint16_t> v(ids.begin() + b, ids.begin() + e);
    return sha256_hex(v.data(), v.size() * 2);
}
static std::string sha_u32(const std::vector<int>& ids) {
    std::vector<uint32_t> v(ids.begin(), ids.end());
    return sha256_hex(v.data(), v.size() * 4);
}
static std::string ids_str(const std::vector<int>& ids, size_t max = 24) {
    std::string s = "[";
    for (size_t i = 0; i < ids.size() && i < max; i++) s += (i ? ", " : "") + std::to_string(ids[i]);
    if (ids.size() > max) s += ", ...";
    return s + "]";
}
static double seconds_since(std::chrono::steady_clock::time_point t0) {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

static std::vector<int> read_shard(const std::string& path, int* magic = nullptr) {
    std::string d = read_file(path);
    std::vector<int> ids;
    if (d.size() < 1024) return ids;
    int32_t h[256];
    memcpy(h, d.data(), 1024);
    if (magic) *magic = h[0];
    size_t w = h[0] == 20240801 ? 4 : 2;
    for (size_t p = 1024; p + w <= d.size(); p += w) {
        uint32_t v = 0;
        memcpy(&v, d.data() + p, w);
        ids.push_back((int)v);
    }
    return ids;
}

// A prepro shard as llm.c writes it: its run slots (header[248..252], which must be set)
// zeroed; "" when they are not set.
static std::string llmc_bytes(std::string shard) {
    int32_t h[DATALOADER_HEADER_INTS];
    if (shard.size() < sizeof h) return "";
    memcpy(h, shard.data(), sizeof h);
    if (h[DATALOADER_RUN_SLOT] != DATALOADER_RUN_MARKER ||
        (h[DATALOADER_RUN_SLOT + 1] | h[DATALOADER_RUN_SLOT + 2]) == 0)
        return "";
    memset(&shard[DATALOADER_RUN_SLOT * 4], 0, 5 * 4);
    return shard;
}

// --- (a) spot checks and the llm.c tinyshakespeare recipe ----------------------------------
static void test_spot_checks(const Tokenizer& tok) {
    auto a = tok.encode("Hello world");
    CHECK(a == std::vector<int>({15496, 995}), "spot check: \"Hello world\" -> %s", ids_str(a).c_str());
    auto b = tok.encode("hello <|endoftext|>", true);
    CHECK(b == std::vector<int>({31373, 220, 50256}), "spot check: \"hello \" + EOT (allowed) -> %s",
          ids_str(b).c_str());
    auto c = tok.encode("<|endoftext|>", false);
    CHECK(c.size() > 1 && std::find(c.begin(), c.end(), 50256) == c.end() && tok.decode(c) == "<|endoftext|>",
          "\"<|endoftext|>\" without allow_special is ordinary text: %s", ids_str(c).c_str());
    CHECK(tok.vocab_size() == 50257 && tok.eot_token() == 50256, "GPT-2 vocabulary: 50257 tokens, EOT 50256");
}

static std::vector<std::string_view> recipe_sections(std::string_view text) {
    std::vector<std::string_view> docs;
    size_t start = 0;
    for (size_t p; (p = text.find("\n\n", start)) != std::string_view::npos; start = p + 2)
        docs.push_back(text.substr(start, p + 2 - start));
    docs.push_back(text.substr(start));
    return docs;
}

static const char* kValSha = "d5ad4a9d91976783859c221697e3e0488675d095f676fe3fedac339caa4c193a";
static const char* kTrainSha = "25f64f50080b1237d8d70e36d9ae43ca00855bbb7d5dcac6118c3cb75eeb7b2f";
static const char* kValFileSha = "fe99db720dc7c83e694806d4e047a952909411da1daccde4ccc2e55f40882a62";
static const char* kTrainFileSha = "8a70606be574040c26d225694f5f9759973b419852d22f7fe5c118e1b359dcc8";

static void test_shakespeare(const Tokenizer& tok, const std::string& text) {
    auto docs = recipe_sections(text);
    std::vector<int> ids;
    {
        llmc::ParallelEncoder enc(tok, 1);
        enc.encode_documents(docs, true, false, &ids);
    }
    CHECK(ids.size() == 338028, "tinyshakespeare (llm.c recipe): %zu tokens (expected 338,028)", ids.size());
    std::vector<int> first = {50256, 5962, 22307, 25,   198, 8421, 356,   5120, 597, 2252,
                              11,    3285, 502,   2740, 13,  628,  50256, 3237, 25,  198};
    CHECK(ids.size() >= 20 && std::vector<int>(ids.begin(), ids.begin() + 20) == first,
          "tinyshakespeare first 20 tokens: %s", ids_str(ids, 20).c_str());
    if (ids.size() == 338028) {
        std::string v = sha_u16(ids, 0, 32768), t = sha_u16(ids, 32768, ids.size());
        CHECK(v == kValSha, "tinyshakespeare val stream (32,768 tokens) sha256 %s", v.c_str());
        CHECK(t == kTrainSha, "tinyshakespeare train stream (305,260 tokens) sha256 %s", t.c_str());
    }
    for (int threads : {2, 3, 8}) {
        llmc::ParallelEncoder enc(tok, threads);
        std::vector<int> p;
        enc.encode_documents(docs, true, false, &p);
        CHECK(p == ids, "tinyshakespeare recipe on %d threads: the same %zu tokens", threads, p.size());
    }
    // one document: split into chunks at safe points, still equal to the one-piece encode
    auto whole = tok.encode(text);
    llmc::ParallelEncoder enc2(tok, 2);
    auto batch = enc2.encode_batch({text, "", "Hello world"});
    CHECK(batch.size() == 3 && batch[0] == whole && batch[1].empty() && batch[2] == std::vector<int>({15496, 995}),
          "encode_batch on 2 threads (tinyshakespeare as one document, split into %zu-byte chunks) = encode",
          llmc::ParallelEncoder::kChunkBytes);
    CHECK(tok.decode(whole) == text, "tinyshakespeare round trip: decode(encode(x)) == x (%zu tokens)", whole.size());
    CHECK(
        tok.decode(ids) ==
            [&] {
                std::string s;
                for (auto d : docs) s += "<|endoftext|>" + std::string(d);
                return s;
            }(),
        "tinyshakespeare recipe stream decodes to the sections, each after <|endoftext|>");
}

static void test_prepro_shakespeare(const std::string& path) {
    if (g_prepro.empty()) {
        printf("SKIP prepro on tinyshakespeare: no prepro binary next to this test or in build/host\n");
        return;
    }
    for (int threads : {1, 2}) {
        std::string prefix = g_tmp + "/ts" + std::to_string(threads) + "/tiny";
        mkdir((g_tmp + "/ts" + std::to_string(threads)).c_str(), 0755);
        Run r = run_cmd(g_prepro + " --out " + prefix + " --split-on-blank-lines --val-tokens 32768 --threads " +
                        std::to_string(threads) + " --gpt2-dir " + g_shared + "/gpt2 " + path);
        CHECK(r.code == 0, "prepro tinyshakespeare --threads %d exits 0 (%s)", threads, first_line(r.err).c_str());
        std::string val = read_file(prefix + "_val_000000.bin"), train = read_file(prefix + "_train_000001.bin");
        val = llmc_bytes(val);
        train = llmc_bytes(train);
        CHECK(val.size() == 66560 && sha256_hex(val) == kValFileSha,
              "prepro --threads %d: val shard %zu B, sha256 %s with its run slots zeroed (llm.c's)", threads,
              val.size(), sha256_hex(val).c_str());
        CHECK(train.size() == 611544 && sha256_hex(train) == kTrainFileSha,
              "prepro --threads %d: train shard %zu B, sha256 %s with its run slots zeroed (llm.c's)", threads,
              train.size(), sha256_hex(train).c_str());
        CHECK(!exists(prefix + "_train_000002.bin"), "prepro --threads %d: exactly two shards", threads);
    }
}

// --- (b) committed cases from tiktoken -----------------------------------------------------
static void test_cases(const Tokenizer& tok, const nlohmann::json& cases, const char* label, const char* key = "ids") {
    int n = 0;
    for (const auto& c : cases["cases"]) {
        std::string name = c["name"], data = from_hex(c["hex"]);
        bool special = c["allow_special"];
        std::vector<int> want = c[key].get<std::vector<int>>(), got = tok.encode(data, special);
        std::string back = tok.decode(got);
        CHECK(got == want && back == data, "%s: case \"%s\" (%zu bytes): %zu ids%s%s", label, name.c_str(), data.size(),
              got.size(), got == want ? "" : (" got " + ids_str(got) + " want " + ids_str(want)).c_str(),
              back == data ? ", round trip" : ", ROUND TRIP DIFFERS");
        if (c.contains("pieces") && !special) {  // the pre-tokenisation itself (the reference split)
            std::vector<int> lens;
            for (auto p : tok.pretokenize(data)) lens.push_back((int)p.size());
            CHECK(lens == c["pieces"].get<std::vector<int>>(), "%s: case \"%s\": pieces of %s bytes", label,
                  name.c_str(), ids_str(lens).c_str());
        }
        n++;
    }
    CHECK(n >= 40, "%s: %d committed cases", label, n);
}

static std::string sweep_text(const std::string& context) {
    std::string out;
    out.reserve(context.size() * 5 * 0x110000 / 2);
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        char u[4];
        size_t n;
        if (cp < 0x80) {
            u[0] = (char)cp;
            n = 1;
        } else if (cp < 0x800) {
            u[0] = (char)(0xC0 | cp >> 6);
            u[1] = (char)(0x80 | (cp & 63));
            n = 2;
        } else if (cp < 0x10000) {
            u[0] = (char)(0xE0 | cp >> 12);
            u[1] = (char)(0x80 | ((cp >> 6) & 63));
            u[2] = (char)(0x80 | (cp & 63));
            n = 3;
        } else {
            u[0] = (char)(0xF0 | cp >> 18);
            u[1] = (char)(0x80 | ((cp >> 12) & 63));
            u[2] = (char)(0x80 | ((cp >> 6) & 63));
            u[3] = (char)(0x80 | (cp & 63));
            n = 4;
        }
        for (char ch : context) {
            if (ch == 'C') out.append(u, n);
            else out += ch;
        }
    }
    return out;
}

static void test_sweeps(const Tokenizer& tok, const nlohmann::json& cases, const char* label = "") {
    llmc::ParallelEncoder enc(tok, 2);
    const char* limit = getenv("TOKENIZER_SWEEPS");
    const size_t wanted = limit && *limit ? strtoul(limit, nullptr, 10) : cases["sweeps"].size();
    size_t done = 0;
    for (const auto& s : cases["sweeps"]) {
        std::string name = s["name"];
        if (done++ >= wanted) {
            printf("SKIP %ssweep %s: TOKENIZER_SWEEPS=%zu\n", label, name.c_str(), wanted);
            continue;
        }
        std::string text = sweep_text(s["context"]);
        auto t0 = std::chrono::steady_clock::now();
        auto ids = enc.encode_batch({text})[0];
        std::string sha = sha_u32(ids);
        CHECK(text.size() == s["bytes"].get<size_t>() && ids.size() == s["count"].get<size_t>() &&
                  sha == s["sha256"].get<std::string>(),
              "%ssweep %s: %zu bytes -> %zu ids, sha256 %.16s... as tiktoken (%.1f s)", label, name.c_str(),
              text.size(), ids.size(), sha.c_str(), seconds_since(t0));
        auto pieces = tok.pretokenize(text);
        std::vector<int> lens;
        for (auto p : pieces) lens.push_back((int)p.size());
        std::string psha = sha_u32(lens);
        CHECK(pieces.size() == s["pieces"].get<size_t>() && psha == s["pieces_sha256"].get<std::string>(),
              "%ssweep %s: pre-tokenisation into %zu pieces as the reference split (tiktoken's classes)", label,
              name.c_str(), pieces.size());
        CHECK(tok.decode(ids) == text, "%ssweep %s: round trip", label, name.c_str());
    }
}

// The letter/number/space class of every code point, against the classes tiktoken's own
// engine gives (committed by dev/make_tokenizer_cases.py; Unicode 16.0.0).
static void test_classes(const nlohmann::json& cases) {
    using namespace llmc::tok_detail;
    if (!cases.contains("classes")) {
        printf("FAIL %s has no \"classes\" (regenerate with dev/make_tokenizer_cases.py)\n", g_tokenizer_cases.c_str());
        g_tally.failed++;
        return;
    }
    std::vector<uint8_t> want(0x110000, kOther);
    for (auto [name, cls] :
         {std::pair<const char*, uint8_t>{"letter", kLetter}, {"number", kNumber}, {"space", kSpace}})
        for (const auto& r : cases["classes"][name])
            for (uint32_t cp = r[0]; cp <= r[1].get<uint32_t>(); cp++) want[cp] = cls;
    const ClassTable& table = class_table();
    long differ = 0, first = -1;
    for (uint32_t cp = 0; cp < 0x110000; cp++) {
        if (cp >= 0xD800 && cp <= 0xDFFF) continue;
        if (table.get(cp) != want[cp]) {
            if (first < 0) first = cp;
            differ++;
        }
    }
    CHECK(differ == 0,
          "letter/number/space class of all 1,112,064 scalar values as tiktoken's engine "
          "(%ld differ; first U+%04lX)",
          differ, first < 0 ? 0 : first);
}

// Unicode 17 made U+088F a letter; tiktoken's Unicode 16 does not, so the apostrophe joins it
// (the tables were Unicode 17's once, and 4,657 code points differed).
static void test_unicode_version_regression(const Tokenizer& tok) {
    auto ids = tok.encode("\xe0\xa2\x8f's");
    CHECK(ids == std::vector<int>({156, 95, 237, 6, 82}), "U+088F then 's -> %s (tiktoken: [156, 95, 237, 6, 82])",
          ids_str(ids).c_str());
}

// --- BPE internals ---------------------------------------------------------------------------
static void test_bpe_properties(const Tokenizer& tok, const char* label) {
    // every token, BPE'd without the whole-piece shortcut, is itself (so the shortcut
    // tiktoken takes never changes a result)
    int bad = -1, count = 0;
    const auto& specials = tok.special_tokens();
    for (int id = 0; id < tok.vocab_size(); id++) {
        if (std::find(specials.begin(), specials.end(), id) != specials.end()) continue;
        std::vector<int> out;
        tok.bpe(tok.token_bytes(id), &out, false);
        if (out.size() != 1 || out[0] != id) {
            if (bad < 0) bad = id;
            count++;
        }
    }
    CHECK(count == 0, "%s: every token BPE-merges to itself without the whole-piece lookup (%d do not; first %d)",
          label, count, bad);
    // heap and bucket merges (long pieces) == the quadratic merge, on random pieces
    std::mt19937 rng(1234);
    int mismatches = 0, total = 0;
    const char* alphabets[] = {"abcdefghijklmnopqrstuvwxyz", "aaaaaab", "eeeeettttthhhh  ", "=-._", "0123456789"};
    for (int trial = 0; trial < 300; trial++) {
        const char* al = alphabets[trial % 5];
        size_t alen = strlen(al), n = 2 + rng() % 700;
        std::string piece;
        for (size_t i = 0; i < n; i++) piece += al[rng() % alen];
        std::vector<int> a, b, c;
        tok.bpe(piece, &a, false, 1 << 20, 1 << 20);  // quadratic
        tok.bpe(piece, &b, false, 0, 1 << 20);        // heap
        tok.bpe(piece, &c, false, 0, 0);              // buckets
        total++;
        if (a != b || a != c) mismatches++;
    }
    CHECK(mismatches == 0, "%s: heap BPE == bucket BPE == quadratic BPE on %d random pieces of 2..701 bytes", label,
          total);
}

static void test_bin_roundtrip(const Tokenizer& tok, const std::string& shakespeare, const nlohmann::json* cases) {
    std::string path = g_tmp + "/gpt2_tokenizer.bin";
    std::string err = error_of([&] { tok.save_bin(path); });
    CHECK(err == "NO ERROR", "save_bin writes %s (%s)", path.c_str(), err.c_str());
    std::string d = read_file(path);
    int32_t h[4] = {0};
    if (d.size() >= 16) memcpy(h, d.data(), 16);
    CHECK(h[0] == 20240328 && h[1] == 2 && h[2] == 50257 && h[3] == 50256,
          "tokenizer .bin header: magic %d, version %d, vocab %d, EOT %d", h[0], h[1], h[2], h[3]);
    Tokenizer t2;
    err = error_of([&] { t2.load_bin(path); });
    bool same = err == "NO ERROR" && t2.vocab_size() == tok.vocab_size() && t2.eot_token() == tok.eot_token();
    for (int i = 0; same && i < tok.vocab_size(); i++) same = t2.token_bytes(i) == tok.token_bytes(i);
    CHECK(same && t2.can_encode(), "load_bin gives back the same %d tokens and EOT (%s)", t2.vocab_size(), err.c_str());
    if (!same) return;
    if (!shakespeare.empty()) {
        auto a = tok.encode(shakespeare), b = t2.encode(shakespeare);
        CHECK(a == b, "tokenizer from .bin (tiktoken merge rule) encodes tinyshakespeare identically (%zu ids)",
              b.size());
    }
    if (cases) {
        test_cases(t2, *cases, "from .bin");
        test_bpe_properties(t2, "from .bin");
    }
    std::string again = g_tmp + "/again.bin";
    t2.save_bin(again);
    CHECK(read_file(again) == d, "save_bin(load_bin(x)) is byte-identical");
}

// --- (d) bad input --------------------------------------------------------------------------
static void test_library_errors(const std::string& gpt2) {
    std::string enc = gpt2 + "/encoder.json", bpe = gpt2 + "/vocab.bpe";
    std::string t = g_tmp + "/bad";
    mkdir(t.c_str(), 0755);
    Tokenizer tok;
    std::string e;

    e = error_of([&] { tok.load_gpt2(t + "/missing.json", bpe); });
    CHECK(contains_all(e, {"missing.json", "cannot open"}), "missing encoder.json: %s", e.c_str());
    write_file(t + "/garbage.json", "this is { not json");
    e = error_of([&] { tok.load_gpt2(t + "/garbage.json", bpe); });
    CHECK(contains_all(e, {"garbage.json", "invalid JSON"}), "garbage encoder.json: %s", e.c_str());
    write_file(t + "/array.json", "[1, 2, 3]");
    e = error_of([&] { tok.load_gpt2(t + "/array.json", bpe); });
    CHECK(contains_all(e, {"array.json", "JSON object"}), "encoder.json not an object: %s", e.c_str());
    write_file(t + "/empty.json", "");
    e = error_of([&] { tok.load_gpt2(t + "/empty.json", bpe); });
    CHECK(contains_all(e, {"empty.json", "invalid JSON"}), "empty encoder.json: %s", e.c_str());

    if (!exists(enc)) {
        printf("SKIP encoder.json/vocab.bpe edits: %s absent\n", enc.c_str());
    } else {
        nlohmann::json j = nlohmann::json::parse(read_file(enc));
        {
            auto k = j;
            k.erase("<|endoftext|>");
            write_file(t + "/noeot.json", k.dump());
            e = error_of([&] { tok.load_gpt2(t + "/noeot.json", bpe); });
            CHECK(contains_all(e, {"noeot.json", "<|endoftext|>"}), "encoder.json without <|endoftext|>: %s",
                  e.c_str());
        }
        {
            auto k = j;
            k.erase("\u0120the");  // "Ġthe": id 262 missing, ids no longer 0..N-1
            write_file(t + "/gap.json", k.dump());
            e = error_of([&] { tok.load_gpt2(t + "/gap.json", bpe); });
            CHECK(contains_all(e, {"gap.json", "outside"}), "encoder.json with a missing entry (id gap): %s",
                  e.c_str());
        }
        {
            auto k = j;
            k["\u0120the"] = "262";
            write_file(t + "/strid.json", k.dump());
            e = error_of([&] { tok.load_gpt2(t + "/strid.json", bpe); });
            CHECK(contains_all(e, {"strid.json", "not an integer"}), "encoder.json with a string id: %s", e.c_str());
        }
        {
            auto k = j;
            k["\u0120the"] = 263;  // duplicate id
            write_file(t + "/dup.json", k.dump());
            e = error_of([&] { tok.load_gpt2(t + "/dup.json", bpe); });
            CHECK(contains_all(e, {"dup.json", "twice"}), "encoder.json with a duplicate id: %s", e.c_str());
        }
        {
            // a token renamed to a string that is not GPT-2 byte symbols (a space is not one)
            auto k = j;
            int id = k["\u0120the"];
            k.erase("\u0120the");
            k[" the"] = id;
            write_file(t + "/sym.json", k.dump());
            e = error_of([&] { tok.load_gpt2(t + "/sym.json", bpe); });
            CHECK(contains_all(e, {"sym.json", "byte symbols"}), "encoder.json key with a raw space: %s", e.c_str());
        }
        {
            // the merge "Ġt he" -> "Ġthe" now gives a token encoder.json lacks
            auto k = j;
            int id = k["\u0120the"];
            k.erase("\u0120the");
            k["\u0120thf\u0120"] = id;
            write_file(t + "/renamed.json", k.dump());
            e = error_of([&] { tok.load_gpt2(t + "/renamed.json", bpe); });
            CHECK(contains_all(e, {"vocab.bpe:", "not a token of"}), "merge whose result encoder.json lacks: %s",
                  e.c_str());
        }
        write_file(t + "/garbage.bpe", "#version: 0.2\nh e\nthis line has three\n");
        e = error_of([&] { tok.load_gpt2(enc, t + "/garbage.bpe"); });
        CHECK(contains_all(e, {"garbage.bpe:3", "two symbols"}), "vocab.bpe with a 3-symbol line: %s", e.c_str());
        write_file(t + "/binary.bpe", std::string("\x00\xff\xfe garbage\x01\x02", 13));
        e = error_of([&] { tok.load_gpt2(enc, t + "/binary.bpe"); });
        CHECK(contains_all(e, {"binary.bpe:1"}), "binary garbage vocab.bpe: %s", e.c_str());
        write_file(t + "/unknown.bpe", "#version: 0.2\nzzzzqqq xyzzy\n");
        e = error_of([&] { tok.load_gpt2(enc, t + "/unknown.bpe"); });
        CHECK(contains_all(e, {"unknown.bpe:2", "not a token"}), "vocab.bpe merge of unknown symbols: %s", e.c_str());
        write_file(t + "/empty.bpe", "#version: 0.2\n");
        e = error_of([&] { tok.load_gpt2(enc, t + "/empty.bpe"); });
        CHECK(contains_all(e, {"empty.bpe", "no merges"}), "vocab.bpe without merges: %s", e.c_str());
        e = error_of([&] { tok.load_gpt2(enc, t + "/missing.bpe"); });
        CHECK(contains_all(e, {"missing.bpe", "cannot open"}), "missing vocab.bpe: %s", e.c_str());
    }

    // tokenizer .bin
    auto bin = [&](int magic, int version, int V, int eot, const std::string& body) {
        std::string d(1024, '\0');
        int32_t h[256] = {0};
        h[0] = magic;
        h[1] = version;
        h[2] = V;
        h[3] = eot;
        memcpy(&d[0], h, 1024);
        return d + body;
    };
    std::string body;
    for (int i = 0; i < 300; i++) {
        std::string tk = i < 256 ? std::string(1, (char)i) : "tok" + std::to_string(i);
        body += (char)tk.size();
        body += tk;
    }
    write_file(t + "/ok.bin", bin(20240328, 2, 300, 299, body));
    e = error_of([&] { tok.load_bin(t + "/ok.bin"); });
    CHECK(e == "NO ERROR" && tok.vocab_size() == 300 && tok.eot_token() == 299 &&
              tok.decode({104, 105, 299}) == "hitok299",
          "a small valid tokenizer .bin loads (%s)", e.c_str());
    std::vector<std::pair<std::string, std::pair<std::string, std::vector<std::string>>>> bcs = {
        {"empty file", {"", {"truncated header"}}},
        {"truncated header", {bin(20240328, 2, 300, 299, "").substr(0, 500), {"truncated header"}}},
        {"garbage", {std::string(2000, 'x'), {"bad magic"}}},
        {"wrong magic (a data shard)", {bin(20240520, 1, 300, 299, body), {"bad magic 20240520"}}},
        {"wrong version", {bin(20240328, 3, 300, 299, body), {"unsupported version 3"}}},
        {"EOT outside the vocabulary", {bin(20240328, 2, 300, 300, body), {"EOT id 300"}}},
        {"negative vocabulary size", {bin(20240328, 2, -5, 0, body), {"vocabulary size"}}},
        {"truncated in the tokens", {bin(20240328, 2, 300, 299, body).substr(0, 1024 + 700), {"truncated at token"}}},
        {"more tokens than the file holds", {bin(20240328, 2, 400, 299, body), {"truncated at token 300 of 400"}}},
        {"zero-length token", {bin(20240328, 2, 300, 299, std::string(1, '\0') + body), {"length 0"}}},
        {"trailing bytes", {bin(20240328, 2, 300, 299, body + "zz"), {"2 bytes after the last token"}}},
    };
    for (auto& bc : bcs) {
        write_file(t + "/bad.bin", bc.second.first);
        e = error_of([&] { tok.load_bin(t + "/bad.bin"); });
        bool ok = e.find(t + "/bad.bin: ") == 0 && e.find('\n') == std::string::npos;
        for (auto& n : bc.second.second) ok = ok && e.find(n) != std::string::npos;
        CHECK(ok, "tokenizer .bin, %s: %s", bc.first.c_str(), e.c_str());
    }
    e = error_of([&] { tok.load_bin(t + "/nope.bin"); });
    CHECK(contains_all(e, {"nope.bin", "cannot open"}), "missing tokenizer .bin: %s", e.c_str());
    // decode-only vocabulary (no single-byte tokens): encode is an error, decode works
    std::string body2;
    for (int i = 0; i < 300; i++) {
        std::string tk = "w" + std::to_string(i);
        body2 += (char)tk.size();
        body2 += tk;
    }
    write_file(t + "/words.bin", bin(20240328, 2, 300, 0, body2));
    e = error_of([&] { tok.load_bin(t + "/words.bin"); });
    std::string e2 = error_of([&] { tok.encode("abc"); });
    CHECK(e == "NO ERROR" && !tok.can_encode() && tok.decode({5, 6}) == "w5w6" &&
              contains_all(e2, {"words.bin", "only decode"}),
          "vocabulary without byte tokens: decodes, encode says: %s", e2.c_str());
    Tokenizer empty;
    e = error_of([&] { empty.encode("abc"); });
    CHECK(contains_all(e, {"nothing loaded"}), "encode before loading: %s", e.c_str());
    std::string out;
    CHECK(!tok.decode(std::vector<int>{1, 300}.data(), 2, &out) && out == "w1" &&
              !tok.decode(std::vector<int>{-1}.data(), 1, &out),
          "decode of an id outside the vocabulary returns false");
}

static void test_tool_errors(const Tokenizer& tok) {
    if (g_prepro.empty()) {
        printf("SKIP prepro bad-input cases: no prepro binary\n");
        return;
    }
    std::string d = g_tmp + "/tool";
    mkdir(d.c_str(), 0755);
    std::string base = g_prepro + " --gpt2-dir " + g_shared + "/gpt2 --out " + d + "/o ";
    auto no_output = [&] {
        Run r = run_cmd("ls " + d + " | grep '^o_' | wc -l");
        return r.out == "0\n";
    };
    Run r;
    r = run_cmd(base + d + "/missing.txt");
    CHECK(is_clean_error(r, {"missing.txt", "no such file"}) && no_output(), "prepro, missing input: %s",
          first_line(r.err).c_str());
    for (const char* format : {"text", "jsonl"}) {  // (a plain open of a FIFO would wait for a writer forever)
        mkfifo((d + "/fifo").c_str(), 0644);
        r = run_cmd(base + "--format " + format + " " + d + "/fifo");
        CHECK(is_clean_error(r, {"fifo", "not a regular file"}) && no_output(),
              "prepro, a FIFO as --format %s input: %s", format, first_line(r.err).c_str());
        unlink((d + "/fifo").c_str());
    }
    write_file(d + "/empty.txt", "");
    r = run_cmd(base + d + "/empty.txt");
    CHECK(is_clean_error(r, {"no documents", "empty.txt is empty"}) && no_output(), "prepro, empty input file: %s",
          first_line(r.err).c_str());
    write_file(d + "/empty.jsonl", "");
    r = run_cmd(base + d + "/empty.jsonl");
    CHECK(is_clean_error(r, {"no documents"}) && no_output(), "prepro, empty JSONL: %s", first_line(r.err).c_str());
    write_file(d + "/nofield.jsonl", "{\"text\": \"a\"}\n{\"body\": \"b\"}\n");
    r = run_cmd(base + d + "/nofield.jsonl");
    CHECK(is_clean_error(r, {"nofield.jsonl:2", "no field \"text\""}) && no_output(),
          "prepro, JSONL line without the field: %s", first_line(r.err).c_str());
    write_file(d + "/broken.jsonl", "{\"text\": \"a\"}\n\n{\"text\": \"b\"}\n{\"text\": \"c\n");
    r = run_cmd(base + d + "/broken.jsonl");
    CHECK(is_clean_error(r, {"broken.jsonl:4", "invalid JSON"}) && no_output(), "prepro, broken JSON line: %s",
          first_line(r.err).c_str());
    write_file(d + "/num.jsonl", "{\"text\": 5}\n");
    r = run_cmd(base + d + "/num.jsonl");
    CHECK(is_clean_error(r, {"num.jsonl:1", "not a string"}) && no_output(), "prepro, non-string field: %s",
          first_line(r.err).c_str());
    write_file(d + "/arr.jsonl", "[\"text\"]\n");
    r = run_cmd(base + d + "/arr.jsonl");
    CHECK(is_clean_error(r, {"arr.jsonl:1", "not a JSON object"}) && no_output(),
          "prepro, JSONL line not an object: %s", first_line(r.err).c_str());
    write_file(d + "/bad.bin", std::string(100, 'x'));
    write_file(d + "/ok.txt", "hello");
    r = run_cmd(g_prepro + " --tokenizer " + d + "/bad.bin --out " + d + "/o " + d + "/ok.txt");
    CHECK(is_clean_error(r, {"bad.bin", "truncated header"}) && no_output(), "prepro, garbage tokenizer .bin: %s",
          first_line(r.err).c_str());
    r = run_cmd(g_prepro + " --gpt2-dir " + d + "/nowhere --out " + d + "/o " + d + "/ok.txt");
    CHECK(is_clean_error(r, {"nowhere/encoder.json", "cannot open"}) && no_output(), "prepro, missing GPT-2 files: %s",
          first_line(r.err).c_str());
    r = run_cmd(base + "--shard-size 0 " + d + "/ok.txt");
    CHECK(is_clean_error(r, {"--shard-size"}) && no_output(), "prepro, bad option value: %s",
          first_line(r.err).c_str());
    r = run_cmd(base + "--bogus " + d + "/ok.txt");
    CHECK(is_clean_error(r, {"unknown option --bogus"}) && no_output(), "prepro, unknown option: %s",
          first_line(r.err).c_str());
    r = run_cmd(g_prepro + " --out /nonexistent_dir_xyz/o --gpt2-dir " + g_shared + "/gpt2 " + d + "/ok.txt");
    CHECK(is_clean_error(r, {"/nonexistent_dir_xyz/o_val_000000.bin", "cannot create"}),
          "prepro, unwritable output: %s", first_line(r.err).c_str());

    // JSONL that works: empty documents (EOT alone), escapes, unicode, blank lines, CRLF, another field
    std::vector<std::string> docs = {"first doc", "",
                                     "tab\there \"quoted\" \\ caf\xc3\xa9 \xe4\xbd\xa0\xe5\xa5\xbd \xf0\x9f\x8d\x95",
                                     "line one\nline two\n", "<|endoftext|> as text"};
    std::string jl;
    for (size_t i = 0; i < docs.size(); i++) {
        nlohmann::json o;
        o["id"] = i;
        o["content"] = docs[i];
        jl += o.dump() + (i == 1 ? "\r\n\n" : "\n");
    }
    write_file(d + "/ok.jsonl", jl.substr(0, jl.size() - 1));  // no final newline
    r = run_cmd(base + "--field content --val-tokens 0 --threads 2 " + d + "/ok.jsonl");
    std::vector<int> want;
    for (auto& doc : docs) {
        want.push_back(50256);
        tok.encode(doc, &want);
    }
    auto got = read_shard(d + "/o_train_000001.bin");
    CHECK(r.code == 0 && got == want && !exists(d + "/o_val_000000.bin"),
          "prepro JSONL --field content (empty doc, escapes, CRLF, blank line, no final newline): %zu tokens as "
          "[EOT]+encode(doc) each (%s)",
          got.size(), first_line(r.err).c_str());
    run_cmd("rm -f " + d + "/o_*");
    // the same with --allow-special: the literal EOT string becomes the token
    r = run_cmd(base + "--field content --val-tokens 0 --allow-special " + d + "/ok.jsonl");
    got = read_shard(d + "/o_train_000001.bin");
    CHECK(r.code == 0 && std::count(got.begin(), got.end(), 50256) == 6, "prepro --allow-special: 6 EOT tokens (%s)",
          first_line(r.err).c_str());
    run_cmd("rm -f " + d + "/o_*");
    // several files, small shards: names, sizes, content in order
    write_file(d + "/b.txt", std::string("Second file. ") + "x y z 1 2 3 " + std::string(100, '!'));
    r = run_cmd(base + "--shard-size 7 --val-tokens 5 " + d + "/ok.txt " + d + "/empty.txt " + d + "/b.txt");
    want.clear();
    want.push_back(50256);
    tok.encode("hello", &want);
    want.push_back(50256);
    tok.encode(read_file(d + "/b.txt"), &want);
    std::vector<int> all;
    bool sizes_ok = true;
    int nshards = 0;
    for (int i = 0;; i++) {
        char name[64];
        snprintf(name, sizeof name, "/o_%s_%06d.bin", i == 0 ? "val" : "train", i);
        if (!exists(d + name)) break;
        auto s = read_shard(d + name);
        size_t fsz = read_file(d + name).size();
        size_t expect = i == 0 ? 5 : std::min<size_t>(7, want.size() - 5 - 7 * (i - 1));
        sizes_ok = sizes_ok && s.size() == expect && fsz == 1024 + 2 * expect;
        all.insert(all.end(), s.begin(), s.end());
        nshards++;
    }
    CHECK(r.code == 0 && all == want && sizes_ok && nshards == 1 + (int)((want.size() - 5 + 6) / 7),
          "prepro 3 files (one empty) --shard-size 7 --val-tokens 5: %d shards, %zu tokens in order", nshards,
          all.size());
    run_cmd("rm -f " + d + "/o_*");
    CHECK(r.err.find("empty") != std::string::npos, "prepro warns about the empty file: %s", first_line(r.err).c_str());

    // an enormous single line: 10 MB of letters without a space (one 10 MB piece)
    std::string big(10 << 20, 'a');
    std::mt19937 rng(7);
    for (auto& ch : big) ch = (char)('a' + rng() % 26);
    write_file(d + "/big.txt", big);
    auto t0 = std::chrono::steady_clock::now();
    r = run_cmd(base + "--val-tokens 0 --threads 2 " + d + "/big.txt");
    double secs = seconds_since(t0);
    got = read_shard(d + "/o_train_000001.bin");
    bool ok = r.code == 0 && got.size() > 1 && got[0] == 50256;
    if (ok) got.erase(got.begin());
    CHECK(ok && tok.decode(got) == big, "prepro on a 10 MB line without spaces: %zu tokens, round trip, %.1f s",
          got.size(), secs);
    run_cmd("rm -f " + d + "/o_* " + d + "/big.txt");
}

// The files of a folder (name -> bytes).
static std::map<std::string, std::string> folder_files(const std::string& d) {
    std::map<std::string, std::string> files;
    Run r = run_cmd("ls -A " + d);
    std::istringstream names(r.out);
    for (std::string n; std::getline(names, n);) files[n] = read_file(d + "/" + n);
    return files;
}

// prepro into a prefix that has shards: refused (nothing changed) without --replace; with
// it the set is exactly the new run's (byte for byte what a run into an empty folder
// writes), and only an earlier prepro run's shards are replaced (never another file, nor
// through a link). The loader refuses two runs' shards mixed by hand.
static void test_prepro_rerun() {
    if (g_prepro.empty()) {
        printf("SKIP prepro re-runs: no prepro binary\n");
        return;
    }
    const std::string d = g_tmp + "/rerun", fresh = g_tmp + "/rerun_fresh", in = g_tmp + "/rerun_in";
    for (const std::string& f : {d, fresh, in}) mkdir(f.c_str(), 0755);
    write_file(in + "/long.txt",
               "the first run wrote this text: one two three four five six seven eight nine ten eleven "
               "twelve thirteen fourteen fifteen sixteen seventeen eighteen nineteen twenty and more");
    write_file(in + "/short.txt", "the second text is shorter: two train shards of seven or fewer");
    write_file(in + "/bad.jsonl", "{\"text\": \"fine\"}\n{\"text\": 5}\n");
    const std::string base = g_prepro + " -q --gpt2-dir " + g_shared + "/gpt2 --shard-size 7 --val-tokens 3 ";
    Run r = run_cmd(base + "--out " + d + "/o " + in + "/long.txt");
    const auto first = folder_files(d);
    CHECK(r.code == 0 && first.size() >= 5 && first.count("o_train_000004.bin"), "prepro, first run: %zu shards (%s)",
          first.size(), first_line(r.err).c_str());
    r = run_cmd(base + "--out " + d + "/o " + in + "/short.txt");
    CHECK(is_clean_error(r, {(d + "/o_train_000001.bin: exists").c_str(), "--replace"}) && folder_files(d) == first,
          "prepro into a prefix with shards, without --replace: refused naming the first, every file unchanged: %s",
          first_line(r.err).c_str());
    r = run_cmd(base + "--replace --out " + d + "/o " + in + "/bad.jsonl");
    CHECK(is_clean_error(r, {"bad.jsonl:2"}) && folder_files(d) == first,
          "prepro --replace that fails on its input leaves the earlier set unchanged: %s", first_line(r.err).c_str());
    r = run_cmd(base + "--replace --out " + d + "/o " + in + "/short.txt");
    Run f = run_cmd(base + "--out " + fresh + "/o " + in + "/short.txt");
    const auto replaced = folder_files(d);
    CHECK(r.code == 0 && f.code == 0 && replaced == folder_files(fresh) && replaced.size() < first.size(),
          "prepro --replace with fewer shards: the folder is exactly what a run into an empty one writes (%zu "
          "shards, none of the earlier %zu left) (%s)",
          replaced.size(), first.size(), first_line(r.err).c_str());
    std::string e = error_of([&] {
        DataLoader L;
        dataloader_init(&L, (d + "/o_train_*.bin").c_str(), 1, 4, 0, 1, 50257, false, 0);
        dataloader_free(&L);
    });
    CHECK(e == "NO ERROR", "the loader reads the replaced set (%s)", e.c_str());
    // the earlier run's higher shards copied back beside the new ones: the loader refuses the mix
    for (const auto& kv : first)
        if (!replaced.count(kv.first)) write_file(d + "/" + kv.first, kv.second);
    e = error_of([&] {
        DataLoader L;
        dataloader_init(&L, (d + "/o_train_*.bin").c_str(), 1, 4, 0, 1, 50257, false, 0);
        dataloader_free(&L);
    });
    CHECK(contains_all(
              e, {d + "/o_train_000003.bin: written by prepro run", "another run than " + d + "/o_train_000001.bin"}),
          "the loader refuses a glob of two prepro runs' shards, naming both: %s", e.c_str());
    // with --replace, a file at the prefix that no prepro run wrote stops the run: an llm.c
    // shard (no run id), a link (its target untouched)
    run_cmd("rm -f " + d + "/o_*");
    write_file(d + "/o_train_000001.bin", read_file(fresh + "/o_train_000001.bin").substr(0, 992) +
                                              std::string(32, '\0') +
                                              read_file(fresh + "/o_train_000001.bin").substr(1024));
    r = run_cmd(base + "--replace --out " + d + "/o " + in + "/short.txt");
    CHECK(is_clean_error(r, {(d + "/o_train_000001.bin: not a shard of a prepro run").c_str()}) &&
              folder_files(d).size() == 1,
          "prepro --replace over a shard without run id: refused, nothing written: %s", first_line(r.err).c_str());
    run_cmd("rm -f " + d + "/o_*");
    write_file(in + "/target.bin", read_file(fresh + "/o_train_000001.bin"));
    symlink((in + "/target.bin").c_str(), (d + "/o_train_000009.bin").c_str());
    r = run_cmd(base + "--replace --out " + d + "/o " + in + "/short.txt");
    CHECK(is_clean_error(r, {(d + "/o_train_000009.bin: a symbolic link").c_str()}) && folder_files(d).size() == 1 &&
              read_file(in + "/target.bin") == read_file(fresh + "/o_train_000001.bin"),
          "prepro --replace with a link at the prefix: refused, the link and its target kept: %s",
          first_line(r.err).c_str());
    // --val-tokens 0 writes and replaces the train set only: another run's val shard stays
    // (a val-only run, then a train-only run: data/tinystories.sh)
    run_cmd("rm -f " + d + "/o_*");
    r = run_cmd(base + "--out " + d + "/o --val-tokens 1000 " + in + "/short.txt");
    const std::string val = read_file(d + "/o_val_000000.bin");
    Run t = run_cmd(base + "--out " + d + "/o --val-tokens 0 " + in + "/long.txt");
    Run t2 = run_cmd(base + "--replace --out " + d + "/o --val-tokens 0 " + in + "/short.txt");
    const auto files = folder_files(d);
    CHECK(r.code == 0 && t.code == 0 && t2.code == 0 && files.size() == 3 && files.count("o_val_000000.bin") &&
              files.at("o_val_000000.bin") == val && files.count("o_train_000002.bin"),
          "prepro --val-tokens 0 beside another run's val shard: accepted; with --replace the train set alone is "
          "replaced (%zu files) (%s %s %s)",
          files.size(), first_line(r.err).c_str(), first_line(t.err).c_str(), first_line(t2.err).c_str());
}

static void test_edge_encodes(const Tokenizer& tok) {
    CHECK(tok.encode("").empty(), "empty text -> no ids");
    llmc::ParallelEncoder enc(tok, 2);
    std::vector<int> out;
    enc.encode_documents({"", "", "a"}, true, false, &out);
    CHECK(out == std::vector<int>({50256, 50256, 50256, 64}), "empty documents -> EOT alone each: %s",
          ids_str(out).c_str());
    // random bytes (mostly invalid UTF-8) round-trip, and agree across chunked/threaded encoding
    std::mt19937 rng(99);
    std::string junk(3 << 20, '\0');
    for (auto& ch : junk) {
        uint32_t r = rng();
        ch = (char)(r % 4 == 0 ? " \n\t'"[r >> 8 & 3] : r >> 8);
    }
    auto a = tok.encode(junk);
    auto b = enc.encode_batch({junk})[0];
    CHECK(tok.decode(a) == junk && a == b, "3 MB of random bytes: round trip, chunked 2-thread encode equal (%zu ids)",
          a.size());
    // the safe split points really split: pieces of the parts == pieces of the whole
    std::string text;
    for (int i = 0; i < 20000; i++) text += (rng() % 5 ? "word's " : " \n\t  x1 !!");
    auto whole = tok.pretokenize(text);
    size_t p = tok.safe_split(text, text.size() / 2);
    auto left = tok.pretokenize(std::string_view(text).substr(0, p));
    auto right = tok.pretokenize(std::string_view(text).substr(p));
    CHECK(p < text.size() && left.size() + right.size() == whole.size(),
          "safe_split at %zu: pieces of the halves = pieces of the whole", p);
}

// --- (e) tiktoken ranks files, Llama 3's pattern and specials --------------------------------
static std::string base64(const std::string& in) {
    static const char* a = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    std::string out;
    for (size_t i = 0; i < in.size(); i += 3) {
        uint32_t w = (uint8_t)in[i] << 16;
        if (i + 1 < in.size()) w |= (uint8_t)in[i + 1] << 8;
        if (i + 2 < in.size()) w |= (uint8_t)in[i + 2];
        out += a[w >> 18];
        out += a[(w >> 12) & 63];
        out += i + 1 < in.size() ? a[(w >> 6) & 63] : '=';
        out += i + 2 < in.size() ? a[w & 63] : '=';
    }
    return out;
}
static std::string ranks_line(const std::string& token, int rank) {
    return base64(token) + " " + std::to_string(rank) + "\n";
}
static std::string byte_ranks() {
    std::string out;
    for (int b = 0; b < 256; b++) out += ranks_line(std::string(1, (char)b), b);
    return out;
}

// GPT-2's 50,256 ordinary tokens as a ranks file (rank = GPT-2's id).
static void write_gpt2_ranks(const Tokenizer& gpt2, const std::string& path) {
    std::string out;
    for (int id = 0; id < gpt2.vocab_size(); id++)
        if (id != gpt2.eot_token()) out += ranks_line(gpt2.token_bytes(id), id);
    write_file(path, out);
}

// The committed small BPE against tiktoken: cases (specials included), every code point.
static void test_llama3_small(const Tokenizer& tok, const nlohmann::json& cases) {
    const int N = 2256;
    CHECK(tok.vocab_size() == N + 256 && tok.doc_token() == N && tok.eot_token() == N + 1 &&
              tok.pattern() == llmc::Pattern::Llama3 && tok.token_bytes(N + 9) == "<|eot_id|>" &&
              tok.token_bytes(N + 255) == "<|reserved_special_token_250|>",
          "%s: %d ranks + Llama 3's 256 specials (doc token %d = %s, eot %d = %s)", g_test_ranks.c_str(),
          tok.vocab_size() - 256, tok.doc_token(), tok.token_bytes(tok.doc_token()).c_str(), tok.eot_token(),
          tok.token_bytes(tok.eot_token()).c_str());
    test_cases(tok, cases, "llama3 pattern, test ranks");
    test_sweeps(tok, cases, "llama3 pattern, test ranks: ");
    test_bpe_properties(tok, "test ranks");
}

// A shared corpus under a vocabulary: count and sha256 of its ids as tiktoken's, on 1 and
// 2 threads (the 2-thread encode splits the text at safe_split points).
static void test_corpora(const Tokenizer& tok, const nlohmann::json& cases, const std::string& ranks) {
    for (const auto& c : cases["corpora"]) {
        if (c["ranks"] != ranks) continue;
        std::string file = c["file"], path = g_shared + "/" + file;
        if (!exists(path)) {
            printf("SKIP llama3 pattern, %s ranks, %s: absent (set SHARED_DATA)\n", ranks.c_str(), path.c_str());
            continue;
        }
        std::string text = read_file(path);
        auto one = tok.encode(text);
        llmc::ParallelEncoder enc(tok, 2);
        auto two = enc.encode_batch({text})[0];
        std::string sha = sha_u32(one);
        CHECK(text.size() == c["bytes"].get<size_t>() && one.size() == c["count"].get<size_t>() &&
                  sha == c["sha256"].get<std::string>() && two == one,
              "llama3 pattern, %s ranks, %s: %zu ids, sha256 %.16s... as tiktoken; 2-thread chunked encode equal",
              ranks.c_str(), file.c_str(), one.size(), sha.c_str());
    }
}

// GPT-2's ranks rewritten as a tiktoken file: with GPT-2's pattern it is GPT-2's tokenizer
// (same ids, same llm.c shards); with Llama 3's, tiktoken's ids on the cases and corpora.
static void test_gpt2_ranks(const Tokenizer& gpt2, const nlohmann::json& gpt2_cases, const nlohmann::json& cases,
                            const std::string& shakespeare) {
    std::string path = g_tmp + "/gpt2.ranks";
    write_gpt2_ranks(gpt2, path);
    Tokenizer same;
    std::string e = error_of([&] { same.load_tiktoken(path, llmc::Pattern::Gpt2); });
    CHECK(e == "NO ERROR" && same.vocab_size() == 50257 && same.doc_token() == 50256 && same.eot_token() == 50256,
          "GPT-2's ranks as a tiktoken file, GPT-2's pattern: 50,257 tokens, <|endoftext|> 50256 (%s)", e.c_str());
    if (e != "NO ERROR") return;
    if (!gpt2_cases.is_null()) test_cases(same, gpt2_cases, "tiktoken file of GPT-2's ranks");
    if (!shakespeare.empty())
        CHECK(same.encode(shakespeare) == gpt2.encode(shakespeare),
              "tiktoken file of GPT-2's ranks encodes tinyshakespeare as encoder.json + vocab.bpe");
    Tokenizer big;
    e = error_of([&] { big.load_tiktoken(path); });
    CHECK(e == "NO ERROR" && big.vocab_size() == 50256 + 256 && big.doc_token() == 50256,
          "GPT-2's ranks with Llama 3's pattern: 50,256 ranks + 256 specials (%s)", e.c_str());
    if (e != "NO ERROR" || cases.is_null()) return;
    test_cases(big, cases, "llama3 pattern, GPT-2's ranks", "ids_gpt2_ranks");
    test_corpora(big, cases, "gpt2");
    if (g_prepro.empty() || shakespeare.empty()) return;
    // prepro --tiktoken --pattern gpt2 writes llm.c's tinyshakespeare shards byte for byte
    std::string prefix = g_tmp + "/tsr";
    Run r = run_cmd(g_prepro + " --tiktoken " + path + " --pattern gpt2 --out " + prefix +
                    " --split-on-blank-lines --val-tokens 32768 " + g_shared + "/tinyshakespeare.txt");
    CHECK(r.code == 0 && sha256_hex(llmc_bytes(read_file(prefix + "_val_000000.bin"))) == kValFileSha &&
              sha256_hex(llmc_bytes(read_file(prefix + "_train_000001.bin"))) == kTrainFileSha,
          "prepro --tiktoken GPT-2's ranks --pattern gpt2: llm.c's tinyshakespeare shards, but the run slots (%s)",
          first_line(r.err).c_str());
}

// The safe split points of Llama 3's pattern really split (".\n" is one piece: no split
// before a line break), on random text of the fragments where the patterns differ.
static void test_llama3_safe_split(const Tokenizer& tok) {
    const char* frags[] = {"word", " word", "'s", "'S",    ".",  "!!",     "\n",  "\r\n",
                           " ",    "  ",    "\t", "12345", " 1", "x.\n\n", "(a)", "\xc3\xa9t\xc3\xa9",
                           " \n ", "\xff"};
    std::mt19937 rng(5);
    std::string text;
    for (int i = 0; i < 40000; i++) text += frags[rng() % (sizeof frags / sizeof frags[0])];
    auto lengths = [&](std::string_view t, size_t base, std::vector<size_t>* ends) {
        for (auto p : tok.pretokenize(t)) ends->push_back(base + (size_t)(p.data() - t.data()) + p.size());
    };
    std::vector<size_t> whole;
    lengths(text, 0, &whole);
    int bad = 0, splits = 0;
    for (size_t from = 1; from < text.size(); from += 997) {
        size_t p = tok.safe_split(text, from);
        if (p >= text.size()) continue;
        std::vector<size_t> parts;
        lengths(std::string_view(text).substr(0, p), 0, &parts);
        lengths(std::string_view(text).substr(p), p, &parts);
        splits++;
        if (parts != whole) bad++;
    }
    CHECK(bad == 0 && splits > 100,
          "llama3 pattern: pieces of the halves = pieces of the whole at %d safe_split points "
          "(%d differ)",
          splits, bad);
}

static void test_ranks_errors() {
    std::string t = g_tmp + "/ranks";
    mkdir(t.c_str(), 0755);
    Tokenizer tok;
    std::string e;
    const std::string bytes = byte_ranks();
    write_file(t + "/ok.ranks", bytes + ranks_line("ab", 256) + ranks_line("abc", 257));
    e = error_of([&] { tok.load_tiktoken(t + "/ok.ranks"); });
    CHECK(e == "NO ERROR" && tok.encode("abc abcab") == std::vector<int>({257, 32, 257, 256}) &&
              tok.encode("<|eot_id|>", true) == std::vector<int>({258 + 9}),
          "a small valid ranks file loads and encodes (%s)", e.c_str());
    std::string crlf;
    for (char c : bytes + ranks_line("ab", 256)) crlf += c == '\n' ? std::string("\r\n") : std::string(1, c);
    write_file(t + "/crlf.ranks", crlf + "\r\n\r\n");
    e = error_of([&] { tok.load_tiktoken(t + "/crlf.ranks"); });
    CHECK(e == "NO ERROR" && tok.vocab_size() == 257 + 256, "CRLF line ends and blank lines are read (%s)", e.c_str());
    std::string junk(3000, '\0');
    std::mt19937 rng(3);
    for (auto& c : junk) c = (char)rng();
    std::vector<std::pair<std::string, std::pair<std::string, std::vector<std::string>>>> cases = {
        {"empty file", {"", {"no tokens"}}},
        {"binary garbage", {junk, {":1: "}}},
        {"no rank", {bytes + "YWI=\n", {":257: ", "expected"}}},
        {"two spaces", {bytes + "YWI=  256\n", {":257: ", "expected"}}},
        {"a tab", {bytes + "YWI=\t256\n", {":257: ", "expected"}}},
        {"three fields", {bytes + "YWI= 256 7\n", {":257: ", "expected"}}},
        {"negative rank", {bytes + "YWI= -256\n", {":257: ", "expected"}}},
        {"rank not a number", {bytes + "YWI= 2x6\n", {":257: ", "expected"}}},
        {"rank too large", {bytes + "YWI= 99999999999999999999\n", {":257: ", "too large"}}},
        {"bad base64 character", {bytes + "Y?I= 256\n", {":257: ", "bad base64"}}},
        {"base64 length not a multiple of 4", {bytes + "YWI 256\n", {":257: ", "bad base64"}}},
        {"base64 padding inside", {bytes + "YQ==YWI= 256\n", {":257: ", "bad base64"}}},
        {"duplicate rank",
         {bytes + ranks_line("ab", 256) + ranks_line("bc", 256), {":258: ", "rank 256 appears twice", "line 257"}}},
        {"duplicate token", {bytes + ranks_line("ab", 256) + ranks_line("ab", 257), {"token 257", "appears twice"}}},
        {"ranks with a gap", {bytes + ranks_line("ab", 300), {":257: ", "rank 300 outside 0..256"}}},
        {"a byte missing",
         {bytes.substr(0, bytes.find("QQ== 65\n")) + ranks_line("ab", 65) + bytes.substr(bytes.find("QQ== 65\n") + 8),
          {"no token for the byte 0x41"}}},
        {"token not made of lower ranks",
         {bytes + ranks_line("abc", 256), {":257: ", "rank 256", "do not form a BPE"}}},
        {"merge of a higher rank",
         {bytes + ranks_line("abc", 256) + ranks_line("ab", 257), {"rank 256", "do not form a BPE"}}},
        {"huge line", {bytes + std::string(100000, 'Q') + " 256\n", {":257: ", "line of 100004 bytes"}}},
    };
    for (auto& c : cases) {
        write_file(t + "/bad.ranks", c.second.first);
        e = error_of([&] { tok.load_tiktoken(t + "/bad.ranks"); });
        bool ok = e.find(t + "/bad.ranks") == 0 && e.find('\n') == std::string::npos;
        for (auto& n : c.second.second) ok = ok && e.find(n) != std::string::npos;
        CHECK(ok, "ranks file, %s: %s", c.first.c_str(), e.c_str());
    }
    // a 300 MB file (sparse): refused before it is read
    int fd = open((t + "/huge.ranks").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0644);
    bool made = fd >= 0 && ftruncate(fd, 300ll << 20) == 0;
    if (fd >= 0) close(fd);
    e = error_of([&] { tok.load_tiktoken(t + "/huge.ranks"); });
    CHECK(made && contains_all(e, {"huge.ranks", "314572800 bytes, more than"}), "ranks file of 300 MB: %s", e.c_str());
    // 4,194,305 short lines (30 MB): refused at the line past the bound
    std::string many;
    many.reserve(30 << 20);
    for (int i = 0; i <= (1 << 22); i++) many += "QQ== 1\n";
    write_file(t + "/many.ranks", many);
    e = error_of([&] { tok.load_tiktoken(t + "/many.ranks"); });
    CHECK(contains_all(e, {"many.ranks:4194305: ", "more than 4194304 tokens"}), "ranks file of 4,194,305 lines: %s",
          e.c_str());
    e = error_of([&] { tok.load_tiktoken(t + "/missing.ranks"); });
    CHECK(contains_all(e, {"missing.ranks", "cannot open"}), "missing ranks file: %s", e.c_str());
    run_cmd("rm -f " + t + "/huge.ranks " + t + "/many.ranks");
}

// prepro --tiktoken: the document token before each document, uint16 shards while the
// vocabulary fits, uint32 once it does not; bad ranks files are clean errors.
static void test_prepro_tiktoken(const Tokenizer& small) {
    if (g_prepro.empty()) {
        printf("SKIP prepro --tiktoken: no prepro binary\n");
        return;
    }
    std::string d = g_tmp + "/tk";
    mkdir(d.c_str(), 0755);
    std::vector<std::string> docs = {"First doc.\n", "Second's \xc3\xa9t\xc3\xa9 12345!\r\n", "<|eot_id|> as text"};
    write_file(d + "/in.txt", docs[0] + "\n" + docs[1] + "\n" + docs[2]);
    std::string base = g_prepro + " --split-on \"\n\" --val-tokens 0 --out " + d + "/o ";
    Run r = run_cmd(base + "--tiktoken " + g_test_ranks + " --write-tokenizer " + d + "/small.bin " + d + "/in.txt");
    std::vector<int> want;
    for (auto& doc : docs) {
        want.push_back(small.doc_token());
        small.encode(doc.substr(0, doc.find_last_not_of(" \t\r\n") + 1), &want);
    }
    int magic = 0;
    auto got = read_shard(d + "/o_train_000001.bin", &magic);
    CHECK(r.code == 0 && magic == 20240520 && got == want &&
              r.out.find("starts with token 2256 (<|begin_of_text|>)") != std::string::npos,
          "prepro --tiktoken test ranks: uint16 shard, <|begin_of_text|> (2256) + ids before each of 3 documents, "
          "named in the summary (%s)",
          first_line(r.err).c_str());
    // its tokenizer .bin (for the trainer's samples) decodes the shard, specials included
    Tokenizer bin;
    std::string e = error_of([&] { bin.load_bin(d + "/small.bin"); });
    std::string text;
    for (auto& doc : docs) text += "<|begin_of_text|>" + doc.substr(0, doc.find_last_not_of(" \t\r\n") + 1);
    CHECK(e == "NO ERROR" && bin.vocab_size() == 2512 && bin.eot_token() == 2257 && bin.decode(got) == text,
          "prepro --tiktoken --write-tokenizer: a .bin of 2,512 tokens, EOT <|end_of_text|>, decodes the shard (%s)",
          e.c_str());
    run_cmd("rm -f " + d + "/o_*");
    // 256 bytes + 65,300 two-byte tokens: V = 65,812 > 65,536, doc token 65,556
    std::string wide = byte_ranks();
    for (int k = 0; k < 65300; k++) wide += ranks_line(std::string{(char)(k >> 8), (char)(k & 255)}, 256 + k);
    write_file(d + "/wide.ranks", wide);
    Tokenizer w;
    e = error_of([&] { w.load_tiktoken(d + "/wide.ranks"); });
    r = run_cmd(base + "--tiktoken " + d + "/wide.ranks " + d + "/in.txt");
    want.clear();
    if (e == "NO ERROR")
        for (auto& doc : docs) {
            want.push_back(w.doc_token());
            w.encode(doc.substr(0, doc.find_last_not_of(" \t\r\n") + 1), &want);
        }
    got = read_shard(d + "/o_train_000001.bin", &magic);
    CHECK(e == "NO ERROR" && w.vocab_size() == 65812 && r.code == 0 && magic == 20240801 && got == want &&
              got[0] == 65556,
          "prepro --tiktoken, V = 65,812: uint32 shard (magic 20240801), %zu ids from token 65556 (%s %s)", got.size(),
          e.c_str(), first_line(r.err).c_str());
    run_cmd("rm -f " + d + "/o_*");
    auto no_output = [&] { return run_cmd("ls " + d + " | grep '^o_' | wc -l").out == "0\n"; };
    write_file(d + "/bad.ranks", byte_ranks() + ranks_line("ab", 256) + ranks_line("cd", 256));
    r = run_cmd(base + "--tiktoken " + d + "/bad.ranks " + d + "/in.txt");
    CHECK(is_clean_error(r, {"bad.ranks:258", "appears twice"}) && no_output(),
          "prepro, ranks file with a duplicate rank: %s", first_line(r.err).c_str());
    r = run_cmd(base + "--pattern llama3 " + d + "/in.txt");
    CHECK(is_clean_error(r, {"--pattern applies to --tiktoken"}) && no_output(),
          "prepro --pattern without --tiktoken: %s", first_line(r.err).c_str());
    r = run_cmd(base + "--tiktoken " + g_test_ranks + " --pattern cl100k " + d + "/in.txt");
    CHECK(is_clean_error(r, {"--pattern must be llama3 or gpt2"}) && no_output(), "prepro --pattern cl100k: %s",
          first_line(r.err).c_str());
    r = run_cmd(base + "--tiktoken " + g_test_ranks + " --gpt2-dir x " + d + "/in.txt");
    CHECK(is_clean_error(r, {"--tiktoken excludes"}) && no_output(), "prepro --tiktoken with --gpt2-dir: %s",
          first_line(r.err).c_str());
}

int main(int argc, char** argv) {
    const char* sd = getenv("SHARED_DATA");
    g_shared = sd && *sd ? sd : "../shared/data";
    std::string self = argv[0], dir = self.find('/') == std::string::npos ? "." : self.substr(0, self.rfind('/'));
    for (const std::string& cand : {dir + "/prepro", std::string("build/host/prepro")})
        if (exists(cand)) {
            g_prepro = cand;
            break;
        }
    for (const std::string& root : {std::string("."), dir + "/../.."})
        if (exists(root + "/test/data/tokenizer_cases.json")) {
            g_tokenizer_cases = root + "/test/data/tokenizer_cases.json";
            g_llama3_cases = root + "/test/data/tokenizer_cases_llama3.json";
            g_test_ranks = root + "/test/data/tiktoken_test.ranks";
            break;
        }
    char tmpl[] = "/tmp/test_tokenizer.XXXXXX";
    if (!mkdtemp(tmpl)) {
        printf("FAIL cannot create a temporary directory\n");
        return test_summary("test_tokenizer");
    }
    g_tmp = tmpl;

    nlohmann::json cases;
    if (g_tokenizer_cases.empty()) {
        printf("FAIL test/data/tokenizer_cases.json not found (run from the project root)\n");
        g_tally.failed++;
    } else {
        cases = nlohmann::json::parse(read_file(g_tokenizer_cases));
        test_classes(cases);
    }
    nlohmann::json llama3_cases;
    if (!g_tokenizer_cases.empty() && exists(g_llama3_cases) && exists(g_test_ranks)) {
        llama3_cases = nlohmann::json::parse(read_file(g_llama3_cases));
        Tokenizer small;
        std::string e = error_of([&] { small.load_tiktoken(g_test_ranks); });
        CHECK(e == "NO ERROR", "the test ranks file loads with Llama 3's pattern (%s)", e.c_str());
        if (e == "NO ERROR") {
            test_llama3_small(small, llama3_cases);
            test_corpora(small, llama3_cases, "test");
            test_llama3_safe_split(small);
            test_prepro_tiktoken(small);
        }
    } else {
        printf("FAIL test/data/tokenizer_cases_llama3.json or tiktoken_test.ranks not found\n");
        g_tally.failed++;
    }
    test_ranks_errors();
    std::string gpt2 = g_shared + "/gpt2", ts_path = g_shared + "/tinyshakespeare.txt";
    test_library_errors(gpt2);
    if (!exists(gpt2 + "/encoder.json") || !exists(gpt2 + "/vocab.bpe")) {
        printf("SKIP GPT-2 encode/decode tests: %s/encoder.json or vocab.bpe absent (set SHARED_DATA)\n", gpt2.c_str());
    } else {
        auto t0 = std::chrono::steady_clock::now();
        Tokenizer tok = Tokenizer::from_gpt2_files(gpt2 + "/encoder.json", gpt2 + "/vocab.bpe");
        CHECK(tok.can_encode(), "GPT-2 tokenizer loads from encoder.json + vocab.bpe (%.2f s)", seconds_since(t0));
        test_spot_checks(tok);
        test_edge_encodes(tok);
        test_unicode_version_regression(tok);
        const bool have_cases = !g_tokenizer_cases.empty();
        if (have_cases) {
            test_cases(tok, cases, "tiktoken");
            test_sweeps(tok, cases);
        }
        test_bpe_properties(tok, "encoder.json+vocab.bpe");
        std::string shakespeare;
        if (exists(ts_path)) {
            shakespeare = read_file(ts_path);
            test_shakespeare(tok, shakespeare);
            test_prepro_shakespeare(ts_path);
        } else {
            printf("SKIP tinyshakespeare tests: %s absent\n", ts_path.c_str());
        }
        test_bin_roundtrip(tok, shakespeare, have_cases ? &cases : nullptr);
        test_gpt2_ranks(tok, cases, llama3_cases, shakespeare);
        test_tool_errors(tok);
        test_prepro_rerun();
    }
    run_cmd("rm -rf " + g_tmp);
    return test_summary("test_tokenizer");
}
