// A Hugging Face model folder (config.json, and model.safetensors or shards
// with model.safetensors.index.json) read into a trainer's fp32 parameter
// buffer, header-only host C++. Each family (train_gpt.cu, train_llama3.cu)
// reads its own config keys and lists where each of its tensors goes
// (HfPlacement); what is the same for every family is here: config.json as a
// JSON object, its integer and number fields, and the tensors checked as a
// whole (names, shapes, dtypes: nothing missing, nothing unknown) before any
// buffer is sized, then read one at a time, transposed where the folder
// stores a matrix (in, out).
#pragma once

#include <nlohmann/json.hpp>

#include <sys/stat.h>

#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "llmc/error.h"
#include "llmc/formats/regular_file.h"
#include "llmc/formats/safetensors.h"

namespace llmc {

// Whether path is a folder (a Hugging Face model) rather than a file.
inline bool hf_is_folder(const char* path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

// config.json (at most 1 MiB) as a JSON object.
inline nlohmann::json hf_read_config_json(const std::string& path) {
    std::string text, why;
    if (!read_regular_file(path.c_str(), &text, 1 << 20, &why)) fail(path + ": cannot read (" + why + ")");
    if (safetensors_json_depth_(text, SAFETENSORS_MAX_JSON_DEPTH) > SAFETENSORS_MAX_JSON_DEPTH)
        fail(path + ": nests JSON deeper than a model config can");
    const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
    if (j.is_discarded()) fail(path + ": is not valid JSON");
    if (!j.is_object()) fail(path + ": is not a JSON object");
    return j;
}

// The int32 at key; *found false (and 0) when the key is absent or null.
inline int hf_json_int(const nlohmann::json& j, const std::string& key, const std::string& where, bool* found) {
    auto it = j.find(key);
    *found = it != j.end() && !it->is_null();
    if (!*found) return 0;
    if (!it->is_number_integer() || it->get<int64_t>() < INT32_MIN || it->get<int64_t>() > INT32_MAX)
        fail(where + ": " + key + " is not an integer");
    return it->get<int>();
}
inline int hf_json_required_int(const nlohmann::json& j, const std::string& key, const std::string& where) {
    bool found;
    const int v = hf_json_int(j, key, where, &found);
    if (!found) fail(where + ": " + key + " is missing");
    return v;
}
// a number, or fallback when key is absent or null
inline double hf_json_number(const nlohmann::json& j, const std::string& key, const std::string& where,
                             double fallback) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_number()) fail(where + ": " + key + " is not a number");
    return it->get<double>();
}
// true or false, or fallback when key is absent or null
inline bool hf_json_bool(const nlohmann::json& j, const std::string& key, const std::string& where, bool fallback) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_boolean()) fail(where + ": " + key + " is not true or false");
    return it->get<bool>();
}

// a string, or fallback when key is absent or null
inline std::string hf_json_string(const nlohmann::json& j, const std::string& key, const std::string& where,
                                  const std::string& fallback) {
    auto it = j.find(key);
    if (it == j.end() || it->is_null()) return fallback;
    if (!it->is_string()) fail(where + ": " + key + " is not a string");
    return it->get<std::string>();
}

// One tensor of a folder and its place in the parameter buffer.
struct HfPlacement {
    std::string name;             // in the folder
    std::vector<uint64_t> shape;  // as the folder stores it
    size_t offset;                // of its first element in the buffer
    bool transposed = false;      // a matrix stored (in, out) (GPT-2's Conv1D): placed as (out, in)
    uint64_t numel() const {
        uint64_t n = 1;
        for (uint64_t d : shape) n *= d;
        return n;
    }
};

inline std::string hf_shape_text(const std::vector<uint64_t>& shape) {
    std::string s = "[";
    for (size_t i = 0; i < shape.size(); i++) s += (i ? ", " : "") + std::to_string(shape[i]);
    return s + "]";
}

// Every placed tensor is in the folder with its shape and a dtype the reader
// converts (F32, BF16, F16); every other tensor of the folder is one `extra`
// accepts (a buffer, a tied head), else refused: a tensor of a layer past the
// config's would otherwise be dropped without a word.
inline void hf_check_tensors(const SafetensorsModel& folder, const std::string& where,
                             const std::vector<HfPlacement>& placed,
                             const std::function<bool(const std::string&)>& extra) {
    std::map<std::string, const HfPlacement*> by_name;
    for (const HfPlacement& p : placed) by_name[p.name] = &p;
    for (const std::string& n : folder.names())
        if (!by_name.count(n) && !extra(n))
            fail(where + ": the tensor " + quote_for_error(n) + " is not one of this model's (config.json's shape)");
    for (const HfPlacement& p : placed) {
        const SafetensorsTensor* t = folder.find(p.name);
        if (!t) fail(where + ": the tensor " + p.name + " is missing");
        if (t->shape != p.shape)
            fail(where + ": " + p.name + " has the shape " + hf_shape_text(t->shape) + ", config.json gives " +
                 hf_shape_text(p.shape));
        if (t->dtype != "F32" && t->dtype != "BF16" && t->dtype != "F16")
            fail(where + ": " + p.name + " is " + t->dtype + " (F32, BF16 or F16 are read)");
    }
}

// Reads every placed tensor (checked by hf_check_tensors) into weights as fp32.
inline void hf_read_tensors(const SafetensorsModel& folder, const std::vector<HfPlacement>& placed, float* weights) {
    std::vector<float> stored;
    for (const HfPlacement& p : placed) {
        if (!p.transposed) {
            folder.read(p.name, SafetensorsTarget::F32, weights + p.offset, p.numel());
            continue;
        }
        const size_t in = p.shape[0], out = p.shape[1];
        stored.resize(in * out);
        folder.read(p.name, SafetensorsTarget::F32, stored.data(), stored.size());
        float* dst = weights + p.offset;
        for (size_t i = 0; i < in; i++)
            for (size_t o = 0; o < out; o++) dst[o * in + i] = stored[i * out + o];
    }
}

}  // namespace llmc
