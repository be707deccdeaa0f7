// Streams and events of the CUDA-on-CPU runtime (see internal.h for the two
// modes). In the default mode work runs when issued and an event records the
// host time at which everything before it has finished. In deferred mode each
// created stream is a queue of operations; an event record and a stream wait
// are operations too, and a wait names the event's most recent record at the
// time it was issued, as in CUDA. Work runs only when needed, and then only
// what it depends on; the legacy default stream first runs everything.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <mutex>
#include <vector>

#include "internal.h"

struct StreamOp {
    uint64_t seq;                  // issue order, over all streams
    std::function<void()> work;    // empty for a wait
    CUevent_st* records = nullptr;  // a record of this event (generation `gen`)
    CUevent_st* waits = nullptr;    // a wait for generation `gen` of this event
    uint64_t gen = 0;
};

struct CUstream_st {
    std::deque<StreamOp> ops;  // deferred mode only
};

struct CUevent_st {
    std::chrono::steady_clock::time_point when;
    uint64_t issued = 0;     // records issued
    uint64_t completed = 0;  // records that have run
};

namespace cpucuda {

static std::recursive_mutex stream_mutex;  // recursive: work may issue work
static std::vector<CUstream_st*> streams;  // live created streams, in creation order
static uint64_t next_seq = 0;

// The legacy default stream (0, cudaStreamLegacy, cudaStreamPerThread).
static bool is_legacy(cudaStream_t s) { return s == nullptr || s == cudaStreamLegacy || s == cudaStreamPerThread; }

static void run_op(StreamOp& op) {
    if (op.work) op.work();
    if (op.records) {
        op.records->when = std::chrono::steady_clock::now();
        op.records->completed = std::max(op.records->completed, op.gen);
    }
}

// The queued record of generation `gen` of event `e`: its stream and issue number.
static CUstream_st* find_record(const CUevent_st* e, uint64_t gen, uint64_t* seq) {
    for (CUstream_st* t : streams)
        for (const StreamOp& op : t->ops)
            if (op.records == e && op.gen == gen) {
                *seq = op.seq;
                return t;
            }
    return nullptr;
}

// Runs the operations of `s` up to and including issue number `seq`, and
// first, for each wait among them, the stream that holds the awaited record.
static void run_through(CUstream_st* s, uint64_t seq) {
    while (!s->ops.empty() && s->ops.front().seq <= seq) {
        StreamOp& head = s->ops.front();
        if (head.waits && head.waits->completed < head.gen) {
            uint64_t record_seq = 0;
            CUstream_st* holder = find_record(head.waits, head.gen, &record_seq);
            if (!holder) {  // cannot happen: a pending record is always queued somewhere
                fprintf(stderr, "cpu_cuda: stream waits for an event record that is nowhere queued\n");
                abort();
            }
            run_through(holder, record_seq);
            continue;
        }
        StreamOp op = std::move(head);
        s->ops.pop_front();
        run_op(op);
    }
}

// Everything queued. Later streams go first: together with running only
// dependencies elsewhere, work issued late runs as early as its stream allows.
static void run_all() {
    for (size_t i = streams.size(); i-- > 0;) run_through(streams[i], UINT64_MAX);
}

static void push(cudaStream_t stream, StreamOp op) {
    op.seq = next_seq++;
    stream->ops.push_back(std::move(op));
}

void enqueue(cudaStream_t stream, std::function<void()> work) {
    if (!streams_deferred()) return work();
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    if (is_legacy(stream)) {  // the legacy stream waits for every stream
        run_all();
        return work();
    }
    push(stream, StreamOp{0, std::move(work)});
}

void run_after_dependencies(cudaStream_t stream, std::function<void()> work) {
    if (!streams_deferred()) return work();
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    enqueue(stream, std::move(work));  // on the legacy stream it has run already
    if (!is_legacy(stream)) run_through(stream, next_seq - 1);
}

void synchronize_stream(cudaStream_t stream) {
    if (!streams_deferred()) return;
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    if (is_legacy(stream)) run_all();
    else run_through(stream, UINT64_MAX);
}

void synchronize_device() {
    if (!streams_deferred()) return;
    std::lock_guard<std::recursive_mutex> lock(stream_mutex);
    run_all();
}

// Runs until event `e`'s latest record has completed.
static void synchronize_event(CUevent_st* e) {
    if (e->completed >= e->issued) return;
    uint64_t seq = 0;
    if (CUstream_st* t = find_record(e, e->issued, &seq)) run_through(t, seq);
}

}  // namespace cpucuda

