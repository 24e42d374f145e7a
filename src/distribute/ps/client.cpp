#include "hpm/distribute/ps/client.h"

#include <functional>

#include "distribute/ps/rpc.h"

namespace hpm::distribute::ps {

nn::NamedTensors ps_variables(const nn::Module& model) {
  nn::NamedTensors vars = model.named_parameters();
  for (const auto& [name, t] : model.named_buffers())
    if (t.dtype() == DType::F32) vars.emplace_back(kBufferPrefix + name, t);
  return vars;
}

struct PsClient::Impl {
  Cluster cluster;
  std::vector<std::unique_ptr<rpc::ParameterServer::Stub>> stubs;

  // Starts `start(task, ctx, cq)` on every task at once and waits for all; `start` returns the
  // async reader to finish into reply[task]. The statuses come back in task order.
  template <typename Reply, typename Start>
  std::vector<grpc::Status> all(std::vector<Reply>& replies, Start start,
                                std::chrono::milliseconds timeout = std::chrono::milliseconds(0)) {
    const std::size_t n = stubs.size();
    grpc::CompletionQueue cq;
    std::vector<std::unique_ptr<grpc::ClientContext>> ctx;
    std::vector<std::unique_ptr<grpc::ClientAsyncResponseReader<Reply>>> readers;
    std::vector<grpc::Status> status(n);
    replies.assign(n, Reply());
    for (std::size_t t = 0; t < n; ++t) {
      ctx.push_back(std::make_unique<grpc::ClientContext>());
      prepare(*ctx.back(), cluster, timeout);
      readers.push_back(start(t, ctx.back().get(), &cq));
      readers.back()->Finish(&replies[t], &status[t], reinterpret_cast<void*>(t));
    }
    for (std::size_t k = 0; k < n; ++k) {
      void* tag = nullptr;
      bool ok = false;
      cq.Next(&tag, &ok);
    }
    return status;
  }

