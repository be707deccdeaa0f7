// The reference files of dev/train_gpt2.py and dev/train_llama3.py (their
// debug and train layouts) and the error metric the model tests share.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "test/test_util.h"

static std::string ref_path(const char* name) {
    const char* dir = getenv("TEST_REF_DIR");
    return std::string(dir ? dir : "test/ref") + "/" + name;
}

struct Reader {
    FILE* f;
    explicit Reader(const std::string& path) : f(fopen(path.c_str(), "rb")) {
        if (!f) {
            printf("FAIL cannot open %s\n", path.c_str());
            exit(1);
        }
    }
    ~Reader() { fclose(f); }
    template <class T> std::vector<T> read(size_t n) {
        std::vector<T> v(n);
        if (fread(v.data(), sizeof(T), n, f) != n) {
            printf("FAIL short reference file\n");
            exit(1);
        }
        return v;
    }
};

struct DebugRef {
    int B, T;
    std::vector<int> x, y;
    std::vector<float> logits, grads;
    float loss;
};
static DebugRef read_debug(const std::string& path, int V, size_t num_parameters) {
    Reader r(path);
    auto header = r.read<int>(256);
    DebugRef d;
    d.B = header[2];
    d.T = header[3];
    const size_t BT = (size_t)d.B * d.T;
    d.x = r.read<int>(BT);
    d.y = r.read<int>(BT);
    d.logits = r.read<float>(BT * V);
    d.loss = r.read<float>(1)[0];
    d.grads = r.read<float>(num_parameters);
    return d;
}

struct TrainRef {
    int B, T, A, K, warmup;
    int optimizer;  // 0 AdamW, 1 Muon for the blocks' matrices and AdamW for the rest (Optimizer's order)
    float lr, beta1, beta2, eps, weight_decay, grad_clip, final_fraction;
    float muon_lr, muon_weight_decay, muon_momentum;  // Muon's (0 with AdamW)
    std::vector<int> x, y;
    std::vector<float> losses, norms, lrs, params;
};
static TrainRef read_train(const char* name, size_t num_params) {
    Reader r(ref_path(name));
    auto h = r.read<int>(256);
    TrainRef t;
    t.B = h[2];
    t.T = h[3];
    t.A = h[4];
    t.K = h[5];
    t.warmup = h[6];
    t.optimizer = h[9];
    float* hf = (float*)h.data();
    t.lr = hf[16];
    t.beta1 = hf[17];
    t.beta2 = hf[18];
    t.eps = hf[19];
    t.weight_decay = hf[20];
    t.grad_clip = hf[21];
    t.final_fraction = hf[22];
    t.muon_lr = hf[23];
    t.muon_weight_decay = hf[24];
    t.muon_momentum = hf[25];
    const size_t n = (size_t)t.K * t.A * t.B * t.T;
    t.x = r.read<int>(n);
    t.y = r.read<int>(n);
    t.losses = r.read<float>(t.K);
    t.norms = r.read<float>(t.K);
    t.lrs = r.read<float>(t.K);
    t.params = r.read<float>(num_params);
    return t;
}

// The trainer's optimizer settings for a trajectory: AdamW's, and Muon's where
// the reference ran Muon (its lr on lr's schedule, as --muon-lr: lr_t * muon_lr / lr).
// model.optimizer must be set from t.optimizer before the model is allocated (Muon's scratch).
static OptimizerSettings reference_settings(const TrainRef& t) {
    OptimizerSettings opt;
    opt.beta1 = t.beta1;
    opt.beta2 = t.beta2;
    opt.eps = t.eps;
    opt.weight_decay = t.weight_decay;
    opt.grad_clip = t.grad_clip;
    opt.muon_lr_per_lr = t.muon_lr / t.lr;
    opt.muon_weight_decay = t.muon_weight_decay;
    opt.muon_momentum = t.muon_momentum;
    return opt;
}

// max |a-b| / max |b| over n elements
static double scaled_error(const float* got, const float* ref, size_t n) {
    double worst = 0, scale = 1e-30;
    for (size_t i = 0; i < n; i++) scale = std::fmax(scale, std::fabs((double)ref[i]));
    for (size_t i = 0; i < n; i++) {
        double d = std::fabs((double)got[i] - ref[i]);
        if (!(d <= worst)) worst = d;
    }
    return worst / scale;
}

static std::vector<float> read_device(const float* d, size_t n) {
    std::vector<float> h(n);
    CUDA_OK(cudaMemcpy(h.data(), d, n * sizeof(float), cudaMemcpyDeviceToHost));
    return h;
}

// The first V of the Vp columns of rows x Vp device logits (the trainer's
// floatX and read_logits_row, included before this header).
static std::vector<float> unpadded_logits(const floatX* device_logits, size_t rows, int V, int Vp) {
    std::vector<float> out(rows * V);
    for (size_t r = 0; r < rows; r++) read_logits_row(device_logits, (int)r, V, Vp, &out[r * V]);
    return out;
}
