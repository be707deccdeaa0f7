// Tests of llmc/formats/safetensors.h and llmc/formats/llama3_config.h: transformers' tiny Llama 3 models
// (test/ref/llama3_hf_tiny, dev/make_llama3_fixture.py) read tensor by tensor against the values
// torch recorded, a bitwise write/read round trip (one file and shards), no saved file
// overwritten or written through a link, every kind of hostile header refused with one line
// (and every truncation of a real file), the dtype conversions, and the Llama 3 config: the
// descriptor and its errors, the published sizes' parameter counts, config.json both ways and
// what it refuses.
#include <sys/stat.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "llmc/formats/llama3_config.h"
#include "llmc/formats/safetensors.h"
#include "test/test_util.h"

#include "test/host/host_util.h"

using namespace llmc;

static const std::string FIXTURE = "test/ref/llama3_hf_tiny";
static const std::string NO_ERROR = "NO ERROR";
static std::string g_root;  // the repository root (the tests chdir into g_tmp)

static std::string le64(uint64_t n) {
    std::string s(8, '\0');
    for (int i = 0; i < 8; i++) s[i] = (char)(n >> (8 * i));
    return s;
}
// A safetensors file of header text and data bytes; header_len overrides the length field.
static std::string st_file(const std::string& name, const std::string& header, const std::string& data,
                           int64_t header_len = -1) {
    const std::string p = g_tmp + "/" + name;
    write_file(p, le64(header_len < 0 ? header.size() : (uint64_t)header_len) + header + data);
    return p;
}
static std::string open_error(const std::string& path) {
    return error_of([&] { SafetensorsFile f(path); });
}
// one line "safetensors: PATH: ..." containing needle
static bool st_error(const std::string& message, const std::string& path, const std::string& needle) {
    return message.rfind("safetensors: " + path + ": ", 0) == 0 && contains_all(message, {needle});
}

// ---------------------------------------------------------------------------
// the fixture

static std::string dtype_name(const std::string& torch_dtype) {
    return torch_dtype == "bfloat16" ? "BF16" : torch_dtype == "float32" ? "F32" : "?" + torch_dtype;
}

static void check_fixture_model(const std::string& sub, const nlohmann::json& expected) {
    const std::string dir = g_root + "/" + FIXTURE + "/" + sub;
    std::string err = error_of([&] {
        SafetensorsModel m(dir);
        const Llama3Config c = llama3_read_hf_config(dir + "/config.json");
        std::set<std::string> want, table;
        for (auto it = expected.begin(); it != expected.end(); ++it) want.insert(it.key());
        for (const auto& p : llama3_param_table(c)) table.insert(p.name);
        const std::vector<std::string> names = m.names();
        CHECK(std::set<std::string>(names.begin(), names.end()) == want && want == table,
              "%s: the tensor names are torch's (%zu) and llama3_param_table's", sub.c_str(), want.size());
        int shape_bad = 0, dtype_bad = 0, sum_bad = 0, first_bad = 0, bf16_bad = 0;
        double worst_sum = 0;
        for (const auto& p : llama3_param_table(c)) {
            const auto& e = expected[p.name];
            const SafetensorsTensor& t = m.get(p.name);
            if (t.shape != e["shape"].get<std::vector<uint64_t>>() || t.shape != p.shape) shape_bad++;
            if (t.dtype != dtype_name(e["dtype"])) dtype_bad++;
            std::vector<float> v(t.numel());
            m.read(p.name, SafetensorsTarget::F32, v.data(), v.size());
            double sum = 0;
            for (float x : v) sum += x;
            const double want_sum = e["sum"].get<double>();
            const double d = std::fabs(sum - want_sum) / std::max(1.0, std::fabs(want_sum));
            worst_sum = std::max(worst_sum, d);
            if (d > 1e-9) sum_bad++;
            const auto first = e["first"].get<std::vector<double>>();
            for (size_t i = 0; i < first.size(); i++)
                if ((double)v[i] != first[i]) first_bad++;
            std::vector<uint16_t> b(t.numel());
            m.read(p.name, SafetensorsTarget::BF16, b.data(), b.size());
            for (size_t i = 0; i < b.size(); i++)
                if (b[i] != f32_to_bf16(v[i])) bf16_bad++;
        }
        CHECK(shape_bad == 0 && dtype_bad == 0,
              "%s: every shape is torch's and the table's, every dtype torch's (%d, %d wrong)", sub.c_str(), shape_bad,
              dtype_bad);
        CHECK(sum_bad == 0 && first_bad == 0,
              "%s: every tensor read as fp32 has torch's sum and first values (worst sum rel diff %.1e; %d sums, %d "
              "values wrong)",
              sub.c_str(), worst_sum, sum_bad, first_bad);
        CHECK(bf16_bad == 0, "%s: read as bf16, every element is the fp32 value rounded to bf16 (%d wrong)",
              sub.c_str(), bf16_bad);
    });
    CHECK(err == NO_ERROR, "%s: reads without an error (%s)", sub.c_str(), err.c_str());
}

