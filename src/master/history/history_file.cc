#include "master/history/history_file.h"

#include <xxhash.h>

#include <cstring>

#include "master/state/state_codec.h"

namespace granary::master {

namespace {
constexpr size_t kHeaderBytes = 12;  // u32 length + u64 hash
constexpr uint32_t kMaxRecordBytes = 1u << 31;
}  // namespace

Result<std::unique_ptr<HistoryFile>> HistoryFile::Create(const std::string& path,
                                                         const MasterState& state) {
  std::FILE* f = std::fopen(path.c_str(), "wb");
  if (!f) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "cannot create history file '" + path + "': " + std::strerror(errno));
  }
  std::setvbuf(f, nullptr, _IOFBF, 1 << 20);
  std::unique_ptr<HistoryFile> file(new HistoryFile(f));
  // Encoded before taking mu_: Append takes mu_ under the state's apply lock, so taking the apply
  // lock (EncodeSnapshot) under mu_ would be the reverse order (a lock cycle TSan reports).
  std::string snapshot = state.EncodeSnapshot();
  {
    std::lock_guard lock(file->mu_);
    file->Write(snapshot);
  }
  if (Status s = file->Flush(); !s.ok()) return s;
  return file;
}

HistoryFile::~HistoryFile() {
  (void)Flush();
  std::fclose(file_);
}

void HistoryFile::Write(const std::string& payload) {
  const uint32_t length = static_cast<uint32_t>(payload.size());
  const uint64_t hash = XXH3_64bits(payload.data(), payload.size());
  char header[kHeaderBytes];
  std::memcpy(header, &length, 4);
  std::memcpy(header + 4, &hash, 8);
  if (std::fwrite(header, 1, kHeaderBytes, file_) != kHeaderBytes ||
      std::fwrite(payload.data(), 1, payload.size(), file_) != payload.size()) {
    if (error_.ok()) error_ = Status(ErrorCode::INTERNAL_ERROR, "history file write failed");
  }
}

void HistoryFile::Append(const Operation& op) {
  std::string payload = EncodeOperation(op);
  std::lock_guard lock(mu_);
  Write(payload);
}

Status HistoryFile::Flush() {
  std::lock_guard lock(mu_);
  if (std::fflush(file_) != 0 && error_.ok()) {
    error_ = Status(ErrorCode::INTERNAL_ERROR, "history file flush failed");
  }
  return error_;
}

Result<std::vector<std::string>> ReadHistoryRecords(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) {
    return Status(ErrorCode::INVALID_PARAMS,
                  "cannot open history file '" + path + "': " + std::strerror(errno));
  }
  std::vector<std::string> records;
  for (;;) {
    char header[kHeaderBytes];
    if (std::fread(header, 1, kHeaderBytes, f) != kHeaderBytes) break;
    uint32_t length = 0;
    uint64_t hash = 0;
    std::memcpy(&length, header, 4);
    std::memcpy(&hash, header + 4, 8);
    if (length >= kMaxRecordBytes) break;
    std::string payload(length, '\0');
    if (std::fread(payload.data(), 1, length, f) != length) break;
    if (XXH3_64bits(payload.data(), payload.size()) != hash) break;
    records.push_back(std::move(payload));
  }
  std::fclose(f);
  if (records.empty()) {
    return Status(ErrorCode::INVALID_PARAMS, "history file '" + path + "' has no intact snapshot");
  }
  return records;
}

Status ReplayHistory(const std::vector<std::string>& records, MasterState& state,
                     uint64_t up_to_seq) {
  if (records.empty()) return Status(ErrorCode::INVALID_PARAMS, "empty history");
  if (Status s = state.LoadSnapshot(records[0]); !s.ok()) return s;
  for (size_t i = 1; i < records.size(); ++i) {
    auto op = DecodeOperation(records[i]);
    if (!op.ok()) return op.status();
    if (up_to_seq != 0 && op->seq > up_to_seq) break;
    auto applied = state.Replay(*op);
    if (!applied.ok()) return applied.status();
  }
  if (up_to_seq != 0 && state.last_seq() != up_to_seq) {
    return Status(ErrorCode::INVALID_PARAMS, "history ends at " + std::to_string(state.last_seq()) +
                                                 ", before " + std::to_string(up_to_seq));
  }
  return Status::Ok();
}

}  // namespace granary::master
