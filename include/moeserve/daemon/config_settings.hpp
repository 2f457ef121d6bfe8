// Every setting moe-daemon serve accepts: name, kind, default, range and
// meaning, declared once. The --config reader checks a key against it (a
// key not listed here is refused as unknown, whatever config.cpp knows how
// to apply) and takes the value's kind from it; `moe-daemon serve --help`
// is printed from it (every setting is a flag, --key or --key-with-dashes);
// daemon.config_reference holds docs/http-api.md's configuration reference
// to it row for row (type, default, range, meaning) and the parser to every
// numeric range it states.
//
// Each row also says where its value goes, so the value checks are derived
// from it: ApplySettingValue parses the row's kind, holds a number to the
// row's range ("A to B"), refuses an empty text where the row says so, and
// stores it in the row's field; a text with a form of its own (a host list,
// the peers) has the row's parse function instead.
//
// Adding a setting: a row here (config_settings.cpp) and its field in
// DaemonConfig (config.hpp; or SessionSettings, AuditSettings) with its
// default; then the same row in docs/http-api.md's reference
// (daemon.config_reference says what differs until it is there).
//
// The sections `pricing`, `budgets` and `hooks` are not listed: their fields
// are budget_policy.hpp's (kPricingFields, kBudgetFields, kHookFields).
//
// Thread safety: immutable data.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>

#include "moeserve/common/status.hpp"

namespace moeserve::daemon {

struct DaemonConfig;

enum class SettingKind { kText, kInteger, kNumber, kBoolean };

// The field of a DaemonConfig a setting is stored in (size_t is uint64_t).
using SettingField = std::variant<std::string*, bool*, int*, int64_t*, uint64_t*, double*>;

// Where a setting's value goes. Either a field, for a value whose checks are
// its kind, the row's range and (for a text) `if_empty`; or a parse
// function, for a text with a form of its own, which stores it or says what
// is wrong (the message without key or value: ApplySettingValue adds them).
struct SettingTarget {
  using FieldFn = SettingField (*)(DaemonConfig&);
  using ParseFn = Status (*)(DaemonConfig&, const std::string& value);
  constexpr SettingTarget(FieldFn f, std::string_view empty_message = {}) : field(f), if_empty(empty_message) {}
  constexpr SettingTarget(ParseFn p) : parse(p) {}

  FieldFn field = nullptr;
  ParseFn parse = nullptr;
  std::string_view if_empty;  // a text's message for an empty value ("" = empty is fine)
};

struct SettingSpec {
  std::string_view key;  // as in YAML; a flag spells it --key or with '-' for '_'
  SettingKind kind;
  std::string_view default_value;  // in words, as the docs' reference states it (Markdown)
  // Numbers: "A to B" (2^N allowed), the bounds ApplySettingValue holds a
  // value to, optionally followed by ", <words>" checked elsewhere. Else
  // words, or "".
  std::string_view range;
  std::string_view doc;  // what it does (Markdown)
  SettingTarget target;  // where the value goes
};

// The bounds a numeric row's range states; nullopt for a range that does
// not start "A to B" (or is not a number's).
struct SettingRange {
  double lo, hi;
};
std::optional<SettingRange> ParseSettingRange(std::string_view range);

// Whether a row is coherent: one target; a parse function only for text; a
// field of the row's kind (text: std::string, boolean: bool, number: double,
// integer: an integer type); a numeric range that reads "A to B", with whole
// bounds for an integer, inside what the field's type holds.
Status CheckSettingRow(const SettingSpec& spec);

// Checks `value` (text as a flag gives it, or as the YAML reader renders a
// scalar of the row's kind) against the row and stores it in c. Messages:
// "<where>: <key>: <what is wrong> (got '<value>')".
Status ApplySettingValue(DaemonConfig& c, const SettingSpec& spec, const std::string& value, const std::string& where);

// "text", "integer", "number", "boolean": the docs' type column.
std::string_view SettingKindName(SettingKind kind);

std::span<const SettingSpec> DaemonSettings();
// nullptr when `key` is not a setting.
const SettingSpec* FindDaemonSetting(std::string_view key);

}  // namespace moeserve::daemon