static void test_fixture() {
    std::string text, why;
    const std::string path = g_root + "/" + FIXTURE + "/expected.json";
    CHECK(read_regular_file(path.c_str(), &text, 1 << 20, &why), "fixture: %s is there", path.c_str());
    const nlohmann::json expected = nlohmann::json::parse(text, nullptr, false);
    for (const char* sub : {"untied", "tied", "sharded"}) check_fixture_model(sub, expected[sub]);

    Llama3Config c = llama3_read_hf_config(g_root + "/" + FIXTURE + "/untied/config.json");
    CHECK(c.L == 2 && c.C == 32 && c.H == 4 && c.KV == 2 && c.F == 64 && c.V == 96 && c.max_seq_len == 64 && !c.tied &&
              c.rope_theta == 500000.0 && c.rms_norm_eps == 1e-5 && c.rope_scaling && c.rope_factor == 8.0 &&
              c.rope_low_freq_factor == 1.0 && c.rope_high_freq_factor == 4.0 && c.rope_original_max_seq_len == 16,
          "fixture: untied/config.json (transformers 5's rope_parameters) read as written");
    c = llama3_read_hf_config(g_root + "/" + FIXTURE + "/tied/config.json");
    CHECK(c.L == 1 && c.tied && !c.rope_scaling && c.rope_theta == 500000.0,
          "fixture: tied/config.json: tied, plain RoPE");
    SafetensorsModel sharded(g_root + "/" + FIXTURE + "/sharded");
    CHECK(sharded.num_files() == 3, "fixture: the sharded model is read from its 3 shards (%zu)", sharded.num_files());
}

// ---------------------------------------------------------------------------
// writing and reading back

struct OutTensor {
    std::string name, dtype;
    std::vector<uint64_t> shape;
    std::string bytes;
};
static std::vector<OutTensor> random_tensors(uint32_t seed) {
    std::mt19937 rng(seed);
    std::vector<OutTensor> ts = {{"a.f32", "F32", {3, 5}, ""},    {"b.bf16", "BF16", {7}, ""},
                                 {"c.f16", "F16", {2, 2, 2}, ""}, {"d.i64", "I64", {4}, ""},
                                 {"e.empty", "F32", {0, 9}, ""},  {"f.scalar", "F32", {}, ""},
                                 {"g.big", "BF16", {64, 33}, ""}};
    for (auto& t : ts) {
        uint64_t n = 1;
        for (auto d : t.shape) n *= d;
        t.bytes.resize(n * safetensors_dtype_bytes(t.dtype));
        for (auto& b : t.bytes) b = (char)rng();  // any bits: NaNs and infinities included
    }
    return ts;
}
static std::vector<SafetensorsOut> outs(const std::vector<OutTensor>& ts) {
    std::vector<SafetensorsOut> o;
    for (const auto& t : ts) o.push_back({t.name, t.dtype, t.shape, t.bytes.data()});
    return o;
}
// every tensor of ts has its dtype, shape and exact bytes in m
template <class M>
static int count_mismatches(const M& m, const std::vector<OutTensor>& ts,
                            const std::function<void(const SafetensorsTensor&, std::string*)>& raw) {
    int bad = 0;
    for (const auto& t : ts) {
        const SafetensorsTensor* s = m.find(t.name);
        if (!s || s->dtype != t.dtype || s->shape != t.shape) {
            bad++;
            continue;
        }
        std::string got(t.bytes.size(), '\0');
        raw(*s, &got);
        if (got != t.bytes) bad++;
    }
    return bad;
}

static void test_round_trip() {
    const auto ts = random_tensors(1);
    const std::string p = g_tmp + "/rt.safetensors";
    std::string err = error_of([&] { safetensors_write(p, outs(ts), {{"format", "pt"}, {"step", "7"}}); });
    CHECK(err == NO_ERROR, "round trip: writes a file (%s)", err.c_str());
    SafetensorsFile f(p);
    const int bad = count_mismatches(f, ts, [&](const SafetensorsTensor& s, std::string* out) {
        if (!out->empty()) f.read_bytes(s.begin, &(*out)[0], out->size());
    });
    CHECK(bad == 0 && f.tensors().size() == ts.size(),
          "round trip: every tensor's dtype, shape and bytes back bitwise (%d wrong)", bad);
    CHECK(f.metadata() == (std::map<std::string, std::string>{{"format", "pt"}, {"step", "7"}}),
          "round trip: __metadata__ back");
    const std::string text = read_file(p);
    CHECK(text.size() >= 8 && (8 + (uint8_t)text[0] + 256 * (uint8_t)text[1]) % 8 == 0,
          "round trip: the data section starts 8-byte aligned");

    // sharded
    const std::string dir = g_tmp + "/shards";
    mkdir(dir.c_str(), 0755);
    err = error_of([&] { safetensors_write_model(dir, outs(ts), 4200); });
    CHECK(err == NO_ERROR && exists(dir + "/model.safetensors.index.json") &&
              exists(dir + "/model-00001-of-00002.safetensors") && !exists(dir + "/model.safetensors"),
          "round trip: over max_shard_bytes, shards and an index are written (%s)", err.c_str());
    err = error_of([&] {
        SafetensorsModel m(dir);
        int bad = 0;
        for (const auto& t : ts) {
            const SafetensorsTensor& s = m.get(t.name);
            if (s.dtype != t.dtype || s.shape != t.shape) bad++;
            if (t.dtype == "F32" || t.dtype == "BF16") {
                std::string got(t.bytes.size(), '\0');
                m.read(t.name, t.dtype == "F32" ? SafetensorsTarget::F32 : SafetensorsTarget::BF16, &got[0], s.numel());
                if (got != t.bytes) bad++;
            }
        }
        CHECK(bad == 0 && m.num_files() == 2,
              "round trip: the sharded model reads back bitwise from 2 files (%d wrong)", bad);
    });
    CHECK(err == NO_ERROR, "round trip: the sharded model opens (%s)", err.c_str());
    const std::string one = g_tmp + "/one";
    mkdir(one.c_str(), 0755);
    safetensors_write_model(one, outs(ts), 1 << 20);
    CHECK(exists(one + "/model.safetensors") && !exists(one + "/model.safetensors.index.json"),
          "round trip: under max_shard_bytes, one model.safetensors");

    const auto bad_dtype = std::vector<SafetensorsOut>{{"x", "F33", {1}, ts[0].bytes.data()}};
    err = error_of([&] { safetensors_write(g_tmp + "/bad.safetensors", bad_dtype); });
    CHECK(st_error(err, g_tmp + "/bad.safetensors", "unknown dtype \"F33\"") && !exists(g_tmp + "/bad.safetensors"),
          "write: an unknown dtype is refused, nothing written (%s)", err.c_str());
    const auto dup =
        std::vector<SafetensorsOut>{{"x", "F32", {1}, ts[0].bytes.data()}, {"x", "F32", {1}, ts[0].bytes.data()}};
    err = error_of([&] { safetensors_write(g_tmp + "/dup.safetensors", dup); });
    CHECK(st_error(err, g_tmp + "/dup.safetensors", "reserved or repeated"), "write: a repeated name is refused (%s)",
          err.c_str());
    const auto bad_utf8 = std::vector<SafetensorsOut>{{"x\xff", "F32", {1}, ts[0].bytes.data()}};
    err = error_of([&] { safetensors_write(g_tmp + "/utf8.safetensors", bad_utf8); });
    CHECK(st_error(err, g_tmp + "/utf8.safetensors", "not valid UTF-8"),
          "write: a name that is not UTF-8 is refused (%s)", err.c_str());
}

