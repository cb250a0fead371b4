#include "common/http_client.h"

#include "common/httplib_abi.h"

namespace granary {

Result<std::string> HttpGet(const std::string& host, uint16_t port, const std::string& path,
                            int timeout_ms) {
  const std::string where = "http://" +
                            (host.find(':') != std::string::npos ? "[" + host + "]" : host) +
                            ":" + std::to_string(port) + path;
  httplib::Client client(host, port);
  const auto ms = std::chrono::milliseconds(timeout_ms);
  client.set_connection_timeout(ms);
  client.set_read_timeout(ms);
  client.set_write_timeout(ms);
  httplib::Result res = client.Get(path);
  if (!res) {
    const httplib::Error e = res.error();
    return Status(ErrorCode::RPC_FAIL,
                  where + ": " + (e == httplib::Error::Connection ? std::string("cannot connect")
                                                                  : httplib::to_string(e)));
  }
  if (res->status != 200) {
    return Status(ErrorCode::RPC_FAIL, where + ": HTTP " + std::to_string(res->status));
  }
  return std::move(res->body);
}

}  // namespace granary
