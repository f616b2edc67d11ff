// The tensor-parallel group as one StepModel (tensor_parallel_model.h): a thread per rank,
// each call fanned out to all of them and joined.
#include "fp4kv/engine/tensor_parallel_model.h"

#include <condition_variable>
#include <algorithm>
#include <chrono>
#include <exception>
#include <mutex>
#include <thread>

#include "fp4kv/cache/cuda_check.h"
#include "fp4kv/core/error.h"
#include "fp4kv/model/tensor_parallel.h"

namespace fp4kv::engine {

// A rank's thread: runs one posted job at a time and reports its end (with the job's
// exception, if it threw) through the job's own callback.
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
  void post(std::function<void()> job, std::function<void(std::exception_ptr)> done) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      job_ = std::move(job);
      done_ = std::move(done);
    }
    posted_.notify_all();
  }

 private:
  void loop() {
    for (;;) {
      std::function<void()> job;
      std::function<void(std::exception_ptr)> done;
      {
        std::unique_lock<std::mutex> lock(mutex_);
        posted_.wait(lock, [this] { return job_ || stop_; });
        if (!job_) return;
        job = std::move(job_);
        done = std::move(done_);
        job_ = nullptr;
      }
      std::exception_ptr error;
      try {
        job();
      } catch (...) {
        error = std::current_exception();
      }
      done(error);
    }
  }

  std::mutex mutex_;
  std::condition_variable posted_;
  std::function<void()> job_;
  std::function<void(std::exception_ptr)> done_;
  bool stop_ = false;
  std::thread thread_;  // last: starts once the members above exist
};

TensorParallelModel::TensorParallelModel(std::unique_ptr<DeviceGroup> group) : group_(std::move(group)) {
  for (int r = 0; r < group_->ranks(); ++r) {
    auto rank = std::make_unique<Rank>();
    rank->worker = std::make_unique<Worker>();
    ranks_.push_back(std::move(rank));
  }
}

TensorParallelModel::~TensorParallelModel() {
  failed_.clear();  // the teardown runs on a failed group too (its collectives were aborted)
  try {  // each rank's model and weights freed on its own thread (its device current)
    on_ranks([this](int r) {
      ranks_[size_t(r)]->model.reset();
      ranks_[size_t(r)]->weights.reset();
    });
  } catch (...) {
  }
}

namespace {
// How long the other ranks get to finish a call after one rank failed in it.
constexpr std::chrono::seconds kAbortGrace{10};

bool is_abort(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const CollectiveAborted&) {
    return true;
  } catch (...) {
    return false;
  }
}
std::string message_of(const std::exception_ptr& e) {
  try {
    std::rethrow_exception(e);
  } catch (const std::exception& x) {
    return x.what();
  } catch (...) {
    return "an unknown error";
  }
}
}  // namespace

// One call on every rank. A rank that fails while others still run past kAbortGrace may leave
// them waiting in a collective: the group is aborted (their collectives throw
// CollectiveAborted) and marked failed. Errors every rank raises alike (bad rows, options:
// before any collective) leave the group usable.
void TensorParallelModel::on_ranks(const std::function<void(int rank)>& fn) const {
  if (!failed_.empty())  // every call: the message only on failure
    throw Error("tensor parallelism: the group failed earlier (" + failed_ + "); build it again");
  struct Round {  // shared with the workers' callbacks, which may run past this call's return
    std::mutex mutex;
    std::condition_variable changed;
    int pending = 0;
    std::vector<std::exception_ptr> errors;
  };
  const auto round = std::make_shared<Round>();
  round->pending = ranks();
  round->errors.resize(ranks_.size());
  for (size_t r = 0; r < ranks_.size(); ++r) {
    const int device = group_->device(int(r));
    ranks_[r]->worker->post(
        [&fn, r, device] {
          if (const cudaError_t e = cudaSetDevice(device); e != cudaSuccess)
            cache::throw_cuda_error(e, "tensor parallelism: rank " + std::to_string(r) + "'s device");
          fn(int(r));
        },
        [round, r](std::exception_ptr e) {
          std::lock_guard<std::mutex> lock(round->mutex);
          round->errors[r] = e;
          --round->pending;
          round->changed.notify_all();
        });
  }
  bool aborted = false;
  std::vector<std::exception_ptr> errors;
  {
    std::unique_lock<std::mutex> lock(round->mutex);
    const auto any_error = [&] {
      const auto& e = round->errors;
      return std::any_of(e.begin(), e.end(), [](const std::exception_ptr& x) { return bool(x); });
    };
    round->changed.wait(lock, [&] { return round->pending == 0 || any_error(); });
    // A rank failed: the others either fail alike soon (a check every rank makes) or may be
    // waiting in a collective for it; after the grace, free them (abort the group).
    if (!round->changed.wait_for(lock, kAbortGrace, [&] { return round->pending == 0; })) {
      aborted = true;
      lock.unlock();
      group_->abort();
      lock.lock();
      round->changed.wait(lock, [&] { return round->pending == 0; });
    }
    errors = round->errors;
  }
  std::exception_ptr first;  // the lowest rank's own error (not an abort it suffered)
  int failed_ranks = 0;
  for (const std::exception_ptr& e : errors) {
    if (!e) continue;
    ++failed_ranks;
    if (!first || (is_abort(first) && !is_abort(e))) first = e;
  }
  if (!first) return;
  if (aborted || failed_ranks < ranks()) failed_ = message_of(first);
  std::rethrow_exception(first);
}

