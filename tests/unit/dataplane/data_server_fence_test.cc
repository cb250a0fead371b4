// Tests of node::DataServer's mount fence (data_server.h, "Fencing"): after a remount nothing of
// an earlier mount's requests touches the new memory, however long their peers pause.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <thread>
#include <vector>

#include "data_server_fixture.h"

namespace granary::dataserver_test {
namespace {

// Issue 13: every mount has its own token. After a remount (SetToken), a late write quoting the
// previous mount's token is refused and changes nothing (its connection closes); the new token
// works. Token 0 ("no mount yet") is never accepted.
TEST_F(DataServerTest, RemountRefusesThePreviousMountsToken) {
  StartServer();
  constexpr uint64_t kNewToken = kToken ^ 0xfeedULL;
  ASSERT_TRUE(server_->SetToken(kNewToken).ok());
  EXPECT_EQ(server_->token(), kNewToken);
  std::vector<uint8_t> payload(5000, 0xEE);
  ExpectWriteRefusedAndClosed(Header(Opcode::kWrite, 100, payload.size(), kToken, 3),
                              ErrorCode::SEGMENT_NOT_FOUND, /*others_served=*/false);
  RawConn conn(server_->port());
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kRead, 100, 64, kToken, 4)));
  auto refused_read = conn.RecvResponse();
  ASSERT_TRUE(refused_read.has_value());
  EXPECT_EQ(refused_read->status, static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));

  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kWrite, 100, payload.size(), kNewToken, 5)));
  ASSERT_TRUE(conn.Send(payload.data(), payload.size()));
  auto ok = conn.RecvResponse();
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 0);
  EXPECT_EQ(std::memcmp(seg() + 100, payload.data(), payload.size()), 0);

  ASSERT_TRUE(server_->SetToken(0).ok());
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kRead, 0, 8, 0, 6)));
  auto zero = conn.RecvResponse();
  ASSERT_TRUE(zero.has_value());
  EXPECT_EQ(zero->status, static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
}

// The mount fence (data_server.h): a WRITE accepted under a mount and paused mid-payload across
// a remount (new memory, new token, as a node does) never stores another byte, wherever: its
// rest is drained and it is answered SEGMENT_NOT_FOUND. The remount does not wait for the paused
// writer. The connection stays usable, and serves the new mount's memory.
TEST_F(DataServerTest, WritePausedMidPayloadAcrossARemountStoresNothingMore) {
  StartServer();
  RawConn conn(server_->port());
  std::vector<uint8_t> payload(300000, 0xEE);  // the rest is larger than the drain scratch
  const size_t half = 100000;
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kWrite, 0, payload.size(), kToken, 11)));
  ASSERT_TRUE(conn.Send(payload.data(), half));
  // The server stores the first half as it arrives (recv() straight into the segment). Not
  // memcmp while it is written: glibc's re-reads the mismatching byte and may then answer 0 (CI
  // saw that); each byte read once says whether it landed.
  auto landed = [&] {
    return std::all_of(seg(), seg() + half, [](uint8_t b) { return b == 0xEE; });
  };
  const auto deadline = Clock::now() + std::chrono::seconds(5);
  while (!landed() && Clock::now() < deadline) {
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  ASSERT_TRUE(landed()) << "the first half never landed";

  constexpr uint64_t kNewToken = kToken ^ 0xbeefULL;
  second_mount_.assign(kSegSize, 0);
  const auto remount = Clock::now();
  Status fenced = server_->SetMount(second_mount_.data(), kNewToken);
  ASSERT_TRUE(fenced.ok()) << fenced.ToString();
  EXPECT_LT(SecondsSince(remount), 1.0) << "the remount waited for a paused peer";
  // The new mount's space is handed out and written; so is the old memory, as if reused.
  std::memset(second_mount_.data(), 0x11, kSegSize);
  std::memset(seg(), 0x22, kSegSize);

  ASSERT_TRUE(conn.Send(payload.data() + half, payload.size() - half));  // the writer resumes
  auto answer = conn.RecvResponse();
  ASSERT_TRUE(answer.has_value()) << "the connection should stay usable";
  EXPECT_EQ(answer->status, static_cast<int32_t>(ErrorCode::SEGMENT_NOT_FOUND));
  EXPECT_EQ(answer->request_id, 11u);
  EXPECT_EQ(std::count(second_mount_.begin(), second_mount_.end(), 0x11), int64_t{kSegSize})
      << "the paused write reached the new mount's memory";
  EXPECT_EQ(std::count(seg(), seg() + kSegSize, 0x22), int64_t{kSegSize})
      << "the paused write kept storing into the old mount's memory";
  EXPECT_EQ(server_->stats().fenced, 1u);

  // The same connection, the new token: it lands in the new memory.
  std::vector<uint8_t> next(4096, 0x33);
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kWrite, 8192, next.size(), kNewToken, 12)));
  ASSERT_TRUE(conn.Send(next.data(), next.size()));
  auto ok = conn.RecvResponse();
  ASSERT_TRUE(ok.has_value());
  EXPECT_EQ(ok->status, 0);
  EXPECT_EQ(std::memcmp(second_mount_.data() + 8192, next.data(), next.size()), 0);
  server_->Stop();  // before second_mount_ goes
}

// The read side of the fence: a READ whose answer a stalled peer does not take (its socket
// buffers full) does not hold a remount up; once the peer reads again it gets what was sent
// before the remount and then the connection closes, never a byte sent after it.
TEST_F(DataServerTest, ReadStalledMidAnswerAcrossARemountIsCutOff) {
  constexpr uint64_t kBig = 64 * kSegSize;  // far more than loopback's socket buffers hold
  std::vector<uint8_t> first(kBig);
  for (uint64_t i = 0; i < kBig; ++i) first[i] = static_cast<uint8_t>(i * 13 + 1);
  std::vector<uint8_t> second(kBig, 0x44);
  DataServer big(first.data(), kBig, kToken);
  ASSERT_TRUE(big.Start().ok());
  RawConn conn(big.port());
  ASSERT_TRUE(conn.SendHeader(Header(Opcode::kRead, 0, kBig, kToken, 21)));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));  // the server fills the buffers

  const auto remount = Clock::now();
  Status fenced = big.SetMount(second.data(), kToken + 2);
  ASSERT_TRUE(fenced.ok()) << fenced.ToString();
  EXPECT_LT(SecondsSince(remount), 1.0) << "the remount waited for a stalled reader";
  std::memset(first.data(), 0x55, kBig);  // the old memory, reused (or punched) after the fence

  auto rh = conn.RecvResponse();
  ASSERT_TRUE(rh.has_value());
  EXPECT_EQ(rh->status, 0);
  ASSERT_EQ(rh->length, kBig);
  std::vector<uint8_t> got(kBig);
  uint64_t received = 0;
  while (received < kBig) {
    ssize_t r = recv(conn.fd(), got.data() + received, kBig - received, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    received += static_cast<uint64_t>(r);
  }
  EXPECT_LT(received, kBig) << "the whole answer came, partly sent after the remount";
  for (uint64_t i = 0; i < received; ++i) {
    ASSERT_EQ(got[i], static_cast<uint8_t>(i * 13 + 1)) << "byte " << i << " was sent after "
                                                           "the remount";
  }
  EXPECT_EQ(big.stats().fenced, 1u);
  big.Stop();
}

}  // namespace
}  // namespace granary::dataserver_test
