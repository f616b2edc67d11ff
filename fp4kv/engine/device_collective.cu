// The tensor-parallel groups of device_collective.h: the host-met group of ranks on one GPU
// (with its rank-order sum kernel) and the NCCL group.
#include "fp4kv/engine/device_collective.h"

#include <algorithm>
#include <atomic>
#include <string>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#ifdef FP4KV_HAVE_NCCL
#include <nccl.h>
#endif

namespace fp4kv::engine {

using cache::cuda_check;

namespace {

constexpr int kSumThreads = 256;
constexpr int kMaxSumBlocks = 1024;

struct RankBuffers {
  const __nv_bfloat16* rank[kMaxTensorParallelRanks];
};

// out[i] = bf16(sum over ranks of in[r][i]), added in rank order in FP32.
__global__ void __launch_bounds__(kSumThreads) sum_ranks_kernel(RankBuffers in, int ranks, size_t n,
                                                                __nv_bfloat16* out) {
  for (size_t i = blockIdx.x * size_t(kSumThreads) + threadIdx.x; i < n; i += size_t(gridDim.x) * kSumThreads) {
    float s = 0.0f;
    for (int r = 0; r < ranks; ++r) s += __bfloat162float(in.rank[r][i]);
    out[i] = __float2bfloat16_rn(s);
  }
}

int checked_ranks(int ranks, const char* who) {
  if (ranks < 1 || ranks > kMaxTensorParallelRanks)
    throw Error(std::string(who) + ": " + std::to_string(ranks) + " ranks (1 to " +
                std::to_string(kMaxTensorParallelRanks) + ")");
  return ranks;
}

}  // namespace

class SameDeviceGroup::Member final : public DeviceCollective {
 public:
  Member(SameDeviceGroup& group, int rank) : group_(group), rank_(rank) {}
  ~Member() override {
    if (sum_) cudaFree(sum_);
  }
  int rank() const override { return rank_; }
  int ranks() const override { return group_.ranks(); }
  bool capturable() const override { return false; }

  void all_reduce_sum(__nv_bfloat16* data, size_t n, cudaStream_t stream) override {
    reserve(n);
    post(data, stream);
    RankBuffers in{};
    for (int r = 0; r < ranks(); ++r) in.rank[r] = static_cast<const __nv_bfloat16*>(group_.posted_[size_t(r)]);
    const int blocks = int(std::min<size_t>(kMaxSumBlocks, (n + kSumThreads - 1) / kSumThreads));
    if (n > 0) sum_ranks_kernel<<<blocks, kSumThreads, 0, stream>>>(in, ranks(), n, sum_);
    cache::cuda_check_launch("SameDeviceGroup: all-reduce");
    leave(stream);
    cuda_check(cudaMemcpyAsync(data, sum_, n * sizeof(__nv_bfloat16), cudaMemcpyDeviceToDevice, stream),
               "SameDeviceGroup: all-reduce");
  }

  void all_gather(const float* in, size_t n, float* out, cudaStream_t stream) override {
    post(in, stream);
    for (int r = 0; r < ranks(); ++r)
      cuda_check(cudaMemcpyAsync(out + size_t(r) * n, group_.posted_[size_t(r)], n * sizeof(float),
                                 cudaMemcpyDeviceToDevice, stream),
                 "SameDeviceGroup: all-gather");
    leave(stream);
  }

 private:
  // The rank's buffer is complete and posted, and every other rank's too.
  void post(const void* buffer, cudaStream_t stream) {
    cuda_check(cudaStreamSynchronize(stream), "SameDeviceGroup: the rank's stream");
    group_.posted_[size_t(rank_)] = buffer;
    group_.barrier_.arrive_and_wait();
  }
  // Every rank is done reading the posted buffers (so none is overwritten early).
  void leave(cudaStream_t stream) {
    cuda_check(cudaStreamSynchronize(stream), "SameDeviceGroup: the rank's stream");
    group_.barrier_.arrive_and_wait();
  }
  void reserve(size_t n) {
    if (n <= sum_elements_) return;
    if (sum_) cudaFree(sum_);
    sum_ = nullptr;
    cuda_check(cudaMalloc(&sum_, n * sizeof(__nv_bfloat16)), "SameDeviceGroup: sum buffer");
    sum_elements_ = n;
  }

