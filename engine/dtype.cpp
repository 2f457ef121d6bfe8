#include "moeserve/engine/dtype.hpp"

#include <array>
#include <utility>

namespace moeserve::engine {
namespace {

struct DTypeEntry {
  DType type;
  std::string_view name;
  size_t size;
};

constexpr std::array<DTypeEntry, 15> kDTypes{{
    {DType::kBool, "BOOL", 1},   {DType::kU8, "U8", 1},       {DType::kI8, "I8", 1},
    {DType::kU16, "U16", 2},     {DType::kI16, "I16", 2},     {DType::kF16, "F16", 2},
    {DType::kBF16, "BF16", 2},   {DType::kU32, "U32", 4},     {DType::kI32, "I32", 4},
    {DType::kF32, "F32", 4},     {DType::kU64, "U64", 8},     {DType::kI64, "I64", 8},
    {DType::kF64, "F64", 8},     {DType::kF8E4M3, "F8_E4M3", 1}, {DType::kF8E5M2, "F8_E5M2", 1},
}};

}  // namespace

std::optional<DType> ParseDType(std::string_view s) {
  for (const auto& e : kDTypes)
    if (e.name == s) return e.type;
  return std::nullopt;
}

std::string_view DTypeName(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.name;
  return "?";
}

size_t DTypeSize(DType t) {
  for (const auto& e : kDTypes)
    if (e.type == t) return e.size;
  return 0;
}

}  // namespace moeserve::engine