using cpucuda::record;

extern "C" {

cudaError_t cudaStreamCreate(cudaStream_t* s) {
    if (!s) return record(cudaErrorInvalidValue);
    std::lock_guard<std::recursive_mutex> lock(cpucuda::stream_mutex);
    *s = new CUstream_st();
    cpucuda::streams.push_back(*s);
    return cudaSuccess;
}
cudaError_t cudaStreamCreateWithFlags(cudaStream_t* s, unsigned int) { return cudaStreamCreate(s); }
cudaError_t cudaStreamCreateWithPriority(cudaStream_t* s, unsigned int, int) { return cudaStreamCreate(s); }

// Work still queued runs first (CUDA finishes it before releasing the stream).
cudaError_t cudaStreamDestroy(cudaStream_t s) {
    if (cpucuda::is_legacy(s)) return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(cpucuda::stream_mutex);
    auto it = std::find(cpucuda::streams.begin(), cpucuda::streams.end(), s);
    if (it == cpucuda::streams.end()) return record(cudaErrorInvalidResourceHandle);
    cpucuda::run_through(s, UINT64_MAX);
    cpucuda::streams.erase(it);
    delete s;
    return cudaSuccess;
}
cudaError_t cudaStreamSynchronize(cudaStream_t s) {
    cpucuda::synchronize_stream(s);
    return cpucuda::take_pending();
}
// Queries make progress (run the stream) so that polling loops terminate.
cudaError_t cudaStreamQuery(cudaStream_t s) {
    cpucuda::synchronize_stream(s);
    return cudaSuccess;
}

cudaError_t cudaStreamWaitEvent(cudaStream_t s, cudaEvent_t e, unsigned int) {
    if (!e) return record(cudaErrorInvalidResourceHandle);
    if (!cpucuda::streams_deferred()) return cudaSuccess;
    std::lock_guard<std::recursive_mutex> lock(cpucuda::stream_mutex);
    if (cpucuda::is_legacy(s)) {
        cpucuda::run_all();
        return cudaSuccess;
    }
    if (e->issued > e->completed) cpucuda::push(s, StreamOp{0, {}, nullptr, e, e->issued});
    return cudaSuccess;
}

cudaError_t cudaEventCreate(cudaEvent_t* e) {
    if (!e) return record(cudaErrorInvalidValue);
    *e = new CUevent_st();
    return cudaSuccess;
}
cudaError_t cudaEventCreateWithFlags(cudaEvent_t* e, unsigned int) { return cudaEventCreate(e); }
cudaError_t cudaEventDestroy(cudaEvent_t e) {
    if (!e) return record(cudaErrorInvalidResourceHandle);
    cpucuda::synchronize_device();  // no queued operation may still name it
    delete e;
    return cudaSuccess;
}
cudaError_t cudaEventRecord(cudaEvent_t e, cudaStream_t s) {
    if (!e) return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(cpucuda::stream_mutex);
    const uint64_t gen = ++e->issued;
    if (!cpucuda::streams_deferred() || cpucuda::is_legacy(s)) {
        if (cpucuda::streams_deferred()) cpucuda::run_all();
        e->when = std::chrono::steady_clock::now();
        e->completed = gen;
        return cudaSuccess;
    }
    cpucuda::push(s, StreamOp{0, {}, e, nullptr, gen});
    return cudaSuccess;
}
cudaError_t cudaEventSynchronize(cudaEvent_t e) {
    if (!e) return record(cudaErrorInvalidResourceHandle);
    {
        std::lock_guard<std::recursive_mutex> lock(cpucuda::stream_mutex);
        cpucuda::synchronize_event(e);
    }
    return cpucuda::take_pending();
}
cudaError_t cudaEventQuery(cudaEvent_t e) {  // makes progress, like cudaStreamQuery
    if (!e) return record(cudaErrorInvalidResourceHandle);
    std::lock_guard<std::recursive_mutex> lock(cpucuda::stream_mutex);
    cpucuda::synchronize_event(e);
    return cudaSuccess;
}
cudaError_t cudaEventElapsedTime(float* ms, cudaEvent_t a, cudaEvent_t b) {
    if (!ms || !a || !b) return record(cudaErrorInvalidResourceHandle);
    if (!a->issued || !b->issued) return record(cudaErrorInvalidResourceHandle);
    if (a->completed < a->issued || b->completed < b->issued) return record(cudaErrorNotReady);
    *ms = std::chrono::duration<float, std::milli>(b->when - a->when).count();
    return cudaSuccess;
}

}  // extern "C"
