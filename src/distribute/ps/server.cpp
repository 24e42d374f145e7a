#include "hpm/distribute/ps/server.h"

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <random>
#include <unordered_map>
#include <unordered_set>

#include "distribute/ps/rpc.h"
#include "hpm/io/atomic_file.h"
#include "hpm/io/crc32c.h"
#include "hpm/io/safetensors.h"
#include "hpm/optim/optimizer.h"
#include "hpm/tensor/kernels.h"

namespace hpm::distribute::ps {

using grpc::ServerContext;

using grpc::StatusCode;

// ---- the shard ---------------------------------------------------------------------------------

class ParameterServer::Service final : public rpc::ParameterServer::Service {
 public:
  Service(const Cluster& cluster, int task)
      : token_(cluster.security.token), task_(task), incarnation_(std::random_device{}() | 1) {}

  ServerCounters counters() const {
    std::lock_guard lock(mu_);
    ServerCounters c = counters_;
    c.refused = refused_.load();
    return c;
  }

  grpc::Status Init(ServerContext* ctx, const rpc::InitRequest* req,
                    rpc::InitReply* reply) override {
    if (grpc::Status s = admit(ctx); !s.ok()) return s;
    nn::NamedTensors vars;
    for (const auto& t : req->vars()) {
      Tensor v;
      if (grpc::Status s = from_proto(t, "Init", &v); !s.ok()) return refuse(s);
      if (!is_buffer_variable(t.name())) v.set_requires_grad(true);
      vars.emplace_back(t.name(), v);
    }
    if (req->sync_parts() < 0)
      return refuse({StatusCode::INVALID_ARGUMENT, "Init: sync_parts must be >= 0"});
    std::shared_ptr<optim::Optimizer> opt;
    try {
      nn::NamedTensors trainable;  // buffers are assigned in apply(), never optimized
      for (const auto& nv : vars)
        if (!is_buffer_variable(nv.first)) trainable.push_back(nv);
      opt = make_optimizer(req->optimizer(), trainable);
      if (req->optimizer_state_size() > 0) {
        nn::NamedTensors state;
        for (const auto& t : req->optimizer_state()) {
          Tensor v;
          if (grpc::Status s = from_proto(t, "Init optimizer state", &v); !s.ok()) return refuse(s);
          if (t.name() == "step") {
            // Saved as a float (exact to 2^24); anything else is not a step count (and casting
            // it, found by fuzz/ps_fuzz.cpp, was undefined behaviour).
            const std::vector<float> count = v.to_vector();
            if (count.size() != 1 || !(count[0] >= 0.0f && count[0] <= 16777216.0f) ||
                count[0] != std::floor(count[0])) {
              return refuse({StatusCode::INVALID_ARGUMENT,
                             "Init optimizer state: 'step' must be one whole number in [0, 2^24], "
                             "got " +
                                 (count.size() == 1 ? std::to_string(count[0])
                                                    : std::to_string(count.size()) + " values")});
            }
            v = Tensor::from_i64(std::vector<std::int64_t>{static_cast<std::int64_t>(count[0])},
                                 Shape{});
          }
          state.emplace_back(t.name(), v);
        }
        opt->load_state(state);
      }
    } catch (const std::exception& e) {
      return refuse({StatusCode::INVALID_ARGUMENT, std::string("Init: ") + e.what()});
    }
    std::lock_guard lock(mu_);
    vars_ = std::move(vars);
    index_.clear();
    grads_.clear();
    for (std::size_t i = 0; i < vars_.size(); ++i) {
      index_[vars_[i].first] = i;
      grads_.push_back(Tensor::zeros(vars_[i].second.shape()));
      if (!is_buffer_variable(vars_[i].first)) vars_[i].second.set_grad(grads_.back());
    }
    optimizer_ = std::move(opt);
    parts_ = req->sync_parts();
    counters_.version = req->version();
    applied_.clear();
    reset_step();
    initialized_ = true;
    reply->set_version(counters_.version);
    return grpc::Status::OK;
  }

  grpc::Status Pull(ServerContext* ctx, const rpc::PullRequest*, rpc::PullReply* reply) override {
    if (grpc::Status s = admit(ctx); !s.ok()) return s;
    std::lock_guard lock(mu_);
    if (!initialized_) return not_initialized("Pull");
    reply->set_version(counters_.version);
    for (const auto& [name, v] : vars_) to_proto(name, v, reply->add_vars());
    return grpc::Status::OK;
  }

