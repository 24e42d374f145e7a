// The parameter server's requests: each input is a sequence of calls, every one a method byte
// (Init, Pull, Push, Status), a little-endian u16 length and that many bytes of the request's
// protocol buffer. Bytes that are not a valid message are skipped (gRPC refuses those before hpm's
// code sees them); valid ones, however odd, reach a server in this process over gRPC with the
// cluster's token. Save (writes where the caller says) and Shutdown are left out.
#include <grpcpp/grpcpp.h>

#include <memory>

#include "distribute/ps/rpc.h"
#include "hpm/distribute/ps/server.h"

using namespace hpm;
using namespace hpm::distribute::ps;

namespace {

struct Target {
  Cluster cluster;
  std::unique_ptr<ParameterServer> server;
  std::unique_ptr<rpc::ParameterServer::Stub> stub;

  Target() {
    cluster.security.token = "fuzz";
    cluster.max_message_bytes = 1 << 20;
    cluster.rpc_timeout = std::chrono::seconds(10);
    server = std::make_unique<ParameterServer>(cluster, 0, "127.0.0.1:0");
    stub = rpc::ParameterServer::NewStub(
        make_channel(cluster, "127.0.0.1:" + std::to_string(server->port())));
  }
};

template <typename Request, typename Reply, typename Call>
void call(Target& t, const std::uint8_t* bytes, std::size_t n, Call method) {
  Request req;
  if (!req.ParseFromArray(bytes, static_cast<int>(n))) return;
  Reply reply;
  grpc::ClientContext ctx;
  prepare(ctx, t.cluster);
  (t.stub.get()->*method)(&ctx, req, &reply);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  static Target target;
  std::size_t at = 0;
  while (size - at >= 3) {
    const int method = data[at] % 4;
    const std::size_t n = std::min<std::size_t>(data[at + 1] | (data[at + 2] << 8), size - at - 3);
    const std::uint8_t* msg = data + at + 3;
    at += 3 + n;
    using Stub = rpc::ParameterServer::Stub;
    switch (method) {
      case 0:
        call<rpc::InitRequest, rpc::InitReply>(target, msg, n, &Stub::Init);
        break;
      case 1:
        call<rpc::PullRequest, rpc::PullReply>(target, msg, n, &Stub::Pull);
        break;
      case 2:
        call<rpc::PushRequest, rpc::PushReply>(target, msg, n, &Stub::Push);
        break;
      default:
        call<rpc::StatusRequest, rpc::StatusReply>(target, msg, n, &Stub::Status);
        break;
    }
  }
  return 0;
}