static void test_no_overwrite() {
    const auto ts = random_tensors(2);
    const std::string p = g_tmp + "/keep.safetensors";
    safetensors_write(p, outs(ts));
    const std::string before = read_file(p);
    std::string err = error_of([&] { safetensors_write(p, outs(random_tensors(3))); });
    CHECK(st_error(err, p, "already exists") && read_file(p) == before,
          "no overwrite: an existing file is refused and unchanged (%s)", err.c_str());
    const std::string target = g_tmp + "/target", link = g_tmp + "/link.safetensors";
    write_file(target, "precious");
    if (symlink(target.c_str(), link.c_str()) != 0) perror("symlink");
    err = error_of([&] { safetensors_write(link, outs(ts)); });
    CHECK(st_error(err, link, "already exists") && read_file(target) == "precious",
          "no overwrite: a symbolic link at the path is refused, its target untouched (%s)", err.c_str());
    const std::string dir = g_tmp + "/taken";
    mkdir(dir.c_str(), 0755);
    write_file(dir + "/model-00002-of-00002.safetensors", "old");
    err = error_of([&] { safetensors_write_model(dir, outs(ts), 4200); });
    CHECK(st_error(err, dir + "/model-00002-of-00002.safetensors", "already exists") &&
              !exists(dir + "/model-00001-of-00002.safetensors") &&
              read_file(dir + "/model-00002-of-00002.safetensors") == "old",
          "no overwrite: a taken shard name refuses the whole model before any shard is written (%s)", err.c_str());
    const std::string cfg = g_tmp + "/config.json";
    write_file(cfg, "{}");
    err = error_of([&] { llama3_write_hf_config(cfg, llama3_parse_descriptor("llama3.2-1b"), "bfloat16"); });
    CHECK(contains_all(err, {cfg, "already exists"}) && read_file(cfg) == "{}",
          "no overwrite: config.json is not overwritten (%s)", err.c_str());
}

