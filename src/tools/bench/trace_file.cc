#include "tools/bench/trace_file.h"

#include <fstream>
#include <nlohmann/json.hpp>

namespace granary::bench {

Result<std::vector<TraceRequest>> LoadTrace(const std::string& path, uint64_t limit) {
  std::ifstream in(path);
  if (!in) return Status(ErrorCode::INVALID_PARAMS, "cannot open trace " + path);
  std::vector<TraceRequest> requests;
  std::string line;
  size_t line_no = 0;
  while (std::getline(in, line) && (limit == 0 || requests.size() < limit)) {
    ++line_no;
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.contains("input_length") || !j.contains("hash_ids") ||
        !j["hash_ids"].is_array() || !j["input_length"].is_number_unsigned()) {
      return Status(ErrorCode::INVALID_PARAMS,
                    path + ":" + std::to_string(line_no) + ": not a trace record");
    }
    TraceRequest r;
    r.input_length = j["input_length"].get<uint64_t>();
    if (j.contains("timestamp") && j["timestamp"].is_number_unsigned()) {
      r.timestamp_ms = j["timestamp"].get<uint64_t>();
    }
    for (const auto& id : j["hash_ids"]) {
      if (!id.is_number_unsigned()) {
        return Status(ErrorCode::INVALID_PARAMS,
                      path + ":" + std::to_string(line_no) + ": hash id is not a number");
      }
      r.hash_ids.push_back(id.get<uint64_t>());
    }
    if (r.hash_ids.empty()) continue;
    requests.push_back(std::move(r));
  }
  return requests;
}

}  // namespace granary::bench
