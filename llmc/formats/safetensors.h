// Hugging Face's safetensors format: reading (one tensor at a time, into a caller's buffer,
// converted to fp32 or bf16) and writing (one file, or shards with their index), header-only.
//
// A file is: 8 bytes N (uint64, little-endian), N bytes of a UTF-8 JSON object (it starts with
// '{' and may be padded at the end with spaces, 0x20 only: no NUL, no other blank), then the
// data section. The object maps each tensor name to {"dtype": "F32", "shape": [d0, d1, ...],
// "data_offsets": [begin, end]}, byte offsets into the data section; the optional key
// "__metadata__" maps strings to strings. The tensors tile the data section exactly (no gaps,
// no overlaps), as the reference implementation requires. A sharded model is a folder of such
// files and model.safetensors.index.json, whose "weight_map" names the file of each tensor.
//
// The reader treats a file as hostile: the whole header is checked (its length against the
// file and MAX_HEADER_BYTES, its nesting depth, the JSON, every dtype, shape product, byte
// range and their tiling) before any tensor data is read or any buffer is sized from it.
// Errors follow llmc/error.h: one line "safetensors: FILE: what is wrong".
//
// The writer never overwrites: a path that exists (a link included) is refused, and each file
// is written through write_file_atomic (llmc/formats/checkpoint.h: an exclusive temporary, fsync,
// rename). An index is written after its shards, so a folder with an index has all of them.
#pragma once

#include <nlohmann/json.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "llmc/formats/checkpoint.h"
#include "llmc/error.h"
#include "llmc/formats/regular_file.h"

