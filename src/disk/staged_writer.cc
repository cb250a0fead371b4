#include "disk/staged_writer.h"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace granary::disk {

namespace {
constexpr size_t kRequestBytes = 1u << 20;  // one request per MiB: many in flight, few syscalls
}

StagedWriter::StagedWriter(DiskIo& io) : io_(io), staging_(io.Staging()) {}

void StagedWriter::Put(int fd, uint64_t offset, std::span<const std::byte> bytes, uint32_t tag) {
  if (staging_.empty()) {
    failures_.emplace(tag, ENOMEM);
    return;
  }
  const size_t padded = AlignUp(bytes.size());
  size_t copied = 0;  // of the padded length
  while (copied < padded) {
    if (used_ == staging_.size()) Drain();
    size_t room = staging_.size() - used_;
    size_t take = std::min(room, padded - copied);  // room and padded are multiples of 4 KiB
    std::byte* dst = staging_.data() + used_;
    size_t from_src = copied < bytes.size() ? std::min(take, bytes.size() - copied) : 0;
    if (from_src) std::memcpy(dst, bytes.data() + copied, from_src);
    if (from_src < take) std::memset(dst + from_src, 0, take - from_src);
    uint64_t file_offset = offset + copied;
    if (!runs_.empty()) {
      Run& last = runs_.back();
      if (last.fd == fd && last.tag == tag && last.file_offset + last.length == file_offset &&
          last.staging_offset + last.length == used_) {
        last.length += take;
        used_ += take;
        copied += take;
        continue;
      }
    }
    runs_.push_back(Run{fd, file_offset, used_, take, tag});
    used_ += take;
    copied += take;
  }
}

void StagedWriter::Drain() {
  std::vector<IoRequest> requests;
  std::vector<uint32_t> tags;
  for (const Run& run : runs_) {
    for (size_t done = 0; done < run.length; done += kRequestBytes) {
      IoRequest r;
      r.fd = run.fd;
      r.write = true;
      r.buffer = staging_.data() + run.staging_offset + done;
      r.length = std::min(kRequestBytes, run.length - done);
      r.offset = run.file_offset + done;
      requests.push_back(r);
      tags.push_back(run.tag);
    }
  }
  io_.Run(requests);
  for (size_t i = 0; i < requests.size(); ++i) {
    const IoRequest& r = requests[i];
    if (r.result == static_cast<int64_t>(r.length)) {
      bytes_written_ += r.length;
      continue;
    }
    int err = r.result < 0 ? static_cast<int>(-r.result) : ENOSPC;
    failures_.emplace(tags[i], err);  // keeps the first errno of a tag
  }
  runs_.clear();
  used_ = 0;
}

std::map<uint32_t, int> StagedWriter::Flush() {
  if (!runs_.empty()) Drain();
  return std::exchange(failures_, {});
}

}  // namespace granary::disk
