// Tests of data-plane capabilities (security/capability.h, transfer/protocol.h CAP_READ and
// CAP_WRITE): the signing itself, the node's DataServer checking them through real sockets
// (hostile ones spoken by hand), and TcpTransport carrying them. The segment sits between guard
// bytes (guarded_segment.h) checked after every test: a refused capability never moves a byte.
#include "security/capability.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "guarded_segment.h"
#include "node/data_server.h"
#include "raw_conn.h"
#include "transfer/protocol.h"
#include "transfer/tcp_transport.h"

namespace granary {
namespace {

using node::DataServer;
using security::CapabilityAccess;
using security::CapabilityGrant;
using testing::RawConn;
using transfer::Opcode;
using transfer::RequestHeader;

constexpr uint64_t kSegSize = 1 << 20;
constexpr uint64_t kToken = 0x0badc0ffee0ddf00ULL | 1;

int64_t NowUnixMs() {
  return std::chrono::duration_cast<std::chrono::milliseconds>(
             std::chrono::system_clock::now().time_since_epoch())
      .count();
}

transfer::Capability Wire(const std::string& key, const CapabilityGrant& grant) {
  transfer::Capability cap;
  cap.grant_offset = grant.offset;
  cap.grant_length = grant.length;
  cap.expiry_unix_ms = grant.expiry_unix_ms;
  cap.access = static_cast<uint32_t>(grant.access);
  const security::CapabilityMac mac = security::SignCapability(key, grant);
  std::memcpy(cap.mac, mac.data(), mac.size());
  return cap;
}

RequestHeader CapHeader(Opcode op, uint64_t offset, uint64_t length, uint64_t id = 7) {
  RequestHeader h;
  h.opcode = op;
  h.request_id = id;
  h.segment_token = 0;
  h.offset = offset;
  h.length = length;
  return h;
}

// ---- the signature ----

TEST(CapabilitySignatureTest, EveryFieldAndTheKeyAreCovered) {
  const std::string key = security::NewCapabilityKey();
  ASSERT_EQ(key.size(), security::kCapabilityKeyBytes);
  EXPECT_NE(key, security::NewCapabilityKey()) << "two mounts drew the same key";
  const CapabilityGrant grant{4096, 65536, 1'900'000'000'000, CapabilityAccess::kRead};
  const security::CapabilityMac mac = security::SignCapability(key, grant);
  EXPECT_TRUE(security::VerifyCapability(key, grant, mac.data()));

  // Any widened, moved, extended or turned grant fails under the same MAC.
  std::vector<CapabilityGrant> altered(5, grant);
  altered[0].offset -= 4096;
  altered[1].length += 1;
  altered[2].expiry_unix_ms += 1;
  altered[3].access = CapabilityAccess::kWrite;
  altered[4].offset += 1;
  for (const CapabilityGrant& g : altered) {
    EXPECT_FALSE(security::VerifyCapability(key, g, mac.data()));
  }
  // Another mount's key, an empty key, a flipped MAC bit: refused.
  EXPECT_FALSE(security::VerifyCapability(security::NewCapabilityKey(), grant, mac.data()));
  EXPECT_FALSE(security::VerifyCapability("", grant, security::SignCapability("", grant).data()));
  for (size_t bit = 0; bit < mac.size() * 8; bit += 13) {
    security::CapabilityMac flipped = mac;
    flipped[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
    EXPECT_FALSE(security::VerifyCapability(key, grant, flipped.data())) << "bit " << bit;
  }
}

// The signer (pads absorbed once) is HMAC-SHA256 as the one-shot functions compute it, for a
// mount's 32-byte keys and for keys of any length (RFC 2104 hashes one longer than a block),
// from several threads at once.
TEST(CapabilitySignatureTest, TheSignerAgreesWithTheOneShotHmac) {
  std::vector<std::string> keys = {security::NewCapabilityKey(), std::string(1, 'k'),
                                   std::string(64, 'x'), std::string(65, 'y'),
                                   std::string(200, 'z')};
  for (const std::string& key : keys) {
    const security::CapabilitySigner signer(key);
    std::vector<std::thread> threads;
    std::atomic<int> mismatches{0};
    for (int t = 0; t < 4; ++t) {
      threads.emplace_back([&, t] {
        for (uint64_t i = 0; i < 200; ++i) {
          const CapabilityGrant g{i * 4096 + t, i + 1, static_cast<int64_t>(i * 7),
                                  i % 2 ? CapabilityAccess::kRead : CapabilityAccess::kWrite};
          const security::CapabilityMac mac = signer.Sign(g);
          if (mac != security::SignCapability(key, g)) mismatches++;
          if (!signer.Verify(g, mac.data()) || !security::VerifyCapability(key, g, mac.data())) {
            mismatches++;
          }
        }
      });
    }
    for (auto& th : threads) th.join();
    EXPECT_EQ(mismatches.load(), 0) << "key of " << key.size() << " bytes";
  }
  const security::CapabilitySigner empty("");
  const CapabilityGrant g{0, 1, 0, CapabilityAccess::kRead};
  EXPECT_FALSE(empty.Verify(g, empty.Sign(g).data()));
}

TEST(CapabilitySignatureTest, CoversOnlyRangesInsideTheGrantWithoutOverflow) {
  const CapabilityGrant grant{1000, 500, 0, CapabilityAccess::kRead};
  EXPECT_TRUE(security::CapabilityCovers(grant, 1000, 500));
  EXPECT_TRUE(security::CapabilityCovers(grant, 1200, 300));
  EXPECT_TRUE(security::CapabilityCovers(grant, 1500, 0));
  EXPECT_FALSE(security::CapabilityCovers(grant, 999, 10));
  EXPECT_FALSE(security::CapabilityCovers(grant, 1200, 301));
  EXPECT_FALSE(security::CapabilityCovers(grant, 1501, 0));
  EXPECT_FALSE(security::CapabilityCovers(grant, 1001, UINT64_MAX));
  EXPECT_FALSE(security::CapabilityCovers(grant, UINT64_MAX, 2));
  const CapabilityGrant top{UINT64_MAX - 10, 10, 0, CapabilityAccess::kRead};
  EXPECT_TRUE(security::CapabilityCovers(top, UINT64_MAX - 5, 5));
  EXPECT_FALSE(security::CapabilityCovers(top, UINT64_MAX - 5, 6));
}

// ---- the node ----

class CapabilityServerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    key_ = security::NewCapabilityKey();
    DataServer::Options options;
    options.idle_timeout_ms = 3000;
    server_ = std::make_unique<DataServer>(seg(), kSegSize, 0, options);
    ASSERT_TRUE(server_->Start().ok());
    ASSERT_TRUE(server_->SetMount(seg(), kToken, key_).ok());
  }
  void TearDown() override {
    if (server_) server_->Stop();
    segment_.AssertGuardsIntact();
  }
  uint8_t* seg() { return segment_.data(); }