namespace llmc {

constexpr uint64_t SAFETENSORS_MAX_HEADER_BYTES = 100ull << 20;  // the reference reader's limit
constexpr int SAFETENSORS_MAX_JSON_DEPTH = 8;                     // a valid header has depth 3
constexpr int SAFETENSORS_MAX_DIMS = 16;

// file escaped: a shard's name comes from the index, a file
[[noreturn]] inline void safetensors_fail_(const std::string& file, const std::string& what) {
    fail("safetensors: " + escape_for_error(file) + ": " + what);
}

// Bytes per element of a safetensors dtype name; 0 when the name is not one.
inline size_t safetensors_dtype_bytes(const std::string& dtype) {
    static const std::map<std::string, size_t> sizes = {
        {"BOOL", 1}, {"U8", 1},  {"I8", 1},  {"F8_E5M2", 1}, {"F8_E4M3", 1}, {"I16", 2}, {"U16", 2}, {"F16", 2},
        {"BF16", 2}, {"I32", 4}, {"U32", 4}, {"F32", 4},     {"I64", 8},     {"U64", 8}, {"F64", 8}};
    auto it = sizes.find(dtype);
    return it == sizes.end() ? 0 : it->second;
}

struct SafetensorsTensor {
    std::string name;
    std::string dtype;
    std::vector<uint64_t> shape;
    uint64_t begin = 0, end = 0;  // byte range in the data section
    uint64_t numel() const {
        uint64_t n = 1;
        for (uint64_t d : shape) n *= d;  // cannot overflow: checked when the header was read
        return n;
    }
};

// The number of elements of shape, false when it overflows uint64 together with elem_bytes.
inline bool safetensors_shape_bytes_(const std::vector<uint64_t>& shape, size_t elem_bytes, uint64_t* bytes) {
    uint64_t n = elem_bytes;
    for (uint64_t d : shape)
        if (__builtin_mul_overflow(n, d, &n)) return false;
    *bytes = n;
    return true;
}

// ---------------------------------------------------------------------------
// the header

// The deepest nesting of [ and { outside strings; stops counting past limit, so a hostile header
// never reaches nlohmann's recursive destructor with a deep tree.
inline int safetensors_json_depth_(const std::string& s, int limit) {
    int depth = 0, deepest = 0;
    bool in_string = false;
    for (size_t i = 0; i < s.size(); i++) {
        const char c = s[i];
        if (in_string) {
            if (c == '\\') i++;
            else if (c == '"') in_string = false;
        } else if (c == '"') {
            in_string = true;
        } else if (c == '{' || c == '[') {
            deepest = std::max(deepest, ++depth);
            if (deepest > limit) return deepest;
        } else if (c == '}' || c == ']') {
            depth--;
        }
    }
    return deepest;
}

inline SafetensorsTensor safetensors_parse_entry_(const std::string& file, const std::string& name,
                                                  const nlohmann::json& e) {
    const std::string at = "tensor " + quote_for_error(name);
    if (!e.is_object()) safetensors_fail_(file, at + " is not a JSON object");
    for (auto it = e.begin(); it != e.end(); ++it)
        if (it.key() != "dtype" && it.key() != "shape" && it.key() != "data_offsets")
            safetensors_fail_(file, at + " has an unknown key " + quote_for_error(it.key()));
    SafetensorsTensor t;
    t.name = name;
    auto dt = e.find("dtype");
    if (dt == e.end() || !dt->is_string()) safetensors_fail_(file, at + " has no dtype string");
    t.dtype = dt->get<std::string>();
    const size_t elem = safetensors_dtype_bytes(t.dtype);
    if (elem == 0) safetensors_fail_(file, at + " has an unknown dtype " + quote_for_error(t.dtype));
    auto sh = e.find("shape");
    if (sh == e.end() || !sh->is_array()) safetensors_fail_(file, at + " has no shape array");
    if (sh->size() > SAFETENSORS_MAX_DIMS) safetensors_fail_(file, at + " has more than 16 dimensions");
    for (const auto& d : *sh) {
        if (!d.is_number_unsigned()) safetensors_fail_(file, at + " has a shape entry that is not an integer >= 0");
        t.shape.push_back(d.get<uint64_t>());
    }
    auto off = e.find("data_offsets");
    if (off == e.end() || !off->is_array() || off->size() != 2 || !(*off)[0].is_number_unsigned() ||
        !(*off)[1].is_number_unsigned())
        safetensors_fail_(file, at + " has no data_offsets [begin, end] of integers >= 0");
    t.begin = (*off)[0].get<uint64_t>();
    t.end = (*off)[1].get<uint64_t>();
    if (t.end < t.begin) safetensors_fail_(file, at + " has data_offsets that end before they begin");
    uint64_t bytes = 0;
    if (!safetensors_shape_bytes_(t.shape, elem, &bytes))
        safetensors_fail_(file, at + " has a shape whose size overflows 64 bits");
    if (t.end - t.begin != bytes)
        safetensors_fail_(file, at + " has " + std::to_string(t.end - t.begin) +
                                    " bytes of data, its dtype and shape need " + std::to_string(bytes));
    return t;
}

// The tensors must tile [0, data_bytes): sorted by offset, each begins where the last ended.
inline void safetensors_check_tiling_(const std::string& file, std::vector<SafetensorsTensor>* tensors,
                                      uint64_t data_bytes) {
    std::sort(tensors->begin(), tensors->end(), [](const SafetensorsTensor& a, const SafetensorsTensor& b) {
        return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
    });
    uint64_t at = 0;
    const SafetensorsTensor* last = nullptr;
    for (const auto& t : *tensors) {
        if (t.end > data_bytes)
            safetensors_fail_(file, "tensor " + quote_for_error(t.name) + " ends at byte " + std::to_string(t.end) +
                                        ", past the data section's " + std::to_string(data_bytes));
        if (t.begin < at)
            safetensors_fail_(file, "tensors " + quote_for_error(last->name) + " and " + quote_for_error(t.name) +
                                        " overlap");
        if (t.begin > at)
            safetensors_fail_(file, "bytes " + std::to_string(at) + ".." + std::to_string(t.begin) +
                                        " of the data section belong to no tensor");
        at = t.end;
        last = &t;
    }
    if (at != data_bytes)
        safetensors_fail_(file,
                          "the data section has " + std::to_string(data_bytes - at) + " bytes past the last tensor");
}

// One open safetensors file with its checked header. Move-only: it owns the descriptor.
class SafetensorsFile {
  public:
    SafetensorsFile() = default;
    explicit SafetensorsFile(const std::string& path) : path_(path) {
        std::string why;
        fd_ = open_regular_file(path.c_str(), &why);
        if (fd_ < 0) safetensors_fail_(path, "cannot open (" + why + ")");
        try {
            read_header_();
        } catch (...) {
            close(fd_);
            fd_ = -1;
            throw;
        }
    }
    SafetensorsFile(SafetensorsFile&& o) noexcept { *this = std::move(o); }
    SafetensorsFile& operator=(SafetensorsFile&& o) noexcept {
        std::swap(fd_, o.fd_);
        std::swap(path_, o.path_);
        std::swap(file_bytes_, o.file_bytes_);
        std::swap(data_start_, o.data_start_);
        std::swap(tensors_, o.tensors_);
        std::swap(index_, o.index_);
        std::swap(metadata_, o.metadata_);
        return *this;
    }
    SafetensorsFile(const SafetensorsFile&) = delete;
    SafetensorsFile& operator=(const SafetensorsFile&) = delete;
    ~SafetensorsFile() {
        if (fd_ >= 0) close(fd_);
    }

