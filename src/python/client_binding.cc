#include "python/client_binding.h"

#include <pybind11/stl.h>

#include <atomic>
#include <cstring>
#include <iterator>
#include <deque>
#include <memory>
#include <optional>

#include "gpu/cuda_device_memory.h"
#include "granary/client.h"
#include "python/buffers.h"
#include "python/errors.h"
#include "python/answer_dicts.h"
#include "python/types_binding.h"

namespace py = pybind11;

namespace granary::python {
namespace {

using Keys = std::vector<std::string>;

ByteSpan Const(std::span<std::byte> s) { return {s.data(), s.size()}; }

int64_t CodeOf(const Status& s) { return static_cast<int64_t>(s.code()); }
template <typename T>
int64_t CodeOrValue(const Result<T>& r) {
  return r.ok() ? static_cast<int64_t>(*r) : CodeOf(r.status());
}

py::list ToList(const std::vector<Status>& v) {
  py::list out;
  for (const auto& s : v) out.append(CodeOf(s));
  return out;
}
template <typename T>
py::list ToList(const std::vector<Result<T>>& v) {
  py::list out;
  for (const auto& r : v) out.append(CodeOrValue(r));
  return out;
}

Status Invalid(const std::string& what) { return Status(ErrorCode::INVALID_PARAMS, what); }

// Runs `call` on the keys whose inputs were valid and scatters its results back; the others keep
// their own error. Lets one bad address fail its key only.
template <typename R, typename Call>
std::vector<R> OnValid(const Keys& keys, const std::vector<Status>& input, Call&& call) {
  std::vector<R> out;
  out.reserve(keys.size());
  Keys valid_keys;
  std::vector<size_t> valid;
  for (size_t i = 0; i < keys.size(); ++i) {
    out.emplace_back(input[i].ok() ? R(Status(ErrorCode::INTERNAL_ERROR, "")) : R(input[i]));
    if (input[i].ok()) {
      valid.push_back(i);
      valid_keys.push_back(keys[i]);
    }
  }
  if (valid.empty()) return out;
  std::vector<R> got = call(valid_keys, valid);
  for (size_t k = 0; k < valid.size(); ++k) out[valid[k]] = std::move(got[k]);
  return out;
}

class PyClient {
 public:
  explicit PyClient(std::unique_ptr<Client> client) : client_(std::move(client)) {}
  // Dropped without close(): closing talks to the master, so other Python threads keep running.
  ~PyClient() {
    py::gil_scoped_release release;
    client_.reset();
  }

  Client& c() {
    if (closed_.load()) {
      Raise(Status(ErrorCode::UNAVAILABLE_IN_CURRENT_STATUS, "the store is closed"));
    }
    return *client_;
  }
  MemoryRegistry& registry() { return registry_; }

  void Close() {
    if (closed_.exchange(true)) return;
    py::gil_scoped_release release;
    client_->Close();
  }
  bool closed() const { return closed_.load(); }

