// run_control.h: stopping a training run cleanly, and never hanging
// (header-only host C++). The watchdog is the one place in llmc/ that prints
// and exits by itself: it runs on its own thread, for a main thread that is
// stuck, so it has no caller to report to.
#pragma once

#include <algorithm>
#include <chrono>
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


// A thread that ends the job when the main thread makes no progress (a step,
// an evaluation, a checkpoint, or a collective in one, waiting for a rank that
// is stopped or gone) for longer than the stall timeout: this rank prints what
// it was doing and exits, and the launcher then ends the other ranks.
class Watchdog {
  public:
    Watchdog(int rank, double fixed_timeout_s) : rank_(rank), fixed_(fixed_timeout_s) {
        std::thread([this] { watch(); }).detach();
    }
    void mark(const std::string& what) {
        std::lock_guard<std::mutex> lock(mu_);
        what_ = what;
        since_ = std::chrono::steady_clock::now();
        armed_ = true;
    }
    // Automatic timeout: 10 x the median of the recent step times, at least 600 s.
    void step_took(double ms) {
        std::lock_guard<std::mutex> lock(mu_);
        recent_ms_.push_back(ms);
        if (recent_ms_.size() > 99) recent_ms_.erase(recent_ms_.begin());
    }

  private:
    double timeout_s() const {  // (mu_ held)
        if (fixed_ > 0) return fixed_;
        std::vector<double> r = recent_ms_;
        if (r.empty()) return 600;
        std::nth_element(r.begin(), r.begin() + r.size() / 2, r.end());
        return std::max(600.0, 10 * r[r.size() / 2] / 1000);
    }
    void watch() {
        for (;;) {
            std::this_thread::sleep_for(std::chrono::milliseconds(250));
            std::lock_guard<std::mutex> lock(mu_);
            const double idle = std::chrono::duration<double>(std::chrono::steady_clock::now() - since_).count();
            if (!armed_ || idle <= timeout_s()) continue;
            fprintf(stderr, "error: rank %d: no progress for %.0f s (--stall-timeout %.0f) during %s: another rank may be "
                    "stopped or gone; ending the job\n", rank_, idle, timeout_s(), what_.c_str());
            fflush(stderr);
            _exit(EXIT_FAILURE);
        }
    }
    const int rank_;
    const double fixed_;
    std::mutex mu_;
    std::string what_;
    std::chrono::steady_clock::time_point since_;
    bool armed_ = false;
    std::vector<double> recent_ms_;
};
