#include "common/placement.h"

#include <sodium.h>

#include <nlohmann/json.hpp>

#include "common/format.h"

namespace rankscope::fleet {

std::string member_json(const Member& member) {
  return nlohmann::json{{"id", member.id},
                        {"agents", member.agents},
                        {"queries", member.queries},
                        {"metrics", member.metrics},
                        {"public_key", member.public_key},
                        {"version", member.version},
                        {"started_ns", member.started_ns}}
      .dump();
}

Result<Member> parse_member(std::string_view json) {
  auto parsed = nlohmann::json::parse(json, nullptr, false);
  if (parsed.is_discarded() || !parsed.is_object()) return make_error(Errc::protocol, "not a JSON object");
  Member out;
  for (auto [name, into] : {std::pair{"id", &out.id}, std::pair{"agents", &out.agents},
                            std::pair{"queries", &out.queries}, std::pair{"metrics", &out.metrics},
                            std::pair{"public_key", &out.public_key}, std::pair{"version", &out.version}}) {
    auto it = parsed.find(name);
    if (it == parsed.end()) continue;
    if (!it->is_string()) return make_error(Errc::protocol, std::string(name) + " is not a string");
    *into = it->get<std::string>();
  }
  if (auto it = parsed.find("started_ns"); it != parsed.end() && it->is_number_unsigned())
    out.started_ns = it->get<uint64_t>();
  if (out.id.empty() || out.queries.empty())
    return make_error(Errc::protocol, "a member record needs an id and a query endpoint");
  return out;
}

std::string placement_key(std::string_view job, uint64_t comm) {
  return job.empty() ? "comm:" + hex64(comm) : "job:" + std::string(job);
}

uint64_t rendezvous_score(std::string_view member_id, std::string_view key) {
  crypto_generichash_state state;
  crypto_generichash_init(&state, nullptr, 0, sizeof(uint64_t));
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(member_id.data()), member_id.size());
  const unsigned char separator = 0;  // ("ab", "c") and ("a", "bc") score apart
  crypto_generichash_update(&state, &separator, 1);
  crypto_generichash_update(&state, reinterpret_cast<const unsigned char*>(key.data()), key.size());
  unsigned char digest[sizeof(uint64_t)];
  crypto_generichash_final(&state, digest, sizeof digest);
  uint64_t score = 0;  // little-endian on every machine: agents and collectors of any architecture agree
  for (size_t i = 0; i < sizeof digest; ++i) score |= uint64_t{digest[i]} << (8 * i);
  return score;
}

const Member* owner(std::string_view key, const std::vector<Member>& members) {
  const Member* best = nullptr;
  uint64_t best_score = 0;
  for (const auto& member : members) {
    uint64_t score = rendezvous_score(member.id, key);
    // Ties (never in practice) go to the smaller id, so every reader agrees.
    if (!best || score > best_score || (score == best_score && member.id < best->id)) {
      best = &member;
      best_score = score;
    }
  }
  return best;
}

}  // namespace rankscope::fleet
