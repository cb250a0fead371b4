// Tests of node::DataServer through real sockets, speaking the wire format by hand so hostile
// frames can be sent. Every test's segment sits between guard bytes that are checked afterwards.
#include <gtest/gtest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <optional>
#include <random>
#include <thread>
#include <vector>

#include "data_server_fixture.h"
#include "process_limits.h"

namespace granary::dataserver_test {
namespace {

TEST_F(DataServerTest, PingReadWriteRoundTrip) {
  StartServer();
  RawConn conn(server_->port());
  ASSERT_TRUE(conn.connected());
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kPing, 0, 0, 0, 1)));
  auto pong = conn.RecvResponse();
  ASSERT_TRUE(pong.has_value());
  EXPECT_EQ(pong->status, 0);
  EXPECT_EQ(pong->request_id, 1u);
  EXPECT_EQ(pong->length, 0u);

  std::vector<uint8_t> payload(70000);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i ^ 0x5A);
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kWrite, 12345, payload.size(), kToken, 2)));
  ASSERT_TRUE(conn.Send(payload.data(), payload.size()));
  auto wr = conn.RecvResponse();
  ASSERT_TRUE(wr.has_value());
  EXPECT_EQ(wr->status, 0);
  EXPECT_EQ(wr->request_id, 2u);
  EXPECT_EQ(wr->length, 0u);
  EXPECT_EQ(std::memcmp(seg() + 12345, payload.data(), payload.size()), 0);
  ExpectReadWorks(conn, 12345, payload.size());
  // The very end of the segment, and an empty range at the end, are inside.
  ExpectReadWorks(conn, kSegSize - 10, 10);
  ExpectReadWorks(conn, kSegSize, 0);

  auto stats = server_->stats();
  EXPECT_EQ(stats.requests, 5u);
  EXPECT_EQ(stats.bytes_written, payload.size());
  EXPECT_EQ(stats.bytes_read, payload.size() + 10);
  EXPECT_EQ(stats.errors, 0u);
  EXPECT_EQ(stats.open_connections, 1u);
}

// Requests sent together, in one send, are each answered once and in order: a request's first
// receive takes up to 88 bytes (a header and a capability), so the first bytes of a WRITE's
// payload, or the next requests, arrive with a header and are served from the connection's
// read-ahead, the socket being silent by then. A refused READ in the middle keeps the rest in
// sync.
TEST_F(DataServerTest, RequestsSentInOneSendAreEachAnsweredInOrder) {
  StartServer();
  RawConn conn(server_->port());
  ASSERT_TRUE(conn.connected());
  std::vector<uint8_t> small(20), large(70000);
  for (size_t i = 0; i < small.size(); ++i) small[i] = static_cast<uint8_t>(0xC0 + i);
  for (size_t i = 0; i < large.size(); ++i) large[i] = static_cast<uint8_t>(i * 13 + 1);
  std::vector<uint8_t> wire;
  auto add = [&](const void* p, size_t n) {
    const auto* b = static_cast<const uint8_t*>(p);
    wire.insert(wire.end(), b, b + n);
  };
  const RequestHeader requests[] = {
      Header(Opcode::kWrite, 500, small.size(), kToken, 1),
      Header(Opcode::kRead, 500, small.size(), kToken, 2),
      Header(Opcode::kPing, 0, 0, 0, 3),
      Header(Opcode::kRead, 0, 8, kToken + 1, 4),  // a stale token: refused, nothing follows
      Header(Opcode::kWrite, 4096, large.size(), kToken, 5),
      Header(Opcode::kRead, 4096, large.size(), kToken, 6),
  };
  add(&requests[0], sizeof(RequestHeader));
  add(small.data(), small.size());
  for (int i = 1; i <= 4; ++i) add(&requests[i], sizeof(RequestHeader));
  add(large.data(), large.size());
  add(&requests[5], sizeof(RequestHeader));
  ASSERT_TRUE(conn.Send(wire.data(), wire.size()));

  const int32_t stale = static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND);
  const struct {
    int32_t status;
    const std::vector<uint8_t>* payload;
  } expected[] = {{0, nullptr}, {0, &small}, {0, nullptr}, {stale, nullptr}, {0, nullptr},
                  {0, &large}};
  for (uint64_t id = 1; id <= 6; ++id) {
    auto rh = conn.RecvResponse();
    ASSERT_TRUE(rh.has_value()) << "no answer to request " << id;
    EXPECT_EQ(rh->request_id, id);
    EXPECT_EQ(rh->status, expected[id - 1].status) << id;
    const std::vector<uint8_t>* payload = expected[id - 1].payload;
    ASSERT_EQ(rh->length, payload ? payload->size() : 0) << id;
    if (payload == nullptr) continue;
    std::vector<uint8_t> got(payload->size());
    ASSERT_TRUE(conn.Recv(got.data(), got.size()));
    EXPECT_EQ(got, *payload) << id;
  }
  EXPECT_EQ(std::memcmp(seg() + 500, small.data(), small.size()), 0);
  EXPECT_EQ(std::memcmp(seg() + 4096, large.data(), large.size()), 0);
  ExpectReadWorks(conn, 100, 64);

  // Two PINGs (80 bytes) come in one receive: the second is answered from the read-ahead alone.
  // Then 1,000 at once, whose answers outlast a connection's turn (kStepsPerTurn) many times.
  for (int burst : {2, 1000}) {
    std::vector<RequestHeader> pings;
    for (int i = 0; i < burst; ++i) pings.push_back(Header(Opcode::kPing, 0, 0, 0, 100 + i));
    ASSERT_TRUE(conn.Send(pings.data(), pings.size() * sizeof(RequestHeader)));
    for (int i = 0; i < burst; ++i) {
      auto rh = conn.RecvResponse();
      ASSERT_TRUE(rh.has_value()) << "no answer to PING " << i << " of " << burst;
      ASSERT_EQ(rh->request_id, 100u + i);
      ASSERT_EQ(rh->status, 0);
    }
  }
}