  // ---- writes ----
  void Put(const std::string& key, py::handle value, const ReplicateConfig& config, bool upsert) {
    Client& client = c();
    BufferHold hold(value, false);
    Status s;
    {
      py::gil_scoped_release release;
      s = upsert ? client.Upsert(key, Const(hold.bytes()), config)
                 : client.Put(key, Const(hold.bytes()), config);
    }
    if (!s.ok()) Raise(s);
  }
  void PutParts(const std::string& key, const py::sequence& parts, const ReplicateConfig& config,
                bool upsert) {
    py::list results = BatchPutParts({key}, py::make_tuple(parts), config, upsert);
    if (int64_t code = results[0].cast<int64_t>(); code != 0) Raise(Coded(code, key));
  }
  void PutAddr(const std::string& key, uintptr_t address, uint64_t size,
               const ReplicateConfig& config, bool upsert) {
    Client& client = c();
    if (Unwrap(registry_.ResolveRange(address, size)).device()) {
      py::list results = BatchPutAddrParts({key}, {{address}}, {{size}}, config, upsert);
      if (int64_t code = results[0].cast<int64_t>(); code != 0) Raise(Coded(code, key));
      return;
    }
    auto span = Unwrap(registry_.Resolve(address, size));
    Status s;
    {
      py::gil_scoped_release release;
      s = upsert ? client.Upsert(key, Const(span), config) : client.Put(key, Const(span), config);
    }
    if (!s.ok()) Raise(s);
  }
  py::list BatchPut(const Keys& keys, const py::sequence& values, const ReplicateConfig& config,
                    bool upsert) {
    Client& client = c();
    if (values.size() != keys.size()) Raise(Invalid("keys and values differ in count"));
    std::deque<BufferHold> holds;  // a deque never relocates a pinned Py_buffer
    std::vector<ByteSpan> spans;
    for (auto v : values) spans.push_back(Const(holds.emplace_back(v, false).bytes()));
    std::vector<Status> out;
    {
      py::gil_scoped_release release;
      out = upsert ? client.BatchUpsert(keys, spans, config) : client.BatchPut(keys, spans, config);
    }
    return ToList(out);
  }
  py::list BatchPutParts(const Keys& keys, const py::sequence& part_lists,
                         const ReplicateConfig& config, bool upsert) {
    Client& client = c();
    if (part_lists.size() != keys.size()) Raise(Invalid("keys and part lists differ in count"));
    std::deque<BufferHold> holds;  // a deque never relocates a pinned Py_buffer
    std::vector<std::vector<ByteSpan>> parts(keys.size());
    for (size_t i = 0; i < keys.size(); ++i) {
      for (auto p : part_lists[i].cast<py::sequence>()) {
        parts[i].push_back(Const(holds.emplace_back(p, false).bytes()));
      }
    }
    std::vector<Status> out;
    {
      py::gil_scoped_release release;
      out = PutPartsCore(client, keys, parts, config, upsert);
    }
    return ToList(out);
  }
  py::list BatchPutAddr(const Keys& keys, const std::vector<uintptr_t>& addresses,
                        const std::vector<uint64_t>& sizes, const ReplicateConfig& config,
                        bool upsert) {
    auto [a, s] = OnePartEach(keys, addresses, sizes);
    return BatchPutAddrParts(keys, a, s, config, upsert);
  }
  py::list BatchPutAddrParts(const Keys& keys, const std::vector<std::vector<uintptr_t>>& addresses,
                             const std::vector<std::vector<uint64_t>>& sizes,
                             const ReplicateConfig& config, bool upsert) {
    Client& client = c();
    auto [parts, input, device] = ResolveParts(keys, addresses, sizes);
    std::vector<Status> out;
    {
      py::gil_scoped_release release;
      out = OnValid<Status>(keys, input, [&](const Keys& valid_keys, const std::vector<size_t>& idx) {
        std::vector<std::vector<MemoryRegistry::Range>> valid_parts;
        for (size_t i : idx) valid_parts.push_back(std::move(parts[i]));
        auto spans = HostSpans<ByteSpan>(valid_parts);
        if (device != nullptr) {
          return client.BatchPutFromDevice(valid_keys, spans, *device, config, upsert);
        }
        return PutPartsCore(client, valid_keys, spans, config, upsert);
      });
    }
    return ToList(out);
  }

