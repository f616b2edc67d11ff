// The collective operations of a tensor-parallel group (Megatron-style): every rank runs the
// same program on its shard of the model and meets the others at the same points, in the
// same order. One Collective object per rank.
//
// HostGroup: the ranks as threads of one process over host memory. The CPU runner's tensor
// parallelism and its tests use it (the check that the sharded model computes what the whole
// one does). GPU ranks would meet through NCCL on device buffers (docs/DESIGN.md, "Tensor
// parallelism": not in this version).
//
// Determinism: a HostGroup sum adds the ranks' values in rank order on every rank, so all
// ranks hold bit-identical results (and a 1-rank group is the identity).
#pragma once

#include <barrier>
#include <cstddef>
#include <memory>
#include <vector>

namespace fp4kv::model {

class Collective {
 public:
  virtual ~Collective() = default;
  virtual int rank() const = 0;
  virtual int ranks() const = 0;
  // data[n] = the sum over ranks of every rank's data[n], in place.
  virtual void all_reduce_sum(float* data, size_t n) = 0;
  // out[ranks][n] = every rank's in[n], in rank order.
  virtual void all_gather(const float* in, size_t n, float* out) = 0;
};

class HostGroup {
 public:
  // Throws fp4kv::Error for ranks < 1.
  explicit HostGroup(int ranks);
  HostGroup(const HostGroup&) = delete;
  HostGroup& operator=(const HostGroup&) = delete;
  ~HostGroup();

  int ranks() const { return int(members_.size()); }
  // The Collective of rank r; each must be used by one thread, all ranks concurrently.
  Collective& member(int r);

 private:
  class Member;
  std::barrier<> arrive_, leave_;             // every rank posted its buffer / every rank is done reading
  std::vector<const float*> posted_;           // per rank: the buffer of the current operation
  std::vector<std::unique_ptr<Member>> members_;
};

}  // namespace fp4kv::model
