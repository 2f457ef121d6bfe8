// daemon.config_settings: the settings table as the source of the value
// checks. Every row is coherent (CheckSettingRow), a value lands in the
// row's own field exactly as given at both ends of its range, and the
// messages come from the row (kind, range, the empty-text message, a parse
// function's words). Also that CheckSettingRow refuses the rows it exists to
// refuse: a range wider than the field's type (a value would wrap), a field
// of another kind, two targets or none.
#include "moeserve/daemon/config_settings.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

#include "moeserve/daemon/config.hpp"

namespace moeserve::daemon {
namespace {

// The field's value, as text (std::string as is, numbers printed exactly).
std::string Read(const SettingSpec& s, DaemonConfig& c) {
  return std::visit(
      [](auto* slot) -> std::string {
        using Slot = std::remove_pointer_t<decltype(slot)>;
        if constexpr (std::is_same_v<Slot, std::string>) return *slot;
        else if constexpr (std::is_same_v<Slot, bool>) return *slot ? "true" : "false";
        else if constexpr (std::is_same_v<Slot, double>) {
          char buf[64];
          std::snprintf(buf, sizeof buf, "%.17g", *slot);
          return buf;
        } else {
          return std::to_string(*slot);
        }
      },
      s.target.field(c));
}

std::string Apply(DaemonConfig& c, const char* key, const std::string& value) {
  const SettingSpec* s = FindDaemonSetting(key);
  if (s == nullptr) return std::string("no such setting: ") + key;
  const Status st = ApplySettingValue(c, *s, value, "daemon.yaml");
  return st ? "ok" : st.error().message();
}

TEST(ConfigSettings, EveryRowIsCoherent) {
  int rows = 0;
  for (const SettingSpec& s : DaemonSettings()) {
    ++rows;
    const Status st = CheckSettingRow(s);
    EXPECT_TRUE(st) << (st ? "" : st.error().message());
  }
  EXPECT_GT(rows, 60);
}

// Both ends of every numeric range (the tiers of thinking_budgets too, one
// at a time) are stored in the row's field as given: a value that wrapped or
// landed in another field would read back differently.
TEST(ConfigSettings, BothEndsOfEveryRangeLandInTheRowsField) {
  int checked = 0;
  for (const SettingSpec& s : DaemonSettings()) {
    if (s.kind != SettingKind::kInteger && s.kind != SettingKind::kNumber) continue;
    const auto range = ParseSettingRange(s.range);
    ASSERT_TRUE(range.has_value()) << s.key;
    for (double v : {range->lo, range->hi}) {
      DaemonConfig c;
      char text[64];
      if (s.kind == SettingKind::kInteger) std::snprintf(text, sizeof text, "%lld", static_cast<long long>(v));
      else std::snprintf(text, sizeof text, "%.17g", v);
      const Status st = ApplySettingValue(c, s, text, "test");
      ASSERT_TRUE(st) << s.key << " = " << text << ": " << st.error().message();
      EXPECT_EQ(Read(s, c), text) << s.key;
      ++checked;
    }
  }
  EXPECT_GT(checked, 70);
}

TEST(ConfigSettings, MessagesComeFromTheRow) {
  DaemonConfig c;
  EXPECT_EQ(Apply(c, "port", "70000"), "daemon.yaml: port: must be between 0 and 65535 (got '70000')");
  EXPECT_EQ(Apply(c, "port", "-1"), "daemon.yaml: port: must be between 0 and 65535 (got '-1')");
  EXPECT_EQ(Apply(c, "port", "80x"), "daemon.yaml: port: must be an integer (got '80x')");
  EXPECT_EQ(Apply(c, "prefix_cache_bytes", "-1"),
            "daemon.yaml: prefix_cache_bytes: must be between 0 and 1125899906842624 (got '-1')");
  // A number's bounds print as written in the table (before: 2.592e+06).
  EXPECT_EQ(Apply(c, "hook_give_up_seconds", "60"),
            "daemon.yaml: hook_give_up_seconds: must be a number of seconds between 3600 and 2592000 (got '60')");
  EXPECT_EQ(Apply(c, "session_idle_seconds", "0"),
            "daemon.yaml: session_idle_seconds: must be a number of seconds between 1 and 31536000 (got '0')");
  EXPECT_EQ(Apply(c, "session_pin_share", "1.5"),
            "daemon.yaml: session_pin_share: must be a number between 0 and 1 (got '1.5')");
  EXPECT_EQ(Apply(c, "session_pin_share", "half"), "daemon.yaml: session_pin_share: must be a number (got 'half')");
  EXPECT_EQ(Apply(c, "prefix_cache", "maybe"), "daemon.yaml: prefix_cache: must be true or false (got 'maybe')");
  EXPECT_EQ(Apply(c, "model", ""), "daemon.yaml: model: must name a model directory (got '')");
  EXPECT_EQ(Apply(c, "policy_name", ""), "daemon.yaml: policy_name: must not be empty (got '')");
  EXPECT_EQ(Apply(c, "kernels", "slow"), "daemon.yaml: kernels: must be fast or reference (got 'slow')");
  EXPECT_EQ(Apply(c, "session_peers", "b=ftp://x"),
            "daemon.yaml: session_peers: peer b: the URL must start with http:// or https:// (got 'b=ftp://x')");
  EXPECT_EQ(Apply(c, "session_replica", "Bad"),
            "daemon.yaml: session_replica: must be 1-32 characters of a-z, 0-9 and '-' (got 'Bad')");
  EXPECT_EQ(c.port, DaemonConfig{}.port) << "a refused value must leave the field alone";
}

TEST(ConfigSettings, ValuesLandWhereTheRowSays) {
  DaemonConfig c;
  EXPECT_EQ(Apply(c, "image_max_pixels", "4096"), "ok");
  EXPECT_EQ(c.images.limits.max_pixels, 4096u);
  EXPECT_EQ(Apply(c, "audit_max_files", "7"), "ok");
  EXPECT_EQ(c.audit.max_files, 7);
  EXPECT_EQ(Apply(c, "policy_name", "gold"), "ok");
  EXPECT_EQ(c.budget.policy_name, "gold");
  EXPECT_EQ(Apply(c, "thinking_budgets.medium", "99"), "ok");
  ASSERT_TRUE(c.thinking_budgets.has_value());
  EXPECT_EQ(c.thinking_budgets->medium, 99);
  EXPECT_EQ(Apply(c, "session_peers", "b=http://h:1/,c=https://k"), "ok");
  EXPECT_EQ(c.sessions.peers.at("b"), "http://h:1");
  EXPECT_EQ(c.sessions.peers.at("c"), "https://k");
  EXPECT_EQ(Apply(c, "default_reasoning_effort", "high"), "ok");
  EXPECT_EQ(c.default_reasoning_effort, ReasoningEffort::kHigh);
  EXPECT_EQ(Apply(c, "image_url_allowed_hosts", "a.example,b.example"), "ok");
  EXPECT_EQ(c.images.allowed_hosts.size(), 2u);
  EXPECT_EQ(Apply(c, "allow_unauthenticated", "yes"), "ok");
  EXPECT_TRUE(c.allow_unauthenticated);
}

// max_context once stated 0 to 2^31 for an int: 2^31 was accepted and
// wrapped to a negative window. The check names such a row.
TEST(ConfigSettings, IncoherentRowsAreRefused) {
  auto message = [](const SettingSpec& s) {
    const Status st = CheckSettingRow(s);
    return st ? std::string("ok") : st.error().message();
  };
  SettingSpec wide = *FindDaemonSetting("max_context");
  wide.range = "0 to 2^31";
  EXPECT_EQ(message(wide), "setting max_context: its range does not fit its field's type");
  SettingSpec kind = *FindDaemonSetting("port");
  kind.kind = SettingKind::kNumber;
  EXPECT_EQ(message(kind), "setting port: a number needs a double field");
  SettingSpec words = *FindDaemonSetting("port");
  words.range = "a port";
  EXPECT_EQ(message(words), "setting port: an integer's range must read \"A to B\"");
  SettingSpec fraction = *FindDaemonSetting("port");
  fraction.range = "0.5 to 10";
  EXPECT_EQ(message(fraction), "setting port: an integer's bounds must be whole");
  SettingSpec none = *FindDaemonSetting("port");
  none.target.field = nullptr;
  EXPECT_EQ(message(none), "setting port: needs exactly one of field, parse");
  SettingSpec parse_number = *FindDaemonSetting("kernels");
  parse_number.kind = SettingKind::kInteger;
  EXPECT_EQ(message(parse_number), "setting kernels: a parse function is for text settings");
}

TEST(ConfigSettings, RangesReadAsTheTableWritesThem) {
  const auto r = ParseSettingRange("0 to 2^30, at least `low`");
  ASSERT_TRUE(r.has_value());
  EXPECT_EQ(r->lo, 0);
  EXPECT_EQ(r->hi, 1 << 30);
  const auto f = ParseSettingRange("0.01 to 3600");
  ASSERT_TRUE(f.has_value());
  EXPECT_DOUBLE_EQ(f->lo, 0.01);
  EXPECT_FALSE(ParseSettingRange("a directory").has_value());
  EXPECT_FALSE(ParseSettingRange("10 to 1").has_value());
  EXPECT_FALSE(ParseSettingRange("1 to ten").has_value());
}

}  // namespace
}  // namespace moeserve::daemon