  CapabilityGrant Grant(uint64_t offset, uint64_t length, CapabilityAccess access,
                        int64_t ttl_ms = 60'000) {
    return {offset, length, NowUnixMs() + ttl_ms, access};
  }

  // Sends a CAP_* request (and a write's payload) and returns the answer's status; a read's
  // bytes land in *got. nullopt when the connection closed without an answer.
  std::optional<int32_t> Send(RawConn& conn, const RequestHeader& h,
                              const transfer::Capability& cap,
                              const std::vector<uint8_t>& payload = {},
                              std::vector<uint8_t>* got = nullptr) {
    if (!conn.SendHeader(h) || !conn.Send(&cap, sizeof(cap))) return std::nullopt;
    if (!payload.empty()) (void)conn.Send(payload.data(), payload.size());  // may race a close
    auto rh = conn.RecvResponse();
    if (!rh) return std::nullopt;
    if (rh->status == 0 && rh->length > 0) {
      std::vector<uint8_t> bytes(rh->length);
      if (!conn.Recv(bytes.data(), bytes.size())) return std::nullopt;
      if (got) *got = std::move(bytes);
    }
    return rh->status;
  }

  testing::GuardedSegment segment_{kSegSize, 11, 5};
  std::string key_;
  std::unique_ptr<DataServer> server_;
};

TEST_F(CapabilityServerTest, AGrantReadsAndWritesItsRangeOnly) {
  RawConn conn(server_->port());
  ASSERT_TRUE(conn.connected());
  const auto read = Wire(key_, Grant(8192, 4096, CapabilityAccess::kRead));
  std::vector<uint8_t> got;
  ASSERT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 8192, 4096), read, {}, &got), 0);
  ASSERT_EQ(got.size(), 4096u);
  EXPECT_EQ(std::memcmp(got.data(), seg() + 8192, 4096), 0);
  // A part of the grant, as a striped or split transfer asks.
  ASSERT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 9000, 100), read, {}, &got), 0);
  EXPECT_EQ(std::memcmp(got.data(), seg() + 9000, 100), 0);

  std::vector<uint8_t> before(seg(), seg() + kSegSize);
  // Outside the grant, one byte before or after, or the whole segment: refused, connection kept.
  for (const auto& [offset, length] : std::vector<std::pair<uint64_t, uint64_t>>{
           {8191, 1}, {8192 + 4096, 1}, {8192, 4097}, {0, kSegSize}, {12000, 4096}}) {
    EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, offset, length), read),
              static_cast<int32_t>(ErrorCode::PERMISSION_DENIED))
        << offset << " +" << length;
  }
  // A read grant does not write.
  std::vector<uint8_t> payload(4096, 0xEE);
  RawConn writer(server_->port());
  EXPECT_EQ(Send(writer, CapHeader(Opcode::kCapWrite, 8192, 4096), read, payload),
            static_cast<int32_t>(ErrorCode::PERMISSION_DENIED));
  EXPECT_TRUE(writer.ClosedByPeer()) << "a refused write's connection must close";
  EXPECT_EQ(std::memcmp(before.data(), seg(), kSegSize), 0) << "a refused capability moved bytes";

  // A write grant writes its range, and only it.
  const auto write = Wire(key_, Grant(65536, 4096, CapabilityAccess::kWrite));
  RawConn w(server_->port());
  ASSERT_EQ(Send(w, CapHeader(Opcode::kCapWrite, 65536, 4096), write, payload), 0);
  EXPECT_EQ(std::memcmp(seg() + 65536, payload.data(), payload.size()), 0);
  std::vector<uint8_t> after_write(seg(), seg() + kSegSize);
  RawConn w2(server_->port());
  EXPECT_EQ(Send(w2, CapHeader(Opcode::kCapWrite, 65536 + 1, 4096), write, payload),
            static_cast<int32_t>(ErrorCode::PERMISSION_DENIED));
  RawConn w3(server_->port());
  EXPECT_EQ(Send(w3, CapHeader(Opcode::kCapRead, 65536, 4096), write),
            static_cast<int32_t>(ErrorCode::PERMISSION_DENIED))
      << "a write grant read";
  EXPECT_EQ(std::memcmp(after_write.data(), seg(), kSegSize), 0);
  EXPECT_GE(server_->stats().capability_refusals, 8u);
}

