// master/ha/stream_wire.h against its promises: lineages (TermOf, IsPrefix's truth table),
// kOps bodies split or refused when torn, records that round-trip and refuse another kind,
// truncation or trailing bytes, and frames read back over a socket, bounded by their deadline
// and by max_body, with a refusal coming back as its coded Status.
#include "common/byte_stream.h"
#include "master/ha/stream_wire.h"

#include <gtest/gtest.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "proto/fast_frame.h"

namespace granary::master::ha {
namespace {

// A test's socket as the stream code takes it (not owned; a plain stream keeps no state).
struct Plain {
  explicit Plain(int fd) : stream(fd, /*owns_fd=*/false) {}
  operator net::ByteStream&() { return stream; }
  net::ByteStream stream;
};

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

// ---- lineages ----

TEST(HaStreamWire, TermOfNamesTheEntryHoldingTheSeq) {
  const Lineage l{{1, 1}, {4, 10}, {9, 25}};
  EXPECT_EQ(TermOf(l, 0), 0u);
  EXPECT_EQ(TermOf(l, 1), 1u);
  EXPECT_EQ(TermOf(l, 9), 1u);
  EXPECT_EQ(TermOf(l, 10), 4u);
  EXPECT_EQ(TermOf(l, 24), 4u);
  EXPECT_EQ(TermOf(l, 25), 9u);
  EXPECT_EQ(TermOf(l, 1'000'000), 9u);
  EXPECT_EQ(TermOf({}, 5), 0u);
  EXPECT_EQ(TermOf({{3, 7}}, 6), 0u) << "before the first entry: no term";
}

TEST(HaStreamWire, IsPrefixTruthTable) {
  const Lineage ours{{1, 1}, {2, 10}, {5, 30}};
  struct Case {
    Lineage theirs;
    uint64_t last_seq;
    bool expected;
    const char* why;
  };
  const Case cases[] = {
      {{}, 0, true, "an empty history is a prefix of any"},
      {{{7, 1}}, 0, true, "an empty history, whatever its lineage says"},
      {{{1, 1}}, 1, true, "the first operation of a shared term"},
      {{{1, 1}}, 9, true, "the last operation of term 1 in ours"},
      {{{1, 1}}, 10, false, "term 1 in ours ends at 9: their 10 is not ours"},
      {{{1, 1}}, 100, false, "far beyond the end of term 1 in ours"},
      {{{1, 1}, {2, 10}}, 15, true, "within term 2"},
      {{{1, 1}, {2, 10}}, 29, true, "the last of term 2"},
      {{{1, 1}, {2, 10}}, 30, false, "term 2 in ours ends at 29"},
      {{{1, 1}, {2, 10}, {5, 30}}, 30, true, "our own term, first operation"},
      {{{1, 1}, {2, 10}, {5, 30}}, 5000, true, "our own term runs on (the log decides)"},
      {{{1, 1}, {3, 10}}, 12, false, "term 3 is unknown to us"},
      {{{1, 1}, {3, 10}}, 9, true, "their unknown term starts after their last operation"},
      {{{1, 1}, {2, 8}}, 12, false, "term 2 started at another seq there: another history"},
      {{{2, 10}}, 12, true, "only the entry holding last_seq matters"},
      {{}, 5, false, "operations but no lineage: no known history"},
      {{{0, 1}}, 5, false, "term 0 is no term"},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(IsPrefix(c.theirs, c.last_seq, ours), c.expected) << c.why;
  }
  EXPECT_FALSE(IsPrefix({{1, 1}}, 3, {})) << "our empty lineage holds nothing";
  EXPECT_TRUE(IsPrefix({{1, 1}}, 0, {}));
}

// ---- kOps bodies ----

std::string Record(std::string_view bytes) {
  const uint32_t len = static_cast<uint32_t>(bytes.size());
  std::string out(4, '\0');
  std::memcpy(out.data(), &len, 4);
  out.append(bytes);
  return out;
}

TEST(HaStreamWire, SplitOpsGivesTheRecordsBack) {
  auto none = SplitOps("");
  ASSERT_TRUE(none.ok());
  EXPECT_TRUE(none->empty());
  const std::string body = Record("first") + Record("") + Record(std::string(300, 'z'));
  auto ops = SplitOps(body);
  ASSERT_TRUE(ops.ok()) << ops.status().ToString();
  ASSERT_EQ(ops->size(), 3u);
  EXPECT_EQ((*ops)[0], "first");
  EXPECT_EQ((*ops)[1], "");
  EXPECT_EQ((*ops)[2], std::string(300, 'z'));
}

TEST(HaStreamWire, SplitOpsRefusesTornRecords) {
  const std::string good = Record("abc") + Record("defgh");
  // Every cut inside the body but at a record boundary is torn.
  for (size_t cut = 1; cut < good.size(); ++cut) {
    if (cut == Record("abc").size()) continue;
    auto r = SplitOps(std::string_view(good).substr(0, cut));
    EXPECT_FALSE(r.ok()) << "cut at " << cut;
    if (!r.ok()) {
      EXPECT_EQ(r.code(), ErrorCode::RPC_FAIL);
    }
  }
  std::string huge(4, '\xff');  // a length of 4 GiB - 1 over 4 bytes of body
  huge += "abcd";
  EXPECT_FALSE(SplitOps(huge).ok());
  EXPECT_FALSE(SplitOps(good + "\x01").ok()) << "trailing bytes are a torn record";
}

// ---- records ----

TEST(HaStreamWire, RecordsRoundTrip) {
  Hello hello{"standby-1", "10.0.0.2:50051", 1234, {{1, 1}, {7, 99}}};
  Hello h2;
  ASSERT_TRUE(Decode(Encode(FrameKind::kHello, hello), FrameKind::kHello, &h2));
  EXPECT_EQ(h2.standby_id, hello.standby_id);
  EXPECT_EQ(h2.advertise, hello.advertise);
  EXPECT_EQ(h2.last_seq, 1234u);
  ASSERT_EQ(h2.lineage.size(), 2u);
  EXPECT_EQ(h2.lineage[1].term, 7u);
  EXPECT_EQ(h2.lineage[1].first_seq, 99u);

  Welcome welcome{42, {{42, 1}}, true, 77};
  Welcome w2;
  ASSERT_TRUE(Decode(Encode(FrameKind::kWelcome, welcome), FrameKind::kWelcome, &w2));
  EXPECT_EQ(w2.term, 42u);
  EXPECT_TRUE(w2.snapshot);
  EXPECT_EQ(w2.next_seq, 77u);
  ASSERT_EQ(w2.lineage.size(), 1u);
  EXPECT_EQ(w2.lineage[0].term, 42u);

  SnapshotChunk chunk{1 << 20, 4096, std::string("\0\1\2bytes", 8)};
  SnapshotChunk c2;
  ASSERT_TRUE(Decode(Encode(FrameKind::kSnapshotChunk, chunk), FrameKind::kSnapshotChunk, &c2));
  EXPECT_EQ(c2.total, uint64_t{1} << 20);
  EXPECT_EQ(c2.offset, 4096u);
  EXPECT_EQ(c2.bytes, chunk.bytes);

  Beat beat{UINT64_MAX, UINT64_MAX - 1};
  Beat b2;
  ASSERT_TRUE(Decode(Encode(FrameKind::kBeat, beat), FrameKind::kBeat, &b2));
  EXPECT_EQ(b2.term, UINT64_MAX);
  EXPECT_EQ(b2.last_seq, UINT64_MAX - 1);

  Ack ack{555};
  Ack a2;
  const std::string body = Encode(FrameKind::kAck, ack);
  EXPECT_EQ(KindOf(body), FrameKind::kAck);
  ASSERT_TRUE(Decode(body, FrameKind::kAck, &a2));
  EXPECT_EQ(a2.last_seq, 555u);
  EXPECT_EQ(KindOf(""), FrameKind{0});
}

TEST(HaStreamWire, DecodeRefusesAnotherKindTruncationAndTrailingBytes) {
  const std::string hello =
      Encode(FrameKind::kHello, Hello{"standby", "host:1", 9, {{1, 1}, {2, 5}}});
  Hello h;
  Welcome w;
  Ack a;
  EXPECT_FALSE(Decode(hello, FrameKind::kWelcome, &w)) << "another kind";
  EXPECT_FALSE(Decode(hello, FrameKind::kAck, &a));
  EXPECT_FALSE(Decode("", FrameKind::kHello, &h));
  for (size_t cut = 0; cut < hello.size(); ++cut) {
    EXPECT_FALSE(Decode(std::string_view(hello).substr(0, cut), FrameKind::kHello, &h)) << cut;
  }
  EXPECT_FALSE(Decode(hello + "x", FrameKind::kHello, &h)) << "trailing bytes";
  const std::string ack = Encode(FrameKind::kAck, Ack{1});
  EXPECT_FALSE(Decode(ack + ack, FrameKind::kAck, &a));
  // A hostile count of lineage entries allocates nothing beyond what the body could hold.
  std::string hostile;
  hostile.push_back(static_cast<char>(FrameKind::kHello));
  hostile += std::string("\x01s\x01h\x05", 5);
  hostile += std::string("\xff\xff\xff\xff\xff\xff\xff\xff\x7f", 9);  // 2^63-ish entries
  EXPECT_FALSE(Decode(hostile, FrameKind::kHello, &h));
}

// ---- frames over a socket ----

class HaStreamWireSocket : public ::testing::Test {
 protected:
  void SetUp() override { ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, fds_), 0); }
  void TearDown() override {
    for (int fd : fds_) {
      if (fd >= 0) ::close(fd);
    }
  }
  int fds_[2] = {-1, -1};
};

