#include "etcd/watch.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <mutex>
#include <thread>

#include "common/logging.h"
#include "etcd/bounded_stream.h"

namespace granary::etcd {

namespace {

using Steady = std::chrono::steady_clock;
using Millis = std::chrono::milliseconds;

// Pauses between attempts to re-create a lost watch: short, because the retries as a whole are
// bounded by the client's timeout anyway.
constexpr Millis kFirstBackoff{50};
constexpr Millis kMaxBackoff{500};

std::vector<WatchEvent> FromProto(const pb::WatchResponse& response) {
  std::vector<WatchEvent> events;
  events.reserve(response.events_size());
  for (const ::mvccpb::Event& e : response.events()) {
    WatchEvent event;
    event.type =
        e.type() == ::mvccpb::Event::DELETE ? WatchEvent::Type::kDelete : WatchEvent::Type::kPut;
    event.kv = etcd::FromProto(e.kv());
    events.push_back(std::move(event));
  }
  return events;
}

// What a Watch and its thread share (watch.h says why it is shared).
class WatchLoop {
 public:
  WatchLoop(std::shared_ptr<grpc::Channel> channel, std::shared_ptr<EtcdAuth> auth, WatchSpec spec,
            int timeout_ms, EtcdClient::WatchCallback on_events,
            std::function<void(Status)> on_error)
      : channel_(std::move(channel)),
        auth_(std::move(auth)),
        stub_(pb::Watch::NewStub(channel_)),
        spec_(std::move(spec)),
        timeout_ms_(timeout_ms),
        on_events_(std::move(on_events)),
        on_error_(std::move(on_error)),
        next_revision_(spec_.start_revision),
        stream_([this](grpc::ClientContext* ctx, grpc::CompletionQueue* cq) {
          RequireLeader(ctx);
          return stub_->PrepareAsyncWatch(ctx, cq);
        }) {}

  // Opens a stream and creates the watch on it from next_revision_; OK once etcd confirmed it.
  // *final: etcd refused the watch, so trying again would not help.
  Status Create(GrpcTime deadline, bool* final);
  // The thread: delivers events until the watch is stopped or lost for good.
  void Run();
  // Any thread: no callback starts after this, and the thread's stream is cancelled.
  void Stop();

 private:
  // Reads and delivers until the stream fails or etcd cancels the watch (*final).
  Status Pump(bool* final);
  // Re-creates the watch after `lost`, for up to the timeout. OK: delivering again.
  Status Resume(const Status& lost, bool* final);
  // False when stopped first.
  bool SleepUnlessStopped(Steady::duration pause);

