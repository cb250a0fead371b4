#!/usr/bin/env python3
"""Writes deploy/grafana/granary.json, the Grafana dashboard of a Granary store.

The dashboard is kept as this script (readable, one line per panel) and as the JSON it writes
(what Grafana imports). Edit the script, run it, commit both:

    python3 deploy/grafana/make_dashboard.py            # rewrites granary.json next to it
    python3 deploy/grafana/make_dashboard.py --check    # exit 1 if granary.json is not current

The data source is a template variable (`datasource`), so the file imports into any Grafana with
a Prometheus data source. `cluster` and `node` filter by the labels deploy/prometheus.yml sets.
Cluster-wide gauges of the masters are read with max(): standbys export the replicated state too.
"""
import argparse
import json
import os
import sys

DS = {"type": "prometheus", "uid": "${datasource}"}
M = 'cluster=~"$cluster"'                        # master series
N = 'cluster=~"$cluster", instance=~"$node"'     # node series
R = "$__rate_interval"


def target(expr, legend="", ref="A"):
    return {"datasource": DS, "expr": expr, "legendFormat": legend, "refId": ref}


class Board:
    """Lays panels out left to right in rows of 24 grid units."""

    def __init__(self):
        self.panels = []
        self.next_id = 1
        self.x = 0
        self.y = 0
        self.row_h = 0

    def _id(self):
        self.next_id += 1
        return self.next_id - 1

    def row(self, title):
        self._newline()
        self.panels.append({"type": "row", "title": title, "id": self._id(), "collapsed": False,
                            "gridPos": {"x": 0, "y": self.y, "w": 24, "h": 1}, "panels": []})
        self.y += 1

    def _newline(self):
        if self.x:
            self.y += self.row_h
            self.x = 0
            self.row_h = 0

    def _place(self, w, h):
        if self.x + w > 24:
            self._newline()
        pos = {"x": self.x, "y": self.y, "w": w, "h": h}
        self.x += w
        self.row_h = max(self.row_h, h)
        return pos

    def panel(self, kind, title, targets, unit="short", w=8, h=8, description="", **options):
        refs = "ABCDEFGH"
        targets = [dict(t, refId=refs[i]) for i, t in enumerate(targets)]
        p = {"type": kind, "title": title, "id": self._id(), "datasource": DS,
             "gridPos": self._place(w, h), "targets": targets,
             "fieldConfig": {"defaults": {"unit": unit}, "overrides": []}}
        if description:
            p["description"] = description
        if kind == "timeseries":
            p["options"] = {"legend": {"displayMode": "list", "placement": "bottom"},
                            "tooltip": {"mode": "multi", "sort": "desc"}}
        if kind == "stat":
            p["options"] = {"reduceOptions": {"calcs": ["lastNotNull"], "fields": "",
                                              "values": False},
                            "colorMode": "value", "graphMode": "area", "textMode": "auto"}
        p["options"] = dict(p.get("options", {}), **options)
        self.panels.append(p)

    def ts(self, title, targets, unit="short", w=8, h=8, description=""):
        self.panel("timeseries", title, targets, unit, w, h, description)

    def stat(self, title, targets, unit="short", w=4, h=4, description=""):
        self.panel("stat", title, targets, unit, w, h, description)


def quantiles(metric, sel, by="", qs=(0.5, 0.99), legend_by=""):
    """histogram_quantile targets of a histogram, one per quantile."""
    group = "le" + (", " + by if by else "")
    return [target(f"histogram_quantile({q}, sum by ({group}) (rate({metric}_bucket{{{sel}}}[{R}])))",
                   f"p{int(q * 100)} {legend_by}".strip())
            for q in qs]