  // ---- reads ----
  py::bytes Get(const std::string& key) {
    std::vector<py::object> out = GetObjects({key}, /*as_bytes=*/true, true);
    return py::reinterpret_borrow<py::bytes>(out[0]);
  }
  py::object GetBuffer(const std::string& key) { return GetObjects({key}, false, true)[0]; }
  py::list BatchGet(const Keys& keys, bool as_bytes) {
    py::list out;
    for (auto& o : GetObjects(keys, as_bytes, false)) out.append(o);
    return out;
  }
  uint64_t GetInto(const std::string& key, py::handle buffer) {
    Client& client = c();
    BufferHold hold(buffer, true);
    Result<uint64_t> r = Status(ErrorCode::INTERNAL_ERROR, "");
    {
      py::gil_scoped_release release;
      r = client.GetInto(key, hold.bytes());
    }
    return Unwrap(std::move(r));
  }
  py::list BatchGetInto(const Keys& keys, const py::sequence& buffers) {
    Client& client = c();
    if (buffers.size() != keys.size()) Raise(Invalid("keys and buffers differ in count"));
    std::deque<BufferHold> holds;  // a deque never relocates a pinned Py_buffer
    std::vector<MutableByteSpan> spans;
    for (auto b : buffers) spans.push_back(holds.emplace_back(b, true).bytes());
    std::vector<Result<uint64_t>> out;
    {
      py::gil_scoped_release release;
      out = client.BatchGetInto(keys, spans);
    }
    return ToList(out);
  }
  uint64_t GetIntoAddr(const std::string& key, uintptr_t address, uint64_t size) {
    Client& client = c();
    if (Unwrap(registry_.ResolveRange(address, size)).device()) {
      int64_t got = BatchGetIntoAddrParts({key}, {{address}}, {{size}})[0].cast<int64_t>();
      if (got < 0) Raise(Coded(got, key));
      return static_cast<uint64_t>(got);
    }
    auto span = Unwrap(registry_.Resolve(address, size));
    Result<uint64_t> r = Status(ErrorCode::INTERNAL_ERROR, "");
    {
      py::gil_scoped_release release;
      r = client.GetInto(key, span);
    }
    return Unwrap(std::move(r));
  }
  py::list BatchGetIntoAddr(const Keys& keys, const std::vector<uintptr_t>& addresses,
                            const std::vector<uint64_t>& sizes) {
    auto [a, s] = OnePartEach(keys, addresses, sizes);
    return BatchGetIntoAddrParts(keys, a, s);
  }
  py::list BatchGetIntoAddrParts(const Keys& keys,
                                 const std::vector<std::vector<uintptr_t>>& addresses,
                                 const std::vector<std::vector<uint64_t>>& sizes) {
    Client& client = c();
    auto [parts, input, device] = ResolveParts(keys, addresses, sizes);
    std::vector<Result<uint64_t>> out;
    {
      py::gil_scoped_release release;
      out = OnValid<Result<uint64_t>>(keys, input, [&](const Keys& valid_keys,
                                                       const std::vector<size_t>& idx) {
        std::vector<std::vector<MemoryRegistry::Range>> valid_parts;
        for (size_t i : idx) valid_parts.push_back(std::move(parts[i]));
        auto spans = HostSpans<MutableByteSpan>(valid_parts);
        if (device != nullptr) return client.BatchGetIntoDevice(valid_keys, spans, *device);
        return client.BatchGetIntoParts(valid_keys, spans);
      });
    }
    return ToList(out);
  }

  // get_into_ranges' core. Fragment f copies sizes[f] bytes from offset src_offsets[f] of object
  // keys[key_of[f]] to buffers[buffer_of[f]] + dst_offsets[f], which must lie in a registered
  // range. Each object is read whole into scratch memory and verified against its checksum
  // (the checksum covers whole objects only), then its fragments are copied out: no fragment is
  // ever filled from bytes that did not verify. A key listed by several fragments or buffers is
  // read once. At most `scratch_budget` bytes of objects are held at a time (but always one
  // object, however large): more keys are read in further rounds. Per fragment: the bytes
  // copied, or a negative code: INVALID_PARAMS (buffer not
  // registered), BUFFER_OVERFLOW (past the end of its registered buffer), INVALID_READ (past
  // the end of the object), or the key's own failure (OBJECT_NOT_FOUND, ...).
  py::list GetRanges(const Keys& keys, const std::vector<uint32_t>& key_of,
                     const std::vector<uintptr_t>& buffers,
                     const std::vector<uint32_t>& buffer_of,
                     const std::vector<uint64_t>& dst_offsets,
                     const std::vector<uint64_t>& src_offsets,
                     const std::vector<uint64_t>& sizes, uint64_t scratch_budget) {
    Client& client = c();
    const size_t n = key_of.size();
    if (buffer_of.size() != n || dst_offsets.size() != n || src_offsets.size() != n ||
        sizes.size() != n) {
      Raise(Invalid("fragment lists differ in length"));
    }
    for (size_t f = 0; f < n; ++f) {
      if (key_of[f] >= keys.size() || buffer_of[f] >= buffers.size()) {
        Raise(Invalid("fragment names a key or buffer that is not listed"));
      }
    }
    std::vector<int64_t> out(n, 0);
    {
      py::gil_scoped_release release;
      RangeRead(client, keys, key_of, buffers, buffer_of, dst_offsets, src_offsets, sizes,
                scratch_budget, out);
    }
    py::list result;
    for (int64_t v : out) result.append(v);
    return result;
  }

