// The tensor-parallel group as one StepModel (tensor_parallel_model.h): a thread per rank,
// each call fanned out to all of them and joined.
#include "fp4kv/engine/tensor_parallel_model.h"

#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/model/tensor_parallel.h"

namespace fp4kv::engine {

// A rank's thread: runs one posted job at a time.
class TensorParallelModel::Worker {
 public:
  Worker() : thread_([this] { loop(); }) {}
  ~Worker() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stop_ = true;
    }
    posted_.notify_all();
    thread_.join();
  }
  void post(std::function<void()> job) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = std::move(job);
      error_ = nullptr;
      pending_ = true;
    }
    posted_.notify_all();
  }
  // Waits for the posted job; its exception, if it threw.
  std::exception_ptr wait() {
    std::unique_lock<std::mutex> lock(mutex_);
    done_.wait(lock, [this] { return !pending_; });
    return error_;
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        posted_.wait(lock, [this] { return pending_ || stop_; });
        if (!pending_) return;
        job = std::move(job_);
      }
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      {
        std::lock_guard<std::mutex> lock(mutex_);
        error_ = error;
        pending_ = false;
      }
      done_.notify_all();
    }
  }

  std::mutex mutex_;
  std::condition_variable posted_, done_;
  std::function<void()> job_;
  bool pending_ = false, stop_ = false;
  std::exception_ptr error_;
  std::thread thread_;  // last: starts once the members above exist
};

TensorParallelModel::TensorParallelModel(std::unique_ptr<SameDeviceGroup> same_device, std::unique_ptr<NcclGroup> nccl,
                                         const std::vector<int>& devices)
    : same_device_(std::move(same_device)), nccl_(std::move(nccl)) {
  for (size_t r = 0; r < devices.size(); ++r) {
    auto rank = std::make_unique<Rank>();
    rank->device = devices[r];
    rank->collective = same_device_ ? &same_device_->member(int(r)) : &nccl_->member(int(r));
    rank->worker = std::make_unique<Worker>();
    ranks_.push_back(std::move(rank));
  }
}

TensorParallelModel::~TensorParallelModel() {
  try {  // each rank's model and weights freed on its own thread (its device current)
    on_ranks([this](int r) {
      ranks_[size_t(r)]->model.reset();
      ranks_[size_t(r)]->weights.reset();
    });
  } catch (...) {
  }
}

void TensorParallelModel::on_ranks(const std::function<void(int rank)>& fn) const {
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const int device = ranks_[r]->device;
    ranks_[r]->worker->post([&fn, r, device] {
      cache::cuda_check(cudaSetDevice(device), "tensor parallelism: rank " + std::to_string(r) + "'s device");
      fn(int(r));
    });
  }
  std::exception_ptr first;
  for (const auto& rank : ranks_) {
    std::exception_ptr e = rank->worker->wait();
    if (e && !first) first = e;
  }
  if (first) std::rethrow_exception(first);
}

void TensorParallelModel::build(const TensorParallelSpec& spec) {
  const float* mu_k = spec.mu_k.empty() ? nullptr : spec.mu_k.data();
  on_ranks([&](int r) {
    Rank& rank = *ranks_[size_t(r)];
    rank.weights = std::make_unique<GpuWeights>(GpuWeights::from_spec(spec.model, spec.seed, r, this->ranks()));
    GpuModelOptions o = spec.options;
    o.collective = rank.collective;
    rank.model = std::make_unique<GpuModel>(*rank.weights, spec.recipe, mu_k, o);
  });
}

namespace {
// The whole model's config of a spec, to check the split before any rank loads anything.
void check_split(const TensorParallelSpec& spec, int ranks) {
  std::string shape;
  const model::Qwen3Config c =
      is_random_model_spec(spec.model, &shape) ? known_shape(shape) : model::Qwen3Config::load_dir(spec.model);
  (void)model::tp_slice(c, 0, ranks);  // throws naming what does not divide
  require(spec.mu_k.empty() || spec.mu_k.size() == size_t(c.num_hidden_layers) * c.num_key_value_heads * c.head_dim,
          "tensor parallelism: mu_k must be [layers][kv_heads][head_dim] of the whole model");
}
}  // namespace

