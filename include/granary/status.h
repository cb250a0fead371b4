// granary/status.h - error codes and the Status / Result<T> value types.
//
// Promise: every fallible Granary call returns a Status or a Result<T>; no exception crosses a
// component boundary. The numeric codes are the Mooncake Store codes that inference engines already
// check (see shared/MOONCAKE-API.md) and must never be renumbered.
// Ownership: plain values, copyable and movable. Thread safety: as for any value type.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>

namespace granary {

enum class ErrorCode : int32_t {
  OK = 0,
  INTERNAL_ERROR = -1,
  BUFFER_OVERFLOW = -10,
  SEGMENT_NOT_FOUND = -101,
  SEGMENT_ALREADY_EXISTS = -102,
  CLIENT_NOT_FOUND = -103,
  NO_AVAILABLE_HANDLE = -200,
  INVALID_KEY = -400,
  WRITE_FAIL = -500,
  INVALID_PARAMS = -600,
  ILLEGAL_CLIENT = -601,
  INVALID_WRITE = -700,
  INVALID_READ = -701,
  REPLICA_IS_NOT_READY = -703,
  OBJECT_NOT_FOUND = -704,
  OBJECT_ALREADY_EXISTS = -705,
  OBJECT_HAS_LEASE = -706,
  LEASE_EXPIRED = -707,
  TRANSFER_FAIL = -800,
  CHECKSUM_MISMATCH = -801,
  RPC_FAIL = -900,
  RPC_TIMEOUT = -901,
  // High availability (docs/ha.md).
  ETCD_OPERATION_ERROR = -1000,    // etcd answered an error or could not be reached
  ETCD_TRANSACTION_FAIL = -1002,   // a guarded etcd transaction did not hold
  UNAVAILABLE_IN_CURRENT_STATUS = -1010,
  UNAVAILABLE_IN_CURRENT_MODE = -1011,  // this master is not the leader (a standby, or stepped down)
  // Security (docs/security.md).
  UNAUTHENTICATED = -1100,  // no secret, or a wrong one, where the master or node requires one
  PERMISSION_DENIED = -1101,  // a known caller whose role or tenant may not make this call
  QUOTA_EXCEEDED = -1102,     // the tenant's objects would pass its quota
};

// The code's name, e.g. "OBJECT_NOT_FOUND"; "UNKNOWN_ERROR" for a number that is not a code.
std::string_view ErrorCodeName(ErrorCode code);
// Maps any int32 (e.g. read off the wire) to a code; unknown numbers become INTERNAL_ERROR.
ErrorCode ErrorCodeFromInt(int32_t value);

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(ErrorCode code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == ErrorCode::OK; }
  ErrorCode code() const { return code_; }
  const std::string& message() const { return message_; }
  // "OBJECT_NOT_FOUND (-704): no object 'k'" ; "OK" when ok.
  std::string ToString() const;

  bool operator==(ErrorCode c) const { return code_ == c; }

 private:
  ErrorCode code_ = ErrorCode::OK;
  std::string message_;
};

// A value or the Status saying why there is none. Never both.
template <typename T>
class [[nodiscard]] Result {
 public:
  Result(T value) : value_(std::move(value)) {}  // NOLINT(google-explicit-constructor)
  Result(Status status) : status_(std::move(status)) {  // NOLINT(google-explicit-constructor)
    if (status_.ok()) status_ = Status(ErrorCode::INTERNAL_ERROR, "Result built from OK status");
  }
  Result(ErrorCode code, std::string message) : status_(code, std::move(message)) {}

  bool ok() const { return value_.has_value(); }
  const Status& status() const { return status_; }
  ErrorCode code() const { return status_.code(); }

  T& value() & { return *value_; }
  const T& value() const& { return *value_; }
  T&& value() && { return std::move(*value_); }
  T* operator->() { return &*value_; }
  const T* operator->() const { return &*value_; }
  T& operator*() & { return *value_; }
  const T& operator*() const& { return *value_; }

 private:
  std::optional<T> value_;
  Status status_;
};

}  // namespace granary