  grpc::Status Push(ServerContext* ctx, const rpc::PushRequest* req,
                    rpc::PushReply* reply) override {
    if (grpc::Status s = admit(ctx); !s.ok()) return s;
    std::lock_guard lock(mu_);
    if (!initialized_) return not_initialized("Push");
    if (static_cast<std::size_t>(req->grads_size()) != vars_.size()) {
      return refuse(
          {StatusCode::INVALID_ARGUMENT, "Push to task " + std::to_string(task_) + ": " +
                                             std::to_string(req->grads_size()) + " gradients for " +
                                             std::to_string(vars_.size()) + " variables"});
    }
    if (!(req->lr() >= 0.0f) || !std::isfinite(req->lr())) {
      return refuse({StatusCode::INVALID_ARGUMENT, "Push: learning rate must be finite, >= 0"});
    }
    reply->set_staleness(counters_.version - req->base_version());
    if (parts_ == 0) {  // async and ssp: apply each push
      if (applied_.count(req->task())) return duplicate(reply);
      for (std::size_t i = 0; i < vars_.size(); ++i) {
        if (grpc::Status s = copy_into(req->grads(static_cast<int>(i)), "Push gradient",
                                       vars_[i].first, grads_[i]);
            !s.ok())
          return refuse(s);
      }
      apply(req->lr());
      applied_.insert(req->task());
    } else {  // sync: average the step's parts, then one update
      if (req->step() < counters_.version) return duplicate(reply);
      if (req->step() > counters_.version) {
        return refuse({StatusCode::FAILED_PRECONDITION,
                       "Push for step " + std::to_string(req->step()) + " while task " +
                           std::to_string(task_) + " is at step " +
                           std::to_string(counters_.version)});
      }
      if (req->part() < 0 || req->part() >= parts_) {
        return refuse({StatusCode::INVALID_ARGUMENT, "Push: part " + std::to_string(req->part()) +
                                                         " not in [0, " + std::to_string(parts_) +
                                                         ")"});
      }
      if (seen_[static_cast<std::size_t>(req->part())]) return duplicate(reply);
      // Check everything first, so a bad push leaves the sum untouched.
      std::vector<Tensor> in(vars_.size());
      for (std::size_t i = 0; i < vars_.size(); ++i) {
        const auto& g = req->grads(static_cast<int>(i));
        if (g.name() != vars_[i].first || g.data().size() != vars_[i].second.nbytes()) {
          return refuse({StatusCode::INVALID_ARGUMENT,
                         "Push gradient: tensor '" + g.name() + "' does not match variable '" +
                             vars_[i].first + "' " + vars_[i].second.shape().str()});
        }
      }
      for (std::size_t i = 0; i < vars_.size(); ++i) {
        const std::string& g = req->grads(static_cast<int>(i)).data();
        if (seen_count_ == 0) {
          grads_[i].assign_bytes(g);
        } else {
          kernels::axpy_(grads_[i], 1.0f,
                         Tensor::from_bytes(g, grads_[i].shape(), grads_[i].dtype()));
        }
      }
      seen_[static_cast<std::size_t>(req->part())] = true;
      if (++seen_count_ == parts_) {
        const float scale = 1.0f / static_cast<float>(parts_);
        for (auto& g : grads_) kernels::scale_(g, scale);
        apply(req->lr());
        reset_step();
      }
    }
    ++counters_.pushes;
    reply->set_version(counters_.version);
    return grpc::Status::OK;
  }

  grpc::Status Save(ServerContext* ctx, const rpc::SaveRequest* req,
                    rpc::SaveReply* reply) override {
    if (grpc::Status s = admit(ctx); !s.ok()) return s;
    std::lock_guard lock(mu_);
    if (!initialized_) return not_initialized("Save");
    nn::NamedTensors all = vars_;
    for (auto& [name, t] : optimizer_->state()) {
      Tensor f = t;
      if (t.dtype() != DType::F32) {  // the step count: saved as a float (exact to 2^24)
        f = Tensor::full(Shape{}, static_cast<float>(t.to_vector_i64().at(0)));
      }
      all.emplace_back("optimizer/" + name, f);
    }
    const std::string file = req->dir() + "/shard-" + std::to_string(task_) + ".safetensors";
    try {
      const std::string bytes =
          io::encode_safetensors(all, {{"version", std::to_string(counters_.version)}});
      io::write_file_atomic(file, bytes);
      reply->set_crc32c(io::crc32c(bytes.data(), bytes.size()));
    } catch (const std::exception& e) {
      return {StatusCode::INTERNAL, "Save " + file + ": " + e.what()};
    }
    reply->set_file(file);
    reply->set_version(counters_.version);
    return grpc::Status::OK;
  }

  grpc::Status Shutdown(ServerContext* ctx, const rpc::StatusRequest*,
                        rpc::StatusReply* reply) override {
    if (grpc::Status s = admit(ctx); !s.ok()) return s;
    std::lock_guard lock(mu_);
    stop_requested_ = true;
    stop_cv_.notify_all();
    reply->set_version(counters_.version);
    return grpc::Status::OK;
  }