TEST_F(HaStreamWireSocket, FramesRoundTrip) {
  const std::string body = Encode(FrameKind::kBeat, Beat{3, 4});
  ASSERT_TRUE(SendFrame(Plain(fds_[0]), body, Clock::now() + 1s).ok());
  ASSERT_TRUE(SendFrame(Plain(fds_[0]), body, Clock::now() + 1s, /*request=*/true).ok());
  for (int i = 0; i < 2; ++i) {
    Result<std::string> got = ReadFrame(Plain(fds_[1]), 1024, Clock::now() + 1s);
    ASSERT_TRUE(got.ok()) << got.status().ToString();
    EXPECT_EQ(*got, body);
  }
  // The header says what the fast port needs: kReplicate, a reply unless it is the request.
  const std::string request = Frame(body, true), reply = Frame(body);
  fast::Header h;
  ASSERT_EQ(fast::DecodeHeader(reinterpret_cast<const unsigned char*>(request.data()), &h),
            fast::HeaderError::kNone);
  EXPECT_EQ(h.method, static_cast<uint8_t>(fast::Method::kReplicate));
  EXPECT_EQ(h.flags & fast::kReply, 0);
  EXPECT_EQ(h.body_size, body.size());
  ASSERT_EQ(fast::DecodeHeader(reinterpret_cast<const unsigned char*>(reply.data()), &h),
            fast::HeaderError::kNone);
  EXPECT_NE(h.flags & fast::kReply, 0);
}

