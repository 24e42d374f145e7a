// The parameter servers' defences: the shared token on every call, refused malformed, oversized
// and garbage messages (a small fuzz test) with the server serving on, TLS with a certificate made
// by the openssl CLI here, token files, and the size-balanced placement.
#include <arpa/inet.h>
#include <grpcpp/generic/generic_stub.h>
#include <grpcpp/grpcpp.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>

#include "common/temp_dir.h"
#include "distribute/ps_cluster.h"
#include "hpm/distribute/ps/client.h"
#include "ps.grpc.pb.h"

namespace hpm::distribute::ps {
namespace {

using namespace testing;

// A server holding small_model()'s variables, and a client of it.
struct OneServer {
  Cluster cluster = loopback_cluster(1);
  std::vector<std::unique_ptr<ParameterServer>> servers;
  nn::NamedTensors vars = small_model()->named_parameters();
  std::unique_ptr<PsClient> client;

  explicit OneServer(std::size_t max_message = 256u << 20) {
    cluster.max_message_bytes = max_message;
    servers = start_servers(cluster, 1);
    client = make_client(cluster);
    client->init(vars, OptimizerSpec{}, 0, {0});
  }
  std::unique_ptr<PsClient> make_client(const Cluster& c) const {
    std::vector<std::string> names;
    std::vector<std::int64_t> numels;
    for (const auto& [n, t] : vars) {
      names.push_back(n);
      numels.push_back(t.numel());
    }
    return std::make_unique<PsClient>(c, names, numels);
  }
  // A pull still returns the variables (the server is serving and unharmed).
  void expect_serving() {
    nn::NamedTensors into = small_model(99)->named_parameters();
    client->pull(into);
    EXPECT_EQ(flat(into), flat(vars));
  }
  std::shared_ptr<grpc::Channel> channel() const {
    return grpc::CreateChannel(cluster.ps[0], grpc::InsecureChannelCredentials());
  }
};

grpc::Status raw_call(grpc::GenericStub& stub, const std::string& method, const std::string& bytes,
                      const std::string& token) {
  grpc::ClientContext ctx;
  if (!token.empty()) ctx.AddMetadata("x-hpm-token", token);
  ctx.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(5));
  grpc::Slice slice(bytes.data(), bytes.size());
  grpc::ByteBuffer request(&slice, 1), response;
  grpc::CompletionQueue cq;
  grpc::Status status;
  auto call = stub.PrepareUnaryCall(&ctx, method, request, &cq);
  call->StartCall();
  call->Finish(&response, &status, reinterpret_cast<void*>(1));
  void* tag = nullptr;
  bool ok = false;
  cq.Next(&tag, &ok);
  return status;
}

const std::string kPush = "/hpm.distribute.ps.rpc.ParameterServer/Push";

TEST(PsSecurity, CallsWithoutTheTokenAreRefused) {
  OneServer s;
  auto stub = rpc::ParameterServer::NewStub(s.channel());
  for (const std::string token : {"", "wrong", "test-token-012345678", "test-token-0123456789x"}) {
    grpc::ClientContext ctx;
    if (!token.empty()) ctx.AddMetadata("x-hpm-token", token);
    rpc::PullReply reply;
    const grpc::Status st = stub->Pull(&ctx, rpc::PullRequest(), &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::UNAUTHENTICATED) << "token '" << token << "'";
    EXPECT_EQ(st.error_message(),
              token.empty() ? "the call carries no token (x-hpm-token metadata)" : "wrong token");
    EXPECT_EQ(reply.vars_size(), 0);
  }
  Cluster wrong = s.cluster;
  wrong.security.token = "nope";
  nn::NamedTensors into = s.vars;
  try {
    s.make_client(wrong)->pull(into);
    ADD_FAILURE() << "a pull with the wrong token went through";
  } catch (const PsError& e) {
    EXPECT_NE(std::string(e.what()).find("Pull parameter-server task 0 at " + s.cluster.ps[0] +
                                         ": UNAUTHENTICATED: wrong token"),
              std::string::npos)
        << e.what();
  }
  EXPECT_GE(s.servers[0]->counters().refused, 5);
  s.expect_serving();
}

TEST(PsSecurity, MalformedPushesAreRefusedNamingWhatIsWrong) {
  OneServer s;
  std::vector<Tensor> grads;
  for (const auto& [n, t] : s.vars) grads.push_back(Tensor::zeros(t.shape()));
  auto expect_refused = [&](std::vector<Tensor> g, const std::string& what, float lr = 0.1f) {
    try {
      s.client->push(g, 1, 0, {0}, 0, 0, lr);
      ADD_FAILURE() << "accepted: " << what;
    } catch (const PsError& e) {
      EXPECT_NE(std::string(e.what()).find(what), std::string::npos) << e.what();
    }
  };
  auto wrong_shape = grads;
  wrong_shape[0] = Tensor::zeros({3});
  expect_refused(wrong_shape,
                 "INVALID_ARGUMENT: Push gradient: tensor '0.weight' does not match its "
                 "variable (12 bytes, expected 768 in shape [16, 12])");
  expect_refused(grads, "INVALID_ARGUMENT: Push: learning rate must be finite, >= 0", -1.0f);
  expect_refused(grads, "INVALID_ARGUMENT: Push: learning rate must be finite, >= 0", NAN);
  s.expect_serving();
  // A wrong count of gradients, straight through the stub.
  auto stub = rpc::ParameterServer::NewStub(s.channel());
  grpc::ClientContext ctx;
  ctx.AddMetadata("x-hpm-token", s.cluster.security.token);
  rpc::PushRequest req;
  req.set_lr(0.1f);
  rpc::PushReply reply;
  const grpc::Status st = stub->Push(&ctx, req, &reply);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_EQ(st.error_message(), "Push to task 0: 0 gradients for 4 variables");
  s.expect_serving();
}

// Found by fuzz/ps_fuzz.cpp: an Init whose optimizer state held a step count no integer can
// hold (1e34, NaN, -1, 2.5) was cast to int64 regardless (undefined behaviour).
TEST(PsSecurity, AnInitWithAnImpossibleStepCountIsRefused) {
  OneServer s;
  auto stub = rpc::ParameterServer::NewStub(s.channel());
  for (const float step : {1.2499e34f, NAN, -1.0f, 2.5f}) {
    rpc::InitRequest req;
    const auto add = [](rpc::TensorData* d, const std::string& name, const Tensor& t) {
      d->set_name(name);
      for (std::int64_t k : t.shape().dims()) d->add_shape(k);
      d->set_data(t.data<float>(), t.nbytes());
    };
    for (const auto& [n, t] : s.vars) add(req.add_vars(), n, t);
    req.mutable_optimizer()->set_kind("adamw");
    req.mutable_optimizer()->set_lr(0.01f);
    add(req.add_optimizer_state(), "step", Tensor::full({}, step));
    grpc::ClientContext ctx;
    ctx.AddMetadata("x-hpm-token", s.cluster.security.token);
    rpc::InitReply reply;
    const grpc::Status st = stub->Init(&ctx, req, &reply);
    EXPECT_EQ(st.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << step;
    EXPECT_NE(st.error_message().find("Init optimizer state: 'step' must be one whole number"),
              std::string::npos)
        << st.error_message();
  }
  s.expect_serving();
}

TEST(PsSecurity, OversizedMessagesAreRefusedAndTheServerServesOn) {
  OneServer s(64 << 10);  // 64 KiB
  grpc::GenericStub stub(s.channel());
  const grpc::Status st =
      raw_call(stub, kPush, std::string(100 << 10, 'x'), s.cluster.security.token);
  EXPECT_EQ(st.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED) << st.error_message();
  s.expect_serving();
}

TEST(PsSecurity, FuzzedGarbageIsRefusedAndTheServerServesOn) {
  OneServer s;
  grpc::GenericStub stub(s.channel());
  // A valid push's bytes, to mutate.
  rpc::PushRequest valid;
  valid.set_lr(0.0f);
  for (const auto& [n, t] : s.vars) {
    auto* g = valid.add_grads();
    g->set_name(n);
    for (int d = 0; d < t.dim(); ++d) g->add_shape(t.size(d));
    g->set_data(std::string(t.nbytes(), '\0'));
  }
  const std::string bytes = valid.SerializeAsString();
  Generator gen(1234);
  int refused = 0, accepted = 0;
  for (int i = 0; i < 300; ++i) {
    std::string m;
    switch (i % 3) {
      case 0:  // random bytes
        m.resize(gen.below(2048));
        for (auto& c : m) c = static_cast<char>(gen.below(256));
        break;
      case 1:  // a valid push truncated
        m = bytes.substr(0, gen.below(bytes.size()));
        break;
      default:  // a valid push with bytes flipped
        m = bytes;
        for (int k = 0; k < 8; ++k) m[gen.below(m.size())] = static_cast<char>(gen.below(256));
    }
    const grpc::Status st = raw_call(stub, kPush, m, s.cluster.security.token);
    (st.ok() ? accepted : refused)++;
    // Without the token: refused, as unparseable (gRPC parses before the handler runs) or
    // unauthenticated, never applied.
    const auto code = raw_call(stub, kPush, m, "").error_code();
    EXPECT_TRUE(code == grpc::StatusCode::UNAUTHENTICATED || code == grpc::StatusCode::INTERNAL)
        << code;
  }
  // Flipped bytes inside gradient data (lr 0) or unknown fields may still be a well-formed push:
  // those are accepted; everything else is refused.
  EXPECT_GT(refused, 200) << accepted << " accepted";
  // Garbage on the raw socket, below HTTP/2.
  for (int i = 0; i < 20; ++i) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<std::uint16_t>(s.servers[0]->port()));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    std::string junk(gen.below(4096) + 1, '\0');
    for (auto& c : junk) c = static_cast<char>(gen.below(256));
    EXPECT_GT(::write(fd, junk.data(), junk.size()), 0);
    ::close(fd);
  }
  s.expect_serving();
  EXPECT_GT(s.servers[0]->counters().refused, 0);
}

