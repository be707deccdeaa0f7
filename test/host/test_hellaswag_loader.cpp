// Tests of llmc/data/hellaswag.h's loader and vocabulary check on eval files written
// here byte by byte: many generated examples load exactly as written; every
// truncation of a good file, every wrong example count in its header and every
// garbled structural field is refused with one line naming the file, never a
// crash; tokens at and past the vocabulary size. (The rows an example fills
// and the prediction are tested in test_eval.cpp.)
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "llmc/data/hellaswag.h"
#include "test/host/host_util.h"
#include "test/test_util.h"

// The loader's and the vocabulary check's verdicts: "" when all is well, else
// the message of the llmc::Error thrown. Every call of llmc/data/hellaswag.h goes
// through these two.
static std::string load_error(const std::string& path, std::vector<HellaSwagExample>* out = nullptr) {
    const std::string e = error_of([&] {
        std::vector<HellaSwagExample> exs = hellaswag_load(path);
        if (out) out->swap(exs);
    });
    return e == "NO ERROR" ? "" : e;
}
static std::string vocab_error(const std::vector<HellaSwagExample>& exs, int vocab_size) {
    const std::string e = error_of([&] { hellaswag_check_vocab(exs, vocab_size, "exs.bin"); });
    return e == "NO ERROR" ? "" : e;
}

// An error as the loader promises it: one line, starting with the file's path.
static bool names_file(const std::string& error, const std::string& path) {
    return error.rfind(path + ": ", 0) == 0 && error.find('\n') == std::string::npos;
}

// One example's uint16s in the file format.
static std::vector<uint16_t> example_u16(const HellaSwagExample& ex) {
    std::vector<uint16_t> u = {HELLASWAG_DELIMITER,         0,
                               (uint16_t)ex.index,          (uint16_t)ex.label,
                               (uint16_t)ex.endings.size(), (uint16_t)ex.context.size()};
    for (int t : ex.context) u.push_back((uint16_t)t);
    for (const auto& e : ex.endings) {
        u.push_back((uint16_t)e.size());
        for (int t : e) u.push_back((uint16_t)t);
    }
    u[1] = (uint16_t)(u.size() * 2);
    return u;
}

// A whole file: the header (count and longest example from the examples) and
// the examples. The caller may change the header or the uint16s before bytes().
struct EvalFile {
    int32_t header[HELLASWAG_HEADER_INTS] = {HELLASWAG_MAGIC, HELLASWAG_VERSION};
    std::vector<uint16_t> payload;
    explicit EvalFile(const std::vector<HellaSwagExample>& exs) {
        for (const auto& ex : exs) {
            const std::vector<uint16_t> u = example_u16(ex);
            payload.insert(payload.end(), u.begin(), u.end());
            header[3] = std::max(header[3], (int32_t)(u.size() * 2));
        }
        header[2] = (int32_t)exs.size();
    }
    std::string bytes() const {
        return std::string((const char*)header, sizeof header) +
               std::string((const char*)payload.data(), payload.size() * 2);
    }
};

static std::vector<HellaSwagExample> random_examples(int n, uint32_t seed) {
    std::mt19937 rng(seed);
    auto pick = [&](int lo, int hi) { return std::uniform_int_distribution<int>(lo, hi)(rng); };
    std::vector<HellaSwagExample> exs(n);
    for (int i = 0; i < n; i++) {
        exs[i].index = i;
        exs[i].label = pick(0, HELLASWAG_ENDINGS - 1);
        exs[i].context.resize(pick(1, 40));
        for (int& t : exs[i].context) t = pick(0, 50256);
        exs[i].endings.resize(HELLASWAG_ENDINGS);
        for (auto& e : exs[i].endings) {
            e.resize(pick(1, 20));
            for (int& t : e) t = pick(0, 50256);
        }
    }
    return exs;
}

static bool same_examples(const std::vector<HellaSwagExample>& a, const std::vector<HellaSwagExample>& b) {
    if (a.size() != b.size()) return false;
    for (size_t i = 0; i < a.size(); i++)
        if (a[i].index != b[i].index || a[i].label != b[i].label || a[i].context != b[i].context ||
            a[i].endings != b[i].endings)
            return false;
    return true;
}

static void test_round_trip() {
    const std::vector<HellaSwagExample> exs = random_examples(200, 1);
    EvalFile f(exs);
    const std::string path = g_tmp + "/many.bin";
    write_file(path, f.bytes());
    std::vector<HellaSwagExample> got;
    std::string err = load_error(path, &got);
    CHECK(err.empty() && same_examples(got, exs), "200 random examples load as written, %zu of them (%s)", got.size(),
          err.c_str());
    // the header's longest example is a bound a reader sizes its buffer by: equal is fine, smaller is not
    f.header[3] -= 2;
    write_file(path, f.bytes());
    err = load_error(path);
    CHECK(names_file(err, path) && err.find("longer than the header's longest") != std::string::npos,
          "a header whose longest example is 2 bytes short of the longest is refused: %s", err.c_str());
}

// Every proper prefix of a good file is refused: nothing past the end is read as data.
static void test_every_truncation() {
    const std::string good = EvalFile(random_examples(3, 2)).bytes(), path = g_tmp + "/cut.bin";
    int refused = 0, named = 0;
    for (size_t n = 0; n < good.size(); n++) {
        write_file(path, good.substr(0, n));
        const std::string err = load_error(path);
        refused += !err.empty();
        named += names_file(err, path);
    }
    CHECK(refused == (int)good.size() && named == (int)good.size(),
          "every truncation of a %zu-byte file is refused (%d), each with one line naming the file (%d)", good.size(),
          refused, named);
}

