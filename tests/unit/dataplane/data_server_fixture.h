// The fixture of node::DataServer's tests (data_server_test.cc, data_server_fence_test.cc): a
// server over a segment between guard bytes (guarded_segment.h), checked after every test, and
// helpers that speak the wire format by hand.
#pragma once

#include <gtest/gtest.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <vector>

#include "guarded_segment.h"
#include "node/data_server.h"
#include "raw_conn.h"
#include "transfer/protocol.h"

namespace granary::dataserver_test {

using node::DataServer;
using testing::RawConn;
using transfer::Opcode;
using transfer::RequestHeader;
using transfer::ResponseHeader;

constexpr uint64_t kSegSize = 1 << 20;
constexpr uint64_t kToken = 0x1234567890abcdefULL;

using Clock = std::chrono::steady_clock;

inline double SecondsSince(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

inline RequestHeader Header(Opcode op, uint64_t offset, uint64_t length, uint64_t token = kToken,
                     uint64_t id = 7) {
  RequestHeader h;
  h.opcode = op;
  h.request_id = id;
  h.segment_token = token;
  h.offset = offset;
  h.length = length;
  return h;
}

class DataServerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    if (server_) server_->Stop();
    segment_.AssertGuardsIntact();
  }
  uint8_t* seg() { return segment_.data(); }

  DataServer& StartServer(int idle_timeout_ms = 2000, size_t max_connections = 64) {
    DataServer::Options options;
    options.idle_timeout_ms = idle_timeout_ms;
    options.max_connections = max_connections;
    return StartServer(options);
  }
  DataServer& StartServer(const DataServer::Options& options) {
    server_ = std::make_unique<DataServer>(seg(), kSegSize, kToken, options);
    Status s = server_->Start();
    EXPECT_TRUE(s.ok()) << s.ToString();
    EXPECT_NE(server_->port(), 0);
    return *server_;
  }

  // A READ of [offset, +length) on `conn` that must succeed with the segment's bytes.
  void ExpectReadWorks(RawConn& conn, uint64_t offset, uint64_t length) {
    ASSERT_TRUE(conn.SendHeader(Header(Opcode::kRead, offset, length, kToken, 99)));
    auto rh = conn.RecvResponse();
    ASSERT_TRUE(rh.has_value()) << "connection was closed";
    EXPECT_EQ(rh->magic, transfer::kResponseMagic);
    ASSERT_EQ(rh->status, 0);
    EXPECT_EQ(rh->request_id, 99u);
    ASSERT_EQ(rh->length, length);
    if (length == 0) return;
    std::vector<uint8_t> got(length);
    ASSERT_TRUE(conn.Recv(got.data(), length));
    EXPECT_EQ(std::memcmp(got.data(), seg() + offset, length), 0);
  }

  // Sends `h` (plus `payload` bytes) and expects the error `code` and a usable connection.
  void ExpectRefused(RawConn& conn, const RequestHeader& h, ErrorCode code, size_t payload = 0) {
    std::vector<uint8_t> before(seg(), seg() + kSegSize);
    ASSERT_TRUE(conn.SendHeader(h));
    if (payload > 0) {
      std::vector<uint8_t> junk(payload, 0xEE);
      ASSERT_TRUE(conn.Send(junk.data(), junk.size()));
    }
    auto rh = conn.RecvResponse();
    ASSERT_TRUE(rh.has_value()) << "refusal must not close the connection";
    EXPECT_EQ(rh->status, static_cast<int32_t>(code));
    EXPECT_EQ(rh->length, 0u);
    EXPECT_EQ(rh->request_id, h.request_id);
    EXPECT_EQ(std::memcmp(before.data(), seg(), kSegSize), 0) << "a refused request wrote";
    ExpectReadWorks(conn, 1000, 64);
  }

  // Sends a WRITE header alone and expects the refusal `code` at once (the payload is never
  // waited for), then this connection closed; the segment is untouched and others are served.
  void ExpectWriteRefusedAndClosed(const RequestHeader& h, ErrorCode code,
                                   bool others_served = true) {
    RawConn conn(server_->port());
    ASSERT_TRUE(conn.connected());
    std::vector<uint8_t> before(seg(), seg() + kSegSize);
    ASSERT_TRUE(conn.SendHeader(h));
    pollfd pfd{conn.fd(), POLLIN, 0};
    ASSERT_EQ(poll(&pfd, 1, 2000), 1) << "no answer to a refused WRITE before its payload";
    auto rh = conn.RecvResponse();
    ASSERT_TRUE(rh.has_value());
    EXPECT_EQ(rh->status, static_cast<int32_t>(code));
    EXPECT_EQ(rh->length, 0u);
    EXPECT_EQ(rh->request_id, h.request_id);
    EXPECT_TRUE(conn.ClosedByPeer()) << "a refused WRITE's connection must close";
    EXPECT_EQ(std::memcmp(before.data(), seg(), kSegSize), 0) << "a refused request wrote";
    if (!others_served) return;  // the caller's token is not the server's
    RawConn other(server_->port());
    ExpectReadWorks(other, 1000, 64);
  }

  // Sends a malformed header and expects the server to close this connection only.
  void ExpectClosesOn(const RequestHeader& h) {
    RawConn conn(server_->port());
    ASSERT_TRUE(conn.connected());
    uint64_t rejected = server_->stats().rejected_frames;
    ASSERT_TRUE(conn.SendHeader(h));
    EXPECT_TRUE(conn.ClosedByPeer());
    EXPECT_EQ(server_->stats().rejected_frames, rejected + 1);
    RawConn other(server_->port());
    ExpectReadWorks(other, 0, 128);
  }

  testing::GuardedSegment segment_{kSegSize, 7, 3};
  std::vector<uint8_t> second_mount_;  // a remount's memory, for the fence tests
  std::unique_ptr<DataServer> server_;
};

}  // namespace granary::dataserver_test
