#include "fp4kv/model/collective.h"

#include <algorithm>
#include <string>

#include "fp4kv/core/error.h"

namespace fp4kv::model {

class HostGroup::Member final : public Collective {
 public:
  Member(HostGroup& group, int rank) : group_(group), rank_(rank) {}
  int rank() const override { return rank_; }
  int ranks() const override { return group_.ranks(); }

  void all_reduce_sum(float* data, size_t n) override {
    sum_.assign(n, 0.0f);
    group_.posted_[size_t(rank_)] = data;
    group_.arrive_.arrive_and_wait();
    for (const float* src : group_.posted_) {  // rank order on every rank: identical sums
      for (size_t i = 0; i < n; ++i) sum_[i] += src[i];
    }
    group_.leave_.arrive_and_wait();  // no rank overwrites its buffer while another still reads it
    std::copy(sum_.begin(), sum_.end(), data);
  }

  void all_gather(const float* in, size_t n, float* out) override {
    group_.posted_[size_t(rank_)] = in;
    group_.arrive_.arrive_and_wait();
    for (size_t r = 0; r < group_.posted_.size(); ++r) std::copy_n(group_.posted_[r], n, out + r * n);
    group_.leave_.arrive_and_wait();
  }

 private:
  HostGroup& group_;
  int rank_;
  std::vector<float> sum_;
};

namespace {
int checked_ranks(int ranks) {
  if (ranks < 1) throw Error("HostGroup: " + std::to_string(ranks) + " ranks (at least 1)");
  return ranks;
}
}  // namespace

HostGroup::HostGroup(int ranks)
    : arrive_(checked_ranks(ranks)), leave_(ranks), posted_(size_t(ranks), nullptr) {
  for (int r = 0; r < ranks; ++r) members_.push_back(std::make_unique<Member>(*this, r));
}

HostGroup::~HostGroup() = default;

Collective& HostGroup::member(int r) {
  if (r < 0 || r >= ranks())
    throw Error("HostGroup: rank " + std::to_string(r) + " outside [0, " + std::to_string(ranks()) + ")");
  return *members_[size_t(r)];
}

}  // namespace fp4kv::model
