#include "common/http_server.h"

#include <gtest/gtest.h>

#include "common/httplib_abi.h"  // cpp-httplib as the library was built

#include <atomic>
#include <stdexcept>
#include <string>

namespace granary {
namespace {

TEST(HttpServerTest, ServesRoutesOnAFreePort) {
  HttpServer server;
  std::atomic<int> calls{0};
  server.Get("/health", [&calls] {
    ++calls;
    return HttpResponse{200, "text/plain; charset=utf-8", "ok\n"};
  });
  server.Get("/status.json", [] {
    return HttpResponse{200, "application/json", R"({"state":"serving"})"};
  });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  ASSERT_NE(server.port(), 0);

  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/health");
  ASSERT_TRUE(res) << httplib::to_string(res.error());
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, "ok\n");
  EXPECT_EQ(res->get_header_value("Content-Type"), "text/plain; charset=utf-8");
  EXPECT_EQ(calls.load(), 1);

  res = client.Get("/status.json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 200);
  EXPECT_EQ(res->body, R"({"state":"serving"})");
  EXPECT_EQ(res->get_header_value("Content-Type"), "application/json");
}

TEST(HttpServerTest, UnknownPathIs404AndPathsMatchExactly) {
  HttpServer server;
  server.Get("/status.json", [] { return HttpResponse{200, "text/plain", "s"}; });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client client("127.0.0.1", server.port());
  for (const char* path : {"/nope", "/statusXjson", "/status.json/extra", "/"}) {
    auto res = client.Get(path);
    ASSERT_TRUE(res) << path;
    EXPECT_EQ(res->status, 404) << path;
    EXPECT_NE(res->body.find("not found"), std::string::npos) << path;
  }
}

TEST(HttpServerTest, HandlerStatusAndThrowingHandler) {
  HttpServer server;
  server.Get("/ready", [] { return HttpResponse{503, "text/plain", "not ready\n"}; });
  server.Get("/boom", []() -> HttpResponse { throw std::runtime_error("kaput"); });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  httplib::Client client("127.0.0.1", server.port());
  auto res = client.Get("/ready");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 503);
  EXPECT_EQ(res->body, "not ready\n");  // the handler's body, not the 4xx/5xx default
  res = client.Get("/boom");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 500);
  EXPECT_NE(res->body.find("kaput"), std::string::npos);
}

TEST(HttpServerTest, PortInUseIsAnError) {
  HttpServer first;
  first.Get("/health", [] { return HttpResponse{200, "text/plain", "first"}; });
  ASSERT_TRUE(first.Start("127.0.0.1", 0).ok());

  HttpServer second;
  second.Get("/health", [] { return HttpResponse{200, "text/plain", "second"}; });
  Status st = second.Start("127.0.0.1", first.port());
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(st.message().find("127.0.0.1:" + std::to_string(first.port())), std::string::npos)
      << st.message();
  EXPECT_EQ(second.port(), 0);

  // The first server still owns the port and answers.
  httplib::Client client("127.0.0.1", first.port());
  auto res = client.Get("/health");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->body, "first");
}

TEST(HttpServerTest, StopClosesThePortAndIsIdempotent) {
  HttpServer server;
  server.Get("/health", [] { return HttpResponse{}; });
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  const uint16_t port = server.port();
  server.Stop();
  server.Stop();
  httplib::Client client("127.0.0.1", port);
  client.set_connection_timeout(1);
  EXPECT_FALSE(client.Get("/health"));
  // The port is free again for a new server.
  HttpServer again;
  ASSERT_TRUE(again.Start("127.0.0.1", port).ok());
  EXPECT_EQ(again.port(), port);
}

TEST(HttpServerTest, SecondStartIsRejected) {
  HttpServer server;
  ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  Status st = server.Start("127.0.0.1", 0);
  EXPECT_EQ(st.code(), ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS);
}

TEST(HttpServerTest, StopRightAfterStartDoesNotHang) {
  for (int i = 0; i < 20; ++i) {
    HttpServer server;
    ASSERT_TRUE(server.Start("127.0.0.1", 0).ok());
  }  // destructor stops
  SUCCEED();
}

TEST(HttpServerTest, NonLocalAddressIsAnError) {
  HttpServer server;
  Status st = server.Start("192.0.2.1", 8080);  // TEST-NET-1: never an address of this host
  ASSERT_FALSE(st.ok());
  EXPECT_EQ(st.code(), ErrorCode::INVALID_PARAMS);
  EXPECT_NE(st.message().find("192.0.2.1:8080"), std::string::npos) << st.message();
}

TEST(HttpServerDeathTest, GetAfterStartAborts) {
  EXPECT_DEATH(
      {
        HttpServer server;
        (void)server.Start("127.0.0.1", 0);
        server.Get("/late", [] { return HttpResponse{}; });
      },
      "after Start");
}

}  // namespace
}  // namespace granary
