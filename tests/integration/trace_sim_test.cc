// granary-bench trace --simulate, the real binary: on a trace small enough to work out by hand,
// the offline references give the figures the hand gives, the master's policies stay at or below
// Belady's, and bad input is a clear error.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "process_harness.h"

namespace granary::it {
namespace {

// Runs a command line, returns its exit status and what it wrote to stdout and stderr.
int RunCommand(const std::string& command, std::string* output) {
  FILE* pipe = popen((command + " 2>&1").c_str(), "r");
  if (pipe == nullptr) return -1;
  char buffer[4096];
  size_t n;
  while ((n = fread(buffer, 1, sizeof buffer, pipe)) > 0) output->append(buffer, n);
  const int status = pclose(pipe);
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

// Four requests over blocks 1-4, three blocks each (1,500 tokens: the last block is partial).
// Infinite cache: r1 hits 1,2 (1,024 tokens), r2 and r3 hit everything (1,500 each): 4,024 of
// 6,000. Belady with two blocks keeps 1 and 2 (used by every request) and admits neither 3 nor
// 4, whose next uses are later: r1, r2 and r3 hit 1,024 tokens each, 3,072 of 6,000.
constexpr const char* kTrace =
    "{\"timestamp\": 0, \"input_length\": 1500, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 10, \"input_length\": 1500, \"hash_ids\": [1, 2, 4]}\n"
    "\n"
    "{\"timestamp\": 20, \"input_length\": 1500, \"hash_ids\": [1, 2, 3]}\n"
    "{\"timestamp\": 30, \"input_length\": 1500, \"hash_ids\": [1, 2, 4]}\n";

TEST(TraceSimulation, ReferencesMatchTheHandAndPoliciesStayBelowBelady) {
  TempDir dir("granary-trace-sim");
  const std::string trace = dir.WriteFile("trace.jsonl", kTrace);
  const std::string json = dir.File("sim.json");
  std::string output;
  ASSERT_EQ(RunCommand(BinaryPath("granary-bench") + " trace --simulate all --capacity-tokens 1024,2048 "
                    "--trace " + trace + " --json " + json,
                &output),
            0)
      << output;
  std::ifstream in(json);
  auto rows = nlohmann::json::parse(in);
  ASSERT_EQ(rows.size(), 10u) << rows.dump();  // 5 policies x 2 capacities
  std::map<std::pair<std::string, uint64_t>, double> rate;
  for (const auto& row : rows) {
    rate[{row["policy"], row["capacity_tokens"]}] = row["hit_rate"];
    EXPECT_EQ(row["requests"], 4u);
    // Two blocks of room cannot take a request's three at once; four can.
    if (row["capacity_tokens"] == 2048u) {
      EXPECT_EQ(row["put_failures"], 0u) << row.dump();
    }
  }
  EXPECT_DOUBLE_EQ((rate[{"infinite", 1024}]), 4024.0 / 6000);
  EXPECT_DOUBLE_EQ((rate[{"belady", 1024}]), 3072.0 / 6000);
  EXPECT_DOUBLE_EQ((rate[{"belady", 2048}]), 4024.0 / 6000) << "4 blocks hold them all";
  for (const char* policy : {"lru", "s3fifo", "prefix"}) {
    for (uint64_t capacity : {1024u, 2048u}) {
      EXPECT_LE((rate[{policy, capacity}]), (rate[{"belady", capacity}]) + 1e-12) << policy;
    }
    // Four blocks of room: the master's policies never need to evict, so they hit what an
    // infinite cache hits.
    EXPECT_DOUBLE_EQ((rate[{policy, 2048}]), 4024.0 / 6000) << policy;
  }
  EXPECT_NE(output.find("belady"), std::string::npos) << output;
}

// Two prompts of two full blocks each, taking turns 10 s apart: memory holds one prompt (1,024
// tokens), so each turn evicts the other and memory alone never hits. A disk tier of 4,096 tokens
// (four copies with their metadata) gets both copied (lazy offload: memory is above 80% between
// turns), so from the third request
// on every block is a hit, from disk or memory: what an infinite cache hits, 3,072 of 5,120
// tokens.
constexpr const char* kTurnsTrace =
    "{\"timestamp\": 0, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 10000, \"input_length\": 1024, \"hash_ids\": [3, 4]}\n"
    "{\"timestamp\": 20000, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n"
    "{\"timestamp\": 30000, \"input_length\": 1024, \"hash_ids\": [3, 4]}\n"
    "{\"timestamp\": 40000, \"input_length\": 1024, \"hash_ids\": [1, 2]}\n";

std::map<std::string, nlohmann::json> SimulateByPolicy(const std::string& args,
                                                       std::string* output) {
  TempDir dir("granary-trace-sim");
  const std::string trace = dir.WriteFile("turns.jsonl", kTurnsTrace);
  const std::string json = dir.File("sim.json");
  std::map<std::string, nlohmann::json> rows;
  const int rc = RunCommand(BinaryPath("granary-bench") + " trace --simulate all --trace " + trace +
                                " --capacity-tokens 1024 --json " + json + " " + args,
                            output);
  if (rc != 0) return rows;
  std::ifstream in(json);
  for (const auto& row : nlohmann::json::parse(in)) rows[row["policy"]] = row;
  return rows;
}

TEST(TraceSimulation, ADiskTierKeepsWhatMemoryEvicts) {
  std::string output;
  auto memory = SimulateByPolicy("", &output);
  ASSERT_EQ(memory.size(), 5u) << output;
  auto disk = SimulateByPolicy("--disk-tokens 4096", &output);
  ASSERT_EQ(disk.size(), 5u) << output;
  EXPECT_DOUBLE_EQ(disk["infinite"]["hit_rate"].get<double>(), 3072.0 / 5120);
  EXPECT_DOUBLE_EQ(disk["belady"]["hit_rate"].get<double>(), 3072.0 / 5120)
      << "belady's cache is memory and disk together";
  for (const char* policy : {"lru", "s3fifo", "prefix"}) {
    EXPECT_DOUBLE_EQ(memory[policy]["hit_rate"].get<double>(), 0.0) << policy;
    EXPECT_EQ(memory[policy]["disk_offloaded"], 0u) << policy;
    EXPECT_GE(disk[policy]["disk_offloaded"].get<uint64_t>(), 4u) << policy;
    // Requests 3 and 5 read blocks 1-2 from disk (and request 4 those of 3-4 the housekeeping
    // tick demoted).
    EXPECT_GE(disk[policy]["disk_reads"].get<uint64_t>(), 4u) << policy;
    EXPECT_EQ(disk[policy]["disk_evicted"], 0u) << policy;
    EXPECT_EQ(disk[policy]["disk_tokens"], 4096u) << policy;
    EXPECT_EQ(disk[policy]["disk_lost"], 0u) << policy << ": a read of a copy the disk dropped";
  }
  for (const char* policy : {"lru", "s3fifo"}) {
    EXPECT_DOUBLE_EQ(disk[policy]["hit_rate"].get<double>(), 3072.0 / 5120) << policy << output;
  }
  // prefix copies no unread tail of a batch (offload_planner.h): blocks 2 and 4 leave memory
  // uncopied, so requests 3 and 4 hit only their first block, and put the second alone (a
  // batch of one has no tail), which is copied: request 5 hits both. 512 + 512 + 1,024 tokens.
  EXPECT_DOUBLE_EQ(disk["prefix"]["hit_rate"].get<double>(), 2048.0 / 5120) << output;
  EXPECT_NE(output.find("read from disk"), std::string::npos) << output;
}

TEST(TraceSimulation, AFullDiskEvictsAndTellsTheMaster) {
  // Room on disk for one prompt's two copies, not both: the second prompt's offload evicts the
  // first's unit, and the master, told (DiskDrop), stops naming those copies: the third request
  // misses instead of reading a copy the disk no longer has.
  // The same whether the disk evicts whole units (fifo, lru-units) or copies (lru on buckets:
  // a copy's space back, its unit kept).
  for (const char* eviction : {"fifo", "lru-units", "lru"}) {
    std::string output;
    auto rows = SimulateByPolicy(std::string("--disk-tokens 1536 --disk-eviction ") + eviction, &output);
    ASSERT_EQ(rows.size(), 5u) << output;
    for (const char* policy : {"lru", "s3fifo", "prefix"}) {
      EXPECT_GT(rows[policy]["disk_evicted"].get<uint64_t>(), 0u) << eviction << " " << policy << output;
      EXPECT_EQ(rows[policy]["disk_lost"], 0u) << eviction << " " << policy << output;
    }
    // Below what each gets from a disk with room for all (ADiskTierKeepsWhatMemoryEvicts).
    for (const char* policy : {"lru", "s3fifo"}) {
      EXPECT_LT(rows[policy]["hit_rate"].get<double>(), 3072.0 / 5120) << eviction << " " << policy << output;
    }
    EXPECT_LT(rows["prefix"]["hit_rate"].get<double>(), 2048.0 / 5120) << eviction << output;
  }
}

TEST(TraceSimulation, AMalformedTraceOrUnknownPolicyIsAClearError) {
  TempDir dir("granary-trace-sim");
  const std::string bad = dir.WriteFile("bad.jsonl", "{\"timestamp\": 0, \"hash_ids\": \"x\"}\n");
  std::string output;
  EXPECT_EQ(RunCommand(BinaryPath("granary-bench") + " trace --simulate lru --trace " + bad, &output), 2);
  EXPECT_NE(output.find("bad.jsonl:1: not a trace record"), std::string::npos) << output;
  output.clear();
  EXPECT_NE(RunCommand(BinaryPath("granary-bench") + " trace --simulate arc --trace " + bad, &output), 0);
  EXPECT_NE(output.find("arc"), std::string::npos) << output;
  output.clear();
  EXPECT_EQ(RunCommand(BinaryPath("granary-bench") + " trace --simulate lru --trace " + dir.File("none"),
                &output),
            2);
  EXPECT_NE(output.find("cannot open trace"), std::string::npos) << output;
  output.clear();
  EXPECT_NE(RunCommand(BinaryPath("granary-bench") +
                           " trace --simulate lru --disk-tokens 2048 --disk-eviction mru",
                       &output),
            0);
  EXPECT_NE(output.find("mru"), std::string::npos) << output;
}

}  // namespace
}  // namespace granary::it
