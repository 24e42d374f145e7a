// Parameter-server training (after tf.distribute.experimental.ParameterServerStrategy and
// ps-lite): P parameter-server tasks hold the variables, sharded by size; W workers pull them,
// compute gradients on their batches and push them back; the optimizer runs on the servers. A
// coordinator hands out the steps (at least once: a dead worker's steps go to the others) and
// checkpoints every shard at once.
//
// This header: where the tasks are and how they talk (token, TLS, limits, deadlines).
#pragma once
#include <chrono>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

namespace hpm::distribute::ps {

class PsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// How updates from several workers meet.
enum class Mode {
  kAsync,  // every push is applied when it arrives
  kSsp,    // stale synchronous parallel: a worker more than `staleness` steps ahead of the
           // slowest live worker waits for it
  kSync,   // each step's parts (one per worker) are averaged, then applied once
};
Mode mode_from_name(const std::string& name);  // "async" | "ssp" | "sync"; PsError otherwise
std::string mode_name(Mode m);

struct Security {
  std::string token;     // every RPC carries it; compared in constant time
  std::string tls_cert;  // PEM file paths; both set: TLS (servers present the pair)
  std::string tls_key;
  std::string tls_ca;  // what clients trust (default: tls_cert, a self-signed pair)
  bool tls() const { return !tls_cert.empty(); }
};

struct Cluster {
  std::string coordinator;      // HOST:PORT
  std::vector<std::string> ps;  // HOST:PORT of each parameter-server task
  int workers = 1;
  std::string bind = "127.0.0.1";  // the interface servers listen on (loopback by default)
  Security security;
  std::size_t max_message_bytes = 256u << 20;                       // larger messages are refused
  std::chrono::milliseconds rpc_timeout{std::chrono::seconds(30)};  // every call's deadline
};

// The token from `token_file` if set (PsError naming the file when it cannot be read or is empty;
// one trailing newline is dropped), else from the environment variable HPM_PS_TOKEN; PsError
// when neither gives one.
std::string load_token(const std::string& token_file);

// Which task holds each variable: size-balanced (largest first, onto the least-loaded task; ties
// to the lowest index), the way TensorFlow's round-robin placement would be if it looked at sizes.
std::vector<int> place_variables(const std::vector<std::int64_t>& numels, int tasks);

// A model's floating-point buffers (BatchNorm's running statistics) live on the parameter servers
// beside its parameters, as variables named kBufferPrefix + the buffer's name (ps_variables in
// client.h). The servers do not optimize them: what a push carries for one is its new value, not
// a gradient, assigned as it arrives (async, SSP) or averaged over a synchronous step's parts.
inline constexpr char kBufferPrefix[] = "buffers/";
inline bool is_buffer_variable(const std::string& name) {
  return name.rfind(kBufferPrefix, 0) == 0;
}

// "HOST:PORT" -> port (PsError naming the text otherwise).
int port_of(const std::string& address);

}  // namespace hpm::distribute::ps
