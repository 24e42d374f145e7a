// [optimizer] and [schedule]: the update rule and the learning rate over time.
#include <set>

#include "config/reader.h"
#include "config/sections.h"

namespace hpm::config::detail {

void read_optimizer(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  TableReader opt(path, "[optimizer]", section(path, root, "optimizer"));
  opt.get("kind", c.optimizer);
  opt.get_non_negative("lr", c.lr);
  opt.get_non_negative("momentum", c.momentum);
  opt.get("dampening", c.dampening);
  opt.get("nesterov", c.nesterov);
  opt.get_non_negative("weight_decay", c.weight_decay);
  opt.get("beta1", c.beta1);
  opt.get("beta2", c.beta2);
  opt.get_non_negative("eps", c.eps);
  opt.get("amsgrad", c.amsgrad);
  opt.get("weight_decay_min_rank", c.weight_decay_min_rank);
  opt.finish();
  if (c.optimizer != "sgd" && c.optimizer != "adam" && c.optimizer != "adamw") {
    opt.invalid("kind", "must be one of sgd, adam, adamw, got \"" + c.optimizer + "\"");
  }
  for (const char* key : {"beta1", "beta2"}) {
    const float beta = std::string(key) == "beta1" ? c.beta1 : c.beta2;
    if (opt.has(key) && !(beta >= 0.0f && beta < 1.0f))
      opt.out_of_range(*opt.find(key), key, "in [0, 1)");
  }
  if (c.weight_decay_min_rank < 0) {
    opt.out_of_range(*opt.find("weight_decay_min_rank"), "weight_decay_min_rank", ">= 0");
  }
  // The defaults a PyTorch or Keras user expects of each kind: Adam's and AdamW's learning rate
  // 1e-3 and AdamW's decay 0.01 (torch.optim's). An AdamW without a lr ran at 0.01 (10x) with no
  // decay at all.
  if (!opt.has("lr") && c.optimizer != "sgd") c.lr = 1e-3f;
  if (!opt.has("weight_decay") && c.optimizer == "adamw") c.weight_decay = 0.01f;
}

void read_schedule(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  TableReader sch(path, "[schedule]", section(path, root, "schedule"));
  sch.get("kind", c.schedule);
  sch.get("unit", c.schedule_unit);
  sch.get_positive("step_size", c.step_size);
  sch.get("gamma", c.gamma);
  sch.get_positive("t_max", c.t_max);
  sch.get("eta_min", c.eta_min);
  sch.get_non_negative("warmup", c.warmup);
  sch.get("warmup_start_factor", c.warmup_start_factor);
  sch.finish();
  if (sch.has("warmup_start_factor") &&
      !(c.warmup_start_factor >= 0.0f && c.warmup_start_factor <= 1.0f)) {
    sch.out_of_range(*sch.find("warmup_start_factor"), "warmup_start_factor", "in [0, 1]");
  }
  static const std::set<std::string> kinds = {"constant", "step", "cosine", "warmup",
                                              "warmup_cosine"};
  if (!kinds.count(c.schedule)) {
    sch.invalid("kind", "must be one of constant, step, cosine, warmup, warmup_cosine, got \"" +
                            c.schedule + "\"");
  }
  if (c.schedule_unit != "epoch" && c.schedule_unit != "step") {
    throw ConfigError(sch.at("unit") + ": [schedule] unit must be \"epoch\" or \"step\", got \"" +
                      c.schedule_unit + "\"");
  }
}

}  // namespace hpm::config::detail

namespace hpm::config {

std::shared_ptr<optim::Optimizer> build_optimizer(const Config& c, const nn::Module& model) {
  try {
    if (c.optimizer == "sgd") {
      return std::make_shared<optim::SGD>(
          model.named_parameters(),
          optim::SgdOptions{c.lr, c.momentum, c.dampening, c.weight_decay, c.nesterov,
                            c.weight_decay_min_rank});  // it was dropped: every bias decayed
    }
    if (c.optimizer == "adam" || c.optimizer == "adamw") {
      optim::AdamOptions o{c.lr, c.beta1, c.beta2, c.eps, c.weight_decay, c.amsgrad, false};
      o.weight_decay_min_rank = c.weight_decay_min_rank;
      if (c.optimizer == "adamw")
        return std::make_shared<optim::AdamW>(model.named_parameters(), o);
      return std::make_shared<optim::Adam>(model.named_parameters(), o);
    }
  } catch (const std::invalid_argument& e) {
    throw ConfigError(c.path + ": [optimizer] " + e.what());
  }
  throw ConfigError(c.path + ": [optimizer] kind '" + c.optimizer +
                    "' is not one of sgd, adam, adamw");
}

std::shared_ptr<optim::LrSchedule> build_schedule(const Config& c) {
  try {
    if (c.schedule == "constant") return std::make_shared<optim::ConstantLr>();
    if (c.schedule == "step") return std::make_shared<optim::StepLr>(c.step_size, c.gamma);
    if (c.schedule == "cosine") return std::make_shared<optim::CosineLr>(c.t_max, c.eta_min);
    if (c.schedule == "warmup")
      return std::make_shared<optim::WarmupLr>(c.warmup_start_factor, c.warmup);
    if (c.schedule == "warmup_cosine") {
      return std::make_shared<optim::WarmupLr>(
          c.warmup_start_factor, c.warmup, std::make_shared<optim::CosineLr>(c.t_max, c.eta_min));
    }
  } catch (const std::invalid_argument& e) {
    throw ConfigError(c.path + ": [schedule] " + e.what());
  }
  throw ConfigError(c.path + ": [schedule] kind '" + c.schedule +
                    "' is not one of constant, step, cosine, warmup, warmup_cosine");
}

}  // namespace hpm::config
