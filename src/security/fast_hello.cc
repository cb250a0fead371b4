#include "security/fast_hello.h"

#include <string>

#include "proto/fast_frame.h"
#include "proto/rpc_util.h"

namespace granary::security {

Status PresentSecret(net::ByteStream& conn, std::string_view secret, net::SteadyTime deadline) {
  const uint8_t hello = static_cast<uint8_t>(fast::Method::kHello);
  std::string frame(fast::kHeaderSize, '\0');
  fast::EncodeHeader({hello, 0, 0, static_cast<uint32_t>(secret.size())},
                     reinterpret_cast<unsigned char*>(frame.data()));
  frame.append(secret);
  if (Status s = conn.SendAll(frame, deadline); !s.ok()) return s;
  unsigned char header[fast::kHeaderSize];
  if (Status s = conn.RecvExact(reinterpret_cast<char*>(header), sizeof(header), deadline);
      !s.ok()) {
    return s;
  }
  fast::Header h;
  // A hello's answer is a short message at most.
  if (fast::DecodeHeader(header, &h, 4096) != fast::HeaderError::kNone ||
      !(h.flags & fast::kReply)) {
    return Status(ErrorCode::RPC_FAIL, "fast port: malformed answer to the hello");
  }
  std::string body(h.body_size, '\0');
  if (Status s = conn.RecvExact(body.data(), body.size(), deadline); !s.ok()) return s;
  if (!(h.flags & fast::kError)) {
    if (h.method != hello) return Status(ErrorCode::RPC_FAIL, "fast port: hello answered oddly");
    return Status::Ok();
  }
  if (h.method == 0) {  // over the connection cap: refused before reading anything
    return Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "fast port busy: " + body);
  }
  if (auto coded = rpc::ParseCodedMessage(body)) return *coded;
  return Status(ErrorCode::RPC_FAIL, "fast port refused the hello: " + body);
}

}  // namespace granary::security
