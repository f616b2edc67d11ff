// The collectives of a tensor-parallel group of GPU ranks (model/tensor_parallel.h's split):
// every rank enqueues the same operations on its own stream, in the same order, and the
// ranks meet in them. One DeviceCollective per rank; GpuModel calls it at the split's points
// (the embedding, each O and MLP output: BF16 all-reduce; the LM head: FP32 all-gather).
//
//   NcclGroup        one rank per GPU of this process, over NCCL (ncclCommInitAll): the real
//                    thing. Its operations are enqueued without host synchronization, so a
//                    step with them is captured in its CUDA graph. Builds with NCCL only
//                    (FP4KV_HAVE_NCCL).
//   SameDeviceGroup  N ranks on the current GPU, one thread each, meeting on the host: what
//                    lets one GPU check that the sharded engine computes what the whole one
//                    does. Each operation synchronizes its rank's stream and waits for the
//                    others, so it cannot be captured (capturable() false: the model runs
//                    eagerly), and it is no speed measure.
//
// Failure: a rank that fails outside the collectives leaves the others waiting in one. The
// group's abort() (any thread) ends every pending and later operation of every rank with a
// CollectiveAborted error (NCCL: ncclCommAbort, whose kernels then return); the group is then
// unusable.
//
// Determinism: a SameDeviceGroup sum adds the ranks' values in rank order in FP32 and rounds
// once to BF16, on every rank (bit-identical results everywhere; NCCL's two-rank sum is the
// same single rounding). A 1-rank group is the identity.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime_api.h>

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <vector>

#include "fp4kv/core/error.h"

namespace fp4kv::engine {

// What a rank's collective throws once its group is aborted.
class CollectiveAborted : public Error {
 public:
  explicit CollectiveAborted(const std::string& what) : Error(what) {}
};

inline constexpr int kMaxTensorParallelRanks = 8;  // the GPUs of one host

class DeviceCollective {
 public:
  virtual ~DeviceCollective() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // Whether the operations may be captured in a CUDA graph (no host synchronization).
  virtual bool capturable() const = 0;
  // data[n] = the sum over ranks of every rank's data[n], in place, enqueued on `stream`.
  virtual void all_reduce_sum(__nv_bfloat16* data, size_t n, cudaStream_t stream) = 0;
  // out[ranks][n] = every rank's in[n] in rank order, enqueued on `stream`.
  virtual void all_gather(const float* in, size_t n, float* out, cudaStream_t stream) = 0;
};

// A group of ranks: rank r's collective (each used by one thread, all ranks concurrently),
// the device rank r runs on, and abort().
class DeviceGroup {
 public:
  virtual ~DeviceGroup() = default;
  virtual int ranks() const = 0;
  virtual int device(int r) const = 0;
  // Throws fp4kv::Error for r outside [0, ranks()).
  virtual DeviceCollective& member(int r) = 0;
  virtual void abort() = 0;
};

class SameDeviceGroup final : public DeviceGroup {
 public:
  // `ranks` ranks on the current device. Throws fp4kv::Error for ranks outside
  // [1, kMaxTensorParallelRanks].
  explicit SameDeviceGroup(int ranks);
  SameDeviceGroup(const SameDeviceGroup&) = delete;
  SameDeviceGroup& operator=(const SameDeviceGroup&) = delete;
  ~SameDeviceGroup() override;

  int ranks() const override { return int(members_.size()); }
  int device(int) const override { return device_; }
  DeviceCollective& member(int r) override;
  void abort() override;

 private:
  class Member;
  // All ranks meet here twice per operation (every rank posted its buffer / every rank is done
  // reading); abort() wakes the waiters with CollectiveAborted.
  class Barrier {
   public:
    explicit Barrier(int ranks) : ranks_(ranks) {}
    void arrive_and_wait();
    void abort();

   private:
    std::mutex mutex_;
    std::condition_variable all_arrived_;
    int ranks_, arrived_ = 0;
    long long generation_ = 0;
    bool aborted_ = false;
  };
  int device_ = 0;
  Barrier barrier_;
  std::vector<const void*> posted_;  // per rank: the device buffer of the current operation
  std::vector<std::unique_ptr<Member>> members_;
};

// Whether this build has NCCL (tensor parallelism across GPUs).
bool have_nccl();

// One NCCL communicator per device of `devices` (distinct GPUs of this host), rank r on
// devices[r]. Throws fp4kv::Error without NCCL in the build, for a bad device list, or with
// NCCL's message when its initialization fails.
class NcclGroup final : public DeviceGroup {
 public:
  explicit NcclGroup(const std::vector<int>& devices);
  NcclGroup(const NcclGroup&) = delete;
  NcclGroup& operator=(const NcclGroup&) = delete;
  ~NcclGroup() override;

  int ranks() const override { return int(members_.size()); }
  int device(int r) const override { return devices_[size_t(r)]; }
  DeviceCollective& member(int r) override;
  void abort() override;

 private:
  class Member;
  std::vector<int> devices_;
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace fp4kv::engine