// Issue 22: the granary_node_* series move on the paths that did the work: requests and bytes
// by op, answer times of the requests answered OK, refusals by reason.
TEST_F(DataServerTest, MetricsCountRequestsBytesAndErrorsByReason) {
  MetricsRegistry metrics;
  DataServer::Options options;
  options.host = "127.0.0.1";
  options.metrics = &metrics;
  StartServer(options);
  RequestHeader bad = Header(Opcode::kRead, 0, 64);
  bad.magic = 0xBAD;
  ExpectClosesOn(bad);  // then a good read on another connection
  RawConn conn(server_->port());
  ASSERT_TRUE(conn.connected());
  std::vector<uint8_t> payload(5000, 0x42);
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kWrite, 100, payload.size(), kToken, 2)));
  ASSERT_TRUE(conn.Send(payload.data(), payload.size()));
  auto wr = conn.RecvResponse();
  ASSERT_TRUE(wr.has_value());
  ASSERT_EQ(wr->status, 0);
  ExpectReadWorks(conn, 100, 3000);
  ExpectRefused(conn, Header(Opcode::kRead, kSegSize - 10, 11), ErrorCode::INVALID_PARAMS);
  ExpectRefused(conn, Header(Opcode::kRead, 0, 64, kToken + 1), ErrorCode::SEGMENT_NOT_FOUND);
  // A request is counted before its connection reads the next header: once the pong is here,
  // every earlier answer on this connection has been counted.
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kPing, 0, 0, 0, 3)));
  ASSERT_TRUE(conn.RecvResponse().has_value());

  const std::string page = metrics.RenderPrometheus();
  SCOPED_TRACE(page);
  auto has = [&](const std::string& line) { return page.find(line + "\n") != std::string::npos; };
  // One write; reads: ExpectClosesOn's check, the good one, two refused and ExpectRefused's checks.
  EXPECT_TRUE(has("granary_node_requests_total{op=\"write\"} 1"));
  EXPECT_TRUE(has("granary_node_requests_total{op=\"read\"} 6"));
  EXPECT_TRUE(has("granary_node_bytes_total{op=\"write\"} 5000"));
  EXPECT_TRUE(has("granary_node_bytes_total{op=\"read\"} " + std::to_string(3000 + 2 * 64 + 128)));
  EXPECT_TRUE(has("granary_node_request_seconds_count{op=\"write\"} 1"));
  EXPECT_TRUE(has("granary_node_request_seconds_count{op=\"read\"} 4")) << "refusals are not timed";
  EXPECT_TRUE(has("granary_node_request_errors_total{reason=\"out_of_range\"} 1"));
  EXPECT_TRUE(has("granary_node_request_errors_total{reason=\"stale_mount\"} 1"));
  EXPECT_TRUE(has("granary_node_request_errors_total{reason=\"bad_frame\"} 1"));
  EXPECT_TRUE(has("granary_node_request_errors_total{reason=\"capability\"} 0"));
  EXPECT_TRUE(has("granary_node_requests_total{op=\"ping\"} 1"));
  EXPECT_TRUE(has("granary_node_connections_total 3"));
  EXPECT_EQ(server_->stats().errors, 2u) << "a bad frame is not a request error in Stats";
  server_.reset();  // before the registry its counters live in
}

