// CPU-runtime extensions to NCCL (cpu_cuda/nccl.cpp): per-communicator
// counters that tests read to prove how much communication a program issued.
// Only the CPU build has these; guard uses with #ifdef CPUCUDA.
//
// Counting rule: a collective is counted when it is EXECUTED successfully.
// A call outside a group executes at once; a call between ncclGroupStart and
// ncclGroupEnd executes (and is counted) at the outermost ncclGroupEnd. Calls
// rejected by argument checking are not counted. Calls with count 0 are
// counted (calls += 1, bytes += 0).
//
// bytes[k] adds, per executed call of kind k (size = bytes of one element of
// the datatype, nranks = communicator size):
//   CPUCUDA_NCCL_ALLREDUCE      count * size                (one buffer)
//   CPUCUDA_NCCL_REDUCESCATTER  recvcount * nranks * size   (the full input)
//   CPUCUDA_NCCL_ALLGATHER      sendcount * nranks * size   (the full output)
//   CPUCUDA_NCCL_BROADCAST      count * size                (ncclBroadcast and ncclBcast)
//   CPUCUDA_NCCL_REDUCE         count * size                (ncclReduce)
// The numbers are the same on every rank of a communicator, so "one gradient's
// worth of reduction" is bytes[ALLREDUCE] + bytes[REDUCESCATTER] equal to the
// gradient size in bytes.
#pragma once
#include <stdint.h>
#include <nccl.h>

enum CpuCudaNcclColl {
    CPUCUDA_NCCL_ALLREDUCE = 0,
    CPUCUDA_NCCL_REDUCESCATTER = 1,
    CPUCUDA_NCCL_ALLGATHER = 2,
    CPUCUDA_NCCL_BROADCAST = 3,
    CPUCUDA_NCCL_REDUCE = 4,
    CPUCUDA_NCCL_NUM_COLLS = 5
};

struct CpuCudaNcclCounters {
    uint64_t calls[CPUCUDA_NCCL_NUM_COLLS];  // executed calls, indexed by CpuCudaNcclColl
    uint64_t bytes[CPUCUDA_NCCL_NUM_COLLS];  // bytes as defined above
};

#ifdef __cplusplus
extern "C" {
#endif

// Copies comm's counters into *out. ncclInvalidArgument for a null/destroyed
// comm or a null out.
ncclResult_t cpucuda_nccl_get_counters(ncclComm_t comm, struct CpuCudaNcclCounters* out);
// Sets all of comm's counters to zero. ncclInvalidArgument for a null/destroyed comm.
ncclResult_t cpucuda_nccl_reset_counters(ncclComm_t comm);

#ifdef __cplusplus
}
#endif