static void test_conversions() {
    const uint16_t halves[] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x7c00, 0x8000, 0x0400};
    const float want[] = {1.0f, -2.0f, std::ldexp(1.0f, -24), 65504.0f, INFINITY, -0.0f, std::ldexp(1.0f, -14)};
    int bad = 0;
    for (int i = 0; i < 7; i++)
        if (f16_to_f32(halves[i]) != want[i] || std::signbit(f16_to_f32(halves[i])) != std::signbit(want[i])) bad++;
    CHECK(bad == 0 && std::isnan(f16_to_f32(0x7e00)),
          "conversions: f16 -> f32 (normal, subnormal, max, inf, -0, NaN; %d wrong)", bad);
    CHECK(f32_to_bf16(1.0f + std::ldexp(1.0f, -8)) == 0x3f80 &&
              f32_to_bf16(1.0f + 3 * std::ldexp(1.0f, -8)) == 0x3f82 && f32_to_bf16(-1.0f) == 0xbf80 &&
              std::isnan(bf16_to_f32(f32_to_bf16(NAN))) && bf16_to_f32(0x3f80) == 1.0f,
          "conversions: f32 -> bf16 rounds half to even, keeps NaN a NaN");
    // an F16 tensor read as fp32 and as bf16
    const std::string p = g_tmp + "/f16.safetensors";
    safetensors_write(p, {{"h", "F16", {7}, halves}});
    SafetensorsFile f(p);
    float got[7];
    uint16_t got16[7];
    safetensors_read(f, f.get("h"), SafetensorsTarget::F32, got, 7);
    safetensors_read(f, f.get("h"), SafetensorsTarget::BF16, got16, 7);
    bad = 0;
    for (int i = 0; i < 7; i++)
        if (got[i] != want[i] || got16[i] != f32_to_bf16(want[i])) bad++;
    CHECK(bad == 0, "conversions: an F16 tensor read as fp32 and as bf16 (%d wrong)", bad);
    std::string err = error_of([&] { safetensors_read(f, f.get("h"), SafetensorsTarget::F32, got, 6); });
    CHECK(st_error(err, p, "7 elements, the buffer 6"), "read: a buffer of the wrong size is refused (%s)",
          err.c_str());
    const int64_t ints[2] = {1, 2};
    const std::string q = g_tmp + "/i64.safetensors";
    safetensors_write(q, {{"i", "I64", {2}, ints}});
    SafetensorsFile fi(q);
    err = error_of([&] { safetensors_read(fi, fi.get("i"), SafetensorsTarget::F32, got, 2); });
    CHECK(st_error(err, q, "is I64, which is not converted to F32"), "read: an integer tensor is not converted (%s)",
          err.c_str());
    err = error_of([&] { fi.get("nope"); });
    CHECK(st_error(err, q, "no tensor \"nope\""), "read: a missing name is an error (%s)", err.c_str());
}

// ---------------------------------------------------------------------------
// hostile files

static std::string entry(const std::string& name, const std::string& dtype, const std::string& shape,
                         const std::string& offsets) {
    return "\"" + name + "\":{\"dtype\":\"" + dtype + "\",\"shape\":" + shape + ",\"data_offsets\":" + offsets + "}";
}

static void test_hostile() {
    struct Case {
        const char* what;
        std::string header, data;
        int64_t header_len;
        const char* needle;
    };
    const std::string d8(8, 'x'), d16(16, 'x');
    const std::vector<Case> cases = {
        {"an empty file", "", "", -2, "shorter than the 8-byte header length"},
        {"a truncated header", "{\"a\":{\"dtype\":\"F32\"", "", 100, "past the end of the file"},
        {"a header length of 2^63", "{}", "", (int64_t)1 << 62, "past the end of the file"},
        {"a header of 0 bytes", "", "", 0, "cannot hold a JSON object"},
        {"a JSON array", "[1,2,3]", "", -1, "not a JSON object"},
        {"a JSON string", "\"abc\"", "", -1, "not a JSON object"},
        {"broken JSON", "{\"a\":", "", -1, "not valid JSON"},
        {"a deep nest", "{\"a\":" + std::string(100000, '[') + std::string(100000, ']') + "}", "", -1,
         "nests JSON deeper"},
        {"an unknown dtype", "{" + entry("w", "F33", "[2]", "[0,8]") + "}", d8, -1, "unknown dtype \"F33\""},
        {"a negative dimension", "{" + entry("w", "F32", "[-2]", "[0,8]") + "}", d8, -1, "not an integer >= 0"},
        {"a fractional dimension", "{" + entry("w", "F32", "[2.5]", "[0,8]") + "}", d8, -1, "not an integer >= 0"},
        {"a huge shape product", "{" + entry("w", "F32", "[4294967296,4294967296,2]", "[0,8]") + "}", d8, -1,
         "overflows 64 bits"},
        {"a shape/size mismatch", "{" + entry("w", "F32", "[3]", "[0,8]") + "}", d8, -1,
         "8 bytes of data, its dtype and shape need 12"},
        {"offsets past the end", "{" + entry("w", "F32", "[4]", "[0,16]") + "}", d8, -1, "past the data section's 8"},
        {"offsets past 2^64", "{" + entry("w", "F32", "[4]", "[18446744073709551615,18446744073709551631]") + "}", d8,
         -1, "no data_offsets [begin, end] of integers"},
        {"offsets near 2^64", "{" + entry("w", "F32", "[2]", "[18446744073709551600,18446744073709551608]") + "}", d8,
         -1, "ends at byte 18446744073709551608, past the data section's 8"},
        {"offsets ending before they begin", "{" + entry("w", "F32", "[0]", "[8,0]") + "}", d8, -1,
         "end before they begin"},
        {"overlapping tensors",
         "{" + entry("a", "F32", "[2]", "[0,8]") + "," + entry("b", "F32", "[2]", "[4,12]") + "}", d16, -1,
         "\"a\" and \"b\" overlap"},
        {"a gap", "{" + entry("a", "F32", "[1]", "[0,4]") + "," + entry("b", "F32", "[2]", "[8,16]") + "}", d16, -1,
         "bytes 4..8 of the data section belong to no tensor"},
        {"trailing data", "{" + entry("a", "F32", "[2]", "[0,8]") + "}", d16, -1, "8 bytes past the last tensor"},
        {"a tensor that is not an object", "{\"a\":[1,2]}", "", -1, "tensor \"a\" is not a JSON object"},
        {"a missing dtype", "{\"a\":{\"shape\":[1],\"data_offsets\":[0,4]}}", "", -1, "no dtype string"},
        {"missing data_offsets", "{\"a\":{\"dtype\":\"F32\",\"shape\":[1]}}", "", -1, "no data_offsets"},
        {"three data_offsets", "{" + entry("w", "F32", "[2]", "[0,8,8]") + "}", d8, -1, "no data_offsets"},
        {"an unknown key", "{\"a\":{\"dtype\":\"F32\",\"shape\":[],\"data_offsets\":[0,4],\"x\":1}}", "abcd", -1,
         "unknown key \"x\""},
        {"17 dimensions", "{" + entry("w", "F32", "[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]", "[0,4]") + "}", "abcd", -1,
         "more than 16 dimensions"},
        {"a metadata value that is no string", "{\"__metadata__\":{\"k\":1}}", "", -1,
         "value of \"k\" is not a string"},
        {"a name with a newline and quotes", "{" + entry("a\\n\\\"b", "F33", "[1]", "[0,4]") + "}", "abcd", -1,
         "tensor \"a\\x0a\\x22b\" has an unknown dtype"},
        {"metadata that is no object", "{\"__metadata__\":[]}", "", -1, "__metadata__ is not a JSON object"},
        // padding is spaces only: the JSON parser stops at a NUL, and would take what hides behind it
        {"a header padded with NUL bytes", "{" + entry("w", "F32", "[2]", "[0,8]") + "}" + std::string(4, '\0'), d8, -1,
         "header holds a NUL byte"},
        {"a NUL before a second object", "{" + entry("w", "F32", "[2]", "[0,8]") + "}" + std::string(1, '\0') + "{}",
         d8, -1, "header holds a NUL byte"},
        {"a header padded with a newline", "{" + entry("w", "F32", "[2]", "[0,8]") + "}\n", d8, -1,
         "bytes other than spaces after its JSON object"},
    };
    int i = 0;
    for (const auto& c : cases) {
        const std::string name = "hostile" + std::to_string(i++) + ".safetensors";
        const std::string p = c.header_len == -2 ? (write_file(g_tmp + "/" + name, "abc"), g_tmp + "/" + name)
                                                 : st_file(name, c.header, c.data, c.header_len);
        const std::string err = open_error(p);
        CHECK(st_error(err, p, c.needle), "hostile: %s is one error line (%s)", c.what, err.c_str());
    }
    // a header over the limit, in a sparse file that is long enough for it
    const std::string big = g_tmp + "/big.safetensors";
    write_file(big, le64(SAFETENSORS_MAX_HEADER_BYTES + 1) + "{");
    if (truncate(big.c_str(), (off_t)(SAFETENSORS_MAX_HEADER_BYTES + 16)) != 0) perror("truncate");
    std::string err = open_error(big);
    CHECK(st_error(err, big, "over the limit of 100 MiB"), "hostile: a header over 100 MiB is refused unread (%s)",
          err.c_str());
    CHECK(st_error(open_error(g_tmp + "/absent"), g_tmp + "/absent", "cannot open"),
          "hostile: a missing file is one error line");
    const std::string padded = st_file("padded.safetensors", "{" + entry("w", "F32", "[2]", "[0,8]") + "}    ", d8);
    CHECK(open_error(padded) == NO_ERROR, "valid: a header padded with spaces and __metadata__-free opens");
}