TEST_F(DataServerTest, TruncatedHeaderThenCloseIsHarmless) {
  StartServer();
  {
    RawConn conn(server_->port());
    RequestHeader h = Header(Opcode::kWrite, 0, 100);
    ASSERT_TRUE(conn.Send(&h, 17));
  }
  {
    RawConn conn(server_->port());  // a WRITE cut off in the middle of its payload
    ASSERT_TRUE(conn.SendHeader(Header(Opcode::kWrite, 0, 1000)));
    std::vector<uint8_t> half(500, 0xCC);
    ASSERT_TRUE(conn.Send(half.data(), half.size()));
  }
  RawConn good(server_->port());
  ExpectReadWorks(good, 4096, 4096);  // clear of [0, 500), which the cut WRITE may be storing
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (server_->stats().open_connections != 1 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  EXPECT_EQ(server_->stats().open_connections, 1u);
  EXPECT_EQ(server_->stats().errors, 2u);
}

TEST_F(DataServerTest, BadMagicCloses) {
  StartServer();
  RequestHeader h = Header(Opcode::kRead, 0, 16);
  h.magic = 0xDEADBEEF;
  ExpectClosesOn(h);
}

TEST_F(DataServerTest, BadVersionCloses) {
  StartServer();
  RequestHeader h = Header(Opcode::kRead, 0, 16);
  h.version = 2;
  ExpectClosesOn(h);
}

TEST_F(DataServerTest, BadOpcodeCloses) {
  StartServer();
  for (uint8_t op : {0, 8, 255}) {  // 4-7 are the disk tier's (DiskRead*, DiskStage*)
    RequestHeader h = Header(Opcode::kRead, 0, 16);
    h.opcode = static_cast<Opcode>(op);
    ExpectClosesOn(h);
  }
}

TEST_F(DataServerTest, NonZeroReservedCloses) {
  StartServer();
  RequestHeader h = Header(Opcode::kRead, 0, 16);
  h.reserved = 1;
  ExpectClosesOn(h);
}

TEST_F(DataServerTest, LengthAboveMaxRequestCloses) {
  StartServer();
  ExpectClosesOn(Header(Opcode::kWrite, 0, transfer::kMaxRequestBytes + 1));
  ExpectClosesOn(Header(Opcode::kRead, 0, UINT64_MAX));
}

TEST_F(DataServerTest, OffsetPastEndIsRefused) {
  StartServer();
  RawConn conn(server_->port());
  ExpectRefused(conn, Header(Opcode::kRead, kSegSize + 1, 0), ErrorCode::INVALID_PARAMS);
  ExpectRefused(conn, Header(Opcode::kRead, UINT64_MAX, 1), ErrorCode::INVALID_PARAMS);
}

TEST_F(DataServerTest, OverflowingRangeIsRefused) {
  StartServer();
  RawConn conn(server_->port());
  const uint64_t offset = UINT64_MAX - 7;  // 2^64 - 8: offset + 16 wraps to 8
  ExpectRefused(conn, Header(Opcode::kRead, offset, 16), ErrorCode::INVALID_PARAMS);
  ExpectWriteRefusedAndClosed(Header(Opcode::kWrite, offset, 16), ErrorCode::INVALID_PARAMS);
}

TEST_F(DataServerTest, LengthPastEndIsRefused) {
  StartServer();
  RawConn conn(server_->port());
  ExpectRefused(conn, Header(Opcode::kRead, kSegSize - 10, 11), ErrorCode::INVALID_PARAMS);
  ExpectWriteRefusedAndClosed(Header(Opcode::kWrite, kSegSize - 10, 20), ErrorCode::INVALID_PARAMS);
  ExpectRefused(conn, Header(Opcode::kRead, 0, kSegSize + 1), ErrorCode::INVALID_PARAMS);
  EXPECT_EQ(server_->stats().errors, 3u);
}

TEST_F(DataServerTest, WrongTokenIsRefusedAndConnectionStaysUsable) {
  StartServer();
  RawConn conn(server_->port());
  ExpectRefused(conn, Header(Opcode::kRead, 0, 64, kToken + 1), ErrorCode::SEGMENT_NOT_FOUND);
  // Token is checked before the range: a stale token with a wild range says "stale" clearly.
  ExpectRefused(conn, Header(Opcode::kRead, UINT64_MAX, 64, 0), ErrorCode::SEGMENT_NOT_FOUND);
}

// A probe: a WRITE quoting a wrong token or a range outside the segment, whose payload never
// comes, got neither an answer nor a close until the request deadline (10 s). It is answered at
// once and its connection closed, however large the payload it announced.
TEST_F(DataServerTest, ARefusedWriteIsAnsweredAtItsHeaderAndItsConnectionClosed) {
  StartServer();
  ExpectWriteRefusedAndClosed(Header(Opcode::kWrite, 0, 300000, kToken ^ 1),
                              ErrorCode::SEGMENT_NOT_FOUND);
  ExpectWriteRefusedAndClosed(Header(Opcode::kWrite, kSegSize - 100, 200000),
                              ErrorCode::INVALID_PARAMS);
  ExpectWriteRefusedAndClosed(Header(Opcode::kWrite, uint64_t{0} - 1024, 1024),
                              ErrorCode::INVALID_PARAMS);
  // A peer that sends the payload anyway gets the refusal too (what a client reads after its
  // send was cut off), and nothing lands.
  RawConn conn(server_->port());
  std::vector<uint8_t> before(seg(), seg() + kSegSize);
  std::vector<uint8_t> junk(4096, 0xEE);
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kWrite, 0, junk.size(), kToken ^ 1)));
  (void)conn.Send(junk.data(), junk.size());  // may race the close
  auto rh = conn.RecvResponse();
  ASSERT_TRUE(rh.has_value());
  EXPECT_EQ(rh->status, static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  EXPECT_EQ(std::memcmp(before.data(), seg(), kSegSize), 0);
}

