// python/answer_dicts.cc - see answer_dicts.h.
#include "python/answer_dicts.h"

namespace py = pybind11;

namespace granary::python {

py::dict StatsDict(const ClientStats& s) {
  py::dict d;
  d["shm_bytes_written"] = s.shm_bytes_written;
  d["shm_bytes_read"] = s.shm_bytes_read;
  d["tcp_bytes_written"] = s.tcp_bytes_written;
  d["tcp_bytes_read"] = s.tcp_bytes_read;
  d["shm_mappings"] = s.shm_mappings;
  d["disk_bytes_read"] = s.disk_bytes_read;
  d["disk_bytes_read_shm"] = s.disk_bytes_read_shm;
  d["shm_bytes_warmed"] = s.shm_bytes_warmed;
  d["shm_bytes_warm_pending"] = s.shm_bytes_warm_pending;
  d["shm_warm_ns"] = s.shm_warm_ns;
  d["reserved_puts"] = s.reserved_puts;
  d["reservations_held"] = s.reservations_held;
  d["cached_gets"] = s.cached_gets;
  return d;
}

py::dict StatDict(const ObjectStat& s) {
  py::list replicas;
  for (const auto& r : s.replicas) {
    py::dict d;
    d["segment"] = r.segment_name;
    d["endpoint"] = r.endpoint;
    d["offset"] = r.offset;
    d["length"] = r.length;
    replicas.append(d);
  }
  py::list disk;
  for (const auto& r : s.disk_replicas) {
    py::dict d;
    d["node_id"] = r.node_id;
    d["endpoint"] = r.endpoint;
    d["location"] = r.location;
    d["length"] = r.length;
    disk.append(d);
  }
  py::dict d;
  d["state"] = s.state;
  d["size"] = s.size;
  d["checksum"] = s.checksum;
  d["replicas"] = replicas;
  d["disk_replicas"] = disk;
  d["read_locks"] = s.read_locks;
  d["hard_pinned"] = s.hard_pinned;
  d["soft_pinned"] = s.soft_pinned;
  d["idle_ms"] = s.idle_ms;
  d["want_replicas"] = s.want_replicas;
  d["copying"] = s.copying;
  return d;
}

py::list SegmentsList(const std::vector<SegmentStatus>& segments) {
  py::list out;
  for (const auto& s : segments) {
    py::dict d;
    d["name"] = s.name;
    d["node_id"] = s.node_id;
    d["endpoint"] = s.endpoint;
    d["size"] = s.size;
    d["used_bytes"] = s.used_bytes;
    d["free_bytes"] = s.free_bytes;
    d["largest_free_block"] = s.largest_free_block;
    d["objects"] = s.replicas;
    d["disk_capacity"] = s.disk_capacity;
    d["disk_used"] = s.disk_used;
    d["disk_objects"] = s.disk_objects;
    d["draining"] = s.draining;
    d["drain_remaining_objects"] = s.drain_remaining_objects;
    d["drain_remaining_bytes"] = s.drain_remaining_bytes;
    out.append(d);
  }
  return out;
}

py::list DrainsList(const std::vector<DrainStatus>& drains) {
  py::list out;
  for (const auto& d : drains) {
    py::dict e;
    e["segment"] = d.segment;
    e["drop"] = d.drop;
    e["done"] = d.done;
    e["start_unix_ms"] = d.start_unix_ms;
    e["remaining_objects"] = d.remaining_objects;
    e["remaining_bytes"] = d.remaining_bytes;
    out.append(e);
  }
  return out;
}

py::dict ClusterDict(const ClusterStatus& s) {
  py::list standbys;
  for (const auto& st : s.standbys) {
    py::dict d;
    d["id"] = st.id;
    d["address"] = st.address;
    d["connected"] = st.connected;
    d["synchronous"] = st.synchronous;
    d["acked_seq"] = st.acked_seq;
    d["lag"] = st.lag;
    standbys.append(d);
  }
  py::dict d;
  d["ha"] = s.ha;
  d["cluster_id"] = s.cluster_id;
  d["leader_id"] = s.leader_id;
  d["leader_address"] = s.leader_address;
  d["term"] = s.term;
  d["applied_seq"] = s.applied_seq;
  d["serving_alone"] = s.serving_alone;
  d["standbys"] = standbys;
  d["caller_role"] = s.caller_role;
  d["caller_tenant"] = s.caller_tenant;
  py::list tenants;
  for (const auto& t : s.tenants) {
    py::dict td;
    td["name"] = t.name;
    td["bytes"] = t.bytes;
    td["objects"] = t.objects;
    td["quota_bytes"] = t.quota_bytes;
    tenants.append(td);
  }
  d["tenants"] = tenants;
  return d;
}

}  // namespace granary::python