  std::shared_ptr<grpc::Channel> channel_;
  std::shared_ptr<EtcdAuth> auth_;  // null: no user
  std::unique_ptr<pb::Watch::Stub> stub_;
  const WatchSpec spec_;
  const int timeout_ms_;
  const EtcdClient::WatchCallback on_events_;
  const std::function<void(Status)> on_error_;
  int64_t next_revision_;  // the first revision not yet delivered; 0 before the first create
  std::atomic<bool> stopping_{false};
  std::mutex mu_;  // with stopped_cv_: wakes a backoff pause at Stop()
  std::condition_variable stopped_cv_;
  BoundedStream<pb::WatchRequest, pb::WatchResponse> stream_;
};

Status WatchLoop::Create(GrpcTime deadline, bool* final) {
  *final = false;
  const std::string what = "etcd Watch of '" + spec_.key + "'";
  if (auth_ != nullptr) {
    if (Status s = auth_->EnsureToken(deadline); !s.ok()) return Status(s.code(), what + ": " + s.message());
  }
  StreamStep step = stream_.Open(deadline);
  if (step == StreamStep::kOk) {
    pb::WatchRequest request;
    pb::WatchCreateRequest* create = request.mutable_create_request();
    create->set_key(spec_.key);
    create->set_range_end(spec_.range_end);
    create->set_start_revision(next_revision_);
    step = stream_.Write(request, deadline);
  }
  pb::WatchResponse response;
  // etcd's first answer on a fresh stream is the create's confirmation.
  if (step == StreamStep::kOk) step = stream_.Read(&response, deadline);
  if (step != StreamStep::kOk) {
    const grpc::Status why = stream_.Close();
    if (step == StreamStep::kTimeout) return StreamTimeout(what, *channel_, timeout_ms_);
    if (why.ok()) return Status(ErrorCode::ETCD_OPERATION_ERROR, what + ": stream ended");
    return FromGrpc(why, what, *channel_, timeout_ms_);
  }
  if (!response.created() || response.canceled()) {
    *final = true;
    (void)stream_.Close();
    return Status(ErrorCode::ETCD_OPERATION_ERROR,
                  what + ": etcd refused the watch: " + response.cancel_reason());
  }
  // Watching "from now" means from the revision after the one etcd created the watch at, so a
  // stream lost before any event resumes without a gap.
  if (next_revision_ == 0) next_revision_ = response.header().revision() + 1;
  return Status::Ok();
}

Status WatchLoop::Pump(bool* final) {
  *final = false;
  const std::string what = "etcd Watch of '" + spec_.key + "'";
  for (;;) {
    pb::WatchResponse response;
    if (stream_.Read(&response, GrpcTime::max()) != StreamStep::kOk) {
      const grpc::Status why = stream_.Close();
      if (why.ok()) return Status(ErrorCode::ETCD_OPERATION_ERROR, what + ": stream ended");
      return FromGrpc(why, what, *channel_, timeout_ms_);
    }
    if (response.canceled()) {
      *final = true;
      (void)stream_.Close();
      if (response.compact_revision() > 0) {
        return Status(ErrorCode::ETCD_OPERATION_ERROR,
                      what + ": etcd compacted its history up to revision " +
                          std::to_string(response.compact_revision()) + ", past revision " +
                          std::to_string(next_revision_) + "; re-read and watch again");
      }
      return Status(ErrorCode::ETCD_OPERATION_ERROR,
                    what + ": etcd cancelled the watch: " + response.cancel_reason());
    }
    if (response.events_size() == 0) continue;  // e.g. a progress notification
    next_revision_ = response.events(response.events_size() - 1).kv().mod_revision() + 1;
    if (stopping_.load()) return Status::Ok();
    on_events_(FromProto(response));
  }
}

Status WatchLoop::Resume(const Status& lost, bool* final) {
  GLOG_WARN("{}; re-creating the watch from revision {}", lost.message(), next_revision_);
  const auto give_up = Steady::now() + Millis(timeout_ms_);
  Millis backoff = kFirstBackoff;
  Status last = lost;
  while (!stopping_.load()) {
    const auto left = std::chrono::duration_cast<Millis>(give_up - Steady::now());
    if (left.count() <= 0) {
      return Status(ErrorCode::ETCD_OPERATION_ERROR,
                    "etcd Watch of '" + spec_.key + "' lost, not resumed within " +
                        std::to_string(timeout_ms_) + " ms: " + last.message());
    }
    last = Create(std::chrono::system_clock::now() + left, final);
    if (last.ok() || *final) return last;
    if (!SleepUnlessStopped(std::min<Steady::duration>(backoff, give_up - Steady::now()))) break;
    backoff = std::min(backoff * 2, kMaxBackoff);
  }
  return Status(ErrorCode::ETCD_OPERATION_ERROR, "etcd Watch stopped");
}

void WatchLoop::Run() {
  for (;;) {
    bool final = false;
    Status lost = Pump(&final);
    if (stopping_.load()) return;
    if (!final) {
      lost = Resume(lost, &final);
      if (stopping_.load()) return;
      if (lost.ok()) continue;
    }
    on_error_(lost);
    return;
  }
}

void WatchLoop::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_.store(true);
  }
  stopped_cv_.notify_all();
  stream_.Cancel();
}

bool WatchLoop::SleepUnlessStopped(Steady::duration pause) {
  std::unique_lock lock(mu_);
  return !stopped_cv_.wait_for(lock, pause, [this] { return stopping_.load(); });
}

class WatchHandle final : public Watch {
 public:
  explicit WatchHandle(std::shared_ptr<WatchLoop> loop)
      : loop_(std::move(loop)), thread_([loop = loop_] { loop->Run(); }) {}

  ~WatchHandle() override {
    loop_->Stop();
    // From the watch's own callback: joining would wait for ourselves; the thread holds its own
    // reference to the loop and returns as soon as the callback does.
    if (thread_.get_id() == std::this_thread::get_id()) {
      thread_.detach();
    } else {
      thread_.join();
    }
  }

 private:
  std::shared_ptr<WatchLoop> loop_;
  std::thread thread_;
};

}  // namespace

Result<std::unique_ptr<Watch>> StartWatchStream(std::shared_ptr<grpc::Channel> channel,
                                                std::shared_ptr<EtcdAuth> auth,
                                                WatchSpec spec, int timeout_ms,
                                                EtcdClient::WatchCallback on_events,
                                                std::function<void(Status)> on_error) {
  auto loop = std::make_shared<WatchLoop>(std::move(channel), std::move(auth), std::move(spec),
                                         timeout_ms,
                                          std::move(on_events), std::move(on_error));
  bool final = false;
  Status created = loop->Create(DeadlineIn(timeout_ms), &final);
  if (!created.ok()) return created;
  return std::unique_ptr<Watch>(std::make_unique<WatchHandle>(std::move(loop)));
}

}  // namespace granary::etcd