// Every truncation of a real file, and every byte of its header flipped, is an error line or a
// clean open; never a crash (the asan build checks the reads).
static void test_damaged_fixture() {
    const std::string src = read_file(g_root + "/" + FIXTURE + "/untied/model.safetensors");
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = (n << 8) | (uint8_t)src[i];
    const std::string p = g_tmp + "/damaged.safetensors";
    int refused = 0, tried = 0, other = 0;
    for (size_t len = 0; len < src.size(); len += (len < n + 64 ? 1 : 997)) {
        write_file(p, src.substr(0, len));
        const std::string err = open_error(p);
        tried++;
        if (st_error(err, p, "")) refused++;
        else other++;
    }
    CHECK(refused == tried && other == 0, "damage: every one of %d truncations is refused with one line (%d)", tried,
          refused);
    int opened = 0;
    refused = other = 0;
    std::mt19937 rng(5);
    for (int k = 0; k < 400; k++) {
        std::string s = src;
        s[8 + rng() % n] ^= (char)(1 + rng() % 255);
        write_file(p, s);
        const std::string err = open_error(p);
        if (err == NO_ERROR) opened++;
        else if (st_error(err, p, "")) refused++;
        else other++;
    }
    CHECK(other == 0 && refused > 0,
          "damage: 400 header bytes changed: %d refused with one line, %d still valid, 0 other", refused, opened);
}

