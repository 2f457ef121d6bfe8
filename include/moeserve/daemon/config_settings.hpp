// Every setting moe-daemon serve accepts, by name and kind: the one list
// that the --config reader and the flags check a key against (a key not
// listed here is refused as unknown, whatever config.cpp knows how to
// apply), that the YAML reader takes the value's kind from, and that tests
// compare with docs/http-api.md's configuration reference.
//
// Adding a setting: a row here, its parsing in ApplySetting (config.cpp, or
// session_settings.cpp for session_*), a line in config.hpp's summary, and
// a row in docs/http-api.md's reference (daemon.config_reference fails
// until the docs have it).
//
// The sections `pricing`, `budgets` and `hooks` are not listed: their fields
// are budget_policy.hpp's (kPricingFields, kBudgetFields, kHookFields).
//
// Thread safety: immutable data.
#pragma once

#include <span>
#include <string_view>

namespace moeserve::daemon {

enum class SettingKind { kText, kInteger, kNumber, kBoolean };

struct SettingSpec {
  std::string_view key;  // as in YAML; a flag spells it --key or with '-' for '_'
  SettingKind kind;
};

std::span<const SettingSpec> DaemonSettings();
// nullptr when `key` is not a setting.
const SettingSpec* FindDaemonSetting(std::string_view key);

}  // namespace moeserve::daemon
