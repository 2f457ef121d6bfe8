// config.json (ParseModelConfig). Any text is refused with a message naming
// the file, or accepted; an accepted config written back (ToJson) parses to a
// config that writes the same text, and passes validation again.
#include <cstdint>
#include <string>

#include "fuzz_check.hpp"
#include "moeserve/engine/model_config.hpp"

using namespace moeserve;
using namespace moeserve::engine;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  auto config = ParseModelConfig(text, "config.json");
  if (!config) {
    FUZZ_CHECK(config.error().message().find("config.json") != std::string::npos,
               "a refusal names the file: " + config.error().message());
    return 0;
  }
  FUZZ_CHECK(static_cast<int>(config->layer_types.size()) == config->num_layers, "layer_types and num_layers");
  FUZZ_CHECK(ValidateModelConfig(*config).has_value(), "an accepted config fails validation");
  const std::string written = config->ToJson();
  auto again = ParseModelConfig(written, "config.json (written)");
  FUZZ_CHECK(again.has_value(), "ToJson's text is refused: " + (again ? "" : again.error().message()));
  FUZZ_CHECK(again->ToJson() == written, "the config changed in the round trip");
  return 0;
}
