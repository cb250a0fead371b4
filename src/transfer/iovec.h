// transfer/iovec.h - advancing a gather list past the bytes a partial sendmsg() took, shared by
// the node's data server and the client's transport.
// Thread safety: a pure function on the caller's array.
#pragma once

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>

namespace granary::transfer {

// Drops the first `sent` bytes from (*iov, *iovcnt): whole entries leave the front, a partly sent
// one is trimmed in place.
inline void ConsumeIov(iovec** iov, int* iovcnt, size_t sent) {
  while (*iovcnt > 0 && sent >= (*iov)->iov_len) {
    sent -= (*iov)->iov_len;
    ++*iov;
    --*iovcnt;
  }
  if (*iovcnt > 0) {
    (*iov)->iov_base = static_cast<uint8_t*>((*iov)->iov_base) + sent;
    (*iov)->iov_len -= sent;
  }
}

}  // namespace granary::transfer