// A request body is held only as its bytes arrive, and all partial bodies within
// max_body_bytes_held: headers that announce bodies hold nothing; bodies past the bound are shed
// (their connections closed) and the bytes held come back as connections go.
TEST_F(DataServerTest, RequestBodiesAreHeldAsTheyArriveAndWithinTheirBound) {
  DataServer::Options options;
  options.max_connections = 64;
  options.max_body_bytes_held = 1 << 20;
  StartServer(options);
  auto disk_read = [](uint64_t id) {
    RequestHeader h = Header(Opcode::kDiskRead, 0, transfer::kMaxDiskReadBody, 0, id);
    return h;
  };
  std::vector<std::unique_ptr<RawConn>> conns;
  for (uint64_t i = 0; i < 20; ++i) {
    conns.push_back(std::make_unique<RawConn>(server_->port()));
    ASSERT_TRUE(conns.back()->SendHeader(disk_read(i)));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  EXPECT_EQ(server_->stats().body_bytes_held, 0u) << "bodies held before their bytes came";
  std::vector<uint8_t> part(300 * 1024, 0x5A);
  for (auto& c : conns) (void)c->Send(part.data(), part.size());
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto stats = server_->stats();
  EXPECT_LE(stats.body_bytes_held, options.max_body_bytes_held);
  EXPECT_GT(stats.body_bytes_held, 0u);
  EXPECT_GT(stats.shed_bodies, 0u) << "20 bodies of 300 KiB fit 1 MiB?";
  RawConn other(server_->port());
  ExpectReadWorks(other, 0, 4096);
  conns.clear();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(5);
  while (server_->stats().body_bytes_held > 0 && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_EQ(server_->stats().body_bytes_held, 0u) << "closed connections kept their bodies";
}

TEST_F(DataServerTest, StalledPeerIsClosedAfterIdleTimeoutWhileOthersAreServed) {
  StartServer(/*idle_timeout_ms=*/300);
  RawConn stalled_mid_payload(server_->port());
  ASSERT_TRUE(stalled_mid_payload.SendHeader(Header(Opcode::kWrite, 0, 1000)));
  ASSERT_TRUE(stalled_mid_payload.Send("0123456789", 10));
  RawConn stalled_mid_header(server_->port());
  ASSERT_TRUE(stalled_mid_header.Send("GNRY", 4));
  const auto start = Clock::now();

  // Another connection is served throughout, until the server has dropped both stalled ones.
  RawConn busy(server_->port());
  auto readable = [](RawConn& c) {
    pollfd pfd{c.fd(), POLLIN, 0};
    return poll(&pfd, 1, 0) == 1;
  };
  int served = 0;
  while (!(readable(stalled_mid_payload) && readable(stalled_mid_header)) &&
         SecondsSince(start) < 3.0) {
    // Clear of [0, 1000), where the stalled WRITE has stored its first bytes meanwhile.
    ExpectReadWorks(busy, 4096 + static_cast<uint64_t>(served % 100) * 1000, 1000);
    ++served;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  double waited = SecondsSince(start);
  EXPECT_TRUE(stalled_mid_payload.ClosedByPeer());
  EXPECT_TRUE(stalled_mid_header.ClosedByPeer());
  EXPECT_GE(waited, 0.25);
  EXPECT_LT(waited, 3.0);
  EXPECT_GT(served, 10);
  ExpectReadWorks(busy, 4096, 10);  // the active connection survived
  EXPECT_EQ(server_->stats().errors, 2u);
}

TEST_F(DataServerTest, StopDoesNotWaitForStalledPeers) {
  StartServer(/*idle_timeout_ms=*/60000);
  RawConn a(server_->port());
  ASSERT_TRUE(a.SendHeader(Header(Opcode::kWrite, 0, 5000)));  // payload never comes
  RawConn b(server_->port());
  ASSERT_TRUE(b.Send("GN", 2));
  RawConn c(server_->port());
  ExpectReadWorks(c, 0, 10);
  const auto start = Clock::now();
  server_->Stop();
  EXPECT_LT(SecondsSince(start), 2.0);
  EXPECT_EQ(server_->stats().open_connections, 0u);
  EXPECT_TRUE(c.ClosedByPeer());
  server_->Stop();  // idempotent
  RawConn after(server_->port());
  EXPECT_FALSE(after.connected());
}

TEST_F(DataServerTest, PeerVanishingMidReadOnlyClosesItsConnection) {
  StartServer();
  {
    RawConn conn(server_->port());
    ASSERT_TRUE(conn.SendHeader(Header(Opcode::kRead, 0, kSegSize)));
    char first[100];
    ASSERT_TRUE(conn.Recv(first, sizeof(first)));
  }  // closed with most of the payload unread
  RawConn good(server_->port());
  ExpectReadWorks(good, 0, kSegSize);
}

TEST_F(DataServerTest, MaxConnectionsIsEnforced) {
  StartServer(2000, /*max_connections=*/2);
  auto a = std::make_unique<RawConn>(server_->port());
  RawConn b(server_->port());
  ExpectReadWorks(*a, 0, 8);
  ExpectReadWorks(b, 0, 8);
  RawConn third(server_->port());
  EXPECT_TRUE(third.ClosedByPeer());
  EXPECT_EQ(server_->stats().rejected_connections, 1u);
  a.reset();
  auto deadline = Clock::now() + std::chrono::seconds(5);
  while (server_->stats().open_connections > 1 && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  RawConn fourth(server_->port());
  ExpectReadWorks(fourth, 0, 8);
}

TEST_F(DataServerTest, StartRefusesTakenPortAndSecondStart) {
  DataServer& first = StartServer();
  EXPECT_EQ(first.Start().code(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
  DataServer::Options options;
  options.port = first.port();
  DataServer second(seg(), kSegSize, kToken, options);
  Status s = second.Start();
  EXPECT_EQ(s.code(), ErrorCode::TRANSFER_FAIL);
  EXPECT_NE(s.message().find(std::to_string(first.port())), std::string::npos) << s.ToString();
  options.port = 0;
  options.max_connections = 0;
  EXPECT_EQ(DataServer(seg(), kSegSize, kToken, options).Start().code(), ErrorCode::INVALID_PARAMS);
}

// Issue 12: 1,000 connections that stay silent, or stop mid-header, take no thread each and do
// not keep a real client from being served promptly.
TEST_F(DataServerTest, ThousandIdleOrStalledConnectionsDoNotStopARealClient) {
  constexpr int kIdle = 1000;
  ASSERT_TRUE(testing::EnsureDescriptors(2 * kIdle + 256)) << "RLIMIT_NOFILE too low";
  StartServer(DataServer::Options{});  // the defaults: 4096 connections, 60 s idle timeout
  const int threads_before = testing::ThreadCount();
  std::vector<std::unique_ptr<RawConn>> idle;
  for (int i = 0; i < kIdle; ++i) {
    idle.push_back(std::make_unique<RawConn>(server_->port()));
    ASSERT_TRUE(idle.back()->connected()) << i;
    if (i % 2 == 1) {
      ASSERT_TRUE(idle.back()->Send("GNRY", 4));  // half of them mid-header
    }
  }
  auto deadline = Clock::now() + std::chrono::seconds(10);
  while (server_->stats().open_connections < kIdle && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  ASSERT_EQ(server_->stats().open_connections, static_cast<uint64_t>(kIdle));
  EXPECT_LT(testing::ThreadCount() - threads_before, 4) << "a thread per connection?";

  RawConn client(server_->port());
  ASSERT_TRUE(client.connected());
  std::vector<uint8_t> payload(256 * 1024);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i * 13 + 1);
  const auto start = Clock::now();
  for (int round = 0; round < 20; ++round) {
    ASSERT_TRUE(client.SendHeader(Header(Opcode::kWrite, 8192, payload.size(), kToken, round)));
    ASSERT_TRUE(client.Send(payload.data(), payload.size()));
    auto wr = client.RecvResponse();
    ASSERT_TRUE(wr.has_value());
    ASSERT_EQ(wr->status, 0);
    ExpectReadWorks(client, 8192, payload.size());
  }
  EXPECT_LT(SecondsSince(start), 2.0) << "20 writes and reads of 256 KiB took too long";
  EXPECT_EQ(std::memcmp(seg() + 8192, payload.data(), payload.size()), 0);
  EXPECT_EQ(server_->stats().open_connections, static_cast<uint64_t>(kIdle) + 1);
  EXPECT_EQ(server_->stats().rejected_connections, 0u);
}

// A peer that sends part of a header and goes silent is dropped at its request deadline (not at
// twice it, nor at the idle timeout); one that trickles a byte at a time, never silent for long,
// is dropped at the same deadline. Another client is served throughout.
TEST_F(DataServerTest, StalledOrTricklingHeaderIsDroppedAtItsRequestDeadline) {
  DataServer::Options options;
  options.idle_timeout_ms = 60000;
  options.request_timeout_ms = 500;
  StartServer(options);
  RequestHeader h = Header(Opcode::kRead, 0, 64);
  const auto* bytes = reinterpret_cast<const uint8_t*>(&h);
  RawConn stalled(server_->port());
  RawConn trickling(server_->port());
  RawConn busy(server_->port());
  const auto start = Clock::now();
  ASSERT_TRUE(stalled.Send(bytes, 20));
  size_t trickled = 0;
  int served = 0, iteration = 0;
  double stalled_closed = -1, trickling_closed = -1;
  while ((stalled_closed < 0 || trickling_closed < 0) && SecondsSince(start) < 3.0) {
    // A byte every ~40 ms: never silent for long, and the header still unfinished at 1 s.
    if (iteration++ % 4 == 0 && trickled < sizeof(h) - 1 && trickling_closed < 0) {
      trickling.Send(bytes + trickled++, 1);  // may fail once the server has closed it
    }
    ExpectReadWorks(busy, 4096 + static_cast<uint64_t>(served % 100) * 64, 64);
    ++served;
    if (stalled_closed < 0 && testing::Readable(stalled)) stalled_closed = SecondsSince(start);
    if (trickling_closed < 0 && testing::Readable(trickling)) trickling_closed = SecondsSince(start);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(stalled.ClosedByPeer());
  EXPECT_TRUE(trickling.ClosedByPeer());
  EXPECT_GE(stalled_closed, 0.45);
  EXPECT_LT(stalled_closed, 0.9) << "dropped late: at twice the deadline?";
  EXPECT_GE(trickling_closed, 0.45);
  EXPECT_LT(trickling_closed, 0.9);
  EXPECT_GT(served, 20);
  ExpectReadWorks(busy, 0, 16);
  EXPECT_EQ(server_->stats().timeouts, 2u);
  EXPECT_EQ(server_->stats().errors, 2u);
}

// A WRITE whose payload comes a byte at a time is dropped at its deadline (request_timeout_ms
// plus its length at min_transfer_rate), is never acknowledged and counts no written byte, while
// another client writes and reads.
TEST_F(DataServerTest, TricklingWritePayloadIsDroppedAtItsDeadlineAndNeverAcknowledged) {
  DataServer::Options options;
  options.idle_timeout_ms = 60000;
  options.request_timeout_ms = 400;
  options.min_transfer_rate = 10000;  // 2000 bytes: 200 ms more
  StartServer(options);
  RawConn slow(server_->port());
  ASSERT_TRUE(slow.SendHeader(Header(Opcode::kWrite, 0, 2000, kToken, 1)));
  const auto start = Clock::now();
  RawConn busy(server_->port());
  std::vector<uint8_t> payload(4096, 0x3C);
  uint8_t one = 0x77;
  int served = 0;
  double closed = -1;
  while (closed < 0 && SecondsSince(start) < 3.0) {
    slow.Send(&one, 1);  // may fail once the server has closed it
    ASSERT_TRUE(busy.SendHeader(Header(Opcode::kWrite, 65536, payload.size(), kToken, 2)));
    ASSERT_TRUE(busy.Send(payload.data(), payload.size()));
    auto wr = busy.RecvResponse();
    ASSERT_TRUE(wr.has_value());
    ASSERT_EQ(wr->status, 0);
    ExpectReadWorks(busy, 65536, payload.size());
    ++served;
    if (testing::Readable(slow)) closed = SecondsSince(start);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  EXPECT_TRUE(slow.ClosedByPeer()) << "the slow writer got an answer instead of a close";
  EXPECT_GE(closed, 0.55);
  EXPECT_LT(closed, 1.1) << "dropped late: at twice the deadline?";
  EXPECT_GT(served, 20);
  const auto stats = server_->stats();
  EXPECT_EQ(stats.bytes_written, static_cast<uint64_t>(served) * payload.size())
      << "the dropped write's bytes were counted as written";
  EXPECT_EQ(stats.timeouts, 1u);
  EXPECT_EQ(stats.errors, 1u);
}

// Frames split at every byte boundary are reassembled: hostile ranges are still refused (at the
// header, then closed), malformed headers still close only their connection.
TEST_F(DataServerTest, FramesArrivingByteByByteAreCheckedAsWholeOnes) {
  StartServer();
  std::optional<RawConn> refused_conn;
  RawConn conn(server_->port());
  auto send_split = [&](const void* data, size_t n, RawConn& to) {
    for (size_t i = 0; i < n; ++i) {
      ASSERT_TRUE(to.Send(static_cast<const uint8_t*>(data) + i, 1));
      if (i % 8 == 0) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  };
  std::vector<uint8_t> before(seg(), seg() + kSegSize);
  std::vector<uint8_t> junk(300, 0xEE);
  for (uint64_t offset : {UINT64_MAX - 7, kSegSize - 10, kSegSize + 1}) {
    RequestHeader h = Header(Opcode::kWrite, offset, junk.size(), kToken, offset);
    refused_conn.emplace(server_->port());
    send_split(&h, sizeof(h), *refused_conn);
    auto rh = refused_conn->RecvResponse();
    ASSERT_TRUE(rh.has_value());
    EXPECT_EQ(rh->status, static_cast<int32_t>(ErrorCode::INVALID_PARAMS));
    EXPECT_EQ(rh->request_id, offset);
    EXPECT_TRUE(refused_conn->ClosedByPeer());
  }
  EXPECT_EQ(std::memcmp(before.data(), seg(), kSegSize), 0) << "a refused request wrote";
  std::vector<uint8_t> payload(300);
  for (size_t i = 0; i < payload.size(); ++i) payload[i] = static_cast<uint8_t>(i + 9);
  RequestHeader w = Header(Opcode::kWrite, 777, payload.size(), kToken, 5);
  send_split(&w, sizeof(w), conn);
  send_split(payload.data(), payload.size(), conn);
  auto ok = conn.RecvResponse();
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 0);
  EXPECT_EQ(std::memcmp(seg() + 777, payload.data(), payload.size()), 0);
  RequestHeader bad = Header(Opcode::kRead, 0, transfer::kMaxRequestBytes + 1);
  send_split(&bad, sizeof(bad), conn);
  EXPECT_TRUE(conn.ClosedByPeer());
  EXPECT_EQ(server_->stats().rejected_frames, 1u);
}

// Model-checked fuzz: frames of random bytes and of mutated valid headers over several
// connections; each outcome is predicted from the frame, and a shadow copy of the segment tracks
// accepted writes. Afterwards a clean client must read exactly the shadow.
TEST_F(DataServerTest, FuzzedFramesNeverCorruptOrEscapeTheSegment) {
  StartServer();
  std::vector<uint8_t> shadow(seg(), seg() + kSegSize);
  std::mt19937_64 rng(20261122);
  std::vector<uint8_t> random_pool(2 * kSegSize + 4096);  // payloads are slices of it
  for (auto& b : random_pool) b = static_cast<uint8_t>(rng());
  // Edge values for offsets and lengths; a third of them are above kMaxRequestBytes.
  auto pick_u64 = [&]() -> uint64_t {
    switch (rng() % 12) {
      case 0:
        return 0;
      case 1:
        return 1;
      case 2:
      case 3:
        return rng() % 4096;
      case 4:
        return kSegSize - rng() % 8;
      case 5:
        return kSegSize + rng() % 8;
      case 6:
        return transfer::kMaxRequestBytes - rng() % 2;
      case 7:
        return transfer::kMaxRequestBytes + 1 + rng() % 2;
      case 8:
        return UINT64_MAX - rng() % 16;
      case 9:
      case 10:
        return rng() % kSegSize;
      default:
        return rng();
    }
  };
  std::vector<std::unique_ptr<RawConn>> conns(4);
  int closes = 0, refusals = 0, accepted = 0;
  for (int frame = 0; frame < 2000; ++frame) {
    auto& conn = conns[rng() % conns.size()];
    if (!conn) conn = std::make_unique<RawConn>(server_->port());
    RequestHeader h;
    if (rng() % 8 == 0) {
      for (auto* p = reinterpret_cast<uint8_t*>(&h); p < reinterpret_cast<uint8_t*>(&h + 1); ++p) {
        *p = static_cast<uint8_t>(rng());
      }
    } else {
      h = Header(static_cast<Opcode>(1 + rng() % 3), pick_u64(), pick_u64(),
                 rng() % 5 == 0 ? rng() : kToken, rng());
      if (rng() % 20 == 0) h.version = static_cast<uint8_t>(rng());
      if (rng() % 20 == 0) h.reserved = static_cast<uint16_t>(1 + rng() % 65535);
      if (rng() % 20 == 0) h.opcode = static_cast<Opcode>(rng());
      if (rng() % 40 == 0) h.magic ^= 1u << (rng() % 32);
    }
    // DISK_READ, DISK_STAGE, STAGE_RELEASE and STAGE_INFO have their own bodies and tests
    // (DiskRead*, DiskStage*): here they stand for an unknown opcode.
    if (h.opcode >= Opcode::kDiskRead && h.opcode <= Opcode::kStageInfo) {
      h.opcode = static_cast<Opcode>(8);
    }
    const bool well_formed =
        h.magic == transfer::kRequestMagic && h.version == transfer::kProtocolVersion &&
        h.reserved == 0 &&
        (h.opcode == Opcode::kRead || h.opcode == Opcode::kWrite || h.opcode == Opcode::kPing) &&
        h.length <= transfer::kMaxRequestBytes;
    ASSERT_TRUE(conn->SendHeader(h)) << "frame " << frame;
    if (!well_formed) {
      ASSERT_TRUE(conn->ClosedByPeer()) << "frame " << frame;
      conn.reset();
      ++closes;
      continue;
    }
    const bool ping = h.opcode == Opcode::kPing;
    ErrorCode expect = ErrorCode::OK;
    if (!ping && h.segment_token != kToken) {
      expect = ErrorCode::SEGMENT_NOT_FOUND;
    } else if (!ping && (h.offset > kSegSize || h.length > kSegSize - h.offset)) {
      expect = ErrorCode::INVALID_PARAMS;
    }
    std::vector<uint8_t> payload;
    if (h.opcode == Opcode::kWrite && expect != ErrorCode::OK && h.length > 0) {
      // Refused at its header: answered at once, then closed; the payload is never read.
      auto rh = conn->RecvResponse();
      ASSERT_TRUE(rh.has_value()) << "frame " << frame;
      ASSERT_EQ(rh->status, static_cast<int32_t>(expect)) << "frame " << frame;
      ASSERT_TRUE(conn->ClosedByPeer()) << "frame " << frame;
      conn.reset();
      ++refusals;
      continue;
    }
    if (h.opcode == Opcode::kWrite) {
      if (h.length > 2 * kSegSize) {  // too much to send: hang up mid-payload instead
        conn.reset();
        continue;
      }
      const uint64_t start = rng() % (random_pool.size() - h.length + 1);
      payload.assign(random_pool.begin() + start, random_pool.begin() + start + h.length);
      ASSERT_TRUE(conn->Send(payload.data(), payload.size()));
    }
    auto rh = conn->RecvResponse();
    ASSERT_TRUE(rh.has_value()) << "frame " << frame;
    ASSERT_EQ(rh->status, static_cast<int32_t>(expect)) << "frame " << frame;
    ASSERT_EQ(rh->request_id, h.request_id);
    if (expect != ErrorCode::OK) {
      ++refusals;
      continue;
    }
    ++accepted;
    ASSERT_EQ(rh->length, h.opcode == Opcode::kRead ? h.length : 0u) << "frame " << frame;
    if (h.length == 0 || h.opcode == Opcode::kPing) continue;
    if (h.opcode == Opcode::kWrite) {
      std::memcpy(shadow.data() + h.offset, payload.data(), payload.size());
    } else {
      std::vector<uint8_t> got(h.length);
      ASSERT_TRUE(conn->Recv(got.data(), got.size()));
      ASSERT_EQ(std::memcmp(got.data(), shadow.data() + h.offset, got.size()), 0);
    }
  }
  EXPECT_GT(closes, 100);
  EXPECT_GT(refusals, 100);
  EXPECT_GT(accepted, 100);
  RawConn clean(server_->port());
  ASSERT_TRUE(clean.SendHeader(Header(Opcode::kRead, 0, kSegSize)));
  auto rh = clean.RecvResponse();
  ASSERT_TRUE(rh.has_value());
  ASSERT_EQ(rh->status, 0);
  std::vector<uint8_t> all(kSegSize);
  ASSERT_TRUE(clean.Recv(all.data(), all.size()));
  EXPECT_EQ(all, shadow);
  EXPECT_EQ(std::memcmp(seg(), shadow.data(), kSegSize), 0);
}

}  // namespace
}  // namespace granary::dataserver_test
