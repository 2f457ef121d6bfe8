// The value of one sample of a Prometheus text exposition, for tests that read
// the daemon's /metrics.
#pragma once

#include <gtest/gtest.h>

#include <string>

namespace moeserve::testing {

// The value of the sample line that starts with `series ` ("name" or
// "name{labels}" exactly as exposed). A series that is not there is a test
// failure (and -1), never a silent zero.
inline double MetricSample(const std::string& text, const std::string& series) {
  const std::string key = "\n" + series + " ";
  const size_t at = text.find(key);
  if (at == std::string::npos) {
    ADD_FAILURE() << "no sample " << series;
    return -1;
  }
  return std::stod(text.substr(at + key.size()));
}

}  // namespace moeserve::testing