  // ---- queries and removal ----
  template <typename Call>
  auto Released(Call&& call) {
    Client& client = c();
    py::gil_scoped_release release;
    return call(client);
  }
  bool Exist(const std::string& key) {
    return Unwrap(Released([&](Client& c) { return c.Exist(key); }));
  }
  py::list BatchExist(const Keys& keys) {
    auto r = Released([&](Client& c) { return c.BatchExist(keys); });
    py::list out;
    for (const auto& x : r) out.append(x.ok() ? (*x ? 1 : 0) : CodeOf(x.status()));
    return out;
  }
  uint64_t GetSize(const std::string& key) {
    return Unwrap(Released([&](Client& c) { return c.GetSize(key); }));
  }
  py::list BatchGetSize(const Keys& keys) {
    return ToList(Released([&](Client& c) { return c.BatchGetSize(keys); }));
  }
  uint32_t PrefixMatch(const Keys& keys) {
    return Unwrap(Released([&](Client& c) { return c.PrefixMatch(keys); }));
  }
  void Remove(const std::string& key, bool force) {
    Status s = Released([&](Client& c) { return c.Remove(key, force); });
    if (!s.ok()) Raise(s);
  }
  py::list BatchRemove(const Keys& keys, bool force) {
    return ToList(Released([&](Client& c) { return c.BatchRemove(keys, force); }));
  }
  uint64_t RemoveByRegex(const std::string& pattern, bool force) {
    return Unwrap(Released([&](Client& c) { return c.RemoveByRegex(pattern, force); }));
  }
  uint64_t RemoveAll(bool force) {
    return Unwrap(Released([&](Client& c) { return c.RemoveAll(force); }));
  }
  py::list QueryByRegex(const std::string& pattern, uint32_t limit) {
    auto objects = Unwrap(Released([&](Client& c) { return c.QueryByRegex(pattern, limit); }));
    py::list out;
    for (const auto& o : objects) out.append(py::make_tuple(o.key, o.size, o.replica_count));
    return out;
  }
  py::dict Stat(const std::string& key) {
    return StatDict(Unwrap(Released([&](Client& c) { return c.Stat(key); })));
  }
  py::list BatchReplicate(const Keys& keys, uint32_t replica_num) {
    return ToList(Released([&](Client& c) { return c.BatchReplicate(keys, replica_num); }));
  }
  void Drain(const std::string& segment, bool drop, bool undrain) {
    Status s = Released([&](Client& c) {
      return undrain ? c.Undrain(segment) : c.Drain(segment, drop);
    });
    if (!s.ok()) Raise(s);
  }
  py::list Segments() {
    return SegmentsList(Unwrap(Released([&](Client& c) { return c.ListSegments(); })));
  }
  py::list Drains() {
    return DrainsList(Unwrap(Released([&](Client& c) { return c.ListDrains(); })));
  }
  void Health() {
    Status s = Released([&](Client& c) { return c.Health(); });
    if (!s.ok()) Raise(s);
  }
  py::dict Cluster() {
    return ClusterDict(Unwrap(Released([&](Client& c) { return c.Cluster(); })));
  }
  py::dict Stats() { return StatsDict(client_->Stats()); }
  const std::string& client_id() const { return client_->client_id(); }
  const std::string& segment_name() const { return client_->segment_name(); }

