#include "distribute/ps/rpc.h"

#include <openssl/crypto.h>
#include <openssl/sha.h>

#include <cstring>
#include <fstream>
#include <sstream>

#include "hpm/io/atomic_file.h"

namespace hpm::distribute::ps {

namespace {

std::string read_pem(const std::string& path, const char* what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw PsError("cannot read the TLS " + std::string(what) + " file " + path);
  std::ostringstream os;
  os << in.rdbuf();
  if (os.str().empty())
    throw PsError("the TLS " + std::string(what) + " file " + path + " is empty");
  return os.str();
}

std::string host_of(const std::string& address) {
  const auto colon = address.rfind(':');
  return colon == std::string::npos ? address : address.substr(0, colon);
}

}  // namespace

std::unique_ptr<grpc::Server> start_server(const Cluster& cluster, const std::string& address,
                                           const std::vector<grpc::Service*>& services, int* port) {
  const std::string listen = cluster.bind + ":" + std::to_string(port_of(address));
  std::shared_ptr<grpc::ServerCredentials> creds;
  if (cluster.security.tls()) {
    grpc::SslServerCredentialsOptions o;
    o.pem_key_cert_pairs.push_back({read_pem(cluster.security.tls_key, "key"),
                                    read_pem(cluster.security.tls_cert, "certificate")});
    creds = grpc::SslServerCredentials(o);
  } else {
    creds = grpc::InsecureServerCredentials();
  }
  grpc::ServerBuilder b;
  // gRPC sets SO_REUSEPORT by default: a second server on a port in use would listen too, and
  // clients would reach either. One server a port.
  b.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  b.AddListeningPort(listen, creds, port);
  b.SetMaxReceiveMessageSize(static_cast<int>(cluster.max_message_bytes));
  b.SetMaxSendMessageSize(static_cast<int>(cluster.max_message_bytes));
  for (grpc::Service* s : services) b.RegisterService(s);
  std::unique_ptr<grpc::Server> server = b.BuildAndStart();
  if (!server || *port == 0) {
    const int wanted = port_of(address);
    throw PsError("cannot listen on " + listen +
                  (wanted > 0 ? ": port " + std::to_string(wanted) + " is in use (or not ours)"
                              : std::string(": no free port")));
  }
  return server;
}

std::shared_ptr<grpc::Channel> make_channel(const Cluster& cluster, const std::string& address) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(static_cast<int>(cluster.max_message_bytes));
  args.SetMaxSendMessageSize(static_cast<int>(cluster.max_message_bytes));
  // Each channel its own connection: a worker's pushes do not queue behind the coordinator's.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  // Reconnect quickly after a restarted server comes back.
  args.SetInt(GRPC_ARG_INITIAL_RECONNECT_BACKOFF_MS, 100);
  args.SetInt(GRPC_ARG_MAX_RECONNECT_BACKOFF_MS, 1000);
  std::shared_ptr<grpc::ChannelCredentials> creds;
  if (cluster.security.tls()) {
    grpc::SslCredentialsOptions o;
    o.pem_root_certs = read_pem(
        cluster.security.tls_ca.empty() ? cluster.security.tls_cert : cluster.security.tls_ca,
        "CA certificate");
    creds = grpc::SslCredentials(o);
    const std::string host = host_of(address);
    if (host == "127.0.0.1" || host == "::1") args.SetSslTargetNameOverride("localhost");
  } else {
    creds = grpc::InsecureChannelCredentials();
  }
  return grpc::CreateCustomChannel(address, creds, args);
}

void prepare(grpc::ClientContext& ctx, const Cluster& cluster, std::chrono::milliseconds timeout) {
  ctx.AddMetadata(kTokenKey, cluster.security.token);
  ctx.set_deadline(std::chrono::system_clock::now() +
                   (timeout.count() > 0 ? timeout : cluster.rpc_timeout));
}

