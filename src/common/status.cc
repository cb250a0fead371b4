#include "granary/status.h"

#include <string>

namespace granary {

namespace {
struct CodeName {
  ErrorCode code;
  std::string_view name;
};
constexpr CodeName kCodeNames[] = {
    {ErrorCode::OK, "OK"},
    {ErrorCode::INTERNAL_ERROR, "INTERNAL_ERROR"},
    {ErrorCode::BUFFER_OVERFLOW, "BUFFER_OVERFLOW"},
    {ErrorCode::SEGMENT_NOT_FOUND, "SEGMENT_NOT_FOUND"},
    {ErrorCode::SEGMENT_ALREADY_EXISTS, "SEGMENT_ALREADY_EXISTS"},
    {ErrorCode::CLIENT_NOT_FOUND, "CLIENT_NOT_FOUND"},
    {ErrorCode::NO_AVAILABLE_HANDLE, "NO_AVAILABLE_HANDLE"},
    {ErrorCode::INVALID_KEY, "INVALID_KEY"},
    {ErrorCode::WRITE_FAIL, "WRITE_FAIL"},
    {ErrorCode::INVALID_PARAMS, "INVALID_PARAMS"},
    {ErrorCode::ILLEGAL_CLIENT, "ILLEGAL_CLIENT"},
    {ErrorCode::INVALID_WRITE, "INVALID_WRITE"},
    {ErrorCode::INVALID_READ, "INVALID_READ"},
    {ErrorCode::REPLICA_IS_NOT_READY, "REPLICA_IS_NOT_READY"},
    {ErrorCode::OBJECT_NOT_FOUND, "OBJECT_NOT_FOUND"},
    {ErrorCode::OBJECT_ALREADY_EXISTS, "OBJECT_ALREADY_EXISTS"},
    {ErrorCode::OBJECT_HAS_LEASE, "OBJECT_HAS_LEASE"},
    {ErrorCode::LEASE_EXPIRED, "LEASE_EXPIRED"},
    {ErrorCode::TRANSFER_FAIL, "TRANSFER_FAIL"},
    {ErrorCode::CHECKSUM_MISMATCH, "CHECKSUM_MISMATCH"},
    {ErrorCode::RPC_FAIL, "RPC_FAIL"},
    {ErrorCode::RPC_TIMEOUT, "RPC_TIMEOUT"},
    {ErrorCode::ETCD_OPERATION_ERROR, "ETCD_OPERATION_ERROR"},
    {ErrorCode::ETCD_TRANSACTION_FAIL, "ETCD_TRANSACTION_FAIL"},
    {ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "UNAVAILABLE_IN_CURRENT_STATUS"},
    {ErrorCode::UNAVAILABLE_IN_CURRENT_MODE, "UNAVAILABLE_IN_CURRENT_MODE"},
    {ErrorCode::UNAUTHENTICATED, "UNAUTHENTICATED"},
    {ErrorCode::PERMISSION_DENIED, "PERMISSION_DENIED"},
    {ErrorCode::QUOTA_EXCEEDED, "QUOTA_EXCEEDED"},
};
}  // namespace

std::string_view ErrorCodeName(ErrorCode code) {
  for (const auto& entry : kCodeNames) {
    if (entry.code == code) return entry.name;
  }
  return "UNKNOWN_ERROR";
}

ErrorCode ErrorCodeFromInt(int32_t value) {
  for (const auto& entry : kCodeNames) {
    if (static_cast<int32_t>(entry.code) == value) return entry.code;
  }
  return ErrorCode::INTERNAL_ERROR;
}

std::string Status::ToString() const {
  if (ok()) return "OK";
  std::string out(ErrorCodeName(code_));
  out += " (" + std::to_string(static_cast<int32_t>(code_)) + ")";
  if (!message_.empty()) out += ": " + message_;
  return out;
}

}  // namespace granary
