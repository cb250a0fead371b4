// etcd/cluster_keys.h against its promises: the key layout, ParseLeaderRecord accepting exactly
// what EncodeLeaderRecord writes (unknown fields ignored, a missing or mistyped required field an
// error, never a crash), and HostOf's address forms.
#include "etcd/cluster_keys.h"

#include <gtest/gtest.h>

#include <limits>

namespace granary::etcd {
namespace {

TEST(ClusterKeys, KeyLayout) {
  EXPECT_EQ(ClusterPrefix("c1"), "/granary/c1/");
  EXPECT_EQ(LeaderKey("c1"), "/granary/c1/leader");
  EXPECT_EQ(SyncKey("c1"), "/granary/c1/sync");
  EXPECT_EQ(MembersPrefix("c1"), "/granary/c1/members/");
  EXPECT_EQ(MemberKey("c1", "m-7"), "/granary/c1/members/m-7");
  // Every key of a cluster is under its prefix; another cluster's are not.
  EXPECT_EQ(LeaderKey("c1").rfind(ClusterPrefix("c1"), 0), 0u);
  EXPECT_NE(LeaderKey("c10").rfind(ClusterPrefix("c1"), 0), 0u);
  EXPECT_EQ(MemberKey("c1", "x").rfind(MembersPrefix("c1"), 0), 0u);
}

TEST(ClusterKeys, LeaderRecordRoundTrips) {
  const LeaderRecord records[] = {
      {"master-1", "10.0.0.1:50051", 50052, 8080, 12345, true, "granary-fast-0123abcd"},
      {"m", "[::1]:1", 0, 0, 0, false},
      {"m\"with\\quotes\n", "host:65535", 65535, 65535, std::numeric_limits<uint64_t>::max(),
       true},
  };
  for (const LeaderRecord& r : records) {
    const std::string json = EncodeLeaderRecord(r);
    Result<LeaderRecord> parsed = ParseLeaderRecord(json);
    ASSERT_TRUE(parsed.ok()) << json << ": " << parsed.status().ToString();
    EXPECT_EQ(parsed->id, r.id);
    EXPECT_EQ(parsed->grpc, r.grpc);
    EXPECT_EQ(parsed->fast_port, r.fast_port);
    EXPECT_EQ(parsed->http_port, r.http_port);
    EXPECT_EQ(parsed->term, r.term);
    EXPECT_EQ(parsed->serving, r.serving);
    EXPECT_EQ(parsed->fast_local, r.fast_local);
  }
}

TEST(ClusterKeys, UnknownFieldsAreIgnoredAndOptionalOnesDefault) {
  Result<LeaderRecord> r = ParseLeaderRecord(
      R"({"id":"a","grpc":"h:1","term":5,"future_field":[1,2,{"x":null}],"serving":true})");
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->id, "a");
  EXPECT_EQ(r->term, 5u);
  EXPECT_TRUE(r->serving);
  EXPECT_EQ(r->fast_port, 0);
  EXPECT_EQ(r->http_port, 0);
  EXPECT_TRUE(r->fast_local.empty()) << "an older master's record names no local socket";
  r = ParseLeaderRecord(R"({"id":"a","grpc":"h:1","term":5,"fast_local":7})");
  ASSERT_TRUE(r.ok());
  EXPECT_TRUE(r->fast_local.empty()) << "only a string names one";
  r = ParseLeaderRecord(R"({"id":"a","grpc":"h:1","term":5})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->serving) << "a record that does not say it serves is still taking over";
  r = ParseLeaderRecord(R"({"id":"a","grpc":"h:1","term":5,"serving":"yes"})");
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->serving) << "only a JSON true serves";
  r = ParseLeaderRecord(R"({"id":"a","grpc":"h:1","term":5,"fast_port":70000})");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->fast_port, 0) << "a port out of range is no port, not a truncated one";
}

TEST(ClusterKeys, MalformedOrIncompleteRecordsAreErrors) {
  const char* bad[] = {
      "",
      "not json",
      "{",
      "[]",
      "null",
      "42",
      R"("string")",
      "{}",
      R"({"grpc":"h:1","term":5})",                 // no id
      R"({"id":"a","term":5})",                     // no grpc
      R"({"id":"a","grpc":"h:1"})",                 // no term
      R"({"id":5,"grpc":"h:1","term":5})",          // id not a string
      R"({"id":"a","grpc":["h:1"],"term":5})",      // grpc not a string
      R"({"id":"a","grpc":"h:1","term":"5"})",      // term a string
      R"({"id":"a","grpc":"h:1","term":-1})",       // term negative
      R"({"id":"a","grpc":"h:1","term":1.5})",      // term fractional
      R"({"id":"a","grpc":"h:1","term":5} trailing)",
  };
  for (const char* json : bad) {
    Result<LeaderRecord> r = ParseLeaderRecord(json);
    EXPECT_FALSE(r.ok()) << json;
    if (!r.ok()) {
      EXPECT_EQ(r.code(), ErrorCode::ETCD_OPERATION_ERROR) << json;
    }
  }
  // Every truncation of a good record is an error, never a crash.
  const std::string good = EncodeLeaderRecord({"master-1", "10.0.0.1:50051", 1, 2, 3, true});
  for (size_t cut = 0; cut < good.size(); ++cut) {
    EXPECT_FALSE(ParseLeaderRecord(good.substr(0, cut)).ok()) << good.substr(0, cut);
  }
}

TEST(ClusterKeys, HostOfEachAddressForm) {
  EXPECT_EQ(HostOf("10.0.0.1:50051"), "10.0.0.1");
  EXPECT_EQ(HostOf("master.example.com:1"), "master.example.com");
  EXPECT_EQ(HostOf("localhost:0"), "localhost");
  EXPECT_EQ(HostOf("[::1]:50051"), "::1");
  EXPECT_EQ(HostOf("[fe80::1%eth0]:7"), "fe80::1%eth0");
  EXPECT_EQ(HostOf("[2001:db8::2]:443"), "2001:db8::2");
  // No host: empty.
  EXPECT_EQ(HostOf(""), "");
  EXPECT_EQ(HostOf(":50051"), "");
  // No port: the header's "" (no host:port form to take a host from).
  EXPECT_EQ(HostOf("hostname"), "");
}

// A bracketed v6 address without a port is not cut inside its brackets: like "hostname", it has
// no host:port form, so no host.
TEST(ClusterKeys, HostOfABracketedAddressWithoutAPort) {
  EXPECT_EQ(HostOf("[::1]"), "");
  EXPECT_EQ(HostOf("[2001:db8::2]"), "");
  EXPECT_EQ(HostOf("[::1"), "") << "unclosed";
  EXPECT_EQ(HostOf("[]:80"), "");
  EXPECT_EQ(HostOf("[::1]x:80"), "") << "junk between the brackets and the port";
}

}  // namespace
}  // namespace granary::etcd
