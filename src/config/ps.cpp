#include "hpm/config/ps.h"

#include <cstdlib>
#include <nlohmann/json.hpp>

namespace hpm::config {

namespace ps = distribute::ps;

ps::Cluster ps_cluster(const Config& cfg) {
  ps::Cluster c;
  const PsSection& p = cfg.ps;
  c.coordinator = p.coordinator;
  c.ps = p.ps;
  c.workers = p.workers;
  if (const char* env = std::getenv("HPM_PS_CLUSTER"); env != nullptr && *env != '\0') {
    try {
      const auto j = nlohmann::json::parse(env);
      c.coordinator = j.at("coordinator").get<std::string>();
      c.ps = j.at("ps").get<std::vector<std::string>>();
      c.workers = j.at("workers").get<int>();
    } catch (const std::exception& e) {
      throw ps::PsError(std::string("HPM_PS_CLUSTER is not {\"coordinator\": \"HOST:PORT\", "
                                    "\"ps\": [\"HOST:PORT\", ...], \"workers\": W}: ") +
                        e.what());
    }
  }
  c.bind = p.bind;
  c.security.token = ps::load_token(p.token_file);
  c.security.tls_cert = p.tls_cert;
  c.security.tls_key = p.tls_key;
  c.security.tls_ca = p.tls_ca;
  c.max_message_bytes = static_cast<std::size_t>(p.max_message_mb * 1024 * 1024);
  c.rpc_timeout = std::chrono::milliseconds(static_cast<std::int64_t>(p.rpc_timeout_s * 1000));
  return c;
}

ps::OptimizerSpec ps_optimizer(const Config& cfg) {
  ps::OptimizerSpec o;
  o.kind = cfg.optimizer;
  o.lr = cfg.lr;
  o.momentum = cfg.momentum;
  o.dampening = cfg.dampening;
  o.weight_decay = cfg.weight_decay;
  o.nesterov = cfg.nesterov;
  o.beta1 = cfg.beta1;
  o.beta2 = cfg.beta2;
  o.eps = cfg.eps;
  o.amsgrad = cfg.amsgrad;
  return o;
}

data::LabelledData ps_training_set(const Config& cfg) {
  if (cfg.source != "idx") throw ConfigError(cfg.path + ": hpm ps reads [data] source = \"idx\"");
  return data::load_mnist_split(cfg.data_dir, "train").first(cfg.train_limit);
}

}  // namespace hpm::config
