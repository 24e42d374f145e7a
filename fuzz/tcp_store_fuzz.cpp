// The TCP store's server (rendezvous of every multi-process job) fed arbitrary bytes by a client:
// each input is sent on a new connection, which is then half-closed; the target reads what the
// server answers until the server closes the connection. The server runs in this process, so a
// memory error in its event loop is caught here; a server that stops answering is a hang.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "hpm/comm/store.h"

using namespace hpm;

namespace {

// Each connection from another loopback source address (127.0.0.2 to 127.0.0.251): the server
// closes first, so every connection leaves a TIME_WAIT behind for a minute, and at ten thousand
// connections a second one source address runs out of ports. A port the kernel hands out at bind
// can still collide with one of those (EADDRNOTAVAIL at connect): the next address is tried. Only
// a server that refuses every attempt is a finding.
int connect_to(int port) {
  static unsigned next = 0;
  int error = 0;
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) std::abort();
    sockaddr_in source{};
    source.sin_family = AF_INET;
    source.sin_addr.s_addr = htonl(INADDR_LOOPBACK + 1 + (next++ % 250));
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_port = htons(static_cast<std::uint16_t>(port));
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    if (::bind(fd, reinterpret_cast<const sockaddr*>(&source), sizeof source) == 0 &&
        ::connect(fd, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) == 0) {
      return fd;
    }
    error = errno;
    ::close(fd);
  }
  std::fprintf(stderr, "tcp_store_fuzz: cannot connect to the store: %s\n", std::strerror(error));
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static comm::TcpStoreServer server("127.0.0.1", 0);
  const int fd = connect_to(server.port());
  std::size_t sent = 0;
  while (sent < size) {
    const ssize_t n = ::send(fd, data + sent, size - sent, MSG_NOSIGNAL);
    if (n <= 0) break;  // the server dropped a malformed stream: fine
    sent += static_cast<std::size_t>(n);
  }
  ::shutdown(fd, SHUT_WR);
  // The server must answer what it can and close: parked requests (GET, WAIT) of a client that
  // has gone are dropped, not kept until their timeout.
  char buf[4096];
  while (::recv(fd, buf, sizeof buf, 0) > 0) {
  }
  ::close(fd);
  return 0;
}