  void check(const char* what, const std::vector<grpc::Status>& status) const {
    for (std::size_t t = 0; t < status.size(); ++t) {
      if (!status[t].ok()) {
        throw PsError(
            describe(std::string(what) + " parameter-server task " + std::to_string(t) + " at",
                     cluster.ps[t], status[t]));
      }
    }
  }
};

PsClient::PsClient(const Cluster& cluster, const std::vector<std::string>& names,
                   const std::vector<std::int64_t>& numels)
    : impl_(std::make_unique<Impl>()), names_(names) {
  if (cluster.ps.empty()) throw PsError("the cluster has no parameter-server task");
  impl_->cluster = cluster;
  for (const auto& address : cluster.ps)
    impl_->stubs.push_back(rpc::ParameterServer::NewStub(make_channel(cluster, address)));
  placement_ = place_variables(numels, static_cast<int>(cluster.ps.size()));
}

PsClient::~PsClient() = default;

int PsClient::tasks() const { return static_cast<int>(impl_->stubs.size()); }

void PsClient::init(const nn::NamedTensors& vars, const OptimizerSpec& o, int sync_parts,
                    const std::vector<std::int64_t>& versions,
                    const nn::NamedTensors& optimizer_state) {
  std::vector<rpc::InitRequest> req(impl_->stubs.size());
  for (std::size_t t = 0; t < req.size(); ++t) {
    rpc::OptimizerSpec* s = req[t].mutable_optimizer();
    s->set_kind(o.kind);
    s->set_lr(o.lr);
    s->set_momentum(o.momentum);
    s->set_dampening(o.dampening);
    s->set_weight_decay(o.weight_decay);
    s->set_nesterov(o.nesterov);
    s->set_beta1(o.beta1);
    s->set_beta2(o.beta2);
    s->set_eps(o.eps);
    s->set_amsgrad(o.amsgrad);
    req[t].set_sync_parts(sync_parts);
    req[t].set_version(versions.at(t));
  }
  for (std::size_t i = 0; i < vars.size(); ++i)
    to_proto(vars[i].first, vars[i].second,
             req[static_cast<std::size_t>(placement_[i])].add_vars());
  // Optimizer state entries are "<variable>.<buffer>" (or "step", which every task gets).
  for (const auto& [name, t] : optimizer_state) {
    if (name == "step") {
      for (auto& r : req) to_proto(name, t, r.add_optimizer_state());
      continue;
    }
    for (std::size_t i = 0; i < names_.size(); ++i) {
      if (name.size() > names_[i].size() && name.compare(0, names_[i].size(), names_[i]) == 0 &&
          name[names_[i].size()] == '.' &&
          name.find('.', names_[i].size() + 1) == std::string::npos) {
        to_proto(name, t, req[static_cast<std::size_t>(placement_[i])].add_optimizer_state());
        break;
      }
    }
  }
  std::vector<rpc::InitReply> replies;
  impl_->check("Init", impl_->all(replies, [&](std::size_t t, grpc::ClientContext* ctx,
                                               grpc::CompletionQueue* cq) {
    return impl_->stubs[t]->AsyncInit(ctx, req[t], cq);
  }));
}

std::vector<std::int64_t> PsClient::pull(nn::NamedTensors& into) {
  std::vector<rpc::PullReply> replies;
  const rpc::PullRequest req;
  impl_->check("Pull", impl_->all(replies, [&](std::size_t t, grpc::ClientContext* ctx,
                                               grpc::CompletionQueue* cq) {
    return impl_->stubs[t]->AsyncPull(ctx, req, cq);
  }));
  std::vector<int> next(replies.size(), 0);
  for (std::size_t i = 0; i < into.size(); ++i) {
    const auto t = static_cast<std::size_t>(placement_[i]);
    if (next[t] >= replies[t].vars_size())
      throw PsError("Pull: parameter-server task " + std::to_string(t) + " did not send '" +
                    names_[i] + "'");
    grpc::Status s = copy_into(replies[t].vars(next[t]++), "Pull from task " + std::to_string(t),
                               names_[i], into[i].second);
    if (!s.ok()) throw PsError(s.error_message());
  }
  std::vector<std::int64_t> versions;
  for (const auto& r : replies) versions.push_back(r.version());
  return versions;
}

PushOutcome PsClient::push(const std::vector<Tensor>& grads, std::int64_t task, int worker,
                           const std::vector<std::int64_t>& base_versions, std::int64_t step,
                           int part, float lr) {
  std::vector<rpc::PushRequest> req(impl_->stubs.size());
  for (std::size_t t = 0; t < req.size(); ++t) {
    req[t].set_task(task);
    req[t].set_worker(worker);
    req[t].set_base_version(base_versions.at(t));
    req[t].set_step(step);
    req[t].set_part(part);
    req[t].set_lr(lr);
  }
  for (std::size_t i = 0; i < grads.size(); ++i)
    to_proto(names_[i], grads[i], req[static_cast<std::size_t>(placement_[i])].add_grads());
  std::vector<rpc::PushReply> replies;
  impl_->check("Push", impl_->all(replies, [&](std::size_t t, grpc::ClientContext* ctx,
                                               grpc::CompletionQueue* cq) {
    return impl_->stubs[t]->AsyncPush(ctx, req[t], cq);
  }));
  PushOutcome out;
  for (const auto& r : replies) {
    out.staleness = std::max(out.staleness, r.staleness());
    out.duplicate = out.duplicate || r.duplicate();
  }
  return out;
}

std::vector<ShardSave> PsClient::save(const std::string& dir) {
  rpc::SaveRequest req;
  req.set_dir(dir);
  std::vector<rpc::SaveReply> replies;
  impl_->check("Save", impl_->all(replies, [&](std::size_t t, grpc::ClientContext* ctx,
                                               grpc::CompletionQueue* cq) {
    return impl_->stubs[t]->AsyncSave(ctx, req, cq);
  }));
  std::vector<ShardSave> out;
  for (const auto& r : replies) out.push_back({r.file(), r.crc32c(), r.version()});
  return out;
}

std::vector<ShardStatus> PsClient::status(std::chrono::milliseconds timeout) {
  std::vector<rpc::StatusReply> replies;
  const rpc::StatusRequest req;
  const auto st = impl_->all(
      replies,
      [&](std::size_t t, grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
        return impl_->stubs[t]->AsyncStatus(ctx, req, cq);
      },
      timeout);
  std::vector<ShardStatus> out(st.size());
  for (std::size_t t = 0; t < st.size(); ++t) {
    if (!st[t].ok()) {
      out[t].error = describe("Status of", impl_->cluster.ps[t], st[t]);
      out[t].refused = st[t].error_code() == grpc::StatusCode::UNAUTHENTICATED;
      continue;
    }
    out[t] = {true,
              "",
              replies[t].initialized(),
              replies[t].version(),
              replies[t].incarnation(),
              replies[t].pushes(),
              replies[t].duplicates()};
  }
  return out;
}

void PsClient::shutdown() {
  std::vector<rpc::StatusReply> replies;
  const rpc::StatusRequest req;
  impl_->all(
      replies,
      [&](std::size_t t, grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
        return impl_->stubs[t]->AsyncShutdown(ctx, req, cq);
      },
      std::chrono::milliseconds(2000));
}

}  // namespace hpm::distribute::ps
