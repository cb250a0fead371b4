#!/usr/bin/env python3
"""Where an online policy loses to Belady on a trace (issue 25): which use of a block each hit is,
under Belady and under a plain S3-FIFO model, and how soon new blocks are reused by put-batch
class. The master's own policies are judged by `granary-bench trace --simulate`; this script
only explains the gap. Blocks are the trace's hash ids (512 tokens each); capacity in tokens.

    python3 bench/trace_study.py [--trace ../shared/workloads/conversation_trace.jsonl]
        [--capacity-tokens 1000000,3000000]
"""

import argparse
import collections
import heapq
import json

INF = 1 << 62


def load(path):
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def tally(r, k, uses, by_use):
    """Counts a request whose first k blocks hit: each block's use, and which use each hit is.
    Returns the hit tokens."""
    for j, b in enumerate(r["hash_ids"]):
        uses[b] += 1
        if j < k:
            by_use[min(uses[b], 6)] += 1
    return min(k * 512, r["input_length"])


def belady(reqs, cap):
    """Evicts the block used farthest ahead; admits nothing used later than all it holds."""
    nextuse, last = [None] * len(reqs), {}
    for i in range(len(reqs) - 1, -1, -1):
        nextuse[i] = [last.get(b, INF) for b in reqs[i]["hash_ids"]]
        for b in reqs[i]["hash_ids"]:
            last[b] = i
    cache, heap = {}, []
    hits, uses, by_use = 0, collections.Counter(), collections.Counter()
    for i, r in enumerate(reqs):
        h, nu = r["hash_ids"], nextuse[i]
        k = 0
        while k < len(h) and h[k] in cache:
            k += 1
        hits += tally(r, k, uses, by_use)
        for j, b in enumerate(h):
            if b in cache:
                cache[b] = nu[j]
                heapq.heappush(heap, (-nu[j], b))
                continue
            if nu[j] == INF:
                continue
            while len(cache) >= cap:
                far, v = heap[0]
                if cache.get(v) == -far:
                    if -far <= nu[j]:
                        break
                    heapq.heappop(heap)
                    del cache[v]
                else:
                    heapq.heappop(heap)
            if len(cache) < cap:
                cache[b] = nu[j]
                heapq.heappush(heap, (-nu[j], b))
    return hits, by_use


def s3fifo(reqs, cap):
    """A plain S3-FIFO model (10% probation, ghost of 4x, up to 3 reads in main)."""
    small, main, ghost, freq = collections.OrderedDict(), collections.OrderedDict(), \
        collections.OrderedDict(), {}

    def evict():
        if len(small) > cap // 10 or not main:
            b, _ = small.popitem(last=False)
            if freq.get(b, 0) > 0:
                main[b] = None
                freq[b] = 0
                return
            ghost[b] = None
            if len(ghost) > 4 * cap:
                ghost.popitem(last=False)
            freq.pop(b, None)
            return
        while True:
            b, _ = main.popitem(last=False)
            if freq.get(b, 0) > 0:
                freq[b] -= 1
                main[b] = None
            else:
                freq.pop(b, None)
                return

    hits, uses, by_use = 0, collections.Counter(), collections.Counter()
    for r in reqs:
        h = r["hash_ids"]
        k = 0
        while k < len(h) and (h[k] in small or h[k] in main):
            k += 1
        hits += tally(r, k, uses, by_use)
        for b in h[:k]:
            freq[b] = min(freq.get(b, 0) + 1, 3)
        for b in h[k:]:
            if b in small or b in main:
                continue
            while len(small) + len(main) >= cap:
                evict()
            if b in ghost:
                del ghost[b]
                main[b] = None
            else:
                small[b] = None
            freq[b] = 0
    return hits, by_use


def reuse_by_class(reqs):
    """New blocks by put-batch class: share reused at all, within 60 s and within 180 s."""
    first_reuse, seen_at = {}, {}
    for r in reqs:
        for b in r["hash_ids"]:
            if b in seen_at:
                first_reuse.setdefault(b, r["timestamp"])
            else:
                seen_at[b] = r["timestamp"]
    seen, table = set(), collections.defaultdict(lambda: [0, 0, 0, 0])
    for r in reqs:
        h, t = r["hash_ids"], r["timestamp"]
        k = 0
        while k < len(h) and h[k] in seen:
            k += 1
        new = [b for b in h[k:] if b not in seen]
        n = len(new)
        for idx, b in enumerate(new):
            if n > 1 and idx == n - 1:
                cls = "tail of a batch"
            elif n == 1:
                cls = "single-key put"
            elif n <= 8:
                cls = "batch of 2-8"
            elif n <= 32:
                cls = "batch of 9-32"
            else:
                cls = "batch of 33+"
            row = table[("prefix hit <= 1 block" if k <= 1 else "prefix hit >= 2 blocks", cls)]
            row[0] += 1
            g = first_reuse.get(b)
            if g is not None:
                row[1] += 1
                row[2] += g - t <= 60_000
                row[3] += g - t <= 180_000
        seen.update(h)
    return table


def reuse_gaps(reqs, caps):
    """Of the hits an infinite cache gets (block 0, the shared root, left out): the share whose
    block was last used fewer than `cap` new blocks ago, for each capacity in blocks."""
    seen, last_new, new_count, gaps = set(), {}, 0, []
    for r in reqs:
        h = r["hash_ids"]
        k = 0
        while k < len(h) and h[k] in seen:
            k += 1
        gaps += [new_count - last_new[b] for b in h[:k] if b != 0]
        for b in h:
            if b not in seen:
                new_count += 1
                seen.add(b)
            last_new[b] = new_count
    return {cap: sum(g < cap for g in gaps) / len(gaps) for cap in caps}, sorted(gaps)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--trace", default="../shared/workloads/conversation_trace.jsonl")
    ap.add_argument("--capacity-tokens", default="1000000,3000000")
    args = ap.parse_args()
    reqs = load(args.trace)
    total = sum(r["input_length"] for r in reqs)
    print(f"{args.trace}: {len(reqs)} requests")
    print("block hits by which use of the block they are (6 = sixth or later):")
    for cap_tokens in (int(c) for c in args.capacity_tokens.split(",")):
        for name, fn in (("belady", belady), ("s3fifo model", s3fifo)):
            hits, by_use = fn(reqs, cap_tokens // 512)
            uses = "  ".join(f"{u}: {by_use[u]:6d}" for u in range(2, 7))
            print(f"  {cap_tokens:>9} tokens  {name:13} hit rate {hits / total:.4f}  {uses}")
    caps = [int(c) // 512 for c in args.capacity_tokens.split(",")]
    shares, gaps = reuse_gaps(reqs, caps)
    print(f"reuse distance of an infinite cache's hits, in new blocks put between: median "
          f"{gaps[len(gaps) // 2]}; " + ", ".join(
              f"{100 * v:.1f}% under {cap} (the capacity)" for cap, v in shares.items()))
    print("new blocks by put batch: share reused later, within 60 s, within 180 s:")
    for key, (n, reused, in60, in180) in sorted(reuse_by_class(reqs).items()):
        print(f"  {key[0]:23} {key[1]:16} {n:7d} blocks  {reused / n:5.2f}  {in60 / n:5.2f}"
              f"  {in180 / n:5.2f}")


if __name__ == "__main__":
    main()