TEST_F(HaStreamWireSocket, ARefusalComesBackAsItsCode) {
  ASSERT_TRUE(net::SendAll(fds_[0], ErrorFrame("granary:-1011:not the leader"),
                           Clock::now() + 1s)
                  .ok());
  Result<std::string> got = ReadFrame(Plain(fds_[1]), 1024, Clock::now() + 1s);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_MODE);
  EXPECT_NE(got.status().message().find("not the leader"), std::string::npos);
  // An uncoded refusal is still an error, not a body.
  ASSERT_TRUE(net::SendAll(fds_[0], ErrorFrame("go away"), Clock::now() + 1s).ok());
  got = ReadFrame(Plain(fds_[1]), 1024, Clock::now() + 1s);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.code(), ErrorCode::RPC_FAIL);
}

TEST_F(HaStreamWireSocket, ReadFrameIsBoundedByItsDeadline) {
  auto start = Clock::now();
  Result<std::string> got = ReadFrame(Plain(fds_[1]), 1024, start + 80ms);
  auto took = Clock::now() - start;
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.code(), ErrorCode::RPC_TIMEOUT);
  EXPECT_GE(took, 75ms);
  EXPECT_LT(took, 1s);
  // A closed peer: at once, RPC_FAIL.
  ::close(fds_[0]);
  fds_[0] = -1;
  start = Clock::now();
  got = ReadFrame(Plain(fds_[1]), 1024, start + 5s);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.code(), ErrorCode::RPC_FAIL);
  EXPECT_LT(Clock::now() - start, 1s);
}

// The rest of a frame that started may come after the idle deadline (up to 5 s after its first
// byte): a slow frame is not cut at the idle deadline.
TEST_F(HaStreamWireSocket, AStartedFrameMayFinishAfterTheIdleDeadline) {
  const std::string frame = Frame(Encode(FrameKind::kAck, Ack{9}));
  ASSERT_TRUE(net::SendAll(fds_[0], frame.substr(0, 1), Clock::now() + 1s).ok());
  std::thread late([&] {
    std::this_thread::sleep_for(150ms);
    (void)net::SendAll(fds_[0], frame.substr(1), Clock::now() + 1s);
  });
  Result<std::string> got = ReadFrame(Plain(fds_[1]), 1024, Clock::now() + 30ms);
  late.join();
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  Ack ack;
  ASSERT_TRUE(Decode(*got, FrameKind::kAck, &ack));
  EXPECT_EQ(ack.last_seq, 9u);
}

TEST_F(HaStreamWireSocket, ReadFrameRefusesOversizedAndForeignFrames) {
  // A body over max_body is refused from its header, before any of it is read or allocated.
  unsigned char header[fast::kHeaderSize];
  fast::EncodeHeader({static_cast<uint8_t>(fast::Method::kReplicate), fast::kReply, 0, 1u << 30},
                     header);
  ASSERT_TRUE(net::SendAll(fds_[0], std::string_view(reinterpret_cast<char*>(header), 16),
                           Clock::now() + 1s)
                  .ok());
  auto start = Clock::now();
  Result<std::string> got = ReadFrame(Plain(fds_[1]), 64, start + 2s);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.code(), ErrorCode::RPC_FAIL);
  EXPECT_LT(Clock::now() - start, 1s) << "refused from the header, no waiting for the body";

  // Another method's frame on the stream is malformed.
  fast::EncodeHeader({static_cast<uint8_t>(fast::Method::kPing), fast::kReply, 0, 0}, header);
  ASSERT_TRUE(net::SendAll(fds_[0], std::string_view(reinterpret_cast<char*>(header), 16),
                           Clock::now() + 1s)
                  .ok());
  got = ReadFrame(Plain(fds_[1]), 64, Clock::now() + 1s);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.code(), ErrorCode::RPC_FAIL);

  // Garbage magic.
  ASSERT_TRUE(net::SendAll(fds_[0], std::string(16, 'G'), Clock::now() + 1s).ok());
  got = ReadFrame(Plain(fds_[1]), 64, Clock::now() + 1s);
  ASSERT_FALSE(got.ok());
}

}  // namespace
}  // namespace granary::master::ha