 private:
  static Status Coded(int64_t code, const std::string& key) {
    ErrorCode e = ErrorCodeFromInt(static_cast<int32_t>(code));
    return Status(e, std::string(ErrorCodeName(e)) + " for key '" + key + "'");
  }
  static std::vector<Status> PutPartsCore(Client& client, const Keys& keys,
                                          const std::vector<std::vector<ByteSpan>>& parts,
                                          const ReplicateConfig& config, bool upsert) {
    return upsert ? client.BatchUpsertParts(keys, parts, config)
                  : client.BatchPutParts(keys, parts, config);
  }
  // One (address, size) per key, as the single-range case of the *_parts calls.
  static std::pair<std::vector<std::vector<uintptr_t>>, std::vector<std::vector<uint64_t>>>
  OnePartEach(const Keys& keys, const std::vector<uintptr_t>& addresses,
              const std::vector<uint64_t>& sizes) {
    if (addresses.size() != keys.size() || sizes.size() != keys.size()) {
      Raise(Invalid("keys, addresses and sizes differ in count"));
    }
    std::pair<std::vector<std::vector<uintptr_t>>, std::vector<std::vector<uint64_t>>> out;
    for (size_t i = 0; i < keys.size(); ++i) {
      out.first.push_back({addresses[i]});
      out.second.push_back({sizes[i]});
    }
    return out;
  }
  // Each key's (address, size) list as registered ranges; a key whose list does not resolve
  // keeps its error in `input`. `device` is set when any range is GPU memory.
  struct Resolved {
    std::vector<std::vector<MemoryRegistry::Range>> parts;
    std::vector<Status> input;
    DeviceMemory* device = nullptr;
  };
  Resolved ResolveParts(const Keys& keys, const std::vector<std::vector<uintptr_t>>& addresses,
                        const std::vector<std::vector<uint64_t>>& sizes) {
    if (addresses.size() != keys.size() || sizes.size() != keys.size()) {
      Raise(Invalid("keys, address lists and size lists differ in count"));
    }
    Resolved out{std::vector<std::vector<MemoryRegistry::Range>>(keys.size()),
                 std::vector<Status>(keys.size()), nullptr};
    for (size_t i = 0; i < keys.size(); ++i) {
      if (addresses[i].size() != sizes[i].size()) {
        out.input[i] = Invalid("key '" + keys[i] + "': addresses and sizes differ in count");
        continue;
      }
      for (size_t j = 0; j < addresses[i].size() && out.input[i].ok(); ++j) {
        auto range = registry_.ResolveRange(addresses[i][j], sizes[i][j]);
        if (!range.ok()) {
          out.input[i] = range.status();
          continue;
        }
        if (range->device()) out.device = Device();
        out.parts[i].push_back(*range);
      }
    }
    return out;
  }
  void RangeRead(Client& client, const Keys& keys, const std::vector<uint32_t>& key_of,
                 const std::vector<uintptr_t>& buffers, const std::vector<uint32_t>& buffer_of,
                 const std::vector<uint64_t>& dst_offsets,
                 const std::vector<uint64_t>& src_offsets, const std::vector<uint64_t>& sizes,
                 uint64_t budget, std::vector<int64_t>& out) {
    auto code = [](ErrorCode e) { return static_cast<int64_t>(e); };
    // Destinations first: a fragment whose range is not registered fails alone.
    std::vector<std::byte*> dst(key_of.size(), nullptr);
    std::vector<std::vector<size_t>> fragments(keys.size());  // per key, its live fragments
    for (size_t f = 0; f < key_of.size(); ++f) {
      const uintptr_t base = buffers[buffer_of[f]];
      const uintptr_t address = base + dst_offsets[f];
      auto span = address < base ? Result<std::span<std::byte>>(Invalid("overflow"))
                                 : registry_.Resolve(address, sizes[f]);
      if (!span.ok()) {
        out[f] = registry_.Resolve(base, 1).ok() ? code(ErrorCode::BUFFER_OVERFLOW)
                                                 : code(ErrorCode::INVALID_PARAMS);
        continue;
      }
      dst[f] = span->data();
      fragments[key_of[f]].push_back(f);
    }
    Keys pending;
    std::vector<size_t> pending_index;  // position in `keys`
    for (size_t k = 0; k < keys.size(); ++k) {
      if (!fragments[k].empty()) {
        pending.push_back(keys[k]);
        pending_index.push_back(k);
      }
    }
    // Rounds of whole-object reads within the scratch budget; a key that does not fit this round
    // is deferred to the next, and every round reads at least one key, so this ends.
    while (!pending.empty()) {
      std::vector<std::unique_ptr<std::byte[]>> scratch(pending.size());
      std::vector<bool> deferred(pending.size(), false);
      uint64_t held = 0;
      auto results = client.BatchGetWith(
          pending, [&](size_t i, uint64_t size) -> Result<std::vector<MutableByteSpan>> {
            const size_t k = pending_index[i];
            bool any = false;
            for (size_t f : fragments[k]) {
              if (src_offsets[f] > size || sizes[f] > size - src_offsets[f]) {
                out[f] = code(ErrorCode::INVALID_READ);
              } else {
                any = true;
              }
            }
            if (!any) return Status(ErrorCode::INVALID_READ, "no fragment inside the object");
            if (held > 0 && size > budget - std::min(held, budget)) {
              deferred[i] = true;
              return Status(ErrorCode::INTERNAL_ERROR, "deferred to the next round");
            }
            try {
              scratch[i] = std::make_unique_for_overwrite<std::byte[]>(size == 0 ? 1 : size);
            } catch (const std::bad_alloc&) {
              return Status(ErrorCode::INTERNAL_ERROR,
                            "no memory for " + std::to_string(size) + " bytes");
            }
            held += size;
            return std::vector<MutableByteSpan>{MutableByteSpan(scratch[i].get(), size)};
          });
      Keys next;
      std::vector<size_t> next_index;
      for (size_t i = 0; i < pending.size(); ++i) {
        const size_t k = pending_index[i];
        if (deferred[i]) {
          next.push_back(pending[i]);
          next_index.push_back(k);
          continue;
        }
        for (size_t f : fragments[k]) {
          if (out[f] != 0) continue;  // already failed on its own (source range)
          if (!results[i].ok()) {
            out[f] = CodeOf(results[i].status());
          } else {
            if (sizes[f] > 0) std::memcpy(dst[f], scratch[i].get() + src_offsets[f], sizes[f]);
            out[f] = static_cast<int64_t>(sizes[f]);
          }
        }
      }
      pending = std::move(next);
      pending_index = std::move(next_index);
    }
  }