// The header's example count must be the number of examples in the file.
static void test_every_count() {
    const EvalFile good(random_examples(3, 3));
    const std::string path = g_tmp + "/count.bin";
    int wrong_refused = 0;
    for (int32_t count = 0; count <= 6; count++) {
        EvalFile f = good;
        f.header[2] = count;
        write_file(path, f.bytes());
        const std::string err = load_error(path);
        if (count != 3) wrong_refused += names_file(err, path);
    }
    std::vector<HellaSwagExample> got;
    write_file(path, good.bytes());
    CHECK(wrong_refused == 6 && load_error(path, &got).empty() && got.size() == 3,
          "of header counts 0..6 for 3 examples only 3 loads (3 examples); the 6 others are refused (%d)",
          wrong_refused);
}

// Every field that lays out an example (its delimiter, byte length, ending
// count, context length and ending lengths), in every example, garbled by each
// of a few amounts: the file is refused with one line naming it. So is a label
// past 3. (A garbled index or token still loads: any value is valid there.)
static void test_garbled_fields() {
    const std::vector<HellaSwagExample> exs = random_examples(4, 4);
    const EvalFile good(exs);
    const std::string path = g_tmp + "/garbled.bin";
    std::vector<size_t> fields, labels;
    size_t p = 0;
    for (const auto& ex : exs) {
        for (size_t k : {0, 1, 4, 5}) fields.push_back(p + k);
        labels.push_back(p + 3);
        size_t q = p + 6 + ex.context.size();
        for (const auto& e : ex.endings) {
            fields.push_back(q);
            q += 1 + e.size();
        }
        p = q;
    }
    auto refused_after = [&](size_t at, int delta) {
        EvalFile f = good;
        f.payload[at] = (uint16_t)(f.payload[at] + delta);
        write_file(path, f.bytes());
        return names_file(load_error(path), path);
    };
    int tried = 0, refused = 0;
    for (size_t at : fields)
        for (int delta : {1, -1, 4, 1000}) {
            tried++;
            refused += refused_after(at, delta);
        }
    for (size_t at : labels) {
        tried++;
        refused += refused_after(at, HELLASWAG_ENDINGS);
    }
    CHECK(refused == tried, "%d garblings of the %zu layout fields and labels of 4 examples are each refused (%d)",
          tried, fields.size() + labels.size(), refused);
    std::mt19937 rng(5);
    int noise_refused = 0;
    for (int k = 0; k < 50; k++) {
        EvalFile f = good;
        for (auto& u : f.payload) u = (uint16_t)rng();
        write_file(path, f.bytes());
        noise_refused += names_file(load_error(path), path);
    }
    CHECK(noise_refused == 50, "50 files of random uint16s after a good header are refused (%d)", noise_refused);
}

static void test_vocab() {
    std::vector<HellaSwagExample> exs = random_examples(5, 6);
    for (auto& ex : exs) {
        for (int& t : ex.context) t %= 999;  // every token below 999 but the one set next
        for (auto& e : ex.endings)
            for (int& t : e) t %= 999;
    }
    exs[1].endings[3].back() = 999;
    CHECK(vocab_error(exs, 1000).empty() && vocab_error({}, 1).empty(),
          "token 999 with a vocabulary of 1000 passes; so does no example at all");
    std::string err = vocab_error(exs, 999);
    CHECK(err.rfind("exs.bin: example 1", 0) == 0 && err.find("token 999") != std::string::npos &&
              err.find('\n') == std::string::npos,
          "token 999 in the last ending with a vocabulary of 999 is named with its example: %s", err.c_str());
    exs[3].context[0] = 50257;
    exs[4].context[0] = 60000;
    err = vocab_error(exs, 50257);
    CHECK(err.find("example 3") != std::string::npos && err.find("token 50257") != std::string::npos,
          "a context token equal to GPT-2's vocabulary size is refused; the first bad example is named: %s",
          err.c_str());
    // tokens a file can hold (uint16 up to 65534) load as they are; the check is the vocabulary's
    exs[4].endings[0][0] = 65534;
    const std::string path = g_tmp + "/vocab.bin";
    write_file(path, EvalFile(exs).bytes());
    std::vector<HellaSwagExample> got;
    CHECK(load_error(path, &got).empty() && same_examples(got, exs) && !vocab_error(got, 50257).empty() &&
              vocab_error(got, 65535).empty(),
          "tokens up to 65534 load unchanged; the vocabulary check refuses them for 50257 and passes them for 65535");
}

int main() {
    char tmpl[] = "/tmp/test_hellaswag_loader.XXXXXX";
    if (!mkdtemp(tmpl)) {
        printf("FAIL cannot create a temporary directory\n");
        return test_summary("test_hellaswag_loader");
    }
    g_tmp = tmpl;
    TEST_CASE(test_round_trip());
    TEST_CASE(test_every_truncation());
    TEST_CASE(test_every_count());
    TEST_CASE(test_garbled_fields());
    TEST_CASE(test_vocab());
    run_cmd("rm -rf " + g_tmp);
    return test_summary("test_hellaswag_loader");
}