grpc::Status check_token(const grpc::ServerContext* ctx, const std::string& token) {
  const auto& md = ctx->client_metadata();
  const auto it = md.find(kTokenKey);
  if (it == md.end()) {
    return {grpc::StatusCode::UNAUTHENTICATED,
            "the call carries no token (" + std::string(kTokenKey) + " metadata)"};
  }
  // Compare digests, so neither the content nor the length of the token leaks through timing.
  unsigned char a[SHA256_DIGEST_LENGTH], b[SHA256_DIGEST_LENGTH];
  SHA256(reinterpret_cast<const unsigned char*>(it->second.data()), it->second.size(), a);
  SHA256(reinterpret_cast<const unsigned char*>(token.data()), token.size(), b);
  if (CRYPTO_memcmp(a, b, sizeof a) != 0) return {grpc::StatusCode::UNAUTHENTICATED, "wrong token"};
  return grpc::Status::OK;
}

std::string describe(const std::string& what, const std::string& address, const grpc::Status& s) {
  static const char* const names[] = {"OK",
                                      "CANCELLED",
                                      "UNKNOWN",
                                      "INVALID_ARGUMENT",
                                      "DEADLINE_EXCEEDED",
                                      "NOT_FOUND",
                                      "ALREADY_EXISTS",
                                      "PERMISSION_DENIED",
                                      "RESOURCE_EXHAUSTED",
                                      "FAILED_PRECONDITION",
                                      "ABORTED",
                                      "OUT_OF_RANGE",
                                      "UNIMPLEMENTED",
                                      "INTERNAL",
                                      "UNAVAILABLE",
                                      "DATA_LOSS",
                                      "UNAUTHENTICATED"};
  const int code = static_cast<int>(s.error_code());
  return what + " " + address + ": " + (code >= 0 && code <= 16 ? names[code] : "?") + ": " +
         s.error_message();
}

void to_proto(const std::string& name, const Tensor& t, rpc::TensorData* out) {
  out->set_name(name);
  for (int d = 0; d < t.dim(); ++d) out->add_shape(t.size(d));
  out->set_data(t.to_bytes());
}

grpc::Status from_proto(const rpc::TensorData& in, const std::string& what, Tensor* out) {
  std::vector<std::int64_t> dims(in.shape().begin(), in.shape().end());
  std::int64_t numel = 1;
  for (std::int64_t d : dims) {
    if (d < 0 || d > (std::int64_t{1} << 40) || (d > 0 && numel > (std::int64_t{1} << 40) / d)) {
      return {grpc::StatusCode::INVALID_ARGUMENT,
              what + ": tensor '" + in.name() + "' has an impossible shape"};
    }
    numel *= d;
  }
  if (in.data().size() != static_cast<std::size_t>(numel) * 4) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            what + ": tensor '" + in.name() + "' has " + std::to_string(in.data().size()) +
                " bytes, its shape needs " + std::to_string(numel * 4)};
  }
  *out = Tensor::from_bytes(in.data(), Shape(dims), DType::F32);
  return grpc::Status::OK;
}

grpc::Status copy_into(const rpc::TensorData& in, const std::string& what, const std::string& name,
                       Tensor& dst) {
  if (in.name() != name) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            what + ": expected tensor '" + name + "', got '" + in.name() + "'"};
  }
  bool same = in.shape_size() == dst.dim();
  for (int d = 0; same && d < dst.dim(); ++d) same = in.shape(d) == dst.size(d);
  if (!same || in.data().size() != dst.nbytes()) {
    return {grpc::StatusCode::INVALID_ARGUMENT,
            what + ": tensor '" + name + "' does not match its variable (" +
                std::to_string(in.data().size()) + " bytes, expected " +
                std::to_string(dst.nbytes()) + " in shape " + dst.shape().str() + ")"};
  }
  dst.assign_bytes(in.data());
  return grpc::Status::OK;
}

}  // namespace hpm::distribute::ps
