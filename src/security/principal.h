// security/principal.h - who a caller is, once its secret was recognised: a role and a tenant.
//
// Promise: three roles, each a superset of the next but one (docs/security.md):
// - kAdmin (--admin-token-file; the cluster's secret too where no admin secret is set): every
//   call, including those that span tenants or override safeguards (RemoveAll and RemoveByRegex
//   over every namespace, forced removal).
// - kMember (the cluster's secret, --auth-token-file): what nodes, standbys and trusted clients
//   do: mount and unmount segments, report disks, offload and promote (which handle every
//   tenant's objects as the master holds them), stream the history, and every object call in
//   the default namespace. Members are not told apart from each other: one may name another's
//   client id (docs/security.md).
// - kTenant (a token of --tenants-file): object calls inside the tenant's own namespace, within
//   its quota; nothing that touches segments, disks or the history.
// A master that asks for no secret treats every caller as kAdmin in the default namespace.
// Ownership: a Principal is a value; the authenticator owns those it hands out by pointer.
// Thread safety: immutable once made.
#pragma once

#include <cstdint>
#include <string>

namespace granary::security {

struct Principal {
  enum class Role : uint8_t { kAdmin, kMember, kTenant };
  Role role = Role::kAdmin;
  std::string tenant;  // "" for the default namespace (admin and member)
  uint64_t quota_bytes = 0;  // kTenant only; 0: none

  bool admin() const { return role == Role::kAdmin; }
  bool tenant_only() const { return role == Role::kTenant; }
  const char* role_name() const {
    return role == Role::kAdmin ? "admin" : role == Role::kMember ? "member" : "tenant";
  }
};

}  // namespace granary::security
