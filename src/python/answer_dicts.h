// python/answer_dicts.h - what a client answers (its counters, an object's status, the segments,
// the drains, the HA cluster) as the dicts and lists of dicts the Python calls return.
//
// Promise: each is a copy, built with the GIL held; the keys are the documented ones
// (docs/python.md). Thread safety: call with the GIL held.
#pragma once

#include <pybind11/pybind11.h>

#include <vector>

#include "granary/client.h"

namespace granary::python {

// Client::Stats, as Store.stats() returns it.
pybind11::dict StatsDict(const ClientStats& stats);
// Client::Stat: the object's state, size, checksum, memory and disk replicas, locks and pins.
pybind11::dict StatDict(const ObjectStat& stat);
pybind11::list SegmentsList(const std::vector<SegmentStatus>& segments);
pybind11::list DrainsList(const std::vector<DrainStatus>& drains);
// Who leads the HA cluster and how far each standby is; for a master alone, ha is False.
pybind11::dict ClusterDict(const ClusterStatus& status);

}  // namespace granary::python