    const std::string& path() const { return path_; }
    // In data order.
    const std::vector<SafetensorsTensor>& tensors() const { return tensors_; }
    const std::map<std::string, std::string>& metadata() const { return metadata_; }
    // null when the file has no tensor of that name
    const SafetensorsTensor* find(const std::string& name) const {
        auto it = index_.find(name);
        return it == index_.end() ? nullptr : &tensors_[it->second];
    }
    const SafetensorsTensor& get(const std::string& name) const {
        const SafetensorsTensor* t = find(name);
        if (!t) safetensors_fail_(path_, "no tensor " + quote_for_error(name));
        return *t;
    }

    // The raw bytes of [offset, offset + n) of the data section into dst.
    void read_bytes(uint64_t offset, void* dst, size_t n) const {
        char* p = (char*)dst;
        uint64_t at = data_start_ + offset;
        while (n > 0) {
            const ssize_t got = pread(fd_, p, std::min(n, (size_t)1 << 30), (off_t)at);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0)
                safetensors_fail_(path_, got == 0 ? "is shorter than when it was opened"
                                                  : "read failed (" + std::string(strerror(errno)) + ")");
            p += got;
            at += (uint64_t)got;
            n -= (size_t)got;
        }
    }

  private:
    void read_header_() {
        struct stat st;
        if (fstat(fd_, &st) != 0) safetensors_fail_(path_, "cannot stat (" + std::string(strerror(errno)) + ")");
        file_bytes_ = (uint64_t)st.st_size;
        if (file_bytes_ < 8)
            safetensors_fail_(path_,
                              "is " + std::to_string(file_bytes_) + " bytes, shorter than the 8-byte header length");
        uint64_t n = 0;
        unsigned char len[8];
        if (pread(fd_, len, 8, 0) != 8) safetensors_fail_(path_, "cannot read the header length");
        for (int i = 7; i >= 0; i--) n = (n << 8) | len[i];
        if (n > file_bytes_ - 8)
            safetensors_fail_(path_, "header length " + std::to_string(n) + " is past the end of the file (" +
                                         std::to_string(file_bytes_) + " bytes)");
        if (n > SAFETENSORS_MAX_HEADER_BYTES)
            safetensors_fail_(path_, "header length " + std::to_string(n) + " is over the limit of 100 MiB");
        if (n < 2) safetensors_fail_(path_, "header of " + std::to_string(n) + " bytes cannot hold a JSON object");
        std::string text(n, '\0');
        data_start_ = 8 + n;
        uint64_t at = 8;
        size_t left = n;
        char* p = &text[0];
        while (left > 0) {
            const ssize_t got = pread(fd_, p, left, (off_t)at);
            if (got < 0 && errno == EINTR) continue;
            if (got <= 0) safetensors_fail_(path_, "cannot read the header");
            p += got;
            at += (uint64_t)got;
            left -= (size_t)got;
        }
        parse_header_(text);
    }

    void parse_header_(const std::string& text) {
        if (text[0] != '{') safetensors_fail_(path_, "header is not a JSON object (it must begin with '{')");
        // the JSON parser ends its input at a NUL byte, so one would hide whatever follows it
        if (text.find('\0') != std::string::npos) safetensors_fail_(path_, "header holds a NUL byte");
        if (safetensors_json_depth_(text, SAFETENSORS_MAX_JSON_DEPTH) > SAFETENSORS_MAX_JSON_DEPTH)
            safetensors_fail_(path_, "header nests JSON deeper than a safetensors header can");
        const nlohmann::json h = nlohmann::json::parse(text, nullptr, /*allow_exceptions=*/false);
        if (h.is_discarded()) safetensors_fail_(path_, "header is not valid JSON");
        if (text[text.find_last_not_of(' ')] != '}')  // JSON's other blanks (\n, \t) too
            safetensors_fail_(path_, "header has bytes other than spaces after its JSON object");
        if (!h.is_object()) safetensors_fail_(path_, "header is not a JSON object");
        for (auto it = h.begin(); it != h.end(); ++it) {
            if (it.key() == "__metadata__") {
                parse_metadata_(it.value());
                continue;
            }
            tensors_.push_back(safetensors_parse_entry_(path_, it.key(), it.value()));
        }
        safetensors_check_tiling_(path_, &tensors_, file_bytes_ - data_start_);
        for (size_t i = 0; i < tensors_.size(); i++) index_[tensors_[i].name] = i;
    }

