// Every setting moe-daemon serve accepts: name, kind, default, range and
// meaning, declared once. The --config reader checks a key against it (a
// key not listed here is refused as unknown, whatever config.cpp knows how
// to apply) and takes the value's kind from it; `moe-daemon serve --help`
// is printed from it (every setting is a flag, --key or --key-with-dashes);
// daemon.config_reference holds docs/http-api.md's configuration reference
// to it row for row (type, default, range, meaning) and the parser to every
// numeric range it states.
//
// Adding a setting: a row here, its field in DaemonConfig (config.hpp; or
// SessionSettings, AuditSettings) with its default, and its parsing in
// ApplySetting (config.cpp, or session_settings.cpp for session_*); then
// the same row in docs/http-api.md's reference (daemon.config_reference
// says what differs until it is there).
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
  std::string_view default_value;  // in words, as the docs' reference states it (Markdown)
  std::string_view range;          // "A to B" for numbers (2^N allowed); else words, or ""
  std::string_view doc;            // what it does (Markdown)
};

// "text", "integer", "number", "boolean": the docs' type column.
std::string_view SettingKindName(SettingKind kind);

std::span<const SettingSpec> DaemonSettings();
// nullptr when `key` is not a setting.
const SettingSpec* FindDaemonSetting(std::string_view key);

}  // namespace moeserve::daemon
