// Runs a check on every KernelSet this CPU supports, in the ISA registry's
// order (AllIsas: the reference set first), each under a trace naming its
// Isa, and prints (once per label and test program) which variants ran and
// which this CPU could not run, so a log shows what a green run covered.
#pragma once

#include <gtest/gtest.h>

#include <cstdio>
#include <set>
#include <string>

#include "moeserve/kernels/cpu_kernels.hpp"

namespace moeserve::kernels {

inline void ReportVariants(const std::string& family, const std::string& ran, const std::string& skipped) {
  static std::set<std::string> reported;
  if (reported.insert(family).second)
    std::printf("[ variants ] %s ran: %s; not supported by this CPU: %s\n", family.c_str(), ran.c_str(),
                skipped.empty() ? "none" : skipped.c_str());
}

// fn(const KernelSet&) for every supported Isa; `family` labels the report.
template <class Fn>
void ForEachVariant(const char* family, Fn fn) {
  std::string ran, skipped;
  for (Isa isa : AllIsas()) {
    if (!IsaSupported(isa)) {
      skipped += std::string(skipped.empty() ? "" : " ") + IsaName(isa);
      continue;
    }
    SCOPED_TRACE(std::string(family) + " on the " + IsaName(isa) + " set");
    fn(Kernels(isa));
    ran += std::string(ran.empty() ? "" : " ") + IsaName(isa);
  }
  ReportVariants(family, ran, skipped);
}

}  // namespace moeserve::kernels