    void parse_metadata_(const nlohmann::json& m) {
        if (!m.is_object()) safetensors_fail_(path_, "__metadata__ is not a JSON object");
        for (auto it = m.begin(); it != m.end(); ++it) {
            if (!it.value().is_string())
                safetensors_fail_(path_, "__metadata__ value of " + quote_for_error(it.key()) + " is not a string");
            metadata_[it.key()] = it.value().get<std::string>();
        }
    }

    int fd_ = -1;
    std::string path_;
    uint64_t file_bytes_ = 0, data_start_ = 0;
    std::vector<SafetensorsTensor> tensors_;
    std::map<std::string, size_t> index_;
    std::map<std::string, std::string> metadata_;
};

// ---------------------------------------------------------------------------
// element conversions (IEEE bit patterns; NaN stays NaN)

inline float bf16_to_f32(uint16_t b) {
    const uint32_t u = (uint32_t)b << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
// round to nearest even, as PyTorch's .to(torch.bfloat16)
inline uint16_t f32_to_bf16(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((u >> 16) | 0x0040u);  // quiet NaN, sign kept
    u += 0x7fffu + ((u >> 16) & 1u);
    return (uint16_t)(u >> 16);
}
inline float f16_to_f32(uint16_t h) {
    const uint32_t sign = (uint32_t)(h & 0x8000u) << 16;
    uint32_t exp = (h >> 10) & 0x1fu, man = h & 0x3ffu, u;
    if (exp == 0x1f) {
        u = sign | 0x7f800000u | (man << 13);
    } else if (exp != 0) {
        u = sign | ((exp + 112) << 23) | (man << 13);
    } else if (man == 0) {
        u = sign;
    } else {  // subnormal: normalise
        int e = 113;
        while (!(man & 0x400u)) {
            man <<= 1;
            e--;
        }
        u = sign | ((uint32_t)e << 23) | ((man & 0x3ffu) << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

enum class SafetensorsTarget { F32, BF16 };

// Reads tensor t of file into dst, count elements of target type, converting from F32, BF16
// or F16, a chunk at a time (no copy of the whole tensor is held).
inline void safetensors_read(const SafetensorsFile& file, const SafetensorsTensor& t, SafetensorsTarget target,
                             void* dst, size_t count) {
    if (count != t.numel())
        safetensors_fail_(file.path(), "tensor " + quote_for_error(t.name) + " has " + std::to_string(t.numel()) +
                                           " elements, the buffer " + std::to_string(count));
    const size_t elem = safetensors_dtype_bytes(t.dtype);
    const bool same = (t.dtype == "F32" && target == SafetensorsTarget::F32) ||
                      (t.dtype == "BF16" && target == SafetensorsTarget::BF16);
    if (same) {
        file.read_bytes(t.begin, dst, count * elem);
        return;
    }
    if (t.dtype != "F32" && t.dtype != "BF16" && t.dtype != "F16")
        safetensors_fail_(file.path(), "tensor " + quote_for_error(t.name) + " is " + t.dtype +
                                           ", which is not converted to " +
                                           (target == SafetensorsTarget::F32 ? "F32" : "BF16"));
    const size_t chunk = 1 << 16;
    std::vector<unsigned char> buf(chunk * elem);
    for (size_t i = 0; i < count; i += chunk) {
        const size_t n = std::min(chunk, count - i);
        file.read_bytes(t.begin + i * elem, buf.data(), n * elem);
        for (size_t j = 0; j < n; j++) {
            float f;
            uint16_t h;
            if (t.dtype == "F32") {
                memcpy(&f, &buf[j * 4], 4);
            } else {
                memcpy(&h, &buf[j * 2], 2);
                f = t.dtype == "BF16" ? bf16_to_f32(h) : f16_to_f32(h);
            }
            if (target == SafetensorsTarget::F32) ((float*)dst)[i + j] = f;
            else ((uint16_t*)dst)[i + j] = f32_to_bf16(f);
        }
    }
}

// ---------------------------------------------------------------------------
// a model folder: model.safetensors, or shards named by model.safetensors.index.json

class SafetensorsModel {
  public:
    explicit SafetensorsModel(const std::string& dir) : dir_(dir) {
        const std::string index = dir + "/model.safetensors.index.json";
        struct stat st;
        if (stat(index.c_str(), &st) == 0) {
            open_sharded_(index);
        } else {
            files_.emplace_back(dir + "/model.safetensors");
            for (const auto& t : files_[0].tensors()) where_[t.name] = 0;
        }
    }
    // Every tensor name, sorted.
    std::vector<std::string> names() const {
        std::vector<std::string> n;
        for (const auto& w : where_) n.push_back(w.first);
        return n;
    }
    const SafetensorsTensor* find(const std::string& name) const {
        auto it = where_.find(name);
        return it == where_.end() ? nullptr : files_[it->second].find(name);
    }
    const SafetensorsTensor& get(const std::string& name) const {
        const SafetensorsTensor* t = find(name);
        if (!t) safetensors_fail_(dir_, "no tensor " + quote_for_error(name));
        return *t;
    }
    void read(const std::string& name, SafetensorsTarget target, void* dst, size_t count) const {
        const SafetensorsTensor& t = get(name);
        safetensors_read(files_[where_.at(name)], t, target, dst, count);
    }
    size_t num_files() const { return files_.size(); }

  private:
    void open_sharded_(const std::string& index) {
        std::string text, why;
        if (!read_regular_file(index.c_str(), &text, SAFETENSORS_MAX_HEADER_BYTES, &why))
            safetensors_fail_(index, "cannot read (" + why + ")");
        if (safetensors_json_depth_(text, SAFETENSORS_MAX_JSON_DEPTH) > SAFETENSORS_MAX_JSON_DEPTH)
            safetensors_fail_(index, "nests JSON deeper than an index can");
        const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
        if (j.is_discarded() || !j.is_object()) safetensors_fail_(index, "is not a JSON object");
        auto wm = j.find("weight_map");
        if (wm == j.end() || !wm->is_object()) safetensors_fail_(index, "has no weight_map object");
        std::map<std::string, size_t> file_of;  // shard name -> index in files_
        std::map<std::string, std::string> shard_of;
        for (auto it = wm->begin(); it != wm->end(); ++it) {
            if (!it.value().is_string())
                safetensors_fail_(index, "weight_map entry " + quote_for_error(it.key()) + " is not a file name");
            const std::string shard = it.value().get<std::string>();
            // a shard lives in the folder itself: no path, no hidden or parent names
            if (shard.empty() || shard[0] == '.' || shard.find('/') != std::string::npos)
                safetensors_fail_(index, "weight_map names the file " + quote_for_error(shard) +
                                             ", which is not a plain file name");
            shard_of[it.key()] = shard;
            if (!file_of.count(shard)) {
                file_of[shard] = files_.size();
                files_.emplace_back(dir_ + "/" + shard);
            }
        }
        for (const auto& s : shard_of) {
            const SafetensorsFile& f = files_[file_of[s.second]];
            if (!f.find(s.first))
                safetensors_fail_(f.path(),
                                  "has no tensor " + quote_for_error(s.first) + ", which the index puts there");
            where_[s.first] = file_of[s.second];
        }
        for (size_t k = 0; k < files_.size(); k++)
            for (const auto& t : files_[k].tensors()) {
                auto w = where_.find(t.name);
                if (w == where_.end() || w->second != k)
                    safetensors_fail_(files_[k].path(), "has the tensor " + quote_for_error(t.name) +
                                                            ", which the index does not put there");
            }
    }

    std::string dir_;
    std::vector<SafetensorsFile> files_;
    std::map<std::string, size_t> where_;  // tensor name -> index in files_
};

// ---------------------------------------------------------------------------
// writing

struct SafetensorsOut {
    std::string name;
    std::string dtype;
    std::vector<uint64_t> shape;
    const void* data;  // numel * dtype bytes, as stored
};

inline uint64_t safetensors_out_bytes_(const std::string& file, const SafetensorsOut& t) {
    const size_t elem = safetensors_dtype_bytes(t.dtype);
    if (elem == 0)
        safetensors_fail_(file,
                          "tensor " + quote_for_error(t.name) + " has an unknown dtype " + quote_for_error(t.dtype));
    uint64_t bytes = 0;
    if (!safetensors_shape_bytes_(t.shape, elem, &bytes))
        safetensors_fail_(file, "tensor " + quote_for_error(t.name) + " has a shape whose size overflows 64 bits");
    return bytes;
}

[[noreturn]] inline void safetensors_exists_(const std::string& path) {
    safetensors_fail_(path, "already exists; a saved file is never overwritten");
}
inline bool safetensors_path_taken_(const std::string& path) {
    struct stat st;
    return lstat(path.c_str(), &st) == 0;
}

// Writes tensors (in this order) with metadata to path through an exclusive
// temporary, fsync and rename (write_file_hashed), replacing what path held: a
// checkpoint rewriting the model file of a step whose DONE it has removed, as
// the llm.c-format model files are rewritten. Returns the file's name, size and
// hash (the DONE record lists them).
inline CheckpointFile safetensors_write_replacing(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                                                  const std::map<std::string, std::string>& metadata = {}) {
    nlohmann::json h = nlohmann::json::object();
    if (!metadata.empty()) h["__metadata__"] = metadata;
    uint64_t at = 0;
    for (const auto& t : tensors) {
        if (t.name == "__metadata__" || h.contains(t.name))
            safetensors_fail_(path, "tensor name " + quote_for_error(t.name) + " is reserved or repeated");
        const uint64_t bytes = safetensors_out_bytes_(path, t);
        h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {at, at + bytes}}};
        at += bytes;
    }
    std::string text;
    try {
        text = h.dump();
    } catch (const nlohmann::json::exception&) {  // a name or metadata that is not UTF-8
        safetensors_fail_(path, "a tensor name or metadata string is not valid UTF-8");
    }
    text.resize((text.size() + 7) / 8 * 8, ' ');  // the data section starts 8-aligned
    return write_file_hashed(path, [&](HashingWriter& w) {
        unsigned char len[8];
        for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)text.size() >> (8 * i));
        if (!w.put(len, 1, 8) || !w.put(text.data(), 1, text.size())) return false;
        for (const auto& t : tensors)
            if (!w.put(t.data, 1, safetensors_out_bytes_(path, t))) return false;
        return true;
    });
}

