// Helpers of the security tests (security_test.cc, tenants_test.cc): secret files, stubs that
// present a secret, raw fast-port exchanges and reading one series off /metrics.
#pragma once

#include <poll.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <memory>
#include <string>

#include "common/socket_io.h"
#include "granary/client.h"
#include "master_fixture.h"
#include "process_harness.h"
#include "proto/fast_frame.h"
#include "proto/rpc_util.h"

namespace granary::it {

using namespace std::chrono_literals;

// A secret file of mode 0600 in `dir`.
inline std::string SecretFile(const TempDir& dir, const std::string& name,
                              const std::string& secret) {
  const std::string path = dir.WriteFile(name, secret + "\n");
  EXPECT_EQ(::chmod(path.c_str(), 0600), 0);
  return path;
}

// A stub whose calls present `secret` (none when empty).
inline std::unique_ptr<pb::Master::Stub> StubWith(const std::string& address,
                                                 const std::string& secret) {
  return pb::Master::NewStub(rpc::MakeChannel(address, /*own_connection=*/true, secret));
}

inline grpc::Status ListSegments(pb::Master::Stub* stub, pb::ListSegmentsResponse* resp) {
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, 5000);
  return stub->ListSegments(&ctx, pb::ListSegmentsRequest(), resp);
}

// A client of the master at `address` presenting the secret in `file` (nullptr, and a test
// failure, if it cannot connect).
inline std::unique_ptr<Client> ConnectClient(const std::string& address, const std::string& file) {
  ClientOptions o;
  o.master_address = address;
  o.auth_token_file = file;
  o.rpc_timeout_ms = 5000;
  auto c = Client::Connect(o);
  EXPECT_TRUE(c.ok()) << c.status().ToString();
  return c.ok() ? std::move(*c) : nullptr;
}

// A MountSegment of a made-up segment, presenting `secret`: what a forger would send.
inline grpc::Status MountSegmentAs(const std::string& address, const std::string& secret,
                                   const std::string& name) {
  auto stub = StubWith(address, secret);
  grpc::ClientContext ctx;
  rpc::SetDeadline(ctx, 5000);
  pb::MountSegmentRequest req;
  req.set_client_id(name + "-node");
  req.mutable_segment()->set_name(name);
  req.mutable_segment()->set_size(64 * MiB);
  req.mutable_segment()->set_endpoint("127.0.0.1:1");
  pb::MountSegmentResponse resp;
  return stub->MountSegment(&ctx, req, &resp);
}

// One frame on a raw fast-port connection, and its answer.
struct FastReply {
  Status transport;  // not OK: no (complete) answer
  fast::Header header;
  std::string body;
};

inline std::string EncodeFrame(fast::Method method, const std::string& body) {
  std::string frame(fast::kHeaderSize, '\0');
  fast::EncodeHeader({static_cast<uint8_t>(method), 0, 7, static_cast<uint32_t>(body.size())},
                     reinterpret_cast<unsigned char*>(frame.data()));
  return frame + body;
}

inline FastReply Exchange(int fd, fast::Method method, const std::string& body) {
  FastReply r;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  r.transport = net::SendAll(fd, EncodeFrame(method, body), deadline);
  if (!r.transport.ok()) return r;
  unsigned char header[fast::kHeaderSize];
  r.transport = net::RecvExact(fd, reinterpret_cast<char*>(header), sizeof(header), deadline);
  if (!r.transport.ok()) return r;
  if (fast::DecodeHeader(header, &r.header, fast::kMaxFastReply) != fast::HeaderError::kNone) {
    r.transport = Status(ErrorCode::RPC_FAIL, "bad reply header");
    return r;
  }
  r.body.resize(r.header.body_size);
  r.transport = net::RecvExact(fd, r.body.data(), r.body.size(), deadline);
  return r;
}

// Whether the peer closed `fd` (EOF within 5 s).
inline bool ClosedByPeer(int fd) {
  char byte;
  const auto deadline = std::chrono::steady_clock::now() + 5s;
  while (std::chrono::steady_clock::now() < deadline) {  // bounded by the deadline
    if (!net::WaitFor(fd, POLLIN, deadline)) return false;
    const ssize_t n = ::recv(fd, &byte, 1, MSG_DONTWAIT);
    if (n == 0) return true;
    if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
    return n < 0;  // a reset is closed too; a byte is not
  }
  return false;
}

inline int ConnectFast(uint16_t port) {
  auto fd = net::ConnectTcp("127.0.0.1", port, std::chrono::steady_clock::now() + 5s);
  EXPECT_TRUE(fd.ok()) << fd.status().ToString();
  return fd.ok() ? *fd : -1;
}

inline std::string PingBody() {
  pb::PingRequest req;
  req.set_client_id("a-prober");
  return req.SerializeAsString();
}

// The value of the series of `metric` whose labels contain `label` in a Prometheus page; -1 if
// none.
inline double MetricValue(const std::string& page, const std::string& metric,
                          const std::string& label) {
  size_t pos = 0;
  while ((pos = page.find(metric + "{", pos)) != std::string::npos) {  // bounded by the page
    const size_t end = page.find('\n', pos);
    const std::string line = page.substr(pos, end - pos);
    pos = end;
    if (line.find(label) == std::string::npos) continue;
    return std::stod(line.substr(line.rfind(' ') + 1));
  }
  return -1;
}

}  // namespace granary::it
