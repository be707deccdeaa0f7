// Learning-rate schedules (LR_SCHEDULE_NAMES): linear warmup, then cosine,
// linear, constant or wsd (warmup-stable-decay: constant, then a linear decay
// over the last 20%).
// Every schedule ends at lr * final_fraction (constant stays at lr).
#pragma once
#include <algorithm>
#include <cmath>

enum class LRSchedule { Cosine, Linear, Constant, WSD };
// The schedules' names (-k), in LRSchedule's order; null-terminated.
inline constexpr const char* LR_SCHEDULE_NAMES[] = {"cosine", "linear", "constant", "wsd", nullptr};

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
            case LRSchedule::Cosine: return min_lr + 0.5 * (1.0 + cos(M_PI * progress)) * (max_lr - min_lr);
            case LRSchedule::Linear: return max_lr - progress * (max_lr - min_lr);
            case LRSchedule::Constant: return max_lr;
            case LRSchedule::WSD: {
                const double decay_start = 0.8;
                if (progress < decay_start) return max_lr;
                return max_lr - (progress - decay_start) / (1.0 - decay_start) * (max_lr - min_lr);
            }
        }
        return max_lr;
    }
};

// Batch-size ramp: the tokens per step grow linearly from start_tokens to the
// target over `steps` steps, by raising the number of accumulated
// micro-batches A (B, T and N stay; a step holds whole micro-batches of
// micro_tokens = B x T x N, at least one). Batch size is an optimisation
// hyperparameter: small batches early, when the gradient noise is small next
// to its signal, save tokens. The learning rate can follow the batch:
// linear (lr x tokens/target, the SGD rule) or sqrt (lr x sqrt(tokens/target),
// the rule usually quoted for Adam). start_tokens = 0: no ramp.
enum class RampLRScaling { None, Linear, Sqrt };
// The rules' names (--ramp-lr), in RampLRScaling's order; null-terminated.
inline constexpr const char* RAMP_LR_NAMES[] = {"none", "linear", "sqrt", nullptr};

struct BatchRamp {
    long start_tokens;   // 0: no ramp
    int steps;
    long target_tokens;  // B x T x N x A of the run
    long micro_tokens;   // B x T x N
    RampLRScaling lr_scaling;

    // A of optimizer step `step` (0-based).
    int grad_accum_steps(int step) const {
        const long target_accum = target_tokens / micro_tokens;
        if (start_tokens <= 0 || step >= steps) return (int)target_accum;
        const double tokens = start_tokens + (double)(target_tokens - start_tokens) * step / steps;
        const long accum = std::lround(tokens / micro_tokens);
        return (int)std::min(target_accum, std::max(1L, accum));
    }
    long tokens(int step) const { return grad_accum_steps(step) * micro_tokens; }
    // the factor the schedule's lr is multiplied by at `step`
    double lr_factor(int step) const {
        const double fraction = (double)tokens(step) / target_tokens;
        switch (lr_scaling) {
            case RampLRScaling::Linear: return fraction;
            case RampLRScaling::Sqrt: return std::sqrt(fraction);
            case RampLRScaling::None: break;
        }
        return 1.0;
    }
};
