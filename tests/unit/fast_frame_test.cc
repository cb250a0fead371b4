// The fast port's frame header: encoding and decoding are inverses, and a header that is not
// ours or asks for more than the cap is refused before any body is read.
#include "proto/fast_frame.h"

#include <gtest/gtest.h>

namespace granary::fast {
namespace {

TEST(FastFrameTest, HeaderRoundTrips) {
  unsigned char buf[kHeaderSize];
  EncodeHeader({static_cast<uint8_t>(Method::kGetReplicaList), kReply | kError, 0xDEADBEEF,
                kMaxFastBody},
               buf);
  Header h;
  ASSERT_EQ(DecodeHeader(buf, &h), HeaderError::kNone);
  EXPECT_EQ(h.method, static_cast<uint8_t>(Method::kGetReplicaList));
  EXPECT_EQ(h.flags, kReply | kError);
  EXPECT_EQ(h.request_id, 0xDEADBEEFu);
  EXPECT_EQ(h.body_size, kMaxFastBody);
  EXPECT_EQ(std::string(reinterpret_cast<char*>(buf), 4), "GRFP");
}

TEST(FastFrameTest, ForeignOrOversizedHeadersAreRefused) {
  unsigned char buf[kHeaderSize];
  Header h;
  EncodeHeader({1, 0, 1, kMaxFastBody + 1}, buf);
  EXPECT_EQ(DecodeHeader(buf, &h), HeaderError::kTooLarge);
  EncodeHeader({1, 0, 1, 0}, buf);
  buf[4] = kVersion + 1;
  EXPECT_EQ(DecodeHeader(buf, &h), HeaderError::kVersion);
  EncodeHeader({1, 0, 1, 0}, buf);
  buf[0] = 'X';
  EXPECT_EQ(DecodeHeader(buf, &h), HeaderError::kMagic);
}

TEST(FastFrameTest, EveryServedMethodHasAName) {
  for (uint8_t m = 1; m <= 7; ++m) EXPECT_NE(MethodName(static_cast<Method>(m)), nullptr) << int(m);
  EXPECT_EQ(MethodName(static_cast<Method>(99)), nullptr);
}

}  // namespace
}  // namespace granary::fast
