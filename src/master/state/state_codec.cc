#include "master/state/state_codec.h"

namespace granary::master {

namespace {
// Decodes alternative I of the body variant, chosen by its index on the wire.
template <size_t I = 0>
bool DecodeBody(Decoder& in, uint64_t index, Operation& op) {
  using Body = decltype(op.body);
  if constexpr (I < std::variant_size_v<Body>) {
    if (index == I) {
      std::variant_alternative_t<I, Body> body;
      in(body);
      op.body = std::move(body);
      return in.ok();
    }
    return DecodeBody<I + 1>(in, index, op);
  } else {
    return false;
  }
}
}  // namespace

std::string EncodeOperation(const Operation& op) {
  Encoder out;
  // The Encoder takes references but only reads through them.
  Operation& copy_free = const_cast<Operation&>(op);
  out(copy_free.seq);
  out(copy_free.now_ms);
  uint64_t index = copy_free.body.index();
  out(index);
  std::visit([&](auto& body) { out(body); }, copy_free.body);
  return out.Take();
}

Result<Operation> DecodeOperation(std::string_view bytes) {
  Decoder in(bytes);
  Operation op;
  uint64_t index = 0;
  in(op.seq);
  in(op.now_ms);
  in(index);
  if (!in.ok() || !DecodeBody(in, index, op) || !in.done()) {
    return Status(ErrorCode::INVALID_PARAMS, "malformed operation record");
  }
  return op;
}

}  // namespace granary::master