// The same, to a path that must not exist (a saved model is never overwritten).
inline CheckpointFile safetensors_write(const std::string& path, const std::vector<SafetensorsOut>& tensors,
                                        const std::map<std::string, std::string>& metadata = {}) {
    if (safetensors_path_taken_(path)) safetensors_exists_(path);
    return safetensors_write_replacing(path, tensors, metadata);
}

// Writes a model folder dir (which must exist): one model.safetensors when the tensors total at
// most max_shard_bytes, else shards model-0000K-of-0000N.safetensors (tensors in order, a new
// shard when the next would pass max_shard_bytes) and then model.safetensors.index.json.
// Refuses before writing anything when one of those names exists.
inline void safetensors_write_model(const std::string& dir, const std::vector<SafetensorsOut>& tensors,
                                    uint64_t max_shard_bytes, const std::map<std::string, std::string>& metadata = {}) {
    std::vector<std::vector<SafetensorsOut>> shards(1);
    uint64_t total = 0, in_shard = 0;
    for (const auto& t : tensors) {
        const uint64_t bytes = safetensors_out_bytes_(dir, t);
        if (in_shard > 0 && in_shard + bytes > max_shard_bytes) {
            shards.emplace_back();
            in_shard = 0;
        }
        shards.back().push_back(t);
        in_shard += bytes;
        total += bytes;
    }
    if (shards.size() == 1) {
        safetensors_write(dir + "/model.safetensors", tensors, metadata);
        return;
    }
    const std::string index = dir + "/model.safetensors.index.json";
    std::vector<std::string> names;
    for (size_t k = 0; k < shards.size(); k++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05zu-of-%05zu.safetensors", k + 1, shards.size());
        names.push_back(name);
    }
    for (const std::string& p : names)
        if (safetensors_path_taken_(dir + "/" + p)) safetensors_exists_(dir + "/" + p);
    if (safetensors_path_taken_(index)) safetensors_exists_(index);
    nlohmann::json weight_map = nlohmann::json::object();
    for (size_t k = 0; k < shards.size(); k++) {
        safetensors_write(dir + "/" + names[k], shards[k], metadata);
        for (const auto& t : shards[k]) weight_map[t.name] = names[k];
    }
    const nlohmann::json j = {{"metadata", {{"total_size", total}}}, {"weight_map", weight_map}};
    const std::string text = j.dump(2) + "\n";
    if (safetensors_path_taken_(index)) safetensors_exists_(index);
    write_file_atomic(index, [&](FILE* f) { return fwrite(text.data(), 1, text.size(), f) == text.size(); });
}

}  // namespace llmc