static void test_hostile_index() {
    const auto ts = random_tensors(4);
    const std::string dir = g_tmp + "/idx";
    mkdir(dir.c_str(), 0755);
    safetensors_write_model(dir, outs(ts), 4200);
    const std::string index = dir + "/model.safetensors.index.json";
    const std::string good = read_file(index);
    struct Case {
        const char* what;
        std::string from, to, needle;
    };
    const std::vector<Case> cases = {
        {"a path in a shard name", "\"a.f32\": \"model-00001-of-00002.safetensors\"",
         "\"a.f32\": \"../model-00001-of-00002.safetensors\"", "not a plain file name"},
        {"a tensor put in the wrong shard", "\"g.big\": \"model-00002-of-00002.safetensors\"",
         "\"g.big\": \"model-00001-of-00002.safetensors\"", "has no tensor \"g.big\""},
        {"a tensor the index leaves out", "\"a.f32\": \"model-00001-of-00002.safetensors\",", "",
         "which the index does not put there"},
        {"a missing shard", "\"a.f32\": \"model-00001-of-00002.safetensors\"", "\"a.f32\": \"model-9.safetensors\"",
         "cannot open"},
        {"no weight_map", "weight_map", "weight_mop", "no weight_map object"},
        {"a shard name with a newline (escaped: the error stays one line)",
         "\"a.f32\": \"model-00001-of-00002.safetensors\"", "\"a.f32\": \"m\\nerror: forged.safetensors\"",
         "/m\\x0aerror: forged.safetensors: cannot open"},
    };
    for (const auto& c : cases) {
        std::string text = good;
        const size_t at = text.find(c.from);
        if (at != std::string::npos) text.replace(at, c.from.size(), c.to);
        unlink(index.c_str());
        write_file(index, text);
        const std::string err = error_of([&] { SafetensorsModel m(dir); });
        CHECK(at != std::string::npos && contains_all(err, {"safetensors: ", c.needle}),
              "hostile index: %s is one error line (%s)", c.what, err.c_str());
    }
}

// ---------------------------------------------------------------------------
// Llama 3 config

static void test_descriptor() {
    Llama3Config c = llama3_parse_descriptor("llama3:L=2,C=64,H=4,KV=2,F=192,V=256");
    CHECK(c.L == 2 && c.C == 64 && c.H == 4 && c.KV == 2 && c.F == 192 && c.V == 256 && c.max_seq_len == 1024 &&
              !c.tied && !c.rope_scaling && c.rope_theta == 500000.0 && c.head_dim() == 16,
          "descriptor: the sizes, and defaults T=1024, theta 500000, untied, plain RoPE");
    c = llama3_parse_descriptor("llama3:L=1,C=32,H=4,KV=4,F=64,V=96,T=64,theta=10000,tied=1,eps=1e-6,factor=8,orig=16");
    CHECK(c.max_seq_len == 64 && c.rope_theta == 10000 && c.tied && c.rms_norm_eps == 1e-6 && c.rope_scaling &&
              c.rope_factor == 8 && c.rope_low_freq_factor == 1 && c.rope_high_freq_factor == 4 &&
              c.rope_original_max_seq_len == 16,
          "descriptor: T, theta, tied, eps, and RoPE scaling with low 1, high 4 by default");
    const std::pair<const char*, const char*> bad[] = {
        {"llama3:C=64,H=4,KV=2,F=192,V=256", "L= is missing"},
        {"llama3:L=2,C=64,H=4,KV=3,F=192,V=256", "KV=3 does not divide H=4"},
        {"llama3:L=2,C=66,H=4,KV=2,F=192,V=256", "H=4 does not divide C=66"},
        {"llama3:L=2,C=12,H=4,KV=2,F=192,V=256", "C/H=3 must be even"},
        {"llama3:L=2,C=abc,H=4,KV=2,F=192,V=256", "C=abc is not an integer"},
        {"llama3:L=2,C=64,H=4,KV=2,F=192,V=256,theta=x", "theta=x is not a number"},
        {"llama3:L=0,C=64,H=4,KV=2,F=192,V=256", "L must be > 0"},
        {"llama3:L=2,C=64,H=4,KV=2,F=192,V=256,Q=1", "unknown key Q="},
        {"llama3:L=2,C=64,H=4,KV=2,F=192,V=256,low=2", "low= needs factor="},
        {"llama3:L=2,L=3,C=64,H=4,KV=2,F=192,V=256", "L is given twice"},
        {"llama3:L=2,C=64,H=4,KV=2,F=192,V=256,tied=2", "tied=2 is not 0 or 1"},
        {"llama3:L=2,C=64,H=4,KV=2,F=192,V=256,factor=8,low=4,high=1", "0 < low < high"},
        {"llama3:L=2,,C=64", "\"\" is not KEY=VALUE"},
        {"llama3:L=2,C=64,H=4,KV=2,F=192,V=256,", "\"\" is not KEY=VALUE"},
        {"llama3:L=99999999999,C=64,H=4,KV=2,F=192,V=256", "L=99999999999 is not an integer"},
        {"gpt2:d12", "not a Llama 3 model"},
        {"llama3.2-2b", "not a Llama 3 model"},
    };
    for (const auto& b : bad) {
        const std::string err = error_of([&] { llama3_parse_descriptor(b.first); });
        CHECK(contains_all(err, {b.first, b.second}), "descriptor: %s -> %s", b.first, err.c_str());
    }
}