  // Until a Shutdown call or stop().
  void wait_for_stop() {
    std::unique_lock lock(mu_);
    stop_cv_.wait(lock, [&] { return stop_requested_; });
  }
  void stop() {
    std::lock_guard lock(mu_);
    stop_requested_ = true;
    stop_cv_.notify_all();
  }

  grpc::Status Status_(ServerContext* ctx, rpc::StatusReply* reply) {
    if (grpc::Status s = admit(ctx); !s.ok()) return s;
    std::lock_guard lock(mu_);
    reply->set_initialized(initialized_);
    reply->set_version(counters_.version);
    reply->set_incarnation(static_cast<std::int64_t>(incarnation_));
    reply->set_pushes(counters_.pushes);
    reply->set_duplicates(counters_.duplicates);
    return grpc::Status::OK;
  }
  grpc::Status Status(ServerContext* ctx, const rpc::StatusRequest*,
                      rpc::StatusReply* reply) override {
    return Status_(ctx, reply);
  }

 private:
  static std::shared_ptr<optim::Optimizer> make_optimizer(const rpc::OptimizerSpec& o,
                                                          const nn::NamedTensors& vars) {
    if (o.kind() == "sgd") {
      return std::make_shared<optim::SGD>(
          vars,
          optim::SgdOptions{o.lr(), o.momentum(), o.dampening(), o.weight_decay(), o.nesterov()});
    }
    if (o.kind() == "adam" || o.kind() == "adamw") {
      optim::AdamOptions a{o.lr(),           o.beta1(),   o.beta2(), o.eps(),
                           o.weight_decay(), o.amsgrad(), false};
      if (o.kind() == "adamw") return std::make_shared<optim::AdamW>(vars, a);
      return std::make_shared<optim::Adam>(vars, a);
    }
    throw std::invalid_argument("optimizer kind '" + o.kind() + "' is not one of sgd, adam, adamw");
  }

  grpc::Status admit(const ServerContext* ctx) {
    grpc::Status s = check_token(ctx, token_);
    if (!s.ok()) ++refused_;
    return s;
  }
  grpc::Status refuse(grpc::Status s) {
    ++refused_;
    return s;
  }
  grpc::Status not_initialized(const char* what) {
    return {StatusCode::FAILED_PRECONDITION, std::string(what) + ": parameter-server task " +
                                                 std::to_string(task_) +
                                                 " holds no variables yet (restarted?)"};
  }
  grpc::Status duplicate(rpc::PushReply* reply) {
    ++counters_.duplicates;
    reply->set_duplicate(true);
    reply->set_version(counters_.version);
    return grpc::Status::OK;
  }
  // The optimizer updates the parameters from grads_; buffers take grads_' values (what the
  // push carried for them, or the step's average of it).
  void apply(float lr) {
    optimizer_->set_lr(lr);
    optimizer_->step();
    for (std::size_t i = 0; i < vars_.size(); ++i)
      if (is_buffer_variable(vars_[i].first)) vars_[i].second.copy_(grads_[i]);
    ++counters_.version;
  }
  void reset_step() {
    seen_.assign(static_cast<std::size_t>(parts_), false);
    seen_count_ = 0;
  }

  const std::string token_;
  const int task_;
  const std::uint64_t incarnation_;
  mutable std::mutex mu_;
  std::condition_variable stop_cv_;
  bool stop_requested_ = false;
  bool initialized_ = false;
  nn::NamedTensors vars_;
  std::vector<Tensor> grads_;
  std::unordered_map<std::string, std::size_t> index_;
  std::shared_ptr<optim::Optimizer> optimizer_;
  int parts_ = 0;
  std::vector<bool> seen_;
  int seen_count_ = 0;
  std::unordered_set<std::int64_t> applied_;
  ServerCounters counters_;
  std::atomic<std::int64_t> refused_{0};  // also counted before mu_ is taken
};

// ---- the server --------------------------------------------------------------------------------

struct ParameterServer::Impl {
  std::unique_ptr<grpc::Server> server;
  int port = 0;
};

ParameterServer::ParameterServer(const Cluster& cluster, int task, const std::string& address)
    : service_(std::make_unique<Service>(cluster, task)), impl_(std::make_unique<Impl>()) {
  impl_->server = start_server(cluster, address, {service_.get()}, &impl_->port);
}

ParameterServer::~ParameterServer() { shutdown(); }

int ParameterServer::port() const { return impl_->port; }
ServerCounters ParameterServer::counters() const { return service_->counters(); }
void ParameterServer::wait() { service_->wait_for_stop(); }
void ParameterServer::shutdown() {
  service_->stop();
  impl_->server->Shutdown(std::chrono::system_clock::now() + std::chrono::milliseconds(200));
}

}  // namespace hpm::distribute::ps