TEST(PsSecurity, TlsWithASelfSignedCertificate) {
  if (std::system("openssl version > /dev/null 2>&1") != 0) GTEST_SKIP() << "no openssl CLI";
  hpm::testing::TempDir dir;
  const std::string cmd =
      "openssl req -x509 -newkey rsa:2048 -nodes -days 1 -subj /CN=localhost "
      "-addext subjectAltName=DNS:localhost,IP:127.0.0.1 -keyout " +
      (dir / "key.pem") + " -out " + (dir / "cert.pem") + " > /dev/null 2>&1";
  ASSERT_EQ(std::system(cmd.c_str()), 0) << cmd;
  Cluster c = loopback_cluster(1);
  c.security.tls_cert = dir / "cert.pem";
  c.security.tls_key = dir / "key.pem";
  auto servers = start_servers(c, 1);
  auto vars = small_model()->named_parameters();
  OneServer helper;  // only for make_client
  helper.vars = vars;
  auto client = helper.make_client(c);
  client->init(vars, OptimizerSpec{}, 0, {0});
  nn::NamedTensors into = small_model(42)->named_parameters();
  client->pull(into);
  EXPECT_EQ(flat(into), flat(vars));
  // Without TLS the server does not answer.
  Cluster plain = c;
  plain.security.tls_cert.clear();
  plain.security.tls_key.clear();
  plain.rpc_timeout = std::chrono::seconds(2);
  EXPECT_THROW(helper.make_client(plain)->pull(into), PsError);
  // A missing key file is named.
  Cluster missing = c;
  missing.security.tls_key = dir / "nope.pem";
  try {
    ParameterServer s(missing, 0, "127.0.0.1:0");
    ADD_FAILURE() << "started without a key";
  } catch (const PsError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read the TLS key file " + (dir / "nope.pem"));
  }
}