static void test_named_sizes() {
    // The counts are the sums of the published checkpoints' tensors (1B: 1,235,814,400 as the
    // model card's 1.23B; 3B: 3.21B; 8B: 8.03B; 70B: 70.55B), which llama3_param_table's shapes must add up to.
    const std::pair<const char*, uint64_t> sizes[] = {{"llama3.2-1b", 1235814400ull},
                                                      {"llama3.2-3b", 3212749824ull},
                                                      {"llama3.1-8b", 8030261248ull},
                                                      {"llama3.1-70b", 70553706496ull}};
    for (const auto& s : sizes) {
        const Llama3Config c = llama3_parse_descriptor(s.first);
        const uint64_t n = llama3_num_parameters(c);
        CHECK(n == s.second, "named: %s has %llu parameters (expected %llu)", s.first, (unsigned long long)n,
              (unsigned long long)s.second);
    }
    const Llama3Config b1 = llama3_parse_descriptor("llama3.2-1b");
    CHECK(b1.tied && b1.head_dim() == 64 && b1.rope_factor == 32 && b1.rope_original_max_seq_len == 8192 &&
              b1.KV == 8 && b1.rope_theta == 500000 && b1.max_seq_len == 131072,
          "named: llama3.2-1b is tied, head 64, factor 32 over 8192 positions, 8 kv heads");
    const Llama3Config b8 = llama3_parse_descriptor("llama3.1-8b");
    const auto table = llama3_param_table(b8);
    CHECK(!b8.tied && table.back().name == "lm_head.weight" && table.size() == 1 + 32 * 9 + 2 &&
              table[3].name == "model.layers.0.self_attn.k_proj.weight" &&
              table[3].shape == (std::vector<uint64_t>{1024, 4096}),
          "named: llama3.1-8b's table: lm_head last, k_proj [1024, 4096], %zu tensors", table.size());
    const Llama3Config b70 = llama3_parse_descriptor("llama3.1-70b");
    CHECK(!b70.tied && b70.head_dim() == 128 && b70.KV == 8 && b70.rope_theta == 500000 && b70.rope_scaling &&
              b70.rope_factor == 8 && b70.rope_low_freq_factor == 1 && b70.rope_high_freq_factor == 4 &&
              b70.rope_original_max_seq_len == 8192 && b70.max_seq_len == 131072,
          "named: llama3.1-70b is untied, head 128, 8 kv heads, theta 500000, factor 8 (low 1, high 4) over 8192 "
          "positions");
}