def build():
    b = Board()

    b.row("Cluster")
    b.stat("Masters up", [target(f'sum(up{{job="granary-master", {M}}})')])
    b.stat("Nodes up", [target(f'sum(up{{job="granary-node", {M}}})')])
    b.stat("Objects", [target(f"max(granary_master_objects{{{M}}})")])
    b.stat("Segments", [target(f"max(granary_master_segments{{{M}}})")])
    b.stat("Clients and nodes", [target(f"max(granary_master_clients{{{M}}})")],
           description="Live clients and nodes heartbeating the leader.")
    b.stat("Memory used", [target(f"max(granary_master_used_bytes{{{M}}}) / "
                                  f"max(granary_master_capacity_bytes{{{M}}})")], unit="percentunit")
    b.ts("Memory used and capacity", [
        target(f"max(granary_master_used_bytes{{{M}}})", "used"),
        target(f"max(granary_master_capacity_bytes{{{M}}})", "capacity"),
        target(f"max(granary_master_reserved_bytes{{{M}}})", "reserved for puts")], unit="bytes")
    b.ts("Usage per segment", [
        target(f"1 - max by (segment) (granary_segment_free_bytes{{{M}}}) / "
               f"max by (segment) (granary_segment_capacity_bytes{{{M}}})", "{{segment}}")],
        unit="percentunit",
        description="Eviction keeps each segment under --eviction-high-watermark (0.9).")
    b.ts("Fragmentation per segment", [
        target(f"max by (segment) (granary_segment_fragmentation_ratio{{{M}}})", "{{segment}}")],
        unit="percentunit", description="1 - largest free block / free bytes.")

    b.row("Cache")
    hits = f'granary_master_gets_total{{{M}, outcome=~"memory_hit|disk_hit"}}'
    gets = f"granary_master_gets_total{{{M}}}"
    b.ts("Hit rate", [
        target(f"sum(rate({hits}[{R}])) / sum(rate({gets}[{R}]))", "hit rate"),
        target(f'sum(rate(granary_master_gets_total{{{M}, outcome="memory_hit"}}[{R}])) / '
               f"sum(rate({gets}[{R}]))", "from memory"),
        target(f'sum(rate(granary_master_gets_total{{{M}, outcome="disk_hit"}}[{R}])) / '
               f"sum(rate({gets}[{R}]))", "from disk")],
        unit="percentunit",
        description="(memory hits + disk hits) / all gets, as the leader counts them.")
    b.ts("Gets by outcome", [
        target(f"sum by (outcome) (rate({gets}[{R}]))", "{{outcome}}")], unit="ops")
    b.ts("Hit bytes by tier", [
        target(f"sum by (tier) (rate(granary_master_get_hit_bytes_total{{{M}}}[{R}]))",
               "{{tier}}")], unit="Bps", description="Bytes served by hits: prefill not redone.")
    b.ts("Puts and put bytes", [
        target(f"sum(rate(granary_master_puts_total{{{M}}}[{R}]))", "puts/s"),
        target(f"sum(rate(granary_master_put_bytes_total{{{M}}}[{R}]))", "put bytes/s")],
        unit="short",
        description="Keys whose put the leader started or committed, and their bytes (what "
                    "granary top shows as puts/s and write throughput).")
    b.ts("Prefix match length", quantiles("granary_master_prefix_match_keys", M,
                                          qs=(0.5, 0.9, 0.99)),
         description="Keys of a batched existence check found before the first miss.")
    b.ts("Evictions by reason", [
        target(f"sum by (reason) (rate(granary_master_evictions_total{{{M}}}[{R}]))",
               "{{reason}}")], unit="ops")
    b.ts("Evicted bytes and demotions", [
        target(f"sum(rate(granary_master_evicted_bytes_total{{{M}}}[{R}]))", "evicted bytes/s"),
        target(f"sum by (outcome) (rate(granary_master_demotions_total{{{M}}}[{R}]))",
               "demotions {{outcome}}/s")], unit="short",
        description="Demotions: objects evicted from memory that keep (or fail to keep) a disk copy.")

    b.row("Throughput (master)")
    b.ts("RPCs by method", [
        target(f"sum by (method) (rate(granary_master_rpc_total{{{M}}}[{R}]))", "{{method}}")],
        unit="reqps")
    b.ts("RPC latency p99 by method",
         quantiles("granary_master_rpc_seconds", M, by="method", qs=(0.99,),
                   legend_by="{{method}}"), unit="s")
    b.ts("RPC latency p50 by method",
         quantiles("granary_master_rpc_seconds", M, by="method", qs=(0.5,),
                   legend_by="{{method}}"), unit="s")
    b.ts("Keys by method", [
        target(f"sum by (method) (rate(granary_master_rpc_keys_total{{{M}}}[{R}]))",
               "{{method}}")], unit="ops")
    b.ts("Keys answered with an error", [
        target(f"sum by (method) (rate(granary_master_rpc_key_errors_total{{{M}}}[{R}]))",
               "{{method}}")], unit="ops")
    b.ts("Fast-port connections", [
        target(f"sum by (instance) (granary_master_fast_connections{{{M}}})", "{{instance}}")])

    b.row("Nodes")
    b.ts("Requests by node and op", [
        target(f"sum by (instance, op) (rate(granary_node_requests_total{{{N}}}[{R}]))",
               "{{instance}} {{op}}")], unit="reqps")
    b.ts("Bytes by node and op", [
        target(f"sum by (instance, op) (rate(granary_node_bytes_total{{{N}}}[{R}]))",
               "{{instance}} {{op}}")], unit="Bps")
    b.ts("Request latency by op", quantiles("granary_node_request_seconds", N, by="op",
                                            qs=(0.5, 0.99), legend_by="{{op}}"), unit="s")
    b.ts("Errors by node and reason", [
        target(f"sum by (instance, reason) (rate(granary_node_request_errors_total{{{N}}}[{R}]))",
               "{{instance}} {{reason}}")], unit="ops")
    b.ts("Connections", [
        target(f"sum by (instance) (granary_node_connections{{{N}}})", "{{instance}} open"),
        target(f"sum by (instance) (rate(granary_node_connections_total{{{N}}}[{R}]))",
               "{{instance}} accepted/s")])
    b.ts("Segment capacity by node", [
        target(f"sum by (instance) (granary_node_segment_capacity_bytes{{{N}}})",
               "{{instance}}")], unit="bytes")
    b.ts("Disk tier usage", [
        target(f"sum by (instance) (granary_node_disk_used_bytes{{{N}}}) / "
               f"sum by (instance) (granary_node_disk_capacity_bytes{{{N}}})", "{{instance}}")],
        unit="percentunit")
    b.ts("Disk objects", [
        target(f"sum by (instance) (granary_node_disk_objects{{{N}}})", "{{instance}}")])
    b.ts("Offloads, promotions, disk evictions", [
        target(f"sum(rate(granary_node_offloaded_objects_total{{{N}}}[{R}]))", "offloaded"),
        target(f"sum(rate(granary_node_promoted_objects_total{{{N}}}[{R}]))", "promoted"),
        target(f"sum(rate(granary_node_disk_evicted_objects_total{{{N}}}[{R}]))",
               "evicted from disk")], unit="ops")
    b.ts("Offloaded bytes", [
        target(f"sum by (instance) (rate(granary_node_offloaded_bytes_total{{{N}}}[{R}]))",
               "{{instance}}")], unit="Bps")

    b.row("Re-replication")
    b.stat("Draining segments", [target(f"max(granary_master_draining_segments{{{M}}})")])
    b.stat("Backlog objects", [target(f"max(granary_master_rereplication_backlog_objects{{{M}}})")])
    b.stat("Backlog bytes", [target(f"max(granary_master_rereplication_backlog_bytes{{{M}}})")],
           unit="bytes")
    b.ts("Backlog", [
        target(f"max(granary_master_rereplication_backlog_objects{{{M}}})", "objects"),
        target(f"max(granary_master_rereplication_backlog_bytes{{{M}}})", "bytes")],
        description="Objects below their replica count, waiting for a copy.")
    b.ts("Re-replicated", [
        target(f"max(rate(granary_master_rereplicated_objects_total{{{M}}}[{R}]))", "objects/s"),
        target(f"max(rate(granary_master_rereplicated_bytes_total{{{M}}}[{R}]))", "bytes/s")],
        description="Bounded by --rereplicate-mbps. max, not sum: standbys replay the same "
                    "copies.")
    b.stat("Copies in flight", [target(f"max(granary_master_replica_copies_in_flight{{{M}}})")])
    b.ts("Copies by node", [
        target(f"sum by (instance) (rate(granary_node_rereplicated_bytes_total{{{N}}}[{R}]))",
               "{{instance}}"),
        target(f"sum by (instance) (rate(granary_node_rereplication_failures_total{{{N}}}[{R}]))",
               "{{instance}} failures")],
        description="Bytes each node copied into its segment; failures: no source gave the "
                    "right bytes (the master hands the object out again).")

    b.row("High availability")
    b.ts("Leader", [
        target(f"max by (instance) (granary_master_ha_leader{{{M}}})", "{{instance}}")],
        description="1 while a master serves as the leader; exactly one should.")
    b.stat("Term", [target(f"max(granary_master_ha_term{{{M}}})")])
    b.stat("Serving alone", [target(f"max(granary_master_ha_serving_alone{{{M}}})")],
           description="1: the leader has no synchronous standby; a failover may lose puts.")
    b.ts("Standby lag (operations)", [
        target(f"max by (standby) (granary_master_ha_standby_lag{{{M}}})", "{{standby}}"),
        target(f"max by (instance) (granary_master_ha_follower_lag{{{M}}})",
               "{{instance}} (own view)")])
    b.ts("Elections and step-downs", [
        target(f"sum(increase(granary_master_ha_elections_won_total{{{M}}}[{R}]))", "elections won"),
        target(f"sum(increase(granary_master_ha_step_downs_total{{{M}}}[{R}]))", "step-downs")])

    b.row("Tenants")
    b.ts("Bytes by tenant", [
        target(f"max by (tenant) (granary_master_tenant_bytes{{{M}}})", "{{tenant}}")],
        unit="bytes")
    b.ts("Objects by tenant", [
        target(f"max by (tenant) (granary_master_tenant_objects{{{M}}})", "{{tenant}}")])
    b.ts("Quota used", [
        target(f"max by (tenant) (granary_master_tenant_bytes{{{M}}}) / "
               f"(max by (tenant) (granary_master_tenant_quota_bytes{{{M}}}) > 0)", "{{tenant}}")],
        unit="percentunit", description="Tenants with a quota only.")
    b.ts("Quota refusals", [
        target(f"sum by (tenant) (rate(granary_master_tenant_quota_refusals_total{{{M}}}[{R}]))",
               "{{tenant}}")], unit="ops")
    b.ts("Hit rate by tenant", [
        target(f'sum by (tenant) (rate(granary_master_tenant_gets_total{{{M}, '
               f'outcome=~"memory_hit|disk_hit"}}[{R}])) / '
               f"sum by (tenant) (rate(granary_master_tenant_gets_total{{{M}}}[{R}]))",
               "{{tenant}}")], unit="percentunit")
    return b.panels


