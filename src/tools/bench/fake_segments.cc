#include "tools/bench/fake_segments.h"

#include <chrono>

#include "tools/bench/master_rpc.h"

namespace granary::bench {
namespace {
constexpr int kDeadlineMs = 60'000;
}  // namespace

FakeSegments::FakeSegments(const std::string& master, std::vector<Spec> specs)
    : master_(master), specs_(std::move(specs)), admin_(MasterStub(master)) {}

Result<std::unique_ptr<FakeSegments>> FakeSegments::Mount(const std::string& master,
                                                          std::vector<Spec> specs) {
  std::unique_ptr<FakeSegments> fake(new FakeSegments(master, {}));
  for (auto& spec : specs) {
    proto::MountSegmentRequest req;
    req.set_client_id(spec.node);
    req.mutable_segment()->set_name(spec.segment);
    req.mutable_segment()->set_size(spec.size);
    req.mutable_segment()->set_endpoint("127.0.0.1:1");
    req.mutable_segment()->set_fresh(true);  // metadata only: nothing to quarantine
    proto::MountSegmentResponse resp;
    grpc::Status s = fake->admin_->MountSegment(RpcContext(kDeadlineMs).get(), req, &resp);
    if (!s.ok() || resp.code() != 0) {
      return Status(ErrorCode::RPC_FAIL, "mount of " + spec.segment + " failed: " +
                                             s.error_message() + " " + resp.message());
    }
    fake->specs_.push_back(std::move(spec));  // unmounted by the destructor from here on
  }
  fake->pinger_ = std::thread([f = fake.get()] {
    auto stub = MasterStub(f->master_);
    while (!f->done_) {
      for (const auto& spec : f->specs_) {
        proto::PingRequest req;
        req.set_client_id(spec.node);
        proto::PingResponse resp;
        (void)stub->Ping(RpcContext(kDeadlineMs).get(), req, &resp);
      }
      for (int i = 0; i < 10 && !f->done_; ++i) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
      }
    }
  });
  return fake;
}

FakeSegments::~FakeSegments() {
  done_ = true;
  if (pinger_.joinable()) pinger_.join();
  Unmount();
}

void FakeSegments::Unmount() {
  for (const auto& spec : specs_) {
    proto::UnmountSegmentRequest req;
    req.set_client_id(spec.node);
    req.set_name(spec.segment);
    proto::UnmountSegmentResponse resp;
    (void)admin_->UnmountSegment(RpcContext(kDeadlineMs).get(), req, &resp);
  }
}

}  // namespace granary::bench