std::unique_ptr<TensorParallelModel> TensorParallelModel::over_gpus(const TensorParallelSpec& spec,
                                                                    const std::vector<int>& devices) {
  check_split(spec, int(devices.size()));
  auto nccl = std::make_unique<NcclGroup>(devices);
  std::unique_ptr<TensorParallelModel> m(new TensorParallelModel(nullptr, std::move(nccl), devices));
  m->build(spec);
  return m;
}

std::unique_ptr<TensorParallelModel> TensorParallelModel::on_one_gpu(const TensorParallelSpec& spec, int ranks) {
  check_split(spec, ranks);
  require(!spec.options.cuda_graphs, "tensor parallelism on one GPU runs eager steps: set cuda_graphs off");
  int device = 0;
  cache::cuda_check(cudaGetDevice(&device), "tensor parallelism: the current device");
  auto group = std::make_unique<SameDeviceGroup>(ranks);
  std::unique_ptr<TensorParallelModel> m(
      new TensorParallelModel(std::move(group), nullptr, std::vector<int>(size_t(ranks), device)));
  m->build(spec);
  return m;
}

LoadedStepModel load_step_model(const TensorParallelSpec& spec, int ranks) {
  require(ranks >= 1, "tensor parallelism: " + std::to_string(ranks) + " ranks (at least 1)");
  LoadedStepModel m;
  if (ranks == 1) {
    m.weights = std::make_unique<GpuWeights>(GpuWeights::from_spec(spec.model, spec.seed));
    m.model = std::make_unique<GpuModel>(*m.weights, spec.recipe, spec.mu_k.empty() ? nullptr : spec.mu_k.data(),
                                         spec.options);
    return m;
  }
  int visible = 0;
  cache::cuda_check(cudaGetDeviceCount(&visible), "tensor parallelism: device count");
  require(visible >= ranks, "tensor parallelism over " + std::to_string(ranks) + " GPUs: " + std::to_string(visible) +
                                " visible");
  std::vector<int> devices;
  for (int r = 0; r < ranks; ++r) devices.push_back(r);
  m.model = TensorParallelModel::over_gpus(spec, devices);
  return m;
}

void TensorParallelModel::step(const StepRows& rows) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->step(rows); });
}

void TensorParallelModel::prepare_steps(int max_batch) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->prepare_steps(max_batch); });
}

void TensorParallelModel::prefill(const std::vector<int32_t>& tokens, int start, const std::vector<int32_t>& block_row) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->prefill(tokens, start, block_row); });
}

std::vector<float> TensorParallelModel::read_logits() const {
  std::vector<float> logits;  // every rank checks its own error flags; rank 0's logits answer
  on_ranks([&](int r) {
    std::vector<float> mine = ranks_[size_t(r)]->model->read_logits();
    if (r == 0) logits = std::move(mine);
  });
  return logits;
}

std::vector<int32_t> TensorParallelModel::sample(const std::vector<SamplingRow>& params) {
  std::vector<int32_t> tokens;  // the same logits and rule on every rank: rank 0's draw is everyone's
  on_ranks([&](int r) {
    std::vector<int32_t> mine = ranks_[size_t(r)]->model->sample(params);
    if (r == 0) tokens = std::move(mine);
  });
  return tokens;
}

void TensorParallelModel::release(int32_t first_block) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->release(first_block); });
}

void TensorParallelModel::synchronize() const {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->synchronize(); });
}

StepProfile TensorParallelModel::profile_step(const StepRows& rows) {
  StepProfile profile;
  on_ranks([&](int r) {
    StepProfile mine = ranks_[size_t(r)]->model->profile_step(rows);
    if (r == 0) profile = mine;
  });
  return profile;
}

void TensorParallelModel::fill_random_tokens(const StepRows& rows, int first, int count, uint64_t seed, int chunk) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->fill_random_tokens(rows, first, count, seed, chunk); });
}

void TensorParallelModel::set_cache_updates(bool on) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->set_cache_updates(on); });
}

void TensorParallelModel::set_cuda_graphs(bool on) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->set_cuda_graphs(on); });
}

}  // namespace fp4kv::engine