TEST(PsSecurity, TokenFromFileOrEnvironment) {
  hpm::testing::TempDir dir;
  std::ofstream(dir / "token") << "s3cret\n";
  EXPECT_EQ(load_token(dir / "token"), "s3cret");
  std::ofstream(dir / "empty") << "";
  EXPECT_THROW(
      {
        try {
          load_token(dir / "empty");
        } catch (const PsError& e) {
          EXPECT_EQ(std::string(e.what()), "the token file " + (dir / "empty") + " is empty");
          throw;
        }
      },
      PsError);
  try {
    load_token(dir / "missing");
    ADD_FAILURE();
  } catch (const PsError& e) {
    EXPECT_EQ(std::string(e.what()), "cannot read the token file " + (dir / "missing"));
  }
  ::setenv("HPM_PS_TOKEN", "from-env", 1);
  EXPECT_EQ(load_token(""), "from-env");
  ::unsetenv("HPM_PS_TOKEN");
  EXPECT_THROW(load_token(""), PsError);
}

TEST(PsPlacement, SizeBalancedLargestFirst) {
  EXPECT_EQ(place_variables({100, 60, 50, 10}, 2), (std::vector<int>{0, 1, 1, 0}));
  EXPECT_EQ(place_variables({5, 5, 5}, 3), (std::vector<int>{0, 1, 2}));
  EXPECT_EQ(place_variables({7, 1}, 4), (std::vector<int>{0, 1}));
  EXPECT_THROW(place_variables({1}, 0), PsError);
  EXPECT_EQ(mode_from_name("ssp"), Mode::kSsp);
  EXPECT_THROW(mode_from_name("eventual"), PsError);
}

}  // namespace
}  // namespace hpm::distribute::ps
