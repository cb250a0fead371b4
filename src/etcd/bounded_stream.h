// etcd/bounded_stream.h - one gRPC bidirectional stream whose every step (open, write, read,
// close) waits at most until a deadline, on its own completion queue.
//
// Why not the blocking stream API: its Read cannot be given a deadline (a stream's context
// deadline ends the whole stream), and a watch or keepalive stream lives for hours while each of
// its steps must stay bounded.
// Promise: at most one step is outstanding at a time, so the queue's next event is always the
// step's own. A step that times out cancels the call and waits (briefly: cancellation completes
// every pending operation at once) for the step to finish, so no operation outlives the call.
// After a step answers kBroken or kTimeout the call is dead: Close() it, then Open() again.
// Ownership: owns its queue, its context and its call; the stub behind `prepare` must outlive it.
// Thread safety: Open/Write/Read/Close from one thread at a time; Cancel() from any thread, at any
// time (it is how another thread ends a Read that waits for ever).
#pragma once

#include <grpcpp/grpcpp.h>

#include <functional>
#include <memory>
#include <mutex>

#include "common/tsan.h"
#include "etcd/etcd_internal.h"

namespace granary::etcd {

// gRPC copies a call's final status into the caller's grpc::Status inside AsyncNext, from a
// message its own thread built (absl's Cord into a std::string, with this binary's std::string
// code) and handed over through its completion queue, whose locks ThreadSanitizer cannot see
// (Debian's gRPC is not instrumented, see scripts/tsan.supp). Reads during that copy only are not
// checked; without TSan this is nothing.
class IgnoreReadsOfGrpcStatus {
 public:
#ifdef GRANARY_TSAN
  IgnoreReadsOfGrpcStatus() { AnnotateIgnoreReadsBegin(__FILE__, __LINE__); }
  ~IgnoreReadsOfGrpcStatus() { AnnotateIgnoreReadsEnd(__FILE__, __LINE__); }
#else
  IgnoreReadsOfGrpcStatus() {}  // user-provided: a guard held only for its scope is not "unused"
#endif
  IgnoreReadsOfGrpcStatus(const IgnoreReadsOfGrpcStatus&) = delete;
  IgnoreReadsOfGrpcStatus& operator=(const IgnoreReadsOfGrpcStatus&) = delete;
};

enum class StreamStep { kOk, kBroken, kTimeout };

template <typename Req, typename Resp>
class BoundedStream {
 public:
  using Call = grpc::ClientAsyncReaderWriter<Req, Resp>;
  // Prepares (does not start) a call on the given context and queue: a stub's PrepareAsyncXxx.
  using Prepare =
      std::function<std::unique_ptr<Call>(grpc::ClientContext*, grpc::CompletionQueue*)>;

  explicit BoundedStream(Prepare prepare) : prepare_(std::move(prepare)) {}
  ~BoundedStream() {
    (void)Close();
    queue_.Shutdown();
    void* tag;
    bool ok;
    while (queue_.Next(&tag, &ok)) {
    }
  }
  BoundedStream(const BoundedStream&) = delete;
  BoundedStream& operator=(const BoundedStream&) = delete;

  bool is_open() const { return call_ != nullptr; }

  // Starts a new call (closing the old one first). wait_for_ready: while no member is connected
  // the call waits for one, up to the deadline, instead of failing at once.
  StreamStep Open(GrpcTime deadline) {
    (void)Close();
    auto context = std::make_unique<grpc::ClientContext>();
    context->set_wait_for_ready(true);
    {
      std::lock_guard lock(mu_);
      if (cancelled_) return StreamStep::kBroken;
      context_ = std::move(context);
    }
    call_ = prepare_(context_.get(), &queue_);
    broken_ = false;
    call_->StartCall(this);
    return Await(deadline);
  }

  StreamStep Write(const Req& request, GrpcTime deadline) {
    if (call_ == nullptr || broken_) return StreamStep::kBroken;
    call_->Write(request, this);
    return Await(deadline);
  }

  // GrpcTime::max(): wait until a message comes, the call fails or Cancel() ends it.
  StreamStep Read(Resp* response, GrpcTime deadline) {
    if (call_ == nullptr || broken_) return StreamStep::kBroken;
    call_->Read(response, this);
    return Await(deadline);
  }

  // Ends the current call and returns its status: etcd's (or the transport's) when a step saw
  // the call fail, CANCELLED when it was still healthy. OK when no call was open.
  grpc::Status Close() {
    if (call_ == nullptr) return grpc::Status::OK;
    if (!broken_) TryCancel();
    grpc::Status status;
    call_->Finish(&status, this);
    {
      IgnoreReadsOfGrpcStatus unseen_handover;
      // Finish on a failed call completes at once; the bound only guards against the unforeseen.
      (void)Await(DeadlineIn(1000));
    }
    call_.reset();
    std::lock_guard lock(mu_);
    context_.reset();
    return status;
  }

  // Any thread: cancels the current call and refuses every later Open. For shutdown.
  void Cancel() {
    std::lock_guard lock(mu_);
    cancelled_ = true;
    if (context_) context_->TryCancel();
  }

 private:
  void TryCancel() {
    std::lock_guard lock(mu_);
    if (context_) context_->TryCancel();
  }

  StreamStep Await(GrpcTime deadline) {
    void* tag = nullptr;
    bool ok = false;
    switch (queue_.AsyncNext(&tag, &ok, deadline)) {
      case grpc::CompletionQueue::GOT_EVENT:
        if (!ok) broken_ = true;
        return ok ? StreamStep::kOk : StreamStep::kBroken;
      case grpc::CompletionQueue::TIMEOUT:
        TryCancel();
        (void)queue_.Next(&tag, &ok);  // the cancelled step completes now
        broken_ = true;
        return StreamStep::kTimeout;
      case grpc::CompletionQueue::SHUTDOWN:
        break;
    }
    broken_ = true;
    return StreamStep::kBroken;
  }

  Prepare prepare_;
  grpc::CompletionQueue queue_;
  std::unique_ptr<Call> call_;
  bool broken_ = false;  // a step failed: the call can only be closed

  std::mutex mu_;  // guards context_ and cancelled_ against Cancel() from other threads
  std::unique_ptr<grpc::ClientContext> context_;
  bool cancelled_ = false;
};

}  // namespace granary::etcd
