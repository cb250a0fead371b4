// master/service/master_service_auth.cc - who a call's caller is (security/principal.h), and
// what its role and tenant allow: the namespace its keys live in, its quota, refusals.
#include <algorithm>

#include "common/units.h"
#include "master/service/master_service.h"
#include "proto/rpc_util.h"

namespace granary::master {

namespace {
thread_local const security::Principal* t_fast_caller = nullptr;
const std::string kNoPrefix;
}  // namespace

MasterService::FastCaller::FastCaller(const security::Principal* who) : previous_(t_fast_caller) {
  t_fast_caller = who;
}
MasterService::FastCaller::~FastCaller() { t_fast_caller = previous_; }

void MasterService::set_authenticator(const security::Authenticator* auth) {
  auth_ = auth;
  tenants_.clear();
  if (auth_ == nullptr) return;
  for (const Principal& t : auth_->tenants()) {
    auto runtime = std::make_unique<TenantRuntime>();
    runtime->prefix = NamespacePrefix(t.tenant);
    runtime->quota_refusals = registry_->AddCounter(
        "granary_master_tenant_quota_refusals_total",
        "keys refused for passing their tenant's quota", {{"tenant", t.tenant}});
    const char* outcomes[kGetOutcomes] = {"memory_hit", "disk_hit", "miss"};
    for (size_t o = 0; o < kGetOutcomes; ++o) {
      runtime->gets[o] = registry_->AddCounter(
          "granary_master_tenant_gets_total",
          "a tenant's keys answered by BatchGetReplicaList, by outcome",
          {{"tenant", t.tenant}, {"outcome", outcomes[o]}});
    }
    tenants_.emplace(&t, std::move(runtime));
  }
}

Status MasterService::Authenticate(Ctx* ctx, const Principal** who) const {
  if (auth_ == nullptr || !auth_->required()) {
    *who = auth_ ? auth_->open() : nullptr;
    if (*who == nullptr) {
      static const Principal kOpen;  // an admin in the default namespace
      *who = &kOpen;
    }
    return Status::Ok();
  }
  if (ctx == nullptr) {  // the fast port: its connection said hello first
    if (t_fast_caller == nullptr) {
      return Status(ErrorCode::UNAUTHENTICATED, "a fast-port call without its connection's hello");
    }
    *who = t_fast_caller;
    return Status::Ok();
  }
  std::optional<std::string_view> presented;
  const auto& metadata = ctx->client_metadata();
  if (auto it = metadata.find(std::string(rpc::kAuthMetadataKey)); it != metadata.end()) {
    std::string_view value(it->second.data(), it->second.size());
    // Anything but the Bearer form counts as a wrong secret, not a missing one.
    presented = value.substr(0, rpc::kBearerPrefix.size()) == rpc::kBearerPrefix
                    ? value.substr(rpc::kBearerPrefix.size())
                    : std::string_view();
  }
  auto found = auth_->Identify(presented, "grpc", ctx->peer());
  if (!found.ok()) return found.status();
  *who = *found;
  return Status::Ok();
}

MasterService::TenantRuntime* MasterService::TenantOf(const Principal* who) const {
  if (!who->tenant_only()) return nullptr;
  auto it = tenants_.find(who);
  return it == tenants_.end() ? nullptr : it->second.get();
}

const std::string& MasterService::PrefixOf(const Principal* who) const {
  if (TenantRuntime* t = TenantOf(who)) return t->prefix;
  // A tenant this service was not told of (never, by construction) must not fall into the
  // default namespace: its keys get a prefix that no valid key can have.
  static const std::string kNowhere(2, kNamespaceMark);
  return who->tenant_only() ? kNowhere : kNoPrefix;
}

void MasterService::FitQuota(const Principal* who, TenantRuntime* t,
                             std::span<const uint64_t> sizes, std::vector<bool>* admitted,
                             std::vector<Status>* refused) const {
  admitted->assign(sizes.size(), true);
  refused->assign(sizes.size(), Status::Ok());
  if (t == nullptr || who->quota_bytes == 0) return;
  uint64_t used = static_cast<uint64_t>(std::max<int64_t>(state_->UsageOf(who->tenant).bytes, 0));
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] <= who->quota_bytes && used + sizes[i] <= who->quota_bytes) {
      used += sizes[i];
      continue;
    }
    (*admitted)[i] = false;
    (*refused)[i] = Status(ErrorCode::QUOTA_EXCEEDED,
                           "tenant " + who->tenant + " holds " + FormatSize(used) + " of its " +
                               FormatSize(who->quota_bytes) + " quota; this object needs " +
                               FormatSize(sizes[i]));
    t->quota_refusals->Inc();
  }
}

grpc::Status MasterService::Deny(const Principal* who, const char* call) {
  std::string why = std::string(call) + " is not for a " + who->role_name();
  if (who->tenant_only()) why += " (tenant " + who->tenant + ")";
  why += who->role == Principal::Role::kTenant
             ? ": tenants' tokens make object calls in their own namespace only"
             : ": it needs the admin's secret (--admin-token-file)";
  return rpc::ToGrpc(Status(ErrorCode::PERMISSION_DENIED, why));
}

}  // namespace granary::master