TEST_F(CapabilityServerTest, ForgedExpiredOrEarlierMountsCapabilitiesAreRefused) {
  RawConn conn(server_->port());
  std::vector<uint8_t> before(seg(), seg() + kSegSize);
  // Signed under another key (a guess), widened after signing, or with a flipped MAC.
  const CapabilityGrant grant = Grant(0, 4096, CapabilityAccess::kRead);
  EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096),
                 Wire(security::NewCapabilityKey(), grant)),
            static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  transfer::Capability widened = Wire(key_, grant);
  widened.grant_length = kSegSize;
  EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, kSegSize), widened),
            static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  transfer::Capability flipped = Wire(key_, grant);
  flipped.mac[5] ^= 0x10;
  EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096), flipped),
            static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  // Expired a moment ago.
  EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096),
                 Wire(key_, Grant(0, 4096, CapabilityAccess::kRead, -1))),
            static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  // A genuine one works on the same connection (refusals keep a READ's connection in sync).
  std::vector<uint8_t> got;
  ASSERT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096), Wire(key_, grant), {}, &got), 0);

  // A remount draws a new key: the earlier mount's capabilities, read and write, are refused.
  const auto old_read = Wire(key_, grant);
  const auto old_write = Wire(key_, Grant(0, 4096, CapabilityAccess::kWrite));
  const std::string new_key = security::NewCapabilityKey();
  ASSERT_TRUE(server_->SetMount(seg(), kToken + 2, new_key).ok());
  EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096), old_read),
            static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  RawConn writer(server_->port());
  EXPECT_EQ(Send(writer, CapHeader(Opcode::kCapWrite, 0, 4096), old_write,
                 std::vector<uint8_t>(4096, 0xEE)),
            static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  EXPECT_EQ(std::memcmp(before.data(), seg(), kSegSize), 0) << "a refused capability moved bytes";
  ASSERT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096), Wire(new_key, grant), {}, &got), 0);
  // A mount without a key (a node's SetMount(base, token)) accepts no capability at all.
  ASSERT_TRUE(server_->SetMount(seg(), kToken + 4).ok());
  EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096), Wire("", grant)),
            static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
}

