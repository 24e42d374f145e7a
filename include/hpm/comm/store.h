// Rendezvous stores: the small key-value services through which the processes of a group find
// each other before they connect (and, later, report failures and count restarts). Each is a
// gloo::rendezvous::Store (set; get and wait block until the keys exist, up to a timeout) with a
// non-blocking check and an atomic add.
//
//   TcpStore        client of a TcpStoreServer, which rank 0 hosts as a thread of its process, so
//                   hosts without a shared filesystem rendezvous through "HOST:PORT"
//   FileStore       gloo's FileStore over a shared directory (one file per key)
//
// Failures are CommErrors that name the store: "rendezvous 10.0.0.1:29500: no store answered
// within 30 s (last error: Connection refused)".
#pragma once
#include <gloo/rendezvous/store.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hpm/comm/communicator.h"

namespace hpm::comm {

class Store : public gloo::rendezvous::Store {
 public:
  explicit Store(Milliseconds timeout) : timeout_(timeout) {}

  // gloo's wait without a timeout uses the store's own.
  void wait(const std::vector<std::string>& keys) override { wait(keys, timeout_); }
  void wait(const std::vector<std::string>& keys, const Milliseconds& timeout) override = 0;
  // True when every key is set; never waits for a missing one.
  virtual bool check(const std::vector<std::string>& keys) = 0;
  // Adds `delta` to the integer at `key` (0 when unset), atomically across processes, and
  // returns the sum. get() of such a key returns it in decimal.
  virtual std::int64_t add(const std::string& key, std::int64_t delta) = 0;
  // "HOST:PORT" or the directory, for messages.
  virtual std::string address() const = 0;

  Milliseconds timeout() const { return timeout_; }

 protected:
  Milliseconds timeout_;
};

// Limits of the TCP store's protocol: a request or reply larger than this is refused.
inline constexpr std::size_t kStoreMaxKeyBytes = 4096;
inline constexpr std::size_t kStoreMaxMessageBytes = 64u << 20;
inline constexpr std::size_t kStoreMaxTotalBytes = 512u << 20;  // everything the server holds

struct HostPort {
  std::string host;
  int port = 0;
  std::string str() const;  // "host:port", "[v6]:port"
};
// "HOST:PORT" or "[IPV6]:PORT" with PORT in 0..65535; throws std::invalid_argument quoting `text`.
HostPort parse_host_port(const std::string& text);

// The key-value server: a thread that answers TcpStore clients. Blocking gets and waits are held
// at the server until their keys arrive or their timeout passes, so waiting costs no polling.
class TcpStoreServer {
 public:
  // Listens on host:port (port 0: any free port, see port()). Throws CommError when it cannot.
  TcpStoreServer(const std::string& host, int port);
  ~TcpStoreServer();  // stops the thread, drops every connection
  TcpStoreServer(const TcpStoreServer&) = delete;
  TcpStoreServer& operator=(const TcpStoreServer&) = delete;

  int port() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// A client: one connection, one request at a time (calls from several threads are serialized).
class TcpStore : public Store {
 public:
  // Connects to host:port, retrying until `timeout` passes while the server starts up; the
  // timeout also bounds get() and wait() without one of their own.
  TcpStore(const std::string& host, int port, Milliseconds timeout);
  ~TcpStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, const Milliseconds& timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string address() const override { return where_.str(); }

  // The keys among `keys` that are not set (empty when all are), after waiting up to `timeout`
  // for all of them.
  std::vector<std::string> missing(const std::vector<std::string>& keys, Milliseconds timeout);

 private:
  std::vector<char> call(const std::vector<char>& request, Milliseconds reply_within);

  HostPort where_;
  std::mutex mu_;
  int fd_ = -1;
};

// gloo's FileStore over `directory` (created if missing), with wait timeouts counted in
// milliseconds and add() done under an flock(2) so processes on a shared filesystem agree.
class FileStore : public Store {
 public:
  FileStore(const std::string& directory, Milliseconds timeout);
  ~FileStore() override;

  void set(const std::string& key, const std::vector<char>& data) override;
  std::vector<char> get(const std::string& key) override;
  using Store::wait;
  void wait(const std::vector<std::string>& keys, const Milliseconds& timeout) override;
  bool check(const std::vector<std::string>& keys) override;
  std::int64_t add(const std::string& key, std::int64_t delta) override;
  std::string address() const override { return directory_; }

 private:
  struct Files;
  std::string directory_;
  std::unique_ptr<Files> files_;
};

}  // namespace hpm::comm
