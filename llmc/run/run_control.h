// run_control.h: stopping a training run cleanly, and never hanging
// (header-only host C++). The watchdog is the one place in llmc/ that prints
// and exits by itself: it runs on its own thread, for a main thread that is
// stuck, so it has no caller to report to.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <unistd.h>

// SIGTERM (Slurm's warning before preemption), SIGINT and SIGUSR1 ask the run
// to stop after the current step with a checkpoint; a second one ends it at
// once. SIGXFSZ is ignored so that a file-size limit fails the write with
// EFBIG, which the writers report as one error line (earlier checkpoints stay).
inline volatile sig_atomic_t g_stop_signal = 0;  // the first stop signal, or 0

inline void on_stop_signal(int sig) {
    if (g_stop_signal) {  // the second: at once
        signal(sig, SIG_DFL);
        raise(sig);
        return;
    }
    g_stop_signal = sig;
}

inline void install_signal_handlers() {
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_stop_signal;
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    for (int sig : {SIGTERM, SIGINT, SIGUSR1}) sigaction(sig, &sa, nullptr);
    signal(SIGXFSZ, SIG_IGN);
}

// The stop signal this process got, or 0.
inline int stop_signal() { return g_stop_signal; }


// SIGCONT (a job continued after Ctrl-Z or a scheduler's suspend) bumps this
// count; the watchdog reads it (an atomic: async-signal-safe).
inline std::atomic<unsigned> g_continued{0};

inline void on_continue_signal(int) { g_continued.fetch_add(1, std::memory_order_relaxed); }

// --stall-timeout's value read straight from argv (the last one given), for
// the watchdog over start-up, before the flags are parsed; 0 (automatic) when
// absent or not a positive number (the parser reports a bad value later).
inline double prescan_stall_timeout(int argc, char** argv) {
    double timeout = 0;
    for (int i = 1; i + 1 < argc; i++) {
        if (strcmp(argv[i], "--stall-timeout") != 0) continue;
        char* end = nullptr;
        const double v = strtod(argv[i + 1], &end);
        timeout = end != argv[i + 1] && *end == '\0' && std::isfinite(v) && v > 0 ? v : 0;
    }
    return timeout;
}

// A thread that ends the job when the main thread makes no progress (MPI and
// NCCL start-up, a step, an evaluation, a checkpoint, or a collective in one,
// waiting for a rank that is stopped or gone) for longer than the stall
// timeout: this rank prints what it was doing and exits, and the launcher then
// ends the other ranks.
// Idle time is what the watchdog thread itself saw pass in short ticks: a
// process that is stopped (SIGSTOP, SIGTSTP, a scheduler suspending the job)
// is not stalled, so a gap between two ticks much longer than a tick is not
// counted, and SIGCONT starts the idle time afresh. A suspended job has every
// rank stopped; each starts its own count afresh when continued.
class Watchdog {
  public:
    Watchdog(int rank, double fixed_timeout_s) : rank_(rank), fixed_(fixed_timeout_s) {
        struct sigaction sa;
        memset(&sa, 0, sizeof sa);
        sa.sa_handler = on_continue_signal;
        sa.sa_flags = SA_RESTART;
        sigemptyset(&sa.sa_mask);
        sigaction(SIGCONT, &sa, nullptr);
        std::thread([this] { watch(); }).detach();
    }
    void mark(const std::string& what) {
        std::lock_guard<std::mutex> lock(mu_);
        what_ = what;
        idle_s_ = 0;
        armed_ = true;
    }
    // The rank and timeout once MPI is up and the flags are parsed.
    void configure(int rank, double fixed_timeout_s) {
        std::lock_guard<std::mutex> lock(mu_);
        rank_ = rank;
        fixed_ = fixed_timeout_s;
    }
    // Automatic timeout: 10 x the median of the recent step times, at least 600 s.
    void step_took(double ms) {
        std::lock_guard<std::mutex> lock(mu_);
        recent_ms_.push_back(ms);
        if (recent_ms_.size() > 99) recent_ms_.erase(recent_ms_.begin());
    }

  private:
    static constexpr double kTickS = 0.25;
    static constexpr double kLongestTickS = 2.0;  // a longer gap: the process was stopped
    double timeout_s() const {  // (mu_ held)
        if (fixed_ > 0) return fixed_;
        std::vector<double> r = recent_ms_;
        if (r.empty()) return 600;
        std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
        return std::max(600.0, 10 * r[r.size() / 2] / 1000);
    }
    void watch() {
        auto last = std::chrono::steady_clock::now();
        unsigned continued = g_continued.load();
        for (;;) {
            std::this_thread::sleep_for(std::chrono::duration<double>(kTickS));
            const auto now = std::chrono::steady_clock::now();
            const double gap = std::chrono::duration<double>(now - last).count();
            last = now;
            std::lock_guard<std::mutex> lock(mu_);
            const unsigned c = g_continued.load();
            if (c != continued) {
                continued = c;
                idle_s_ = 0;
            } else if (gap <= kLongestTickS) {
                idle_s_ += gap;
            }
            if (!armed_ || idle_s_ <= timeout_s()) continue;
            fprintf(stderr,
                    "error: rank %d: no progress for %.0f s (--stall-timeout %.0f) during %s: another rank may be "
                    "stopped or gone; ending the job\n",
                    rank_, idle_s_, timeout_s(), what_.c_str());
            fflush(stderr);
            _exit(EXIT_FAILURE);
        }
    }
    std::mutex mu_;
    int rank_;
    double fixed_;
    std::string what_;
    double idle_s_ = 0;  // seconds seen without progress since the last mark
    bool armed_ = false;
    std::vector<double> recent_ms_;
};
