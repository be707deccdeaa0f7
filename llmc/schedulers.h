// Learning-rate schedules: linear warmup, then cosine, linear, constant or
// wsd (warmup-stable-decay: constant, then a linear decay over the last 20%).
// Every schedule ends at lr * final_fraction (constant stays at lr).
#pragma once
#include <cmath>
#include <cstring>

enum class LRSchedule { Cosine, Linear, Constant, WSD };

// Returns false for an unknown name.
inline bool parse_lr_schedule(const char* name, LRSchedule* out) {
    if (strcmp(name, "cosine") == 0) *out = LRSchedule::Cosine;
    else if (strcmp(name, "linear") == 0) *out = LRSchedule::Linear;
    else if (strcmp(name, "constant") == 0) *out = LRSchedule::Constant;
    else if (strcmp(name, "wsd") == 0) *out = LRSchedule::WSD;
    else return false;
    return true;
}

struct LRScheduler {
    LRSchedule schedule;
    double max_lr;
    int warmup_steps;
    int total_steps;
    double final_fraction;

    // lr of optimizer step `step` (0-based), computed in double.
    double at(int step) const {
        if (step < warmup_steps) return max_lr * (step + 1) / warmup_steps;
        const double min_lr = max_lr * final_fraction;
        const int decay_steps = total_steps - warmup_steps;
        const double progress = decay_steps > 0 ? (double)(step - warmup_steps) / decay_steps : 1.0;
        switch (schedule) {
        case LRSchedule::Cosine:
            return min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (max_lr - min_lr);
        case LRSchedule::Linear:
            return max_lr - progress * (max_lr - min_lr);
        case LRSchedule::Constant:
            return max_lr;
        case LRSchedule::WSD: {
            const double decay_start = 0.8;
            if (progress < decay_start) return max_lr;
            return max_lr - (progress - decay_start) / (1.0 - decay_start) * (max_lr - min_lr);
        }
        }
        return max_lr;
    }
};
