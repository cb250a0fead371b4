// Tests of security/: reading a secret file (every fault named, the secret never in a message),
// the constant-time comparison, what counts as a loopback host, and the Authenticator's
// refusals (counted per transport, the log line rate-limited, no secret in any message).
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>

#include "common/metrics.h"
#include "security/authenticator.h"
#include "security/secret.h"
#include "security/tenants.h"

namespace granary::security {
namespace {

constexpr const char* kSecret = "4f1c0e9a7b2d4c6e8f0a1b3c5d7e9f01";

class SecretFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/granary-secret-XXXXXX";
    ASSERT_NE(::mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf " + dir_).c_str()); }

  std::string Write(const std::string& name, const std::string& contents, mode_t mode = 0600) {
    const std::string path = dir_ + "/" + name;
    std::ofstream(path, std::ios::binary) << contents;
    EXPECT_EQ(::chmod(path.c_str(), mode), 0);
    return path;
  }

  std::string dir_;
};

TEST_F(SecretFileTest, TheFirstLineWithoutSurroundingSpaceIsTheSecret) {
  auto s = LoadSecretFile(Write("a", std::string("  ") + kSecret + " \r\nsecond line\n"));
  ASSERT_TRUE(s.ok()) << s.status().ToString();
  EXPECT_EQ(*s, kSecret);
  s = LoadSecretFile(Write("b", kSecret, 0400));  // no newline, read-only
  ASSERT_TRUE(s.ok());
  EXPECT_EQ(*s, kSecret);
}

TEST_F(SecretFileTest, FurtherLinesAreSecondarySecretsAMasterAcceptsToo) {
  const std::string older = "older-0123456789abcdef-secret";
  auto all = LoadAcceptedSecrets(Write("r", std::string(kSecret) + "\n# rotating\n\n  " + older +
                                                "  \n"));
  ASSERT_TRUE(all.ok()) << all.status().ToString();
  EXPECT_EQ(*all, (std::vector<std::string>{kSecret, older}));
  // Clients present the first line only.
  EXPECT_EQ(*LoadSecretFile(Write("r2", std::string(kSecret) + "\n" + older)), kSecret);
  auto one = LoadAcceptedSecrets(Write("one", kSecret));
  ASSERT_TRUE(one.ok());
  EXPECT_EQ(one->size(), 1u);
  const struct {
    std::string text;
    std::string says;
  } bad[] = {
      {std::string(kSecret) + "\nshort", "line 2"},
      {std::string(kSecret) + "\n" + kSecret, "the same secret twice"},
      {std::string(kSecret) + "\na123456789abcdef0\nb123456789abcdef0\nc123456789abcdef0\n"
                              "d123456789abcdef0",
       "more than 4"},
  };
  for (const auto& b : bad) {
    auto r = LoadAcceptedSecrets(Write("bad", b.text));
    ASSERT_FALSE(r.ok()) << b.text;
    EXPECT_NE(r.status().message().find(b.says), std::string::npos) << r.status().message();
    EXPECT_EQ(r.status().message().find(kSecret), std::string::npos);
  }
}

TEST_F(SecretFileTest, EveryUnusableFileIsRefusedWithTheReasonAndNeverTheSecret) {
  struct Case {
    std::string name;
    std::string contents;
    mode_t mode;
    std::string why;
  };
  const std::string secret(kSecret);
  const std::vector<Case> cases = {
      {"group-readable", secret, 0640, "chmod 600"},
      {"world-readable", secret, 0604, "chmod 600"},
      {"group-writable", secret, 0620, "chmod 600"},
      {"empty", "", 0600, "empty"},
      {"blank-first-line", "\n" + secret, 0600, "empty"},
      {"short", "0123456789abcde", 0600, "shorter than 16"},
      {"inner-space", "0123456789 abcdef0123", 0600, "printable ASCII"},
      {"control-byte", secret + std::string(1, '\x01'), 0600, "printable ASCII"},
      {"huge", std::string(5000, 'a'), 0600, "over 4096 bytes"},
  };
  for (const Case& c : cases) {
    const std::string path = Write(c.name, c.contents, c.mode);
    auto s = LoadSecretFile(path);
    ASSERT_FALSE(s.ok()) << c.name;
    EXPECT_EQ(s.status().code(), ErrorCode::INVALID_PARAMS) << c.name;
    EXPECT_NE(s.status().message().find(c.why), std::string::npos)
        << c.name << ": " << s.status().message();
    EXPECT_NE(s.status().message().find(path), std::string::npos) << c.name;
    EXPECT_EQ(s.status().message().find(kSecret), std::string::npos) << c.name;
  }
  auto missing = LoadSecretFile(dir_ + "/missing");
  EXPECT_EQ(missing.status().code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(missing.status().message().find("No such file"), std::string::npos);
  auto directory = LoadSecretFile(dir_);
  EXPECT_NE(directory.status().message().find("not a regular file"), std::string::npos);
}

TEST_F(SecretFileTest, AClientTakesTheGivenFileElseTheEnvironmentsElseNone) {
  const std::string given = Write("given", std::string(kSecret) + "\n");
  const std::string other = Write("other", "ffffffffffffffffffffffffffffffff\n");
  ::unsetenv(kSecretFileEnv);
  auto none = LoadClientSecret("");
  ASSERT_TRUE(none.ok());
  EXPECT_EQ(*none, "");
  ::setenv(kSecretFileEnv, other.c_str(), 1);
  auto from_env = LoadClientSecret("");
  ASSERT_TRUE(from_env.ok()) << from_env.status().ToString();
  EXPECT_EQ(*from_env, "ffffffffffffffffffffffffffffffff");
  auto from_given = LoadClientSecret(given);
  ASSERT_TRUE(from_given.ok());
  EXPECT_EQ(*from_given, kSecret) << "the given file wins";
  ::setenv(kSecretFileEnv, (dir_ + "/missing").c_str(), 1);
  EXPECT_FALSE(LoadClientSecret("").ok()) << "a named file that is missing is an error";
  ::unsetenv(kSecretFileEnv);
}

TEST(SecretsEqualTest, OnlyTheSameBytesAreEqual) {
  const std::string a(kSecret);
  EXPECT_TRUE(SecretsEqual(a, std::string(kSecret)));
  EXPECT_FALSE(SecretsEqual(a, a.substr(0, a.size() - 1)));
  EXPECT_FALSE(SecretsEqual(a.substr(0, a.size() - 1), a));
  EXPECT_FALSE(SecretsEqual(a, a + "0"));
  EXPECT_FALSE(SecretsEqual(a, ""));
  EXPECT_FALSE(SecretsEqual("", a));
  EXPECT_TRUE(SecretsEqual("", ""));
  for (size_t i = 0; i < a.size(); ++i) {
    std::string b = a;
    b[i] ^= 0x01;
    EXPECT_FALSE(SecretsEqual(a, b)) << "byte " << i;
  }
  // A trailing NUL does not make a prefix equal.
  EXPECT_FALSE(SecretsEqual(a, std::string(kSecret) + std::string(1, '\0')));
}

TEST(LoopbackTest, OnlyAddressesThatStayOnThisHostAreLoopback) {
  for (const char* host : {"127.0.0.1", "127.1.2.3", "127.255.255.254", "localhost", "::1",
                           "[::1]", "::ffff:127.0.0.1", "0:0:0:0:0:0:0:1"}) {
    EXPECT_TRUE(IsLoopbackHost(host)) << host;
  }
  for (const char* host : {"0.0.0.0", "::", "", "10.0.0.5", "192.168.1.1", "example.com",
                           "128.0.0.1", "::ffff:10.0.0.1", "1127.0.0.1", "127.evil.example",
                           "127.0.0.1.nip.io", "127", "127.0.0.1:50051"}) {
    EXPECT_FALSE(IsLoopbackHost(host)) << host;
  }
}

TEST(AuthenticatorTest, WithoutASecretEveryCallerPasses) {
  Authenticator open("", nullptr, "granary_test");
  EXPECT_FALSE(open.required());
  EXPECT_TRUE(open.Check(std::nullopt, "grpc", "peer").ok());
  EXPECT_TRUE(open.Check("anything", "fast", "peer").ok());
  EXPECT_EQ(open.refused(), 0u);
}

TEST(AuthenticatorTest, RefusalsAreCountedPerTransportAndSayWhatWasWrong) {
  MetricsRegistry registry;
  Authenticator auth(kSecret, &registry, "granary_test");
  EXPECT_TRUE(auth.required());
  // Both transports are shown from the start, at 0.
  std::string page = registry.RenderPrometheus();
  EXPECT_NE(page.find("granary_test_unauthenticated_total{transport=\"grpc\"} 0"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("granary_test_unauthenticated_total{transport=\"fast\"} 0"),
            std::string::npos);

  EXPECT_TRUE(auth.Check(std::string_view(kSecret), "grpc", "p").ok());
  Status none = auth.Check(std::nullopt, "grpc", "p");
  EXPECT_EQ(none.code(), ErrorCode::UNAUTHENTICATED);
  EXPECT_NE(none.message().find("no secret"), std::string::npos);
  Status wrong = auth.Check("ffffffffffffffffffffffffffffffff", "fast", "p");
  EXPECT_EQ(wrong.code(), ErrorCode::UNAUTHENTICATED);
  EXPECT_NE(wrong.message().find("a wrong secret"), std::string::npos);
  Status prefix = auth.Check(std::string_view(kSecret).substr(0, 31), "fast", "p");
  EXPECT_EQ(prefix.code(), ErrorCode::UNAUTHENTICATED);
  Status empty = auth.Check(std::string_view(), "fast", "p");
  EXPECT_EQ(empty.code(), ErrorCode::UNAUTHENTICATED);
  for (const Status& s : {none, wrong, prefix, empty}) {
    EXPECT_EQ(s.message().find(kSecret), std::string::npos) << s.message();
    EXPECT_EQ(s.message().find(std::string(kSecret).substr(0, 31)), std::string::npos);
  }
  EXPECT_EQ(auth.refused(), 4u);
  page = registry.RenderPrometheus();
  EXPECT_NE(page.find("granary_test_unauthenticated_total{transport=\"grpc\"} 1"),
            std::string::npos)
      << page;
  EXPECT_NE(page.find("granary_test_unauthenticated_total{transport=\"fast\"} 3"),
            std::string::npos)
      << page;
}


constexpr const char* kAdminSecret = "admin-0123456789abcdef-secret";
constexpr const char* kAcmeToken = "acme-0123456789abcdef-token00";
constexpr const char* kGlobexToken = "globex-0123456789abcdef-token";

TEST(TenantsFileTest, ALineANameATokenAndAnOptionalQuota) {
  auto parsed = ParseTenants(std::string("# tenants\n\n  acme  ") + kAcmeToken +
                                 "  8 GiB\r\nglobex\t" + kGlobexToken + "\n",
                             "t");
  ASSERT_TRUE(parsed.ok()) << parsed.status().ToString();
  ASSERT_EQ(parsed->size(), 2u);
  EXPECT_EQ((*parsed)[0].name, "acme");
  EXPECT_EQ((*parsed)[0].token, kAcmeToken);
  EXPECT_EQ((*parsed)[0].quota_bytes, 8ull << 30);
  EXPECT_EQ((*parsed)[1].name, "globex");
  EXPECT_EQ((*parsed)[1].quota_bytes, 0u);
  EXPECT_TRUE(ParseTenants("", "t")->empty());
}

TEST(TenantsFileTest, EveryFaultNamesItsLineAndNeverAToken) {
  const std::string acme = std::string("acme ") + kAcmeToken;
  const struct {
    std::string text;
    std::string says;
  } cases[] = {
      {"acme", "no token"},
      {"acme short", "shorter than"},
      {"default " + std::string(kAcmeToken), "not \"default\""},
      {"a/b " + std::string(kAcmeToken), "A-Z a-z"},
      {std::string(65, 'n') + " " + kAcmeToken, "1-64"},
      {acme + " lots", "line 1"},
      {acme + " 0", "quota of 0"},
      {acme + "\n" + acme, "named twice"},
      {acme + "\nglobex " + kAcmeToken, "another tenant's token"},
      {"# c\n" + acme + "\nglobex " + kGlobexToken + " -1G", "line 3"},
  };
  for (const auto& c : cases) {
    auto parsed = ParseTenants(c.text, "tenants.txt");
    ASSERT_FALSE(parsed.ok()) << c.text;
    EXPECT_EQ(parsed.status().code(), ErrorCode::INVALID_PARAMS);
    EXPECT_NE(parsed.status().message().find(c.says), std::string::npos)
        << parsed.status().message();
    EXPECT_NE(parsed.status().message().find("tenants.txt"), std::string::npos);
    EXPECT_EQ(parsed.status().message().find(kAcmeToken), std::string::npos);
    EXPECT_EQ(parsed.status().message().find(kGlobexToken), std::string::npos);
  }
}

TEST(CredentialsTest, RoleSecretsNeedTheClustersAndAllDiffer) {
  EXPECT_TRUE((Credentials{"", "", {}}).Validate().ok());
  EXPECT_TRUE((Credentials{kSecret, kAdminSecret, {{"acme", kAcmeToken, 0}}}).Validate().ok());
  EXPECT_FALSE((Credentials{"", kAdminSecret, {}}).Validate().ok());
  EXPECT_FALSE((Credentials{"", "", {{"acme", kAcmeToken, 0}}}).Validate().ok());
  EXPECT_FALSE((Credentials{kSecret, kSecret, {}}).Validate().ok());
  EXPECT_FALSE((Credentials{kSecret, kAdminSecret, {{"acme", kAdminSecret, 0}}}).Validate().ok());
  EXPECT_FALSE((Credentials{kSecret, "", {{"acme", kSecret, 0}}}).Validate().ok());
}

TEST(AuthenticatorTest, EachSecretNamesItsPrincipal) {
  Authenticator auth(Credentials{kSecret, kAdminSecret,
                                 {{"acme", kAcmeToken, 1 << 20}, {"globex", kGlobexToken, 0}}},
                     nullptr, "granary_test");
  auto member = auth.Identify(std::string_view(kSecret), "grpc", "p");
  ASSERT_TRUE(member.ok());
  EXPECT_EQ((*member)->role, Principal::Role::kMember);
  EXPECT_EQ((*member)->tenant, "");
  auto admin = auth.Identify(std::string_view(kAdminSecret), "fast", "p");
  ASSERT_TRUE(admin.ok());
  EXPECT_TRUE((*admin)->admin());
  auto acme = auth.Identify(std::string_view(kAcmeToken), "grpc", "p");
  ASSERT_TRUE(acme.ok());
  EXPECT_TRUE((*acme)->tenant_only());
  EXPECT_EQ((*acme)->tenant, "acme");
  EXPECT_EQ((*acme)->quota_bytes, 1u << 20);
  EXPECT_EQ(*acme, &auth.tenants()[0]);
  auto globex = auth.Identify(std::string_view(kGlobexToken), "grpc", "p");
  ASSERT_TRUE(globex.ok());
  EXPECT_EQ((*globex)->tenant, "globex");
  // A token's prefix, or one tenant's token with a byte changed, is nobody.
  EXPECT_EQ(auth.Identify(std::string_view(kAcmeToken).substr(0, 20), "grpc", "p").status().code(),
            ErrorCode::UNAUTHENTICATED);
  std::string near(kGlobexToken);
  near.back() ^= 1;
  EXPECT_FALSE(auth.Identify(std::string_view(near), "grpc", "p").ok());
  EXPECT_EQ(auth.refused(), 2u);

  // Older secrets of a rotation name the same principals, and are counted.
  MetricsRegistry registry;
  Authenticator rotating(Credentials{kSecret, kAdminSecret, {}, {"old-cluster-0123456789abcdef"},
                                     {"old-admin-0123456789abcdef00"}},
                         &registry, "granary_test");
  auto old_member =
      rotating.Identify(std::string_view("old-cluster-0123456789abcdef"), "grpc", "p");
  ASSERT_TRUE(old_member.ok());
  EXPECT_EQ((*old_member)->role, Principal::Role::kMember);
  auto old_admin =
      rotating.Identify(std::string_view("old-admin-0123456789abcdef00"), "fast", "p");
  ASSERT_TRUE(old_admin.ok());
  EXPECT_TRUE((*old_admin)->admin());
  EXPECT_TRUE(rotating.Identify(std::string_view(kSecret), "grpc", "p").ok());
  EXPECT_EQ(rotating.secondary_presented(), 2u);
  EXPECT_NE(registry.RenderPrometheus().find("granary_test_secondary_secret_total 2"),
            std::string::npos)
      << registry.RenderPrometheus();
  EXPECT_FALSE((Credentials{kSecret, "", {}, {kSecret}, {}}).Validate().ok());
  EXPECT_FALSE(
      (Credentials{kSecret, "", {}, {}, {"old-admin-0123456789abcdef00"}}).Validate().ok());

  // Without an admin secret the cluster's is the admin's; without any, everyone is.
  Authenticator no_admin(Credentials{kSecret, "", {}}, nullptr, "granary_test");
  EXPECT_TRUE((*no_admin.Identify(std::string_view(kSecret), "grpc", "p"))->admin());
  Authenticator open(Credentials{}, nullptr, "granary_test");
  auto anyone = open.Identify(std::nullopt, "grpc", "p");
  ASSERT_TRUE(anyone.ok());
  EXPECT_TRUE((*anyone)->admin());
  EXPECT_EQ((*anyone)->tenant, "");
}

}  // namespace
}  // namespace granary::security
