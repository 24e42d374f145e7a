// What the parameter-server tasks, the coordinator and the workers share over gRPC: servers and
// channels with the cluster's security and limits, the token check, deadlines, and tensors to and
// from raw bytes.
#pragma once
#include <grpcpp/grpcpp.h>

#include <memory>
#include <string>

#include "hpm/distribute/ps/cluster.h"
#include "hpm/tensor/tensor.h"
#include "ps.grpc.pb.h"

namespace hpm::distribute::ps {

constexpr const char* kTokenKey = "x-hpm-token";

// Builds and starts a server for `services` on `address` ("HOST:PORT"; HOST is replaced by
// cluster.bind, PORT 0 picks a free port, written to *port). PsError when it cannot listen.
std::unique_ptr<grpc::Server> start_server(const Cluster& cluster, const std::string& address,
                                           const std::vector<grpc::Service*>& services, int* port);

std::shared_ptr<grpc::Channel> make_channel(const Cluster& cluster, const std::string& address);

// The token and a deadline `timeout` from now (the cluster's rpc_timeout by default).
void prepare(grpc::ClientContext& ctx, const Cluster& cluster,
             std::chrono::milliseconds timeout = std::chrono::milliseconds(0));

// UNAUTHENTICATED unless the call carries `token` (compared in constant time).
grpc::Status check_token(const grpc::ServerContext* ctx, const std::string& token);

// "Pull from HOST:PORT: <code name>: <message>".
std::string describe(const std::string& what, const std::string& address, const grpc::Status& s);

// Raw bytes of a contiguous F32 tensor into `out` (one copy, no conversion).
void to_proto(const std::string& name, const Tensor& t, rpc::TensorData* out);
// A new tensor from `in`: INVALID_ARGUMENT naming `what` and the variable when the byte count
// does not match the shape.
grpc::Status from_proto(const rpc::TensorData& in, const std::string& what, Tensor* out);
// Copies `in` into `dst` after checking name, shape and size against it.
grpc::Status copy_into(const rpc::TensorData& in, const std::string& what, const std::string& name,
                       Tensor& dst);

}  // namespace hpm::distribute::ps