  SameDeviceGroup& group_;
  int rank_;
  __nv_bfloat16* sum_ = nullptr;
  size_t sum_elements_ = 0;
};

void SameDeviceGroup::Barrier::arrive_and_wait() {
  std::unique_lock<std::mutex> lock(mutex_);
  if (aborted_) throw CollectiveAborted("tensor parallelism: the group was aborted (another rank failed)");
  const long long generation = generation_;
  if (++arrived_ == ranks_) {
    arrived_ = 0;
    ++generation_;
    all_arrived_.notify_all();
    return;
  }
  all_arrived_.wait(lock, [&] { return generation_ != generation || aborted_; });
  if (generation_ == generation)
    throw CollectiveAborted("tensor parallelism: the group was aborted (another rank failed)");
}

void SameDeviceGroup::Barrier::abort() {
  std::lock_guard<std::mutex> lock(mutex_);
  aborted_ = true;
  all_arrived_.notify_all();
}

SameDeviceGroup::SameDeviceGroup(int ranks)
    : barrier_(checked_ranks(ranks, "SameDeviceGroup")), posted_(size_t(ranks), nullptr) {
  cuda_check(cudaGetDevice(&device_), "SameDeviceGroup: the current device");
  for (int r = 0; r < ranks; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

void SameDeviceGroup::abort() { barrier_.abort(); }

SameDeviceGroup::~SameDeviceGroup() = default;

DeviceCollective& SameDeviceGroup::member(int r) {
  if (r < 0 || r >= ranks())
    throw Error("SameDeviceGroup: rank " + std::to_string(r) + " outside [0, " + std::to_string(ranks()) + ")");
  return *members_[size_t(r)];
}

#ifdef FP4KV_HAVE_NCCL

namespace {
void nccl_check(ncclResult_t result, const std::string& what) {
  if (result != ncclSuccess) throw Error(what + ": " + ncclGetErrorString(result));
}
}  // namespace

class NcclGroup::Member final : public DeviceCollective {
 public:
  Member(ncclComm_t comm, int rank, int ranks) : comm_(comm), rank_(rank), ranks_(ranks) {}
  ~Member() override {
    if (!aborted_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int ranks() const override { return ranks_; }
  bool capturable() const override { return true; }
  void all_reduce_sum(__nv_bfloat16* data, size_t n, cudaStream_t stream) override {
    check_live();
    nccl_check(ncclAllReduce(data, data, n, ncclBfloat16, ncclSum, comm_, stream), "NCCL all-reduce");
  }
  void all_gather(const float* in, size_t n, float* out, cudaStream_t stream) override {
    check_live();
    nccl_check(ncclAllGather(in, out, n, ncclFloat32, comm_, stream), "NCCL all-gather");
  }
  void abort() {
    if (!aborted_.exchange(true)) ncclCommAbort(comm_);
  }

 private:
  void check_live() const {
    if (aborted_) throw CollectiveAborted("tensor parallelism: the NCCL group was aborted (another rank failed)");
  }
  ncclComm_t comm_;
  int rank_, ranks_;
  std::atomic<bool> aborted_{false};
};

bool have_nccl() { return true; }

NcclGroup::NcclGroup(const std::vector<int>& devices) : devices_(devices) {
  const int n = checked_ranks(int(devices.size()), "NcclGroup");
  int visible = 0;
  cuda_check(cudaGetDeviceCount(&visible), "NcclGroup: device count");
  for (size_t i = 0; i < devices.size(); ++i) {
    require(devices[i] >= 0 && devices[i] < visible, "NcclGroup: device " + std::to_string(devices[i]) +
                                                         " outside the " + std::to_string(visible) + " visible GPUs");
    for (size_t j = 0; j < i; ++j)
      require(devices[j] != devices[i], "NcclGroup: device " + std::to_string(devices[i]) + " named twice");
  }
  std::vector<ncclComm_t> comms(size_t(n), nullptr);
  nccl_check(ncclCommInitAll(comms.data(), n, devices.data()), "NCCL initialization");
  for (int r = 0; r < n; ++r) members_.push_back(std::make_unique<Member>(comms[size_t(r)], r, n));
}

void NcclGroup::abort() {
  for (auto& m : members_) m->abort();
}

#else

bool have_nccl() { return false; }

class NcclGroup::Member : public DeviceCollective {};  // never made: the constructor throws

void NcclGroup::abort() {}

NcclGroup::NcclGroup(const std::vector<int>& devices) : devices_(devices) {
  throw Error("tensor parallelism across GPUs runs over NCCL, and this build has no NCCL (it was not found at "
              "configure time)");
}

#endif

NcclGroup::~NcclGroup() = default;

DeviceCollective& NcclGroup::member(int r) {
  if (r < 0 || r >= ranks())
    throw Error("NcclGroup: rank " + std::to_string(r) + " outside [0, " + std::to_string(ranks()) + ")");
  return *members_[size_t(r)];
}

}  // namespace fp4kv::engine