  // Bytes or OwnedBuffer objects, allocated once each size is known; a failed key is its code
  // (raised instead when `raise` and there is one key).
  std::vector<py::object> GetObjects(const Keys& keys, bool as_bytes, bool raise) {
    Client& client = c();
    std::vector<py::object> objects(keys.size());
    std::vector<Result<uint64_t>> results;
    {
      py::gil_scoped_release release;
      results = client.BatchGetWith(keys, [&](size_t i, uint64_t size)
                                              -> Result<std::vector<MutableByteSpan>> {
        std::byte* data = nullptr;
        if (as_bytes) {
          py::gil_scoped_acquire acquire;
          PyObject* b = PyBytes_FromStringAndSize(nullptr, static_cast<Py_ssize_t>(size));
          if (b == nullptr) {
            PyErr_Clear();
            return Status(ErrorCode::INTERNAL_ERROR, "no memory for " + std::to_string(size) +
                                                         " bytes");
          }
          objects[i] = py::reinterpret_steal<py::object>(b);
          data = reinterpret_cast<std::byte*>(PyBytes_AS_STRING(b));
        } else {
          // Allocated before the GIL is taken back; owned by its Python object from then on.
          std::unique_ptr<OwnedBuffer> owned;
          try {
            owned = std::make_unique<OwnedBuffer>(size);
          } catch (const std::bad_alloc&) {
            return Status(ErrorCode::INTERNAL_ERROR, "no memory for " + std::to_string(size) +
                                                         " bytes");
          }
          data = owned->data();
          py::gil_scoped_acquire acquire;
          objects[i] = py::cast(owned.get(), py::return_value_policy::take_ownership);
          owned.release();  // the Python object owns it now (if the cast threw, `owned` still does)
        }
        return std::vector<MutableByteSpan>{MutableByteSpan(data, size)};
      });
    }
    if (raise && keys.size() == 1 && !results[0].ok()) Raise(results[0].status());
    for (size_t i = 0; i < keys.size(); ++i) {
      if (!results[i].ok()) objects[i] = py::int_(CodeOf(results[i].status()));
    }
    return objects;
  }

  // GPU memory as the client sees it: the ranges registered as such here.
  DeviceMemory* Device() {
    std::call_once(device_once_, [&] {
      device_ = std::make_unique<gpu::CudaDeviceMemory>(
          gpu::CudaRuntime::Instance(),
          [this](const std::byte* p, uint64_t n) { return registry_.DeviceOf(p, n); });
    });
    return device_.get();
  }
  template <typename Span>
  static std::vector<std::vector<Span>> HostSpans(const std::vector<std::vector<MemoryRegistry::Range>>& in) {
    std::vector<std::vector<Span>> out(in.size());
    for (size_t i = 0; i < in.size(); ++i) {
      for (const MemoryRegistry::Range& r : in[i]) out[i].emplace_back(r.address, r.size);
    }
    return out;
  }

