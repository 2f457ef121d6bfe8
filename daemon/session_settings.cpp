#include "moeserve/daemon/session_settings.hpp"

#include <charconv>
#include <sstream>

namespace moeserve::daemon {

bool ValidReplicaName(const std::string& name) {
  if (name.empty() || name.size() > 32) return false;
  for (char c : name)
    if (!((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '-')) return false;
  return true;
}

Status ApplySessionSetting(SessionSettings& s, const std::string& key, const std::string& value,
                           const std::string& where) {
  auto bad = [&](const std::string& what) {
    return Fail(Error::InvalidArgument(where + ": " + key + ": " + what + " (got '" + value + "')"));
  };
  auto integer = [&](int64_t lo, int64_t hi, auto& out) -> Status {
    int64_t v = 0;
    auto [p, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || p != value.data() + value.size()) return bad("must be an integer");
    if (v < lo || v > hi) return bad("must be between " + std::to_string(lo) + " and " + std::to_string(hi));
    out = static_cast<std::remove_reference_t<decltype(out)>>(v);
    return Ok();
  };
  auto number = [&](double lo, double hi, double& out) -> Status {
    try {
      size_t used = 0;
      double v = std::stod(value, &used);
      if (used != value.size() || !(v >= lo && v <= hi)) {
        std::ostringstream range;
        range << "must be a number between " << lo << " and " << hi;
        return bad(range.str());
      }
      out = v;
    } catch (...) {
      return bad("must be a number");
    }
    return Ok();
  };
  if (key == "session_db_path")
    s.db_path = value;
  else if (key == "session_idle_seconds")
    return number(1, 365.0 * 86400, s.idle_seconds);
  else if (key == "session_tenant_quota_bytes")
    return integer(0, int64_t{1} << 50, s.tenant_quota_bytes);
  else if (key == "session_total_quota_bytes")
    return integer(0, int64_t{1} << 50, s.total_quota_bytes);
  else if (key == "session_image_max_bytes")
    return integer(0, int64_t{1} << 50, s.image_max_bytes);
  else if (key == "session_context_tokens")
    return integer(0, int64_t{1} << 31, s.context_tokens);
  else if (key == "session_keep_exchanges")
    return integer(1, 1 << 20, s.keep_exchanges);
  else if (key == "session_summary_max_tokens")
    return integer(16, 1 << 20, s.summary_max_tokens);
  else if (key == "session_replica") {
    if (!ValidReplicaName(value)) return bad("must be 1-32 characters of a-z, 0-9 and '-'");
    s.replica = value;
  } else if (key == "session_peers") {
    s.peers.clear();
    std::stringstream in(value);
    std::string item;
    while (std::getline(in, item, ',')) {
      if (item.empty()) continue;
      auto eq = item.find('=');
      if (eq == std::string::npos) return bad("must be name=http://host:port entries separated by commas");
      std::string name = item.substr(0, eq), url = item.substr(eq + 1);
      if (!ValidReplicaName(name)) return bad("peer name '" + name + "' must be 1-32 characters of a-z, 0-9 and '-'");
      if (!url.starts_with("http://") && !url.starts_with("https://"))
        return bad("peer " + name + ": the URL must start with http:// or https://");
      while (url.ends_with("/")) url.pop_back();
      s.peers[name] = url;
    }
  } else if (key == "session_forward_max_in_flight")
    return integer(1, 4096, s.forward_max_in_flight);
  else if (key == "session_forward_deadline_seconds")
    return number(0.1, 86400, s.forward_deadline_seconds);
  else if (key == "session_pin_share")
    return number(0, 1, s.pin_share);
  else if (key == "session_pin_seconds")
    return number(0, 86400, s.pin_seconds);
  else
    return Fail(Error::InvalidArgument(where + ": unknown setting '" + key + "'; see `moe-daemon serve --help`"));
  return Ok();
}

}  // namespace moeserve::daemon