void TensorParallelModel::build(const TensorParallelSpec& spec) {
  const float* mu_k = spec.mu_k.empty() ? nullptr : spec.mu_k.data();
  on_ranks([&](int r) {
    Rank& rank = *ranks_[size_t(r)];
    rank.weights = std::make_unique<GpuWeights>(GpuWeights::from_spec(spec.model, spec.seed, r, this->ranks()));
    GpuModelOptions o = spec.options;
    o.collective = &group_->member(r);
    rank.model = std::make_unique<GpuModel>(*rank.weights, spec.recipe, mu_k, o);
  });
}

namespace {
// The whole model's config of a spec, to check the split before any rank loads anything.
void check_split(const TensorParallelSpec& spec, int ranks) {
  const model::Qwen3Config c = config_of_spec(spec.model);
  (void)model::tp_slice(c, 0, ranks);  // throws naming what does not divide
  require(spec.mu_k.empty() || spec.mu_k.size() == size_t(c.num_hidden_layers) * c.num_key_value_heads * c.head_dim,
          "tensor parallelism: mu_k must be [layers][kv_heads][head_dim] of the whole model");
}
}  // namespace

std::unique_ptr<TensorParallelModel> TensorParallelModel::over_gpus(const TensorParallelSpec& spec,
                                                                    const std::vector<int>& devices) {
  check_split(spec, int(devices.size()));
  std::unique_ptr<TensorParallelModel> m(new TensorParallelModel(std::make_unique<NcclGroup>(devices)));
  m->build(spec);
  return m;
}

std::unique_ptr<TensorParallelModel> TensorParallelModel::on_one_gpu(const TensorParallelSpec& spec, int ranks) {
  check_split(spec, ranks);
  std::unique_ptr<TensorParallelModel> m(new TensorParallelModel(std::make_unique<SameDeviceGroup>(ranks)));
  m->build(spec);  // its GpuModels refuse cuda_graphs: this group cannot be captured
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

void TensorParallelModel::for_each_rank(const std::function<void(int rank, GpuModel& model)>& fn) {
  on_ranks([&](int r) { fn(r, *ranks_[size_t(r)]->model); });
}

void TensorParallelModel::step(const StepRows& rows) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->step(rows); });
}

void TensorParallelModel::prepare_steps(int max_batch) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->prepare_steps(max_batch); });
}

void TensorParallelModel::prefill(const std::vector<int32_t>& tokens, int start,
                                  const std::vector<int32_t>& block_row) {
  on_ranks([&](int r) { ranks_[size_t(r)]->model->prefill(tokens, start, block_row); });
}

// Every rank holds the same logits after the gather: rank 0 copies them (or draws from them),
// the others only check their step's error flags.
std::vector<float> TensorParallelModel::read_logits() const {
  std::vector<float> logits;
  on_ranks([&](int r) {
    if (r == 0) {
      logits = ranks_[0]->model->read_logits();
    } else {
      ranks_[size_t(r)]->model->check_errors();
    }
  });
  return logits;
}

std::vector<int32_t> TensorParallelModel::sample(const std::vector<SamplingRow>& params) {
  std::vector<int32_t> tokens;
  on_ranks([&](int r) {
    if (r == 0) {
      tokens = ranks_[0]->model->sample(params);
    } else {
      ranks_[size_t(r)]->model->check_errors();
    }
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