  std::unique_ptr<Client> client_;
  MemoryRegistry registry_;
  std::once_flag device_once_;
  std::unique_ptr<gpu::CudaDeviceMemory> device_;
  std::atomic<bool> closed_{false};
};

}  // namespace

void RegisterClient(py::module_& m) {
  const ReplicateConfig def;
  py::class_<PyClient>(m, "Client")
      .def(py::init([](const std::string& master, uint64_t segment_size,
                       const std::string& segment_name, const std::string& data_host,
                       uint16_t data_port, int rpc_timeout_ms, int io_timeout_ms,
                       size_t connections_per_node, bool use_shared_memory, size_t io_threads,
                       const std::string& disk_dir, uint64_t disk_size,
                       const std::string& disk_backend, const std::string& disk_eviction,
                       const std::string& disk_io, int64_t offload_interval_ms,
                       bool warm_shared_memory, uint64_t reserve_bytes,
                       const std::string& cluster_id, const std::string& auth_token_file,
                       const std::string& tls_ca_file, const std::string& tls_cert_file,
                       const std::string& tls_key_file, int64_t location_cache_ms,
                       int spin_wait_us) {
             ClientOptions o;
             o.location_cache_ms = location_cache_ms;
             o.spin_wait_us = spin_wait_us;
             o.master_address = master;
             o.cluster_id = cluster_id;
             o.auth_token_file = auth_token_file;
             o.tls_ca_file = tls_ca_file;
             o.tls_cert_file = tls_cert_file;
             o.tls_key_file = tls_key_file;
             o.segment_size = segment_size;
             o.segment_name = segment_name;
             o.data_host = data_host;
             o.data_port = data_port;
             o.rpc_timeout_ms = rpc_timeout_ms;
             o.io_timeout_ms = io_timeout_ms;
             o.connections_per_node = connections_per_node;
             o.use_shared_memory = use_shared_memory;
             o.io_threads = io_threads;
             o.disk_dir = disk_dir;
             o.disk_size = disk_size;
             o.disk_backend = disk_backend;
             o.disk_eviction = disk_eviction;
             o.disk_io = disk_io;
             o.offload_interval_ms = offload_interval_ms;
             o.warm_shared_memory = warm_shared_memory;
             o.reserve_bytes = reserve_bytes;
             Result<std::unique_ptr<Client>> c = Status(ErrorCode::INTERNAL_ERROR, "");
             {
               py::gil_scoped_release release;
               c = Client::Connect(o);
             }
             return std::make_unique<PyClient>(Unwrap(std::move(c)));
           }),
           py::arg("master"), py::arg("segment_size") = 0, py::arg("segment_name") = "",
           py::arg("data_host") = "127.0.0.1", py::arg("data_port") = 0,
           py::arg("rpc_timeout_ms") = 10'000, py::arg("io_timeout_ms") = 30'000,
           py::arg("connections_per_node") = 4, py::arg("use_shared_memory") = true,
           py::arg("io_threads") = 4, py::arg("disk_dir") = "", py::arg("disk_size") = 0,
           py::arg("disk_backend") = "", py::arg("disk_eviction") = "", py::arg("disk_io") = "",
           py::arg("offload_interval_ms") = 0, py::arg("warm_shared_memory") = true,
           py::arg("reserve_bytes") = ClientOptions().reserve_bytes,
           // With an etcd:// master: the HA cluster's name ("": $GRANARY_CLUSTER_ID, else
           // "granary").
           py::arg("cluster_id") = "",
           // The cluster's secret file ("": $GRANARY_AUTH_TOKEN_FILE, else none).
           py::arg("auth_token_file") = "",
           // TLS to the master ("": $GRANARY_TLS_CA / _CERT / _KEY, else plain TCP).
           py::arg("tls_ca_file") = "", py::arg("tls_cert_file") = "",
           py::arg("tls_key_file") = "",
           // Repeat gets read without the master for this long (ClientOptions; 0: never).
           py::arg("location_cache_ms") = ClientOptions().location_cache_ms,
           // Waits awake this long for a same-host answer (ClientOptions; -1:
           // $GRANARY_SPIN_WAIT_US, else 50; 0: never).
           py::arg("spin_wait_us") = ClientOptions().spin_wait_us)
      .def("close", &PyClient::Close)
      .def_property_readonly("closed", &PyClient::closed)
      .def_property_readonly("client_id", &PyClient::client_id)
      .def_property_readonly("segment_name", &PyClient::segment_name)
      .def("register_buffer", [](PyClient& c, uintptr_t a, uint64_t n) {
        if (Status s = c.registry().Register(a, n); !s.ok()) Raise(s);
      })
      .def("unregister_buffer", [](PyClient& c, uintptr_t a) {
        if (Status s = c.registry().Unregister(a); !s.ok()) Raise(s);
      })
      .def("put", &PyClient::Put, py::arg("key"), py::arg("value"), py::arg("config") = def,
           py::arg("upsert") = false)
      .def("put_parts", &PyClient::PutParts, py::arg("key"), py::arg("parts"),
           py::arg("config") = def, py::arg("upsert") = false)
      .def("put_addr", &PyClient::PutAddr, py::arg("key"), py::arg("address"), py::arg("size"),
           py::arg("config") = def, py::arg("upsert") = false)
      .def("batch_put", &PyClient::BatchPut, py::arg("keys"), py::arg("values"),
           py::arg("config") = def, py::arg("upsert") = false)
      .def("batch_put_parts", &PyClient::BatchPutParts, py::arg("keys"), py::arg("part_lists"),
           py::arg("config") = def, py::arg("upsert") = false)
      .def("batch_put_addr", &PyClient::BatchPutAddr, py::arg("keys"), py::arg("addresses"),
           py::arg("sizes"), py::arg("config") = def, py::arg("upsert") = false)
      .def("batch_put_addr_parts", &PyClient::BatchPutAddrParts, py::arg("keys"),
           py::arg("address_lists"), py::arg("size_lists"), py::arg("config") = def,
           py::arg("upsert") = false)
      .def("get", &PyClient::Get, py::arg("key"))
      .def("get_buffer", &PyClient::GetBuffer, py::arg("key"))
      .def("batch_get", &PyClient::BatchGet, py::arg("keys"), py::arg("as_bytes") = true)
      .def("get_into", &PyClient::GetInto, py::arg("key"), py::arg("buffer"))
      .def("batch_get_into", &PyClient::BatchGetInto, py::arg("keys"), py::arg("buffers"))
      .def("get_into_addr", &PyClient::GetIntoAddr, py::arg("key"), py::arg("address"),
           py::arg("size"))
      .def("batch_get_into_addr", &PyClient::BatchGetIntoAddr, py::arg("keys"),
           py::arg("addresses"), py::arg("sizes"))
      .def("batch_get_into_addr_parts", &PyClient::BatchGetIntoAddrParts, py::arg("keys"),
           py::arg("address_lists"), py::arg("size_lists"))
      .def("get_ranges", &PyClient::GetRanges, py::arg("keys"), py::arg("key_of"),
           py::arg("buffers"), py::arg("buffer_of"), py::arg("dst_offsets"),
           py::arg("src_offsets"), py::arg("sizes"), py::arg("scratch_budget") = 256ull << 20)
      .def("exist", &PyClient::Exist, py::arg("key"))
      .def("batch_exist", &PyClient::BatchExist, py::arg("keys"))
      .def("get_size", &PyClient::GetSize, py::arg("key"))
      .def("batch_get_size", &PyClient::BatchGetSize, py::arg("keys"))
      .def("prefix_match", &PyClient::PrefixMatch, py::arg("keys"))
      .def("remove", &PyClient::Remove, py::arg("key"), py::arg("force") = false)
      .def("batch_remove", &PyClient::BatchRemove, py::arg("keys"), py::arg("force") = false)
      .def("remove_by_regex", &PyClient::RemoveByRegex, py::arg("pattern"),
           py::arg("force") = false)
      .def("remove_all", &PyClient::RemoveAll, py::arg("force") = false)
      .def("query_by_regex", &PyClient::QueryByRegex, py::arg("pattern"), py::arg("limit") = 0)
      .def("stat", &PyClient::Stat, py::arg("key"))
      .def("batch_replicate", &PyClient::BatchReplicate, py::arg("keys"), py::arg("replica_num"))
      .def("drain", &PyClient::Drain, py::arg("segment"), py::arg("drop") = false,
           py::arg("undrain") = false)
      .def("segments", &PyClient::Segments)
      .def("drains", &PyClient::Drains)
      .def("health", &PyClient::Health)
      .def("cluster", &PyClient::Cluster)
      .def("stats", &PyClient::Stats);
}

}  // namespace granary::python
