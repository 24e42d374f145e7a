// [cluster] and [ps]: parameter-server jobs (hpm ps ...).
#include "config/reader.h"
#include "config/sections.h"

namespace hpm::config::detail {

void read_ps(const Source& s, Config& c) {
  const std::string& path = s.path;
  const toml::table& root = s.root;
  PsSection& p = c.ps;
  const toml::table* cluster = section(path, root, "cluster");
  TableReader cr(path, "[cluster]", cluster);
  cr.get("coordinator", p.coordinator);
  cr.allow("ps");
  if (const toml::node* n = cluster ? cluster->get("ps") : nullptr) {
    const toml::array* a = n->as_array();
    std::vector<std::string> ps;
    for (std::size_t i = 0; a && i < a->size(); ++i) {
      const auto v = (*a)[i].value_exact<std::string>();
      if (!v) {
        a = nullptr;
        break;
      }
      ps.push_back(*v);
    }
    if (!a || ps.empty()) {
      throw ConfigError(where(path, *n) +
                        ": [cluster] ps must be a non-empty array of \"HOST:PORT\" strings");
    }
    p.ps = ps;
  }
  cr.get_positive("workers", p.workers);
  cr.get("bind", p.bind);
  cr.get("token_file", p.token_file);
  cr.get("tls_cert", p.tls_cert);
  cr.get("tls_key", p.tls_key);
  cr.get("tls_ca", p.tls_ca);
  cr.get_positive("max_message_mb", p.max_message_mb);
  cr.get_positive("rpc_timeout_s", p.rpc_timeout_s);
  // gRPC's message limit is an int of bytes; a deadline is milliseconds in an int64.
  if (p.max_message_mb > 2047)
    cr.out_of_range(*cr.find("max_message_mb"), "max_message_mb", "at most 2047 (MiB)");
  if (p.rpc_timeout_s > 1e9)
    cr.out_of_range(*cr.find("rpc_timeout_s"), "rpc_timeout_s", "at most 1e9 (seconds)");
  cr.finish();
  if (p.tls_cert.empty() != p.tls_key.empty())
    throw ConfigError(cr.at(p.tls_cert.empty() ? "tls_key" : "tls_cert") +
                      ": [cluster] tls_cert and tls_key go together");
  TableReader pr(path, "[ps]", section(path, root, "ps"));
  pr.get("mode", p.mode);
  pr.get("staleness", p.staleness);
  pr.get("checkpoint_dir", p.checkpoint_dir);
  pr.get("checkpoint_every_tasks", p.checkpoint_every_tasks);
  pr.get_positive("heartbeat_timeout_s", p.heartbeat_timeout_s);
  pr.get_positive("ps_wait_s", p.ps_wait_s);
  pr.get("slow_worker", p.slow_worker);
  pr.get_positive("slow_factor", p.slow_factor);
  pr.finish();
  if (p.mode != "async" && p.mode != "ssp" && p.mode != "sync") {
    throw ConfigError(pr.at("mode") + ": [ps] mode must be \"async\", \"ssp\" or \"sync\", got \"" +
                      p.mode + "\"");
  }
  if (p.staleness < 0) pr.out_of_range(*pr.find("staleness"), "staleness", ">= 0");
  if (p.checkpoint_every_tasks < 0)
    pr.out_of_range(*pr.find("checkpoint_every_tasks"), "checkpoint_every_tasks", ">= 0");
}

}  // namespace hpm::config::detail
