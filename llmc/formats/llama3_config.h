// The shape of a Llama 3 model and its Hugging Face names, header-only host C++.
//
// A Llama3Config comes from a descriptor ("llama3:L=2,C=64,H=4,KV=2,F=192,V=256", optional
// T=, theta=, eps=, tied=0|1, and Llama 3.1 RoPE scaling factor=, low=, high=, orig=), from a
// published size by name (llama3.2-1b, llama3.2-3b, llama3.1-8b, llama3.1-70b), or from a Hugging Face
// config.json (LlamaConfig). It is written back as a config.json that
// LlamaForCausalLM.from_pretrained reads. What the project does not train (biases, other RoPE
// types, a head size other than C/H, tensor-parallel pretraining) is refused with one line.
//
// llama3_param_table lists every tensor under its Hugging Face name and [out, in] shape, the
// order in which they are written.
#pragma once

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "llmc/formats/checkpoint.h"
#include "llmc/error.h"
#include "llmc/run/flags.h"
#include "llmc/formats/hf_model.h"

namespace llmc {

struct Llama3Config {
    int L = 0;                   // layers
    int C = 0;                   // channels (hidden_size)
    int H = 0;                   // query heads
    int KV = 0;                  // key/value heads; divides H
    int F = 0;                   // MLP width (intermediate_size)
    int V = 0;                   // vocabulary
    int max_seq_len = 0;         // rows of the RoPE table (max_position_embeddings)
    double rope_theta = 500000.0;
    bool rope_scaling = false;   // Llama 3.1's frequency scaling; false: Llama 3.0's plain RoPE
    double rope_factor = 0, rope_low_freq_factor = 0, rope_high_freq_factor = 0;
    int rope_original_max_seq_len = 0;
    double rms_norm_eps = 1e-5;
    bool tied = false;           // lm_head shares model.embed_tokens.weight

