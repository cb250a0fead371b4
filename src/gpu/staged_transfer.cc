#include "gpu/staged_transfer.h"

#include <algorithm>
#include <string>

namespace granary::gpu {
namespace {

uint64_t DeviceBytes(const std::vector<Range>& object) {
  uint64_t n = 0;
  for (const Range& r : object) n += r.device ? r.size : 0;
  return n;
}

}  // namespace

StagedTransfer::StagedTransfer(const CudaRuntime& cuda, size_t buffer_bytes)
    : cuda_(cuda), buffer_bytes_(std::max<size_t>(buffer_bytes, 4096)) {}

StagedTransfer::~StagedTransfer() {
  for (Buffer& b : buffers_) {
    if (b.stream != nullptr) {
      (void)cuda_.Synchronize(b.stream);
      cuda_.DestroyStream(b.stream);
    }
    cuda_.FreePinned(b.data);
  }
}

uint64_t StagedTransfer::pinned_bytes() const {
  std::lock_guard lock(mu_);
  return buffers_[0].size + buffers_[1].size;
}

Status StagedTransfer::Prepare() {
  if (prepared_) return Status::Ok();
  for (Buffer& b : buffers_) {
    if (b.stream == nullptr) {
      auto stream = cuda_.CreateStream();
      if (!stream.ok()) return stream.status();
      b.stream = *stream;
    }
    if (b.data == nullptr) {
      auto data = cuda_.AllocatePinned(buffer_bytes_);
      if (!data.ok()) return data.status();
      b.data = static_cast<std::byte*>(*data);
      b.size = buffer_bytes_;
    }
  }
  prepared_ = true;
  return Status::Ok();
}

std::vector<std::vector<size_t>> StagedTransfer::Groups(
    const std::vector<std::vector<Range>>& objects) const {
  std::vector<std::vector<size_t>> groups;
  uint64_t filled = 0;
  for (size_t i = 0; i < objects.size(); ++i) {
    const uint64_t bytes = DeviceBytes(objects[i]);
    if (groups.empty() || filled + bytes > buffer_bytes_) {
      groups.emplace_back();
      filled = 0;
    }
    groups.back().push_back(i);
    filled += bytes;
  }
  return groups;
}

std::vector<Status> StagedTransfer::Put(const std::vector<std::vector<Range>>& objects,
                                        const PutFn& put) {
  std::lock_guard lock(mu_);
  std::vector<Status> out(objects.size());
  if (Status s = Prepare(); !s.ok()) {
    std::fill(out.begin(), out.end(), s);
    return out;
  }
  const auto groups = Groups(objects);
  // A group's bytes copied off the GPU into buffer `b` (or a pinned buffer of its own when one
  // object is larger than `b`), as host spans for `put`.
  struct Staged {
    std::vector<std::vector<ByteSpan>> spans;
    std::byte* own = nullptr;
    Status status;
  };
  auto stage = [&](size_t g, Buffer& b) {
    Staged st;
    uint64_t need = 0;
    for (size_t i : groups[g]) need += DeviceBytes(objects[i]);
    std::byte* base = b.data;
    if (need > b.size) {
      auto own = cuda_.AllocatePinned(need);
      if (!own.ok()) {
        st.status = own.status();
        return st;
      }
      st.own = base = static_cast<std::byte*>(*own);
    }
    uint64_t offset = 0;
    for (size_t i : groups[g]) {
      auto& spans = st.spans.emplace_back();
      for (const Range& r : objects[i]) {
        if (!r.device) {
          spans.emplace_back(r.address, r.size);
          continue;
        }
        if (st.status.ok()) {
          st.status = cuda_.CopyToHostAsync(base + offset, r.address, r.size, b.stream);
        }
        spans.emplace_back(base + offset, r.size);
        offset += r.size;
      }
    }
    return st;
  };

  Staged current = stage(0, buffers_[0]);
  for (size_t g = 0; g < groups.size(); ++g) {
    Buffer& b = buffers_[g % 2];
    Status copied = cuda_.Synchronize(b.stream);
    if (copied.ok()) copied = current.status;
    // The next group leaves the GPU while this one is written.
    Staged next = g + 1 < groups.size() ? stage(g + 1, buffers_[(g + 1) % 2]) : Staged{};
    if (!copied.ok()) {
      for (size_t i : groups[g]) out[i] = copied;
    } else {
      std::vector<Status> got = put(groups[g], current.spans);
      for (size_t k = 0; k < groups[g].size(); ++k) out[groups[g][k]] = std::move(got[k]);
    }
    cuda_.FreePinned(current.own);
    current = std::move(next);
  }
  return out;
}

std::vector<Result<uint64_t>> StagedTransfer::Get(const std::vector<std::vector<Range>>& objects,
                                                  const GetFn& get) {
  std::lock_guard lock(mu_);
  std::vector<Result<uint64_t>> out(objects.size(), Status(ErrorCode::INTERNAL_ERROR, ""));
  if (Status s = Prepare(); !s.ok()) {
    std::fill(out.begin(), out.end(), Result<uint64_t>(s));
    return out;
  }
  const auto groups = Groups(objects);
  // Objects whose copies onto the GPU from buffer b are queued but not yet known to be done:
  // they are reported read only once that stream is synchronized without error.
  std::vector<size_t> in_flight[2];
  auto settle = [&](int b) {
    Status done = cuda_.Synchronize(buffers_[b].stream);
    if (!done.ok()) {
      for (size_t i : in_flight[b]) out[i] = done;
    }
    in_flight[b].clear();
  };

  for (size_t g = 0; g < groups.size(); ++g) {
    const int bi = static_cast<int>(g % 2);
    Buffer& b = buffers_[bi];
    settle(bi);  // the group before last copied out of this buffer: it may be reused now
    uint64_t need = 0;
    for (size_t i : groups[g]) need += DeviceBytes(objects[i]);
    std::byte* base = b.data;
    std::byte* own = nullptr;
    if (need > b.size) {
      auto pinned = cuda_.AllocatePinned(need);
      if (!pinned.ok()) {
        for (size_t i : groups[g]) out[i] = pinned.status();
        continue;
      }
      own = base = static_cast<std::byte*>(*pinned);
    }
    std::vector<std::vector<MutableByteSpan>> spans;
    uint64_t offset = 0;
    for (size_t i : groups[g]) {
      auto& s = spans.emplace_back();
      for (const Range& r : objects[i]) {
        if (r.device) {
          s.emplace_back(base + offset, r.size);
          offset += r.size;
        } else {
          s.emplace_back(r.address, r.size);
        }
      }
    }
    std::vector<Result<uint64_t>> got = get(groups[g], spans);
    for (size_t k = 0; k < groups[g].size(); ++k) {
      const size_t i = groups[g][k];
      if (!got[k].ok()) {
        out[i] = std::move(got[k]);
        continue;
      }
      // The object filled its ranges in order: copy what landed in staged ranges to the GPU.
      uint64_t left = *got[k];
      Status queued;
      for (size_t j = 0; j < objects[i].size() && left > 0 && queued.ok(); ++j) {
        const Range& r = objects[i][j];
        const uint64_t n = std::min<uint64_t>(r.size, left);
        if (r.device) queued = cuda_.CopyToDeviceAsync(r.address, spans[k][j].data(), n, b.stream);
        left -= n;
      }
      if (!queued.ok()) {
        out[i] = queued;
        continue;
      }
      out[i] = std::move(got[k]);
      in_flight[bi].push_back(i);
    }
    if (own != nullptr) {  // its own buffer is freed now, so its copies must be done
      settle(bi);
      cuda_.FreePinned(own);
    }
  }
  settle(0);
  settle(1);
  return out;
}

}  // namespace granary::gpu