def variable_query(name, label, query, multi):
    return {"name": name, "label": label, "type": "query", "datasource": DS,
            "definition": query, "query": {"query": query, "refId": f"{name}-query"},
            "refresh": 2, "sort": 1, "multi": multi, "includeAll": True, "allValue": ".*",
            "current": {"selected": True, "text": "All", "value": "$__all"}, "hide": 0,
            "options": [], "regex": ""}


def dashboard():
    return {
        "title": "Granary",
        "uid": "granary-store",
        "description": "A Granary KV-cache store: capacity, hit rate, masters, nodes, "
                       "re-replication, HA, tenants (docs/operations.md).",
        "tags": ["granary", "kv-cache"],
        "editable": True,
        "graphTooltip": 1,
        "schemaVersion": 39,
        "version": 1,
        "refresh": "30s",
        "time": {"from": "now-6h", "to": "now"},
        "timepicker": {},
        "timezone": "",
        "annotations": {"list": []},
        "links": [],
        "templating": {"list": [
            {"name": "datasource", "label": "Data source", "type": "datasource",
             "query": "prometheus", "current": {}, "hide": 0, "refresh": 1, "regex": "",
             "options": []},
            variable_query("cluster", "Cluster", "label_values(granary_master_segments, cluster)",
                           False),
            variable_query("node", "Node",
                           'label_values(granary_node_connections{cluster=~"$cluster"}, instance)',
                           True),
        ]},
        "panels": build(),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--check", action="store_true",
                        help="exit 1 if granary.json differs from what this script writes")
    parser.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)),
                                                      "granary.json"))
    args = parser.parse_args()
    text = json.dumps(dashboard(), indent=2) + "\n"
    if args.check:
        with open(args.out, encoding="utf-8") as f:
            if f.read() != text:
                print(f"{args.out} is not current: run {sys.argv[0]}", file=sys.stderr)
                return 1
        return 0
    with open(args.out, "w", encoding="utf-8") as f:
        f.write(text)
    print(f"wrote {args.out} ({len(text)} bytes)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