    int head_dim() const { return C / H; }
    bool operator==(const Llama3Config& o) const {
        return L == o.L && C == o.C && H == o.H && KV == o.KV && F == o.F && V == o.V && max_seq_len == o.max_seq_len &&
               rope_theta == o.rope_theta && rope_scaling == o.rope_scaling && rope_factor == o.rope_factor &&
               rope_low_freq_factor == o.rope_low_freq_factor && rope_high_freq_factor == o.rope_high_freq_factor &&
               rope_original_max_seq_len == o.rope_original_max_seq_len && rms_norm_eps == o.rms_norm_eps &&
               tied == o.tied;
    }
};

// Throws "where: what is wrong" unless c is a shape the model can have.
inline void llama3_check(const Llama3Config& c, const std::string& where) {
    const std::pair<const char*, int> sizes[] = {{"L", c.L}, {"C", c.C}, {"H", c.H},          {"KV", c.KV},
                                                 {"F", c.F}, {"V", c.V}, {"T", c.max_seq_len}};
    for (const auto& s : sizes)
        if (s.second <= 0) fail(where + ": " + s.first + " must be > 0, not " + std::to_string(s.second));
    if (c.C % c.H != 0) fail(where + ": H=" + std::to_string(c.H) + " does not divide C=" + std::to_string(c.C));
    if (c.H % c.KV != 0) fail(where + ": KV=" + std::to_string(c.KV) + " does not divide H=" + std::to_string(c.H));
    if (c.head_dim() % 2 != 0)
        fail(where + ": the head size C/H=" + std::to_string(c.head_dim()) + " must be even for RoPE");
    // (RoPE's frequencies theta^(-2i/HS) fall with i only for theta > 1: rope_frequencies' rule)
    if (!(c.rope_theta > 1) || !std::isfinite(c.rope_theta)) fail(where + ": theta must be a finite number > 1");
    if (!(c.rms_norm_eps > 0) || !std::isfinite(c.rms_norm_eps)) fail(where + ": eps must be a finite number > 0");
    if (c.rope_scaling) {
        if (!(c.rope_factor >= 1) || !std::isfinite(c.rope_factor))
            fail(where + ": factor must be a finite number >= 1");
        if (!(c.rope_low_freq_factor > 0) || !(c.rope_high_freq_factor > c.rope_low_freq_factor) ||
            !std::isfinite(c.rope_high_freq_factor))
            fail(where + ": RoPE scaling needs 0 < low < high (finite)");
        if (c.rope_original_max_seq_len <= 0) fail(where + ": orig must be > 0");
    }
}

// The RoPE of c for the run's "model:" line: theta and the scaling, every field of it.
inline std::string llama3_rope_text(const Llama3Config& c) {
    char text[200];
    if (c.rope_scaling)
        snprintf(text, sizeof text, "rope theta %g, llama3 scaling (factor %g, low %g, high %g, original %d)",
                 c.rope_theta, c.rope_factor, c.rope_low_freq_factor, c.rope_high_freq_factor,
                 c.rope_original_max_seq_len);
    else snprintf(text, sizeof text, "rope theta %g, no scaling", c.rope_theta);
    return text;
}

// Llama 3.1's scaling as published: low 1, high 4, original 8192 positions.
inline void llama3_set_rope_scaling_(Llama3Config* c, double factor) {
    c->rope_scaling = true;
    c->rope_factor = factor;
    c->rope_low_freq_factor = 1.0;
    c->rope_high_freq_factor = 4.0;
    c->rope_original_max_seq_len = 8192;
}

// The published sizes, as in Meta's config.json of meta-llama/Llama-3.2-1B, Llama-3.2-3B,
// Llama-3.1-8B and Llama-3.1-70B on the Hugging Face hub; false for another name.
inline bool llama3_named(const std::string& name, Llama3Config* c) {
    Llama3Config n;
    n.V = 128256;
    n.max_seq_len = 131072;
    n.rope_theta = 500000.0;
    n.rms_norm_eps = 1e-5;
    n.KV = 8;
    if (name == "llama3.2-1b") {
        n.L = 16, n.C = 2048, n.H = 32, n.F = 8192, n.tied = true;
        llama3_set_rope_scaling_(&n, 32.0);
    } else if (name == "llama3.2-3b") {
        n.L = 28, n.C = 3072, n.H = 24, n.F = 8192, n.tied = true;
        llama3_set_rope_scaling_(&n, 32.0);
    } else if (name == "llama3.1-8b") {
        n.L = 32, n.C = 4096, n.H = 32, n.F = 14336, n.tied = false;
        llama3_set_rope_scaling_(&n, 8.0);
    } else if (name == "llama3.1-70b") {
        n.L = 80, n.C = 8192, n.H = 64, n.F = 28672, n.tied = false;
        llama3_set_rope_scaling_(&n, 8.0);
    } else {
        return false;
    }
    *c = n;
    return true;
}

inline long long llama3_parse_int_(const std::string& where, const std::string& key, const std::string& v) {
    char* end = nullptr;
    errno = 0;
    const long long x = strtoll(v.c_str(), &end, 10);
    if (v.empty() || *end != '\0' || errno == ERANGE || x < INT32_MIN || x > INT32_MAX)
        fail(where + ": " + key + "=" + v + " is not an integer");
    return x;
}
inline double llama3_parse_double_(const std::string& where, const std::string& key, const std::string& v) {
    char* end = nullptr;
    const double x = strtod(v.c_str(), &end);
    if (v.empty() || *end != '\0' || !std::isfinite(x)) fail(where + ": " + key + "=" + v + " is not a number");
    return x;
}

// "llama3:KEY=VALUE,..." or a published name (llama3_named).
inline Llama3Config llama3_parse_descriptor(const std::string& desc) {
    Llama3Config c;
    if (llama3_named(desc, &c)) return c;
    const std::string prefix = "llama3:";
    if (desc.rfind(prefix, 0) != 0)
        fail(desc +
             ": not a Llama 3 model (llama3:L=..,C=..,H=..,KV=..,F=..,V=.. or llama3.2-1b, llama3.2-3b, llama3.1-8b, "
             "llama3.1-70b)");
    c.max_seq_len = 1024;
    std::map<std::string, std::string> kv;
    const std::string problem = parse_key_values(desc.substr(prefix.size()), &kv);
    if (!problem.empty()) fail(desc + ": " + problem);
    for (const char* k : {"L", "C", "H", "KV", "F", "V"})
        if (!kv.count(k)) fail(desc + ": " + k + "= is missing");
    const bool scaled = kv.count("factor") > 0;
    if (scaled) llama3_set_rope_scaling_(&c, 1.0);
    for (const auto& e : kv) {
        const std::string &k = e.first, &v = e.second;
        if (k == "L") c.L = (int)llama3_parse_int_(desc, k, v);
        else if (k == "C") c.C = (int)llama3_parse_int_(desc, k, v);
        else if (k == "H") c.H = (int)llama3_parse_int_(desc, k, v);
        else if (k == "KV") c.KV = (int)llama3_parse_int_(desc, k, v);
        else if (k == "F") c.F = (int)llama3_parse_int_(desc, k, v);
        else if (k == "V") c.V = (int)llama3_parse_int_(desc, k, v);
        else if (k == "T") c.max_seq_len = (int)llama3_parse_int_(desc, k, v);
        else if (k == "theta") c.rope_theta = llama3_parse_double_(desc, k, v);
        else if (k == "eps") c.rms_norm_eps = llama3_parse_double_(desc, k, v);
        else if (k == "tied") {
            if (v != "0" && v != "1") fail(desc + ": tied=" + v + " is not 0 or 1");
            c.tied = v == "1";
        } else if (k == "factor") c.rope_factor = llama3_parse_double_(desc, k, v);
        else if (scaled && k == "low") c.rope_low_freq_factor = llama3_parse_double_(desc, k, v);
        else if (scaled && k == "high") c.rope_high_freq_factor = llama3_parse_double_(desc, k, v);
        else if (scaled && k == "orig") c.rope_original_max_seq_len = (int)llama3_parse_int_(desc, k, v);
        else if (k == "low" || k == "high" || k == "orig") fail(desc + ": " + k + "= needs factor=");
        else fail(desc + ": unknown key " + k + "=");
    }
    llama3_check(c, desc);
    return c;
}

// ---------------------------------------------------------------------------
// parameters under their Hugging Face names

struct Llama3Param {
    std::string name;
    std::vector<uint64_t> shape;  // torch's: [out, in] for a linear layer
    uint64_t numel() const {
        uint64_t n = 1;
        for (uint64_t d : shape) n *= d;
        return n;
    }
};

inline std::vector<Llama3Param> llama3_param_table(const Llama3Config& c) {
    const uint64_t C = c.C, F = c.F, V = c.V, KVC = (uint64_t)c.KV * c.head_dim();
    std::vector<Llama3Param> t;
    t.push_back({"model.embed_tokens.weight", {V, C}});
    for (int l = 0; l < c.L; l++) {
        const std::string p = "model.layers." + std::to_string(l) + ".";
        t.push_back({p + "input_layernorm.weight", {C}});
        t.push_back({p + "self_attn.q_proj.weight", {C, C}});
        t.push_back({p + "self_attn.k_proj.weight", {KVC, C}});
        t.push_back({p + "self_attn.v_proj.weight", {KVC, C}});
        t.push_back({p + "self_attn.o_proj.weight", {C, C}});
        t.push_back({p + "post_attention_layernorm.weight", {C}});
        t.push_back({p + "mlp.gate_proj.weight", {F, C}});
        t.push_back({p + "mlp.up_proj.weight", {F, C}});
        t.push_back({p + "mlp.down_proj.weight", {C, F}});
    }
    t.push_back({"model.norm.weight", {C}});
    if (!c.tied) t.push_back({"lm_head.weight", {V, C}});
    return t;
}

inline uint64_t llama3_num_parameters(const Llama3Config& c) {
    uint64_t n = 0;
    for (const auto& p : llama3_param_table(c)) n += p.numel();
    return n;
}

// ---------------------------------------------------------------------------
// Hugging Face config.json

// The LlamaConfig keys as transformers 4.x writes them (rope_theta, rope_scaling), which every
// published Llama 3 checkpoint uses and transformers 5 reads too.
inline nlohmann::json llama3_to_hf_json(const Llama3Config& c, const std::string& torch_dtype) {
    nlohmann::json j = {{"architectures", {"LlamaForCausalLM"}},
                        {"model_type", "llama"},
                        {"hidden_act", "silu"},
                        {"attention_bias", false},
                        {"mlp_bias", false},
                        {"hidden_size", c.C},
                        {"intermediate_size", c.F},
                        {"num_attention_heads", c.H},
                        {"num_key_value_heads", c.KV},
                        {"head_dim", c.head_dim()},
                        {"num_hidden_layers", c.L},
                        {"vocab_size", c.V},
                        {"max_position_embeddings", c.max_seq_len},
                        {"rope_theta", c.rope_theta},
                        {"rms_norm_eps", c.rms_norm_eps},
                        {"tie_word_embeddings", c.tied},
                        {"torch_dtype", torch_dtype}};
    j["rope_scaling"] = nullptr;
    if (c.rope_scaling)
        j["rope_scaling"] = {{"rope_type", "llama3"},
                             {"factor", c.rope_factor},
                             {"low_freq_factor", c.rope_low_freq_factor},
                             {"high_freq_factor", c.rope_high_freq_factor},
                             {"original_max_position_embeddings", c.rope_original_max_seq_len}};
    return j;
}

// The RoPE type of a transformers RoPE dict. transformers 5 reads "rope_type" before the older
// "type", 4's LlamaConfig copies "type" over "rope_type": given both, they must agree. Without
// either, transformers 4 fails and 5 takes "default" (ignoring a factor): refused unless the dict
// holds no scaling key at all.
inline std::string llama3_rope_type_(const nlohmann::json& r, const std::string& where) {
    std::string type;
    for (const char* k : {"rope_type", "type"}) {
        auto it = r.find(k);
        if (it == r.end()) continue;
        if (!it->is_string()) fail(where + ": RoPE " + k + " is not a string");
        const std::string t = it->get<std::string>();
        if (!type.empty() && t != type)
            fail(where + ": RoPE rope_type " + quote_for_error(type) + " and type " + quote_for_error(t) +
                 " disagree (transformers 5 reads rope_type, 4 type)");
        type = t;
    }
    if (type.empty())
        for (auto it = r.begin(); it != r.end(); ++it)
            if (it.key() != "rope_theta")
                fail(where + ": RoPE parameters with " + quote_for_error(it.key()) + " but no rope_type");
    return type.empty() ? "default" : type;
}

// The RoPE scaling the trainer computes: "default" (none) and "llama3" (Llama 3.1's); any other
// type, and any key the type does not use, is refused (it would be dropped without a word).
inline void llama3_rope_from_json_(const nlohmann::json& r, const std::string& where, Llama3Config* c) {
    if (!r.is_object()) fail(where + ": the RoPE parameters are not an object");
    const std::string type = llama3_rope_type_(r, where);
    if (type != "default" && type != "llama3")
        fail(where + ": rope_type " + quote_for_error(type) + " is not supported (only llama3 or default)");
    const std::vector<std::string> llama3_keys = {"factor", "low_freq_factor", "high_freq_factor",
                                                  "original_max_position_embeddings"};
    for (auto it = r.begin(); it != r.end(); ++it) {
        const std::string& k = it.key();
        const bool used = k == "rope_type" || k == "type" || k == "rope_theta" ||
                          (type == "llama3" && std::count(llama3_keys.begin(), llama3_keys.end(), k));
        if (!used) fail(where + ": RoPE " + quote_for_error(k) + " is not used by rope_type " + type);
    }
    if (type == "default") return;
    c->rope_scaling = true;
    c->rope_factor = hf_json_number(r, "factor", where, NAN);
    c->rope_low_freq_factor = hf_json_number(r, "low_freq_factor", where, NAN);
    c->rope_high_freq_factor = hf_json_number(r, "high_freq_factor", where, NAN);
    c->rope_original_max_seq_len = hf_json_required_int(r, "original_max_position_embeddings", where);
    if (std::isnan(c->rope_factor) || std::isnan(c->rope_low_freq_factor) || std::isnan(c->rope_high_freq_factor))
        fail(where + ": llama3 RoPE scaling needs factor, low_freq_factor and high_freq_factor");
}

// The RoPE parameters of a LlamaConfig: transformers 5's "rope_parameters" (theta inside) or 4's
// "rope_scaling"; given both, they must be equal (which one a version reads differs), and so must
// the two thetas.
inline void llama3_rope_config_(const nlohmann::json& j, const std::string& where, Llama3Config* c) {
    const auto present = [&](const char* k) { return j.contains(k) && !j[k].is_null(); };
    if (present("rope_parameters") && present("rope_scaling") && j["rope_parameters"] != j["rope_scaling"])
        fail(where + ": rope_parameters and rope_scaling are both given and differ");
    const char* key = present("rope_parameters") ? "rope_parameters" : present("rope_scaling") ? "rope_scaling" : "";
    if (!*key) return;
    llama3_rope_from_json_(j[key], where, c);
    const double theta = hf_json_number(j[key], "rope_theta", where, c->rope_theta);
    if (j.contains("rope_theta") && !j["rope_theta"].is_null() && theta != c->rope_theta)
        fail(where + ": rope_theta and " + key + "'s rope_theta differ");
    c->rope_theta = theta;
}

// Dropout is not applied by the trainer: a config asking for it (LlamaConfig reads
// attention_dropout; any other *dropout key too) is refused rather than trained without.
inline void llama3_refuse_dropout_(const nlohmann::json& j, const std::string& where) {
    for (auto it = j.begin(); it != j.end(); ++it) {
        if (it.key().find("dropout") == std::string::npos || it->is_null()) continue;
        if (!it->is_number() || it->get<double>() != 0.0)
            fail(where + ": " + quote_for_error(it.key()) + " " + quote_for_error(it->dump()) +
                 " is not supported (the trainer has no dropout; only 0)");
    }
}

// Reads a LlamaConfig; absent optional keys take LlamaConfig's defaults (num_key_value_heads:
// num_attention_heads, rope_theta 10000, rms_norm_eps 1e-6, no tying, no RoPE scaling).
// transformers 5's "rope_parameters" (theta inside) is read as well as 4.x's keys.
inline Llama3Config llama3_from_hf_json(const nlohmann::json& j, const std::string& where) {
    if (!j.is_object()) fail(where + ": is not a JSON object");
    if (j.contains("architectures")) {
        const auto& a = j["architectures"];
        if (!a.is_array() || a.size() != 1 || a[0] != "LlamaForCausalLM")
            fail(where + ": architectures is not [\"LlamaForCausalLM\"]");
    }
    if (j.contains("model_type") && j["model_type"] != "llama") fail(where + ": model_type is not \"llama\"");
    if (j.contains("hidden_act") && j["hidden_act"] != "silu") fail(where + ": hidden_act is not \"silu\"");
    for (const char* k : {"attention_bias", "mlp_bias"})
        if (j.contains(k) && j[k] != false) fail(where + ": " + k + " is not supported (only false)");
    bool found;
    const int tp = hf_json_int(j, "pretraining_tp", where, &found);
    if (found && tp != 1) fail(where + ": pretraining_tp " + std::to_string(tp) + " is not supported (only 1)");
    Llama3Config c;
    c.C = hf_json_required_int(j, "hidden_size", where);
    c.F = hf_json_required_int(j, "intermediate_size", where);
    c.H = hf_json_required_int(j, "num_attention_heads", where);
    c.L = hf_json_required_int(j, "num_hidden_layers", where);
    c.V = hf_json_required_int(j, "vocab_size", where);
    c.max_seq_len = hf_json_required_int(j, "max_position_embeddings", where);
    c.KV = hf_json_int(j, "num_key_value_heads", where, &found);
    if (!found) c.KV = c.H;
    c.rms_norm_eps = hf_json_number(j, "rms_norm_eps", where, 1e-6);
    c.rope_theta = hf_json_number(j, "rope_theta", where, 10000.0);
    c.tied = hf_json_bool(j, "tie_word_embeddings", where, false);
    llama3_rope_config_(j, where, &c);
    llama3_refuse_dropout_(j, where);
    llama3_check(c, where);
    const int hd = hf_json_int(j, "head_dim", where, &found);
    if (found && hd != c.head_dim())
        fail(where + ": head_dim " + std::to_string(hd) +
             " is not hidden_size / num_attention_heads = " + std::to_string(c.head_dim()));
    return c;
}

inline Llama3Config llama3_read_hf_config(const std::string& path) {
    return llama3_from_hf_json(hf_read_config_json(path), path);
}

// Writes config.json at path, which must not exist (a saved file is never overwritten); its
// name, size and hash.
inline CheckpointFile llama3_write_hf_config(const std::string& path, const Llama3Config& c,
                                             const std::string& torch_dtype) {
    struct stat st;
    if (lstat(path.c_str(), &st) == 0) fail(path + ": already exists; a saved file is never overwritten");
    const std::string text = llama3_to_hf_json(c, torch_dtype).dump(2) + "\n";
    return write_file_hashed(path, [&](HashingWriter& w) { return w.put(text.data(), 1, text.size()); });
}

}  // namespace llmc