static void test_config_json() {
    int i = 0;
    for (const char* d : {"llama3.2-1b", "llama3.2-3b", "llama3.1-8b", "llama3.1-70b",
                          "llama3:L=2,C=64,H=4,KV=2,F=192,V=256,theta=10000"}) {
        const Llama3Config c = llama3_parse_descriptor(d);
        const std::string p = g_tmp + "/config" + std::to_string(i++) + ".json";
        Llama3Config back;
        const std::string err = error_of([&] {
            llama3_write_hf_config(p, c, "bfloat16");
            back = llama3_read_hf_config(p);
        });
        CHECK(err == NO_ERROR && back == c, "config.json: %s written and read back equal (%s)", d, err.c_str());
    }
    const nlohmann::json base = llama3_to_hf_json(llama3_parse_descriptor("llama3.2-1b"), "bfloat16");
    CHECK(base["rope_scaling"]["rope_type"] == "llama3" && base["head_dim"] == 64 && base["num_key_value_heads"] == 8 &&
              base["tie_word_embeddings"] == true && base["architectures"][0] == "LlamaForCausalLM",
          "config.json: LlamaConfig's keys (rope_scaling llama3, head_dim, num_key_value_heads, tie_word_embeddings)");
    struct Bad {
        const char* what;
        const char* key;
        nlohmann::json value;
        const char* needle;
    };
    const std::vector<Bad> bads = {
        {"attention_bias", "attention_bias", true, "attention_bias is not supported"},
        {"mlp_bias", "mlp_bias", true, "mlp_bias is not supported"},
        {"rope type yarn",
         "rope_scaling",
         {{"rope_type", "yarn"}, {"factor", 4.0}},
         "rope_type \"yarn\" is not supported"},
        {"rope type linear (old key)", "rope_scaling", {{"type", "linear"}, {"factor", 4.0}}, "rope_type \"linear\""},
        {"a rope type of two lines (quoted: the error stays one line)",
         "rope_scaling",
         {{"rope_type", "two\nlines\x1b"}, {"factor", 4.0}},
         "rope_type \"two\\x0alines\\x1b\" is not supported"},
        {"llama3 rope without factor",
         "rope_scaling",
         {{"rope_type", "llama3"}, {"original_max_position_embeddings", 8192}},
         "needs factor"},
        {"a head_dim other than C/H", "head_dim", 128, "head_dim 128 is not hidden_size / num_attention_heads = 64"},
        {"another architecture", "architectures", {"MistralForCausalLM"}, "architectures is not"},
        {"another activation", "hidden_act", "gelu", "hidden_act is not \"silu\""},
        {"pretraining_tp 2", "pretraining_tp", 2, "pretraining_tp 2 is not supported"},
        {"a string hidden_size", "hidden_size", "2048", "hidden_size is not an integer"},
        {"no hidden_size", "hidden_size", nullptr, "hidden_size is missing"},
        {"KV not dividing H", "num_key_value_heads", 5, "KV=5 does not divide H=32"},
        {"tie_word_embeddings not a bool", "tie_word_embeddings", 1, "tie_word_embeddings is not true or false"},
        // RoPE as transformers reads it: what a version would read otherwise, or compute without, is refused
        {"a factor without a rope type", "rope_scaling", {{"factor", 8.0}}, "with \"factor\" but no rope_type"},
        {"a rope type that is a number",
         "rope_scaling",
         {{"rope_type", 3}, {"factor", 8.0}},
         "rope_type is not a string"},
        {"rope_type and type that disagree",
         "rope_scaling",
         {{"rope_type", "linear"}, {"type", "llama3"}, {"factor", 8.0}},
         "rope_type \"linear\" and type \"llama3\" disagree"},
        {"a factor with the default type",
         "rope_scaling",
         {{"rope_type", "default"}, {"factor", 8.0}},
         "\"factor\" is not used by rope_type default"},
        {"a llama3 key the trainer does not compute",
         "rope_scaling",
         {{"rope_type", "llama3"},
          {"factor", 8.0},
          {"low_freq_factor", 1.0},
          {"high_freq_factor", 4.0},
          {"original_max_position_embeddings", 8192},
          {"attention_factor", 2.0}},
         "\"attention_factor\" is not used by rope_type llama3"},
        {"rope_parameters unlike rope_scaling",
         "rope_parameters",
         {{"rope_type", "default"}, {"rope_theta", 500000.0}},
         "rope_parameters and rope_scaling are both given and differ"},
        {"attention dropout", "attention_dropout", 0.1, "\"attention_dropout\" \"0.1\" is not supported"},
        {"hidden dropout", "hidden_dropout", 0.5, "\"hidden_dropout\" \"0.5\" is not supported"},
        {"a dropout that is a string", "attention_dropout", "0", "\"attention_dropout\" \"\\x220\\x22\""},
    };
    for (const auto& b : bads) {
        nlohmann::json j = base;
        j[b.key] = b.value;
        const std::string err = error_of([&] { llama3_from_hf_json(j, "cfg.json"); });
        CHECK(contains_all(err, {"cfg.json: ", b.needle}), "config.json refuses %s (%s)", b.what, err.c_str());
    }
    nlohmann::json two_thetas = base;
    two_thetas.erase("rope_scaling");
    two_thetas["rope_parameters"] = {{"rope_type", "default"}, {"rope_theta", 500000.0}};
    two_thetas["rope_theta"] = 10000.0;
    std::string err = error_of([&] { llama3_from_hf_json(two_thetas, "cfg.json"); });
    CHECK(contains_all(err, {"cfg.json: rope_theta and rope_parameters's rope_theta differ"}),
          "config.json refuses two different thetas (%s)", err.c_str());
    nlohmann::json both = base;
    both["rope_parameters"] = base["rope_scaling"];
    both["rope_parameters"]["type"] = "llama3";
    both["rope_scaling"] = both["rope_parameters"];
    Llama3Config read;
    err = error_of([&] { read = llama3_from_hf_json(both, "cfg.json"); });
    CHECK(err == NO_ERROR && read == llama3_parse_descriptor("llama3.2-1b"),
          "config.json: rope_parameters equal to rope_scaling, and type equal to rope_type, read as given (%s)",
          err.c_str());
    CHECK(llama3_rope_text(read) == "rope theta 500000, llama3 scaling (factor 32, low 1, high 4, original 8192)" &&
              llama3_rope_text(llama3_parse_descriptor("llama3:L=1,C=32,H=4,KV=4,F=64,V=96,theta=10000")) ==
                  "rope theta 10000, no scaling",
          "config.json: the model line's RoPE text names theta and every scaling field (%s)",
          llama3_rope_text(read).c_str());
    nlohmann::json minimal = base;
    for (const char* k :
         {"num_key_value_heads", "rope_theta", "rms_norm_eps", "tie_word_embeddings", "rope_scaling", "head_dim"})
        minimal.erase(k);
    const Llama3Config m = llama3_from_hf_json(minimal, "cfg.json");
    CHECK(m.KV == m.H && m.rope_theta == 10000 && m.rms_norm_eps == 1e-6 && !m.tied && !m.rope_scaling,
          "config.json: absent keys take LlamaConfig's defaults (KV=H, theta 10000, eps 1e-6, untied, plain RoPE)");
}

// Runs one test function; an error it does not expect is a FAIL line, not an abort.
static void guarded(const char* name, void (*test)()) {
    const std::string err = error_of(test);
    CHECK(err == NO_ERROR, "%s ran to its end (%s)", name, err.c_str());
}

int main() {
    char cwd[4096];
    if (!getcwd(cwd, sizeof cwd)) return 2;
    g_root = cwd;
    char tmpl[] = "/tmp/test_safetensors.XXXXXX";
    if (!mkdtemp(tmpl)) {
        perror("mkdtemp");
        return 2;
    }
    g_tmp = tmpl;

    TEST_CASE(guarded("test_fixture", test_fixture));
    TEST_CASE(guarded("test_round_trip", test_round_trip));
    TEST_CASE(guarded("test_no_overwrite", test_no_overwrite));
    TEST_CASE(guarded("test_conversions", test_conversions));
    TEST_CASE(guarded("test_hostile", test_hostile));
    TEST_CASE(guarded("test_damaged_fixture", test_damaged_fixture));
    TEST_CASE(guarded("test_hostile_index", test_hostile_index));
    TEST_CASE(guarded("test_descriptor", test_descriptor));
    TEST_CASE(guarded("test_named_sizes", test_named_sizes));
    TEST_CASE(guarded("test_config_json", test_config_json));

    std::string cmd = "rm -rf '" + g_tmp + "'";
    if (system(cmd.c_str()) != 0) printf("note: could not remove %s\n", g_tmp.c_str());
    return test_summary("test_safetensors");
}