TEST_F(CapabilityServerTest, ACapabilityBesideATokenOrWithReservedBitsIsMalformed) {
  const auto cap = Wire(key_, Grant(0, 4096, CapabilityAccess::kRead));
  {
    // A token beside a capability: closed at the header, before the capability is waited for.
    RawConn conn(server_->port());
    RequestHeader h = CapHeader(Opcode::kCapRead, 0, 4096);
    h.segment_token = kToken;
    ASSERT_TRUE(conn.SendHeader(h));
    EXPECT_TRUE(conn.ClosedByPeer());
  }
  {
    RawConn conn(server_->port());
    transfer::Capability reserved = cap;
    reserved.reserved = 1;
    EXPECT_EQ(Send(conn, CapHeader(Opcode::kCapRead, 0, 4096), reserved),
              static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  }
  {
    // The capability trickling in byte by byte is read whole.
    RawConn conn(server_->port());
    ASSERT_TRUE(conn.SendHeader(CapHeader(Opcode::kCapRead, 0, 64)));
    const auto* bytes = reinterpret_cast<const uint8_t*>(&cap);
    for (size_t i = 0; i < sizeof(cap); ++i) ASSERT_TRUE(conn.Send(bytes + i, 1));
    auto rh = conn.RecvResponse();
    ASSERT_TRUE(rh.has_value());
    EXPECT_EQ(rh->status, 0);
    std::vector<uint8_t> got(64);
    ASSERT_TRUE(conn.Recv(got.data(), got.size()));
    EXPECT_EQ(std::memcmp(got.data(), seg(), 64), 0);
  }
}

// A node with a secret requires capabilities: a segment's token, even the current mount's,
// reads and writes nothing; capabilities work as before.
TEST(CapabilityRequiredTest, ATokenAloneOpensNothing) {
  std::vector<uint8_t> seg(kSegSize, 0x42);
  DataServer::Options options;
  options.require_capabilities = true;
  DataServer server(seg.data(), kSegSize, 0, options);
  ASSERT_TRUE(server.Start().ok());
  const std::string key = security::NewCapabilityKey();
  ASSERT_TRUE(server.SetMount(seg.data(), kToken, key).ok());
  RawConn conn(server.port());
  ASSERT_TRUE(conn.connected());
  RequestHeader read = CapHeader(Opcode::kRead, 0, 64);
  read.segment_token = kToken;
  ASSERT_TRUE(conn.SendHeader(read));
  auto refused = conn.RecvResponse();
  ASSERT_TRUE(refused.has_value());
  EXPECT_EQ(refused->status, static_cast<int32_t>(ErrorCode::PERMISSION_DENIED));
  EXPECT_EQ(refused->length, 0u);
  // A WRITE is answered at its header and its connection closed; nothing lands.
  RawConn writer(server.port());
  RequestHeader write = CapHeader(Opcode::kWrite, 0, 4096);
  write.segment_token = kToken;
  ASSERT_TRUE(writer.SendHeader(write));
  auto refused_write = writer.RecvResponse();
  ASSERT_TRUE(refused_write.has_value());
  EXPECT_EQ(refused_write->status, static_cast<int32_t>(ErrorCode::PERMISSION_DENIED));
  EXPECT_TRUE(writer.ClosedByPeer());
  EXPECT_EQ(std::count(seg.begin(), seg.end(), 0x42), static_cast<long>(kSegSize));
  // The same connection still serves a capability.
  const CapabilityGrant grant{0, 64, NowUnixMs() + 60'000, CapabilityAccess::kRead};
  const transfer::Capability cap = Wire(key, grant);
  ASSERT_TRUE(conn.SendHeader(CapHeader(Opcode::kCapRead, 0, 64)));
  ASSERT_TRUE(conn.Send(&cap, sizeof(cap)));
  auto ok = conn.RecvResponse();
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 0);
  EXPECT_EQ(ok->length, 64u);
  EXPECT_EQ(server.stats().capability_refusals, 2u);
  server.Stop();
}

TEST_F(CapabilityServerTest, TheTransportCarriesACapabilityThroughStripedAndSplitRequests) {
  transfer::TcpTransportOptions options;
  options.stripe_threshold = 64 * 1024;
  options.stripe_chunk = 16 * 1024;
  transfer::TcpTransport transport(options);
  const std::string endpoint = "127.0.0.1:" + std::to_string(server_->port());
  std::vector<std::byte> src(256 * 1024);
  for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<std::byte>(i * 13 + 1);
  transfer::RemoteRange range{endpoint, 0, 4096, src.size(),
                              Wire(key_, Grant(4096, src.size(), CapabilityAccess::kWrite))};
  ASSERT_TRUE(transport.Write(range, src).ok());
  EXPECT_EQ(std::memcmp(seg() + 4096, src.data(), src.size()), 0);

  range.capability = Wire(key_, Grant(4096, src.size(), CapabilityAccess::kRead));
  std::vector<std::byte> dst(src.size());
  ASSERT_TRUE(transport.Read(range, dst).ok());
  EXPECT_EQ(dst, src);

  // Past its grant by one byte: the node's refusal surfaces as it is.
  range.length += 1;
  std::vector<std::byte> more(range.length);
  EXPECT_EQ(transport.Read(range, more).code(), ErrorCode::PERMISSION_DENIED);
  range.length -= 1;
  range.capability->expiry_unix_ms += 1;  // the MAC no longer matches
  EXPECT_EQ(transport.Read(range, dst).code(), ErrorCode::SEGMENT_NOT_FOUND);
}

}  // namespace
}  // namespace granary
